"""The operating panels of the dashboard (issue 37): claim pauses, dead letters, coverage, Flow versions; read-only.

Each reads Connectors over its RPCs (``dashboard.connectors``: ListClaimPauses and
GetOrderPolicy, GetRetentionPolicy, CountDeadLetters and ListDeadLetters, GetCoverage,
ListFlowVersions), so each raises
``ConnectorsUnavailable`` while it is down; the pack list comes from the database
(``dashboard.queries``). Nothing here pauses, replays or skips: the page names the CLI
commands that do (docs/decisions/164-dashboard-operating-panels.md).

- ``claim_pauses``: per listed pack, its active pauses, its order policy and its retention
  (the limits and the pruner's backlog, decision 181).
- ``dead_letters``: per pack with failed work (all listed packs, or one), the count by
  identity and the first ``DEAD_LETTER_PAGE`` dead letters, oldest finished first.
- ``coverage``: one GetCoverage page of one pack, the identities that are not tiled first,
  and the token of the next page.
- ``flow_versions``: per listed pack, each work type's Flow versions (decision 185) with their
  state, inputs done of the total, rate, time left, verification and recorded steps.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from google.protobuf.message import Message
from sqlalchemy.engine import Engine

from nexuscrm.connectors.v1 import connectors_pb2 as pb
from nexuscrm_controlplane.dashboard import queries
from nexuscrm_controlplane.dashboard.connectors import ConnectorsReads, Unprovable
from nexuscrm_controlplane.dashboard.overview import PACK_LIMIT
from nexuscrm_runtime.clock import iso_utc as iso
from nexuscrm_wire import convert
from nexuscrm_wire.timestamps import from_timestamp
from workqueue import WorkStatus
from workqueue.errors import InvalidArgument

DEAD_LETTER_PAGE = 20  # dead letters listed per pack: ListDeadLetters' first page
# Identities per coverage page: a page reads every retained range and input of its identities,
# about 0.3 s per identity of 100 retained generations on SQLite and 12 ms on MariaDB (the plan
# test's history, 2 shared cores), so 10 stay within the 5 s deadline of a call (connectors.TIMEOUT).
COVERAGE_PAGE = 10
ERROR_SHOWN = 500  # characters of a last error on the page
REPLAY_COMMAND = "nexuscrm dead-letters replay PACK [--dry-run]"  # what acts on what the panel lists
RANGE_STATES = ("completed", "in_flight", "queued", "failed", "replayed", "skipped", "pruned")


def _word(enum: Any, value: int, prefix: str) -> str:
    """An enum value as the CLI and JSON say it: ``COVERAGE_RANGE_STATE_IN_FLIGHT`` -> ``in_flight``."""
    return str(enum.Name(value)).removeprefix(prefix).lower()


def _when(message: Message, field: str) -> str | None:
    return iso(from_timestamp(message, field))


def _identity(route: pb.ProjectionRoute, pack_install_id: str) -> dict[str, Any]:
    """A route as the timeline labels an identity, with its projection key (the label's title)."""
    key = convert.route_from_proto(route).identity(pack_install_id).key
    return {"projection_key": key, "label": f"{route.source_lane} · {route.work_type} · {route.event_kind}"}


def _packs(engine: Engine, pack_install_id: str = "") -> list[tuple[str, str]]:
    """(PackInstallId, "name version") of the listed packs, or of the one asked for (else ``InvalidArgument``)."""
    with engine.connect() as connection:
        listed = [
            (row.PackInstallId, f"{row.PackName} {row.PackVersion}")
            for row in queries.packs_list(connection, PACK_LIMIT)
        ]
    if not pack_install_id:
        return listed
    wanted = [pack for pack in listed if pack[0] == pack_install_id]
    if not wanted:
        raise InvalidArgument(f"pack {pack_install_id!r} is not one of the listed packs", field="pack")
    return wanted


def _pause(pause: pb.ClaimPause, pack_install_id: str) -> dict[str, Any]:
    scope = pause.scope
    return {
        "pause_id": pause.pause_id,
        "scope": _word(pb.PauseScope, scope.scope, "PAUSE_SCOPE_"),
        "identity": _identity(scope.route, pack_install_id) if scope.HasField("route") else None,
        "work_type": scope.work_type or None,
        "paused_by": pause.paused_by,
        "reason": pause.reason,
        "paused_at": _when(pause, "paused_at"),
        "expires_at": _when(pause, "expires_at"),
    }


def _policy(policy: pb.OrderPolicy) -> dict[str, Any]:
    return {
        "policy": _word(pb.OrderPolicyKind, policy.policy, "ORDER_POLICY_KIND_"),
        "default": not policy.HasField("set_at"),
        "set_by": policy.set_by,
        "reason": policy.reason,
        "set_at": _when(policy, "set_at"),
    }


def _policies(answer: pb.GetOrderPolicyResponse | None) -> dict[str, Any] | None:
    """The pack's policy, with its work types' own policies under ``work_types``."""
    if answer is None:
        return None
    types = {policy.work_type: _policy(policy) for policy in answer.work_type_policies}
    return {**_policy(answer.policy), "work_types": types}


def _retention(policy: pb.RetentionPolicy | None) -> dict[str, Any] | None:
    """The pack's retention limits and the pruner's backlog (None: no limit, or Connectors does not know the pack)."""
    if policy is None or not (policy.HasField("keep_generations") or policy.HasField("keep_seconds")):
        return None
    return {
        "keep_generations": policy.keep_generations if policy.HasField("keep_generations") else None,
        "keep_seconds": policy.keep_seconds if policy.HasField("keep_seconds") else None,
        "backlog_generations": policy.backlog_generations,
        "backlog_oldest_finished_at": _when(policy, "backlog_oldest_finished_at"),
    }


def claim_pauses(engine: Engine, connectors: ConnectorsReads) -> dict[str, Any]:
    """Every listed pack's active claim pauses, order policy and retention: three RPCs per pack."""
    packs = []
    for pack_install_id, label in _packs(engine):
        pauses = connectors.list_claim_pauses(pack_install_id)
        packs.append(
            {
                "pack_install_id": pack_install_id,
                "pack": label,
                "pauses": [_pause(p, pack_install_id) for p in pauses or ()],
                "order_policy": _policies(connectors.get_order_policy(pack_install_id)),
                "retention": _retention(connectors.get_retention_policy(pack_install_id)),
            }
        )
    return {"packs": packs}


def _dead_letter(message: pb.WorkItem) -> dict[str, Any]:
    work = convert.work_from_proto(message)
    identity = _identity(message.route, work.pack_install_id)
    return {
        "work_id": work.work_id,
        "identity": identity,
        "range": [work.input_start_ordinal, work.lane_ordinal],
        "attempt": work.attempt,
        "max_attempts": work.max_attempts,
        "last_error": (work.last_error or "")[:ERROR_SHOWN],
        "finished_at": iso(work.finished_at),
    }


def _has_failed_work(engine: Engine, pack_install_id: str) -> bool:
    """Whether the pack has any failed generation: a dead letter is one, so a pack without asks Connectors nothing."""
    with engine.connect() as connection:
        return queries.work_status_count_capped(connection, pack_install_id, WorkStatus.FAILED, 1) > 0


def dead_letters(engine: Engine, connectors: ConnectorsReads, pack_install_id: str = "") -> dict[str, Any]:
    """The dead letters of every listed pack (or of ``pack_install_id``): count by identity and the first page.

    Only packs with at least one dead letter are listed. ``more``: the pack has more than the
    first page. Replaying is the CLI's (``replay_command``): the dashboard changes nothing.
    """
    packs = []
    for pack, label in _packs(engine, pack_install_id):
        if not _has_failed_work(engine, pack):
            continue
        counted = connectors.count_dead_letters(pack)
        if counted is None or counted.total == 0:
            continue
        page = connectors.list_dead_letters(pack, DEAD_LETTER_PAGE)
        packs.append(
            {
                "pack_install_id": pack,
                "pack": label,
                "total": counted.total,
                "complete": counted.complete,
                "examined": counted.examined,
                "identities": [
                    {"identity": _identity(i.route, pack), "dead_letters": i.dead_letters} for i in counted.identities
                ],
                "dead_letters": [] if page is None else [_dead_letter(w) for w in page.dead_letters],
                "more": page is not None and bool(page.next_page_token),
            }
        )
    return {"replay_command": REPLAY_COMMAND, "page_size": DEAD_LETTER_PAGE, "packs": packs}


def _coverage(identity: pb.IdentityCoverage, pack_install_id: str) -> dict[str, Any]:
    states = Counter(_word(pb.CoverageRangeState, r.state, "COVERAGE_RANGE_STATE_") for r in identity.ranges)
    return {
        "identity": _identity(identity.route, pack_install_id),
        "high_water_ordinal": identity.high_water_ordinal,
        "tiled": identity.tiled,
        "inputs": identity.inputs,
        "ranges": {state: states.get(state, 0) for state in RANGE_STATES},
        "exceptions": [
            {
                "kind": _word(pb.CoverageExceptionKind, e.kind, "COVERAGE_EXCEPTION_KIND_"),
                "start": e.start_ordinal,
                "end": e.end_ordinal,
                "work_ids": list(e.work_ids),
            }
            for e in identity.exceptions
        ],
        "exception_count": identity.exception_count,
    }


def coverage(connectors: ConnectorsReads, pack_install_id: str, page_token: str = "") -> dict[str, Any]:
    """One page of the pack's coverage proof (``COVERAGE_PAGE`` identities), identities not tiled first.

    ``next`` is the ``page_token`` of the following page ("" at the end); ``provable`` is false,
    with Connectors' ``explanation``, for a pack without a protocol row. ``InvalidArgument``
    for a pack Connectors does not know, or a token that is not from a previous page.
    """
    answer = connectors.get_coverage(pack_install_id, page_token, COVERAGE_PAGE)
    if answer is None:
        raise InvalidArgument(f"pack {pack_install_id!r} is not installed", field="pack")
    if isinstance(answer, Unprovable):
        found: dict[str, Any] = {"provable": False, "explanation": answer.explanation, "identities": [], "next": ""}
        return {"pack_install_id": pack_install_id, "examined": 0, "not_tiled": 0, **found}
    identities = sorted(
        (_coverage(i, pack_install_id) for i in answer.identities), key=lambda i: i["tiled"]
    )  # stable: by projection key within each group, as Connectors answered
    return {
        "pack_install_id": pack_install_id,
        "provable": True,
        "explanation": "",
        "examined": answer.examined,
        "not_tiled": sum(not i["tiled"] for i in identities),
        "identities": identities,
        "next": answer.next_page_token,
    }


def _flow_version_change(change: pb.FlowVersionChange) -> dict[str, Any]:
    return {
        "version": change.version,
        "action": change.action,
        "actor": change.actor,
        "reason": change.reason,
        "forced": change.forced,
        "at_ordinal": change.at_ordinal,
        "changed_at": _when(change, "changed_at"),
    }


def _flow_version(version: pb.FlowVersion) -> dict[str, Any]:
    """One version as the panel shows it: state and progress, its verification, its recorded steps."""
    verification = None
    if version.verdict:
        verification = {
            "verdict": _word(pb.FlowVersionVerdict, version.verdict, "FLOW_VERSION_VERDICT_"),
            "against": version.verified_against,
            "through_ordinal": version.verified_through_ordinal,
            "verified_at": _when(version, "verified_at"),
        }
    return {
        "version": version.version,
        "state": _word(pb.FlowVersionState, version.state, "FLOW_VERSION_STATE_"),
        "source_version": version.source_version,
        "inputs_done": version.inputs_done,
        "inputs_total": version.inputs_total,
        "high_water_ordinal": version.high_water_ordinal,
        "generations_done": version.generations_done,
        "generations_total": version.generations_total,
        "generations_failed": version.generations_failed,
        "inputs_per_second": version.inputs_per_second,
        "seconds_left": version.seconds_left,
        "max_inputs_per_second": version.max_inputs_per_second,
        "verification": verification,
        "created_at": _when(version, "created_at"),
        "retired_at": _when(version, "retired_at"),
        "changes": [_flow_version_change(change) for change in version.changes],
    }


def flow_versions(engine: Engine, connectors: ConnectorsReads) -> dict[str, Any]:
    """Every listed pack's Flow versions by work type, with state and progress: one RPC per pack."""
    packs = []
    for pack_install_id, label in _packs(engine):
        by_work_type: dict[str, list[dict[str, Any]]] = {}
        for version in connectors.list_flow_versions(pack_install_id) or ():
            by_work_type.setdefault(version.work_type, []).append(_flow_version(version))
        work_types = [{"work_type": name, "versions": found} for name, found in sorted(by_work_type.items())]
        packs.append({"pack_install_id": pack_install_id, "pack": label, "work_types": work_types})
    return {"packs": packs}
