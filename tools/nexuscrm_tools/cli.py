"""``nexuscrm``: the operator command line over the services' RPCs.

Subcommands: ``packs list|install|activate|protocol|show|find``,
``fences arm|disarm|list|override``, ``drain status|wait``, ``queue state|wait``,
``cutover audit|run``, ``work show|list|members``, ``receipts list|missing``,
``retention set|show|prune``, ``schema contract-payloads``, ``why``, ``activation``,
``workers``, ``version``, ``health``, ``claims pause|resume|list``, ``dead-letters list|count|replay|skip``
``order-policy set|show``, ``retry-policy set|show``, ``work retry-now``, ``coverage``, ``identities`` and ``send``.
A pack is named by its id or as ``NAMESPACE/NAME[@VERSION]``, and an identity by the identity
flags that name exactly one of the pack's (decision 178).
Tables by default, ``--json`` for scripts (docs/output-conventions.md).
Services are found through the variables NEXUSCRM_SCHEMA_CATALOG_TARGET,
NEXUSCRM_CONTROLPLANE_TARGET, NEXUSCRM_CONNECTORS_TARGET and NEXUSCRM_INTEGRATION_TARGET
(host:port; ``nexuscrm-run --serve`` prints them). With NEXUSCRM_TLS_CA / _CERT / _KEY set, it
speaks mutual TLS as the principal of that certificate (docs/security.md). Durations are Go
durations (``30s``, ``5m``, ``1h30m``), as in the runbook commands. A fence is named by its id or
by the short id the dashboard shows (a unique prefix of at least 8 hex digits).

Exit codes come from the one table of every operator command (``nexuscrm_tools.exits``; the
list below ``--help``): 0 done, the check passed; 2 usage error, or a pack, fence, receipt or
WorkId the service does not know; 3 a service is unreachable or does not implement the RPC
yet (the message names the service and the variable to set), or is not SERVING (``health``);
4, 5, 6 the cutover refused by
gate, audit or missing prerequisite (as ``connector-projection-cutover``); 7 timeout
(``drain wait`` or ``queue wait`` ended undrained, or an RPC's deadline passed); 8 the service
refused a valid request; 9 the check did not pass (not drained, receipts whose coverage is
missing, no protocol row, host not activated, services outside each other's declared ranges:
``version``).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from google.protobuf.message import Message
from rich.console import Console
from rich.table import Table
from rich.text import Text

from nexuscrm.connectors.v1 import connectors_pb2 as cn_pb
from nexuscrm.controlplane.v1 import controlplane_pb2 as cp_pb
from nexuscrm.integration.v1 import integration_pb2 as in_pb
from nexuscrm_runtime import pack_names
from nexuscrm_runtime.clock import iso_utc
from nexuscrm_runtime.durations import parse_duration, whole_seconds
from nexuscrm_runtime.polling import poll_until
from nexuscrm_runtime.targets import Targets
from nexuscrm_schema.tables import NAMESPACE_SCOPE
from nexuscrm_sdk import convert
from nexuscrm_tools import identities, payload_contract, payload_view, sending, service_health, tables, versions
from nexuscrm_tools.clients import SERVICES, Clients, ServiceCallFailed, deployed
from nexuscrm_tools.exits import REFUSAL_EXIT_CODES, ExitCode, help_epilog, rpc_exit_code
from nexuscrm_tools.json_view import enum_word, message_data, timestamp_text
from nexuscrm_tools.tables import listing, plural
from workqueue import ReceiptState, WorkStatus
from workqueue.values import Outcome as IngestOutcome
from workqueue.values import QueueState, Route

RPC_TIMEOUT = 30.0  # seconds per call
IDENTITY_FLAGS = tuple(identities.FLAG_FIELDS)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outcome:
    """What a subcommand answers: data for ``--json``, a table or line for people, an exit code."""

    data: Any
    view: Table | str
    code: ExitCode = ExitCode.OK


def _dict(message: Message) -> dict[str, Any]:
    return message_data(message)


def _table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> Table:
    return tables.table(title, columns, rows)


def _fields(title: str, data: dict[str, Any]) -> Table:
    return _table(
        title,
        ("field", "value"),
        [(key, json.dumps(value) if isinstance(value, list | dict) else value) for key, value in data.items()],
    )


Handler = Callable[[Clients, argparse.Namespace], Outcome]


def packs_install(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Install a new pack incarnation."""
    response = clients.controlplane.InstallPack(
        cp_pb.InstallPackRequest(namespace=args.namespace, pack_name=args.name, pack_version=args.version),
        timeout=RPC_TIMEOUT,
    )
    data = _dict(response.pack)
    return Outcome(data=data, view=_fields("pack installed", data))


def packs_activate(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Greenfield activation: protocol 1 with LegacyMaxOrdinal 0."""
    response = clients.controlplane.ActivatePack(
        cp_pb.ActivatePackRequest(pack_install_id=args.pack), timeout=RPC_TIMEOUT
    )
    data = _dict(response)
    return Outcome(
        data=data, view=_fields("already active" if response.already_active else "activated", _dict(response.protocol))
    )


def packs_protocol(clients: Clients, args: argparse.Namespace) -> Outcome:
    """The pack's protocol row; exit 4 when it has none."""
    response = clients.controlplane.GetProtocol(
        cp_pb.GetProtocolRequest(pack_install_id=args.pack), timeout=RPC_TIMEOUT
    )
    data = _dict(response)
    if not response.exists:
        return Outcome(data=data, view=f"pack {args.pack} has no protocol row", code=ExitCode.CHECK_FAILED)
    return Outcome(data=data, view=_fields(f"protocol of {args.pack}", _dict(response.protocol)))


def _pack_view(response: cp_pb.GetPackResponse) -> dict[str, object]:
    pack = response.pack
    protocol = response.protocol_state
    if response.HasField("protocol"):
        protocol += f" (LegacyMaxOrdinal {response.protocol.legacy_max_ordinal})"
    return {
        "pack": pack.pack_install_id,
        "namespace": pack.namespace,
        "name": pack.pack_name,
        "version": pack.pack_version,
        "ordinal counter": pack.last_ordinal,
        "protocol": protocol,
        "installed at": timestamp_text(pack.created_at),
    }


def packs_show(clients: Clients, args: argparse.Namespace) -> Outcome:
    """One pack incarnation: namespace, name, version, ordinal counter and protocol state."""
    response = clients.controlplane.GetPack(cp_pb.GetPackRequest(pack_install_id=args.pack), timeout=RPC_TIMEOUT)
    return Outcome(data=_dict(response), view=_fields(f"pack {args.pack}", _pack_view(response)))


def packs_find(clients: Clients, args: argparse.Namespace) -> Outcome:
    """The incarnations of a pack by namespace, name and version, newest first; exit 9 when none."""
    response = clients.controlplane.FindPacks(
        cp_pb.FindPacksRequest(namespace=args.namespace, pack_name=args.name, pack_version=args.version),
        timeout=RPC_TIMEOUT,
    )
    rows = [(p.pack_install_id, p.last_ordinal, timestamp_text(p.created_at)) for p in response.packs]
    view = listing(
        f"{args.namespace}/{args.name} {args.version}: {plural(len(rows), 'incarnation')}",
        ("pack", "ordinal counter", "installed at"),
        rows,
    )
    return Outcome(
        data=[_dict(p) for p in response.packs], view=view, code=ExitCode.OK if rows else ExitCode.CHECK_FAILED
    )


def packs_list(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Every pack incarnation (of ``--namespace``, or of all) with its protocol state, by pack id; paged."""
    response = clients.controlplane.ListPacks(
        cp_pb.ListPacksRequest(namespace=args.namespace, page_size=args.page_size, page_token=args.page_token),
        timeout=RPC_TIMEOUT,
    )
    rows = [
        (
            p.pack.pack_install_id,
            p.pack.namespace,
            p.pack.pack_name,
            p.pack.pack_version,
            p.protocol_state,
            p.pack.last_ordinal,
            timestamp_text(p.pack.created_at),
        )
        for p in response.packs
    ]
    title = f"packs{_count(rows, response.next_page_token, 'incarnation')}"
    columns = ("pack", "namespace", "name", "version", "protocol", "ordinal counter", "installed at")
    return Outcome(data=_dict(response), view=listing(title, columns, rows))


def _fence_rows(fences: Sequence[cp_pb.Fence]) -> Table | str:
    rows = [
        (
            f.fence_id,
            f.namespace,
            f.scope,
            timestamp_text(f.expires_at) if f.HasField("expires_at") else "never",
            f.reason,
            ", ".join(o.pack_install_id for o in f.overrides),
        )
        for f in fences
    ]
    return listing("fences", ("fence", "namespace", "scope", "expires", "reason", "overrides"), rows)


def fences_arm(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Arm a fence on a namespace (``*``) or one pack."""
    response = clients.controlplane.ArmFence(
        cp_pb.ArmFenceRequest(
            namespace=args.namespace,
            scope=args.scope,
            expires_in_seconds=whole_seconds(args.expires_in),
            reason=args.reason,
        ),
        timeout=RPC_TIMEOUT,
    )
    return Outcome(data=_dict(response.fence), view=_fence_rows([response.fence]))


def fences_disarm(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Disarm a fence."""
    clients.controlplane.DisarmFence(cp_pb.DisarmFenceRequest(fence_id=args.fence), timeout=RPC_TIMEOUT)
    return Outcome(data={"fence_id": args.fence, "disarmed": True}, view=f"fence {args.fence} disarmed")


def fences_list(clients: Clients, args: argparse.Namespace) -> Outcome:
    """List a namespace's fences and overrides."""
    response = clients.controlplane.ListFences(cp_pb.ListFencesRequest(namespace=args.namespace), timeout=RPC_TIMEOUT)
    return Outcome(data=[_dict(f) for f in response.fences], view=_fence_rows(response.fences))


def fences_override(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Release a pack from a fence (``add``), or end that release (``remove``)."""
    if args.action == "remove":
        clients.controlplane.RemoveFenceOverride(
            cp_pb.RemoveFenceOverrideRequest(fence_id=args.fence, pack_install_id=args.pack), timeout=RPC_TIMEOUT
        )
        return Outcome(
            data={"fence_id": args.fence, "pack_install_id": args.pack, "removed": True}, view="override removed"
        )
    response = clients.controlplane.AddFenceOverride(
        cp_pb.AddFenceOverrideRequest(
            fence_id=args.fence, pack_install_id=args.pack, expires_in_seconds=whole_seconds(args.expires_in)
        ),
        timeout=RPC_TIMEOUT,
    )
    return Outcome(data=_dict(response.fence), view=_fence_rows([response.fence]))


def _drain_outcome(response: cp_pb.GetDrainStatusResponse, undrained: ExitCode) -> Outcome:
    data = _dict(response)
    rows = [(h.reason, h.count, ", ".join(h.sample_work_ids)) for h in response.holds]
    counts = ", ".join(f"{name} {getattr(response, name)}" for name in ("pending", "blocked", "retry", "processing"))
    table = _table(
        f"{response.pack_install_id}: {'drained' if response.drained else 'not drained'} ({counts})",
        ("held by", "count", "sample work ids"),
        rows,
    )
    return Outcome(data=data, view=table, code=ExitCode.OK if response.drained else undrained)


def _drain_read(clients: Clients, pack_install_id: str) -> Callable[[], cp_pb.GetDrainStatusResponse]:
    stub = clients.controlplane

    def read() -> cp_pb.GetDrainStatusResponse:
        response: cp_pb.GetDrainStatusResponse = stub.GetDrainStatus(
            cp_pb.GetDrainStatusRequest(pack_install_id=pack_install_id), timeout=RPC_TIMEOUT
        )
        return response

    return read


def drain_status(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Old-protocol work of a pack that is not terminal yet; exit 9 (check failed) unless drained."""
    return _drain_outcome(_drain_read(clients, args.pack)(), ExitCode.CHECK_FAILED)


def drain_wait(
    clients: Clients,
    args: argparse.Namespace,
    *,
    monotonic: Callable[[], float] = time.monotonic,
    wait: Callable[[float], bool] | None = None,
) -> Outcome:
    """Poll the drain status until drained or ``--timeout``; never changes anything.

    The loop is ``nexuscrm_runtime.polling.poll_until``, as in ``connector-projection-drain``;
    exit 7 (timeout) with what holds the drain when the bound passes first.
    """
    polled = poll_until(
        _drain_read(clients, args.pack),
        lambda response: response.drained,
        timeout=args.timeout,
        interval=args.interval,
        monotonic=monotonic,
        wait=wait,
    )
    return _drain_outcome(polled.status, ExitCode.TIMEOUT)


def _queue_outcome(state: QueueState, undrained: ExitCode) -> Outcome:
    counts = ", ".join(
        f"{name} {getattr(state, name)}" for name in ("pending", "blocked", "retry", "processing", "receipts_waiting")
    )
    # Drained with dead letters: nothing runs any more, yet some inputs were never applied.
    settled = state.drained and not state.dead_letters
    drained: object = state.drained
    if state.drained and state.dead_letters:
        drained = (
            f"yes, but {state.dead_letters} dead letters: their inputs were never applied; replay or skip them"
            f" (nexuscrm dead-letters list {state.pack_install_id})"
        )
    view: dict[str, object] = {
        "drained": drained,
        "depth": f"{state.depth} generations ({counts.replace('_', ' ')})",
        "oldest waiting": state.oldest_waiting_work_id or "-",
        "waiting since": iso_utc(state.oldest_waiting_since) or "-",
        "waiting for": f"{state.oldest_waiting_age.total_seconds():.1f}s" if state.oldest_waiting_age else "-",
    }
    return Outcome(
        data=_dict(convert.queue_state_to_proto(state)),
        view=_fields(f"native queue of {state.pack_install_id}", view),
        code=ExitCode.OK if settled else undrained,
    )


def queue_state(clients: Clients, args: argparse.Namespace) -> Outcome:
    """A pack's native queue: depth per status, receipts waiting, the oldest waiting generation, its claim pauses.

    Also how many generations failed for good, how many of those are dead letters, and how many
    pending ones the order policy holds behind one. Exit 9 (check failed) unless drained without
    dead letters.
    """
    state = clients.connectors_client.queue_state(args.pack)
    outcome = _queue_outcome(state, ExitCode.CHECK_FAILED)
    pauses = clients.connectors.ListClaimPauses(
        cn_pb.ListClaimPausesRequest(pack_install_id=args.pack), timeout=RPC_TIMEOUT
    ).pauses
    outcome.data["paused"] = [_dict(pause) for pause in pauses]
    if isinstance(outcome.view, Table):
        outcome.view.add_row("claims paused", "; ".join(" ".join(map(str, _pause_row(p)[1:4])) for p in pauses) or "no")
        outcome.view.add_row("failed for good", f"{state.failed} generations, {state.dead_letters} dead letters")
        held = f"{state.held} pending, held by the order policy block (nexuscrm work list {args.pack} says behind what)"
        outcome.view.add_row("held", held if state.held else "0")
    return outcome


def queue_wait(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Wait until a pack's native queue is drained (Connectors WaitQueueDrained); never changes anything.

    Exit 7 (timeout) with the last state when ``--timeout`` passes first.
    """
    state = clients.connectors_client.wait_queue_drained(args.pack, timeout=args.timeout)
    return _queue_outcome(state, ExitCode.TIMEOUT)


def _report_outcome(report: cp_pb.CutoverReport, title: str, data: dict[str, Any]) -> Outcome:
    rows = [(f.category, f.rule, f.count, ", ".join(f.sample_ids), f.detail) for f in report.refusals]
    table = _table(
        f"{title}: {'passed' if report.passed else 'REFUSED'} (cutoff {report.legacy_max_ordinal}, "
        f"{report.events_audited} events, {report.work_items_audited} work items audited)",
        ("category", "rule", "count", "samples", "detail"),
        rows,
    )
    return Outcome(data=data, view=table, code=ExitCode.OK if report.passed else _refusal_code(report))


def _refusal_code(report: cp_pb.CutoverReport) -> ExitCode:
    """The runbook's code for the first refusing family (gate 4, audit 5, prerequisite 6)."""
    if report.refusals and report.refusals[0].category in REFUSAL_EXIT_CODES:
        return REFUSAL_EXIT_CODES[report.refusals[0].category]
    return ExitCode.CHECK_FAILED


def cutover_audit(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Run every cutover gate and the audit; writes nothing. Exit 4, 5 or 6 when refused."""
    response = clients.controlplane.AuditCutover(
        cp_pb.AuditCutoverRequest(pack_install_id=args.pack, timeout_seconds=whole_seconds(args.timeout)),
        timeout=args.timeout.total_seconds() + RPC_TIMEOUT,
    )
    return _report_outcome(response.report, f"cutover audit of {args.pack}", _dict(response))


def cutover_run(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Audit and, when everything passes, write the protocol row exactly once."""
    response = clients.controlplane.Cutover(
        cp_pb.CutoverRequest(pack_install_id=args.pack, timeout_seconds=whole_seconds(args.timeout)),
        timeout=args.timeout.total_seconds() + RPC_TIMEOUT,
    )
    title = "cutover (checkpoint already written)" if response.already_written else "cutover"
    return _report_outcome(response.report, f"{title} of {args.pack}", _dict(response))


def work_show(clients: Clients, args: argparse.Namespace) -> Outcome:
    """One generation: range, member count, status, attempts (those used, and how it ended)."""
    response = clients.connectors.GetWork(cn_pb.GetWorkRequest(work_id=args.work_id), timeout=RPC_TIMEOUT)
    work = response.work
    view = {
        "work_id": work.work_id,
        "pack_install_id": work.pack_install_id,
        "route": f"{work.route.event_kind} v{work.route.route_version} {work.route.companion_version} "
        f"{work.route.work_type} lane {work.route.source_lane}",
        "range": _range(work),
        "members": response.member_count,
        "status": _status(work),
        "attempts": _attempts(work),
        "replay of": work.replay_of_work_id or "-",
        "last error": work.last_error or "-",
    }
    if work.blocked_behind_work_id:
        view["blocked behind"] = f"{work.blocked_behind_work_id}: {work.blocked_reason}"
    if work.HasField("skip"):
        view["skipped"] = _skipped(work.skip)
    view |= _attempt_history(response)
    return Outcome(data=_dict(response), view=_fields(f"work {work.work_id}", view))


def _attempt_history(response: cn_pb.GetWorkResponse) -> dict[str, str]:
    """Each attempt that did not complete the generation (outcome, worker, start, end, error), the last traceback."""
    rows: dict[str, str] = {}
    if response.attempt_count > len(response.attempts):
        rows["attempts listed"] = f"the newest {len(response.attempts)} of {response.attempt_count}"
    for attempt in response.attempts:
        started = timestamp_text(attempt.started_at) if attempt.HasField("started_at") else "-"
        ended = timestamp_text(attempt.finished_at)
        outcome = enum_word(cn_pb.AttemptOutcome.DESCRIPTOR, attempt.outcome)
        rows[f"attempt {attempt.attempt}"] = (
            f"{outcome}, worker {attempt.worker_id}, {started} to {ended}: {attempt.error}"
        )
    traceback = next((a.traceback for a in reversed(response.attempts) if a.traceback), "")
    if traceback:
        rows["last traceback"] = traceback
    return rows


def work_retry_now(clients: Clients, args: argparse.Namespace) -> Outcome:
    """End the backoff of a generation waiting in retry: claimable at once.

    Refused (exit 8) for a generation in any other status; who and why go to Connectors' log.
    """
    response = clients.connectors.RetryNow(
        cn_pb.RetryNowRequest(work_id=args.work_id, retried_by=args.by, reason=args.reason), timeout=RPC_TIMEOUT
    )
    work = response.work
    return Outcome(data=_dict(response), view=f"work {work.work_id} is claimable now ({_attempts(work)})")


def _range(work: cn_pb.WorkItem) -> str:
    """The range as the conventions name it: first ordinal to last ordinal (old protocol: no first)."""
    if not work.input_start_ordinal:
        return f"old protocol, last ordinal {work.lane_ordinal}"
    return f"{work.input_start_ordinal} to {work.lane_ordinal}"


def _status(work: cn_pb.WorkItem) -> str:
    return enum_word(cn_pb.WorkStatus.DESCRIPTOR, work.status)


def _listed_status(work: cn_pb.WorkItem) -> str:
    """The status a listing shows: a generation the order policy holds is "blocked behind" its dead letter.

    A failed one an operator skipped says so, with when, by whom and why.
    """
    if work.blocked_behind_work_id:
        return f"{_status(work)}, blocked behind {work.blocked_behind_work_id} (order policy block)"
    if work.HasField("skip"):
        return f"{_status(work)}, skipped {_skipped(work.skip)}"
    return _status(work)


def _skipped(skip: cn_pb.Skip) -> str:
    """A recorded skip as operators read it: when, by whom and why."""
    return f"at {timestamp_text(skip.skipped_at)} by {skip.skipped_by}: {skip.reason}"


def _attempts(work: cn_pb.WorkItem) -> str:
    """The attempts a generation used and has left: ``attempt`` counts the attempts that failed."""
    status = WorkStatus(_status(work))
    if status is WorkStatus.COMPLETED:
        return f"completed on attempt {work.attempt + 1} of {work.max_attempts}"
    if status is WorkStatus.FAILED:
        return f"failed for good after {plural(work.attempt, 'attempt')} of {work.max_attempts}"
    if status is WorkStatus.PROCESSING:
        return f"attempt {work.attempt + 1} of {work.max_attempts} running"
    if work.attempt:
        return f"{work.attempt} failed; attempt {work.attempt + 1} of {work.max_attempts} next"
    return f"not attempted yet (up to {work.max_attempts})"


def _next_page(token: str) -> str:
    return f"; next page: --page-token {token}" if token else ""


def _count(rows: Sequence[object], token: str, noun: str = "") -> str:
    """A listing title's count (``": 3"``, ``": 1 incarnation"``) and next page; nothing when empty (it says none)."""
    if not rows:
        return ""
    return f": {plural(len(rows), noun) if noun else len(rows)}{_next_page(token)}"


def _identity(args: argparse.Namespace) -> Route | None:
    """The identity the five identity flags name (``_named_identity`` filled in a partial one); None without them."""
    wanted = identities.given(args)
    return Route(**wanted) if wanted else None


def work_list(clients: Clients, args: argparse.Namespace) -> Outcome:
    """A pack's generations (one identity's with identity flags naming it), newest first; ``--status`` filters.

    Without an identity, identity after identity, newest first in each. Range, status,
    attempts and replay origin of each; paged (a page filtered by status may be short).
    """
    route = _identity(args)
    request = cn_pb.ListGenerationsRequest(
        pack_install_id=args.pack,
        page_size=args.page_size,
        page_token=args.page_token,
        status=convert.STATUSES[WorkStatus(args.status)] if args.status else cn_pb.WORK_STATUS_UNSPECIFIED,
    )
    if route is not None:
        request.route.CopyFrom(convert.route_to_proto(route))
    response = clients.connectors.ListGenerations(request, timeout=RPC_TIMEOUT)
    rows = [
        (w.work_id, w.route.source_lane, _range(w), _listed_status(w), _attempts(w), w.replay_of_work_id or "-")
        for w in response.generations
    ]
    whose = f"lane {args.lane} of {args.pack}" if route is not None else args.pack
    status = f"{args.status} " if args.status else ""
    title = f"{status}generations of {whose}{_count(rows, response.next_page_token)}"
    columns = ("work", "lane", "range", "status", "attempts", "replay of")
    return Outcome(data=_dict(response), view=listing(title, columns, rows))


def work_members(clients: Clients, args: argparse.Namespace) -> Outcome:
    """A generation's members in ordinal order, read without a lease, each payload decoded (JSON, text or escaped).

    ``--json`` gives each payload base64-encoded and decoded (``nexuscrm_tools.payload_view``).
    """
    response = clients.connectors.ListMembers(
        cn_pb.ListMembersRequest(work_id=args.work_id, page_size=args.page_size, page_token=args.page_token),
        timeout=RPC_TIMEOUT,
    )
    data = _dict(response)
    for listed, member in zip(data["inputs"], response.inputs, strict=True):
        listed["payload_format"], listed["payload_decoded"] = payload_view.decoded(member.payload)
    rows = [
        (
            i.enqueue_ordinal,
            i.receipt_key or "-",
            "replay" if i.replay else "",
            timestamp_text(i.source_time) if i.HasField("source_time") else "-",
            len(i.payload),
            Text(payload_view.preview(i.payload)),  # a payload's brackets are not markup
        )
        for i in response.inputs
    ]
    title = f"members of {args.work_id}: {len(rows)} of {response.member_count}{_next_page(response.next_page_token)}"
    columns = ("ordinal", "receipt", "replay", "source time", "payload bytes", "payload")
    return Outcome(data=data, view=listing(title, columns, rows))


def _receipts(clients: Clients, state: str, pack: str, args: argparse.Namespace) -> Outcome:
    response = clients.connectors.ListReceipts(
        cn_pb.ListReceiptsRequest(state=state, pack_install_id=pack, page_size=args.limit, page_token=args.page_token),
        timeout=RPC_TIMEOUT,
    )
    rows = [
        (r.pack_install_id, r.receipt_key, r.route.source_lane, timestamp_text(r.received_at))
        for r in response.receipts
    ]
    title = f"{state.replace('_', ' ')} receipts{_count(rows, response.next_page_token)}"
    return Outcome(data=_dict(response), view=listing(title, ("pack", "receipt", "lane", "received at"), rows))


def receipts_list(clients: Clients, args: argparse.Namespace) -> Outcome:
    """A pack's receipts in one state (``--state``), oldest first; paged (``--limit``, ``--page-token``)."""
    return _receipts(clients, args.state, args.pack, args)


def receipts_missing(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Receipts whose coverage is missing (of ``--pack``, or of every pack), oldest first; exit 9 if any.

    ``receipts list PACK --state coverage_missing`` for one pack, with the check's exit code.
    """
    outcome = _receipts(clients, ReceiptState.COVERAGE_MISSING, args.pack or "", args)
    missing = bool(outcome.data["receipts"])
    return dataclasses.replace(outcome, code=ExitCode.CHECK_FAILED if missing else ExitCode.OK)


def why(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Which generation covers a receipt's input, or why none does."""
    response = clients.connectors.ExplainReceipt(
        cn_pb.ExplainReceiptRequest(pack_install_id=args.pack, receipt_key=args.receipt_key), timeout=RPC_TIMEOUT
    )
    view = {
        "receipt": args.receipt_key,
        "state": response.receipt_state,
        "ordinal": response.enqueue_ordinal or "-",
        "covered by": response.covered_by.work_id if response.HasField("covered_by") else "-",
        "why": response.explanation,
    }
    code = ExitCode.CHECK_FAILED if response.receipt_state == ReceiptState.COVERAGE_MISSING else ExitCode.OK
    return Outcome(data=_dict(response), view=_fields(f"receipt {args.receipt_key}", view), code=code)


def _policy_outcome(policy: cn_pb.RetentionPolicy, title: str) -> Outcome:
    view = {
        "keep generations": policy.keep_generations if policy.HasField("keep_generations") else "-",
        "keep age": f"{policy.keep_seconds}s" if policy.HasField("keep_seconds") else "-",
        "horizon ordinal": policy.horizon_ordinal,
        "duplicate window": f"{policy.duplicate_window_seconds}s"
        if policy.HasField("duplicate_window_seconds")
        else "-",
        "horizon source time": (
            timestamp_text(policy.horizon_source_time) if policy.HasField("horizon_source_time") else "-"
        ),
        "generations pruned": policy.pruned_generations,
        "last pruned at": timestamp_text(policy.last_pruned_at) if policy.HasField("last_pruned_at") else "-",
    }
    return Outcome(data=_dict(policy), view=_fields(title, view))


def retention_set(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Set a pack's retention policy; with neither limit, retention is off (the horizon stays)."""
    request = cn_pb.SetRetentionPolicyRequest(pack_install_id=args.pack)
    if args.keep_generations is not None:
        request.keep_generations = args.keep_generations
    if args.keep_age is not None:
        request.keep_seconds = whole_seconds(args.keep_age)
    if args.duplicate_window is not None:
        request.duplicate_window_seconds = whole_seconds(args.duplicate_window)
    response = clients.connectors.SetRetentionPolicy(request, timeout=RPC_TIMEOUT)
    return _policy_outcome(response.policy, f"retention of {args.pack}")


def retention_show(clients: Clients, args: argparse.Namespace) -> Outcome:
    """A pack's retention policy and horizon."""
    response = clients.connectors.GetRetentionPolicy(
        cn_pb.GetRetentionPolicyRequest(pack_install_id=args.pack), timeout=RPC_TIMEOUT
    )
    return _policy_outcome(response.policy, f"retention of {args.pack}")


def retention_prune(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Prune what the pack's policy lets go now (one bounded pass); ``--dry-run`` only counts it."""
    response = clients.connectors.Prune(
        cn_pb.PruneRequest(pack_install_id=args.pack, dry_run=args.dry_run, max_generations=args.max_generations),
        timeout=RPC_TIMEOUT,
    )
    verb = "would prune" if response.dry_run else "pruned"
    view = {
        f"generations {verb}": response.generations,
        f"events {verb}": response.events,
        f"receipts {verb}": response.receipts,
        "old generations kept": response.kept,
        "horizon ordinal": response.horizon_ordinal,
        f"tombstones {'would expire' if response.dry_run else 'expired'}": response.expired_receipts,
        "generation records expired": response.expired_generations,
    }
    return Outcome(data=_dict(response), view=_fields(f"retention pass over {args.pack}", view))


def schema_contract_payloads(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Set the payload contract once no v7 Connectors runs, then move payloads out of Event.Payload (decision 150).

    Idempotent and resumable (``nexuscrm_tools.payload_contract``); refused below schema v10.
    ``--dry-run`` counts what it would move and changes nothing (the contract included).
    """
    counted = payload_contract.count_moves(clients.schema_catalog)
    if args.dry_run:
        view = {
            "payload contract": f"set at {counted.set_at} by {counted.set_by}" if counted.set_at else "not set",
            "Event payloads to empty": counted.emptied,
            "of them to move into EventPayload": counted.moved,
            "bytes": counted.emptied_bytes,
        }
        data = {
            "dry_run": True,
            "set_at": counted.set_at,
            "set_by": counted.set_by,
            "emptied": counted.emptied,
            "emptied_bytes": counted.emptied_bytes,
            "moved": counted.moved,
        }
        return Outcome(data=data, view=_fields("payload move (dry run: nothing changed)", view))
    with payload_contract.shown_progress(counted.emptied) as progress:
        first, totals = payload_contract.contract_payloads(
            clients.schema_catalog,
            after_pack=args.after_pack,
            after_ordinal=args.after_ordinal,
            batches_per_call=args.batches_per_call,
            progress=progress,
        )
    view = {
        "payload contract": "set now" if first.newly_set else "already set",
        "set at": first.set_at,
        "set by": first.set_by,
        "Event payloads emptied": totals.emptied,
        "of them moved into EventPayload": totals.moved,
        "bytes": totals.emptied_bytes,
    }
    data = {
        "dry_run": False,
        "newly_set": first.newly_set,
        "set_at": first.set_at,
        "set_by": first.set_by,
        "emptied": totals.emptied,
        "emptied_bytes": totals.emptied_bytes,
        "moved": totals.moved,
    }
    return Outcome(data=data, view=_fields("payload move", view))


def activation(clients: Clients, args: argparse.Namespace) -> Outcome:
    """The host's activation gate; exit 9 when not active."""
    response = clients.integration.GetActivation(in_pb.GetActivationRequest(), timeout=RPC_TIMEOUT)
    view = listing(
        "activation: " + ("active" if response.active else "NOT active") + "; missing",
        ("missing",),
        [(m,) for m in response.missing],
    )
    return Outcome(data=_dict(response), view=view, code=ExitCode.OK if response.active else ExitCode.CHECK_FAILED)


def workers(clients: Clients, args: argparse.Namespace) -> Outcome:
    """The host's workers and what they are doing."""
    response = clients.integration.ListWorkers(in_pb.ListWorkersRequest(), timeout=RPC_TIMEOUT)
    rows = [
        (
            w.worker_id,
            w.pack_install_id,
            w.work_type,
            w.flow,
            w.state,
            w.current_work_id,
            w.executions,
            f"{w.clock_skew_seconds:+.3f}" if w.HasField("clock_skew_seconds") else "",
        )
        for w in response.workers
    ]
    columns = ("worker", "pack", "work type", "flow", "state", "work", "executions", "clock skew s")
    return Outcome(data=[_dict(w) for w in response.workers], view=listing("workers", columns, rows))


def version(clients: Clients, args: argparse.Namespace) -> Outcome:
    """What each deployed service is (GetBuildInfo), side by side.

    The deployed services are those whose NEXUSCRM_<SERVICE>_TARGET is set (with none set,
    all four at their default local addresses). Exit 9 when the combination is outside the
    declared ranges (a service that does not serve the database's schema version, different
    contract major versions), else 3 when a service did not answer (the line names the
    variable that sets its target), else 0.
    """
    answers = clients.build_infos(deployed())
    view = _table(f"versions: {versions.summary(answers)}", versions.COLUMNS, versions.rows(answers))
    return Outcome(data=versions.to_json(answers), view=view, code=versions.exit_code(answers))


def health(clients: Clients, args: argparse.Namespace) -> Outcome:
    """The gRPC health of each deployed service (or of ``--service``), for its full name.

    The deployed services are those whose NEXUSCRM_<SERVICE>_TARGET is set (with none set,
    all four at their default local addresses). Exit 0 when every one answers SERVING, else 3
    (the line names the variable that sets its target).
    """
    services = [s for s in SERVICES if s.name == args.service] if args.service else deployed()
    answers = clients.health(services)
    view = _table(f"health: {service_health.summary(answers)}", service_health.COLUMNS, service_health.rows(answers))
    return Outcome(data=service_health.to_json(answers), view=view, code=service_health.exit_code(answers))


# Operating projections (issue 37): claim pauses and the dead-letter queue.

PAUSE_SCOPES = {
    "pack": cn_pb.PAUSE_SCOPE_PACK,
    "identity": cn_pb.PAUSE_SCOPE_IDENTITY,
    "work_type": cn_pb.PAUSE_SCOPE_WORK_TYPE,
}


def _claim_scope(args: argparse.Namespace) -> cn_pb.ClaimScope:
    """The scope ``--scope`` names, with the identity flags (identity) or ``--work-type`` (work_type)."""
    scope = cn_pb.ClaimScope(pack_install_id=args.pack, scope=PAUSE_SCOPES[args.scope])
    if args.scope == "identity":
        route = _identity(args)
        if route is None:
            raise UsageError(f"--scope identity needs identity flags ({', '.join(IDENTITY_FLAGS)}) naming one identity")
        scope.route.CopyFrom(convert.route_to_proto(route))
    elif args.scope == "work_type":
        scope.work_type = args.work_type or ""
    return scope


def _pause_row(pause: cn_pb.ClaimPause) -> tuple[object, ...]:
    scope = pause.scope
    what = enum_word(cn_pb.PauseScope.DESCRIPTOR, scope.scope)
    if scope.HasField("route"):
        what += f" lane {scope.route.source_lane} ({scope.route.event_kind}, {scope.route.work_type})"
    elif scope.work_type:
        what += f" {scope.work_type}"
    until = timestamp_text(pause.expires_at) if pause.HasField("expires_at") else "until resumed"
    return (pause.pause_id, what, pause.paused_by, pause.reason, timestamp_text(pause.paused_at), until)


PAUSE_COLUMNS = ("pause", "scope", "by", "reason", "since", "until")


def claims_pause(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Stop claims of a pack, one identity or one work type; admission goes on, leases granted finish.

    ``--for`` or ``--until`` end it by itself (on the database's clock); otherwise it holds until
    ``claims resume``. Refused: an unknown pack, identity or work type, an expiry in the past
    (exit 2), a scope already paused (exit 8).
    """
    request = cn_pb.PauseClaimsRequest(scope=_claim_scope(args), paused_by=args.by, reason=args.reason)
    if args.duration is not None and args.until is not None:
        raise UsageError("give --for or --until, not both")
    if args.duration is not None:
        request.expires_at.FromDatetime(dt.datetime.now(dt.UTC) + args.duration)
    elif args.until is not None:
        request.expires_at.FromDatetime(args.until)
    response = clients.connectors.PauseClaims(request, timeout=RPC_TIMEOUT)
    return Outcome(
        data=_dict(response.pause), view=listing("claims paused", PAUSE_COLUMNS, [_pause_row(response.pause)])
    )


def claims_resume(clients: Clients, args: argparse.Namespace) -> Outcome:
    """End the active pause of a scope; its work is claimable again at once."""
    response = clients.connectors.ResumeClaims(
        cn_pb.ResumeClaimsRequest(scope=_claim_scope(args), resumed_by=args.by), timeout=RPC_TIMEOUT
    )
    pause = response.pause
    view = f"claims resumed: pause {pause.pause_id} ended at {timestamp_text(pause.resumed_at)} by {pause.resumed_by}"
    return Outcome(data=_dict(pause), view=view)


def claims_list(clients: Clients, args: argparse.Namespace) -> Outcome:
    """A pack's active claim pauses."""
    response = clients.connectors.ListClaimPauses(
        cn_pb.ListClaimPausesRequest(pack_install_id=args.pack), timeout=RPC_TIMEOUT
    )
    rows = [_pause_row(p) for p in response.pauses]
    return Outcome(data=_dict(response), view=listing(f"claim pauses of {args.pack}", PAUSE_COLUMNS, rows))


def _identities(args: argparse.Namespace, wanted: cn_pb.DeadLetterFilter | cn_pb.GetCoverageRequest) -> None:
    """Narrow ``wanted`` to the identity the flags name (all five) or to a work type (``--work-type`` alone)."""
    only_work_type = args.work_type is not None and all(
        getattr(args, flag.removeprefix("--").replace("-", "_")) is None
        for flag in IDENTITY_FLAGS
        if flag != "--work-type"
    )
    if only_work_type:
        wanted.work_type = args.work_type
    elif (route := _identity(args)) is not None:
        wanted.route.CopyFrom(convert.route_to_proto(route))


def _dead_letter_filter(args: argparse.Namespace) -> cn_pb.DeadLetterFilter:
    """The filter the flags name: an identity (all five identity flags) or a work type alone, times, error text."""
    wanted = cn_pb.DeadLetterFilter(pack_install_id=args.pack, error_contains=args.error or "")
    _identities(args, wanted)
    if args.after is not None:
        wanted.finished_after.FromDatetime(args.after)
    if args.before is not None:
        wanted.finished_before.FromDatetime(args.before)
    return wanted


def _dead_letter_row(work: cn_pb.WorkItem) -> tuple[object, ...]:
    return (
        work.work_id,
        work.route.source_lane,
        _range(work),
        _attempts(work),
        timestamp_text(work.finished_at),
        work.last_error,
    )


def dead_letters_list(clients: Clients, args: argparse.Namespace) -> Outcome:
    """A pack's generations that failed for good and were never replayed, oldest finished first.

    Range, attempts and last error of each; paged (a filtered page may be short: it examines at
    most ten failed generations per row asked for).
    """
    response = clients.connectors.ListDeadLetters(
        cn_pb.ListDeadLettersRequest(
            filter=_dead_letter_filter(args), page_size=args.page_size, page_token=args.page_token
        ),
        timeout=RPC_TIMEOUT,
    )
    rows = [_dead_letter_row(w) for w in response.dead_letters]
    title = f"dead letters of {args.pack}{_count(rows, response.next_page_token)}"
    columns = ("work", "lane", "range", "attempts", "failed at", "last error")
    return Outcome(data=_dict(response), view=listing(title, columns, rows))


def dead_letters_count(clients: Clients, args: argparse.Namespace) -> Outcome:
    """A pack's dead letters per identity (among its 100 000 oldest failed generations)."""
    response = clients.connectors.CountDeadLetters(
        cn_pb.CountDeadLettersRequest(filter=_dead_letter_filter(args)), timeout=RPC_TIMEOUT
    )
    rows = [(i.route.source_lane, i.route.event_kind, i.route.work_type, i.dead_letters) for i in response.identities]
    complete = "" if response.complete else f" (stopped after {response.examined} failed generations)"
    title = f"{plural(response.total, 'dead letter')} of {args.pack}{complete}"
    return Outcome(data=_dict(response), view=listing(title, ("lane", "event kind", "work type", "dead letters"), rows))


BulkResponse = cn_pb.ReplayDeadLettersResponse | cn_pb.SkipDeadLettersResponse


def dead_letters_replay(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Replay every dead letter the filters keep, page by page, one transaction per WorkId; ``--dry-run`` lists them.

    One identity's are replayed in ordinal order. Each WorkId is answered: replayed (its new
    generation), would replay (dry run) or refused and why. Exit 9 when any was refused; a
    filter that keeps no dead letter exits 2, nothing changed.
    """

    def call(token: str) -> BulkResponse:
        request = cn_pb.ReplayDeadLettersRequest(
            filter=_dead_letter_filter(args), dry_run=args.dry_run, max_generations=args.batch, page_token=token
        )
        response: cn_pb.ReplayDeadLettersResponse = clients.connectors.ReplayDeadLetters(request, timeout=RPC_TIMEOUT)
        return response

    return _bulk_dead_letters(args, call, verb="replay", done="replayed", detail="replay or reason")


def _bulk_dead_letters(
    args: argparse.Namespace, call: Callable[[str], BulkResponse], *, verb: str, done: str, detail: str
) -> Outcome:
    """Call a bulk replay or skip page by page to its last page (a progress line each), then one table of every answer.

    ``call`` takes the page token. Exit 9 when any dead letter was refused.
    """
    answers: list[cn_pb.DeadLetterReplay] = []
    token = ""
    while True:
        response = call(token)
        answers += response.answers
        print(f"nexuscrm: {f'would {verb}' if args.dry_run else done} {len(answers)} so far", file=sys.stderr)
        token = response.next_page_token
        if not token:
            break
    refused = [a for a in answers if a.verdict == cn_pb.DEAD_LETTER_VERDICT_REFUSED]
    rows = [
        (
            a.work_id,
            a.route.source_lane,
            a.lane_ordinal,
            enum_word(cn_pb.DeadLetterVerdict.DESCRIPTOR, a.verdict),
            a.replay_work_id or a.message or "-",
        )
        for a in answers
    ]
    dry = " (dry run: nothing changed)" if args.dry_run else ""
    title = f"{plural(len(answers), 'dead letter')} of {args.pack}, {len(refused)} refused{dry}"
    data = {"dry_run": args.dry_run, "answers": [_dict(a) for a in answers], "refused": len(refused)}
    view = listing(title, ("work", "lane", "last ordinal", "verdict", detail), rows)
    return Outcome(data=data, view=view, code=ExitCode.CHECK_FAILED if refused else ExitCode.OK)


ORDER_POLICIES = {"block": cn_pb.ORDER_POLICY_KIND_BLOCK, "continue": cn_pb.ORDER_POLICY_KIND_CONTINUE}


POLICY_SOURCES = {"work_type": "its work type's own", "pack": "the pack's", "default": "the default"}


def _policy_view(policy: cn_pb.OrderPolicy, title: str) -> Outcome:
    word = enum_word(cn_pb.OrderPolicyKind.DESCRIPTOR, policy.policy)
    view = {
        "policy": word,
        "set": f"{timestamp_text(policy.set_at)} by {policy.set_by}: {policy.reason}"
        if policy.HasField("set_at")
        else "never: the default",
    }
    if policy.work_type:
        view["from"] = POLICY_SOURCES.get(policy.source, policy.source)
    return Outcome(data=_dict(policy), view=_fields(title, view))


def _policy_scope(args: argparse.Namespace) -> str:
    return f"work type {args.work_type} of {args.pack}" if args.work_type else args.pack


def order_policy_set(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Set what a generation that failed for good means for its identity's successors in a pack or one work type.

    block: Claim holds them back until it is replayed or skipped; continue (the default): they
    run, and the failed range stays listed by ``dead-letters list`` for replay. A work type's
    policy overrides its pack's for that type's generations; an unknown work type is refused (exit 3).
    """
    response = clients.connectors.SetOrderPolicy(
        cn_pb.SetOrderPolicyRequest(
            pack_install_id=args.pack,
            policy=ORDER_POLICIES[args.policy],
            set_by=args.by,
            reason=args.reason,
            work_type=args.work_type or "",
        ),
        timeout=RPC_TIMEOUT,
    )
    return _policy_view(response.policy, f"order policy of {_policy_scope(args)} set")


def order_policy_show(clients: Clients, args: argparse.Namespace) -> Outcome:
    """A pack's order policy, or one work type's effective one, who set it, when and why."""
    response = clients.connectors.GetOrderPolicy(
        cn_pb.GetOrderPolicyRequest(pack_install_id=args.pack, work_type=args.work_type or ""), timeout=RPC_TIMEOUT
    )
    outcome = _policy_view(response.policy, f"order policy of {_policy_scope(args)}")
    if not args.work_type:
        outcome.data["work_type_policies"] = [_dict(policy) for policy in response.work_type_policies]
        if isinstance(outcome.view, Table):
            for own in response.work_type_policies:
                word = enum_word(cn_pb.OrderPolicyKind.DESCRIPTOR, own.policy)
                set_ = f"{timestamp_text(own.set_at)} by {own.set_by}: {own.reason}"
                outcome.view.add_row(f"work type {own.work_type}", f"{word}, set {set_}")
    return outcome


def _retry_policy_row(policy: cn_pb.RetryPolicy) -> str:
    """A retry policy in a line: attempts, backoff, and who set it when and why."""
    backoff = f"backoff {policy.backoff_base_seconds}s doubling up to {policy.backoff_max_seconds}s"
    set_ = (
        f"set {timestamp_text(policy.set_at)} by {policy.set_by}: {policy.reason}"
        if policy.HasField("set_at")
        else "Connectors' default"
    )
    return f"{plural(policy.max_attempts, 'attempt')}, {backoff}; {set_}"


def retry_policy_set(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Set how many attempts a work type's generations get before they fail for good, and the backoff between them.

    A backoff bound left out is Connectors' setting; out of range or an unknown work type is
    refused (exit 2), nothing changed.
    """
    request = cn_pb.SetRetryPolicyRequest(
        pack_install_id=args.pack,
        work_type=args.work_type,
        max_attempts=args.max_attempts,
        set_by=args.by,
        reason=args.reason,
    )
    if args.backoff_base is not None:
        request.backoff_base_seconds = args.backoff_base
    if args.backoff_max is not None:
        request.backoff_max_seconds = args.backoff_max
    response = clients.connectors.SetRetryPolicy(request, timeout=RPC_TIMEOUT)
    title = f"retry policy of work type {args.work_type} of {args.pack} set"
    return Outcome(data=_dict(response.policy), view=f"{title}: {_retry_policy_row(response.policy)}")


def retry_policy_show(clients: Clients, args: argparse.Namespace) -> Outcome:
    """A work type's effective retry policy; without ``--work-type``, Connectors' default and each work type's own."""
    response = clients.connectors.GetRetryPolicy(
        cn_pb.GetRetryPolicyRequest(pack_install_id=args.pack, work_type=args.work_type or ""), timeout=RPC_TIMEOUT
    )
    data = _dict(response.policy)
    if args.work_type:
        rows = [(f"work type {args.work_type}", _retry_policy_row(response.policy))]
    else:
        data["work_type_policies"] = [_dict(policy) for policy in response.work_type_policies]
        rows = [("default", _retry_policy_row(response.policy))]
        rows += [(f"work type {own.work_type}", _retry_policy_row(own)) for own in response.work_type_policies]
    return Outcome(data=data, view=_table(f"retry policy of {args.pack}", ("scope", "policy"), rows))


def dead_letters_skip(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Skip a dead letter (WORK_ID), or with ``--pack`` every one the filters keep, as ``replay`` takes them.

    Each skip is recorded (who, when, why): the generation stays failed, leaves the queue and no
    longer holds its identity. One WorkId: refused (exit 8) when it is not failed, was replayed
    or skipped. ``--pack``: page by page, one transaction per WorkId, each answered skipped,
    would skip (``--dry-run``: nothing changes) or refused and why (exit 9 when any was); a
    filter that keeps no dead letter exits 2, nothing changed. The filters, ``--dry-run`` and
    ``--batch`` need ``--pack``.
    """
    if args.pack is None:
        flags = [
            flag
            for flag in (*IDENTITY_FLAGS, "--after", "--before", "--error", "--dry-run", "--batch")
            if _given(args, flag)
        ]
        if flags:
            raise UsageError(f"{', '.join(flags)}: only with --pack PACK, not with a WORK_ID")
        response = clients.connectors.SkipDeadLetter(
            cn_pb.SkipDeadLetterRequest(work_id=args.work_id, skipped_by=args.by, reason=args.reason),
            timeout=RPC_TIMEOUT,
        )
        view = f"skipped {response.work_id} at {timestamp_text(response.skipped_at)} by {response.skipped_by}"
        return Outcome(data=_dict(response), view=view)

    def call(token: str) -> BulkResponse:
        request = cn_pb.SkipDeadLettersRequest(
            filter=_dead_letter_filter(args),
            skipped_by=args.by,
            reason=args.reason,
            dry_run=args.dry_run,
            max_generations=args.batch,
            page_token=token,
        )
        response: cn_pb.SkipDeadLettersResponse = clients.connectors.SkipDeadLetters(request, timeout=RPC_TIMEOUT)
        return response

    return _bulk_dead_letters(args, call, verb="skip", done="skipped", detail="reason refused")


def _given(args: argparse.Namespace, flag: str) -> bool:
    """Whether ``flag`` was given (a flag left out keeps its default: None, False or 0)."""
    return bool(getattr(args, flag.removeprefix("--").replace("-", "_")))


def _runs(identity: cn_pb.IdentityCoverage) -> str:
    """An identity's ranges as runs of one state: ``completed 1 to 40; failed 41 to 41``."""
    runs: list[tuple[str, int, int]] = []
    for r in identity.ranges:
        state = enum_word(cn_pb.CoverageRangeState.DESCRIPTOR, r.state)
        if runs and runs[-1][0] == state:
            runs[-1] = (state, runs[-1][1], r.end_ordinal)
        else:
            runs.append((state, r.start_ordinal, r.end_ordinal))
    return "; ".join(f"{state} {start} to {end}" for state, start, end in runs) or "-"


def _exceptions(identity: cn_pb.IdentityCoverage) -> str:
    listed = [
        f"{enum_word(cn_pb.CoverageExceptionKind.DESCRIPTOR, e.kind)} {e.start_ordinal} to {e.end_ordinal}"
        + (f" ({', '.join(e.work_ids)})" if e.work_ids else "")
        for e in identity.exceptions
    ]
    more = identity.exception_count - len(listed)
    return "; ".join(listed + ([f"{more} more"] if more > 0 else [])) or "-"


def coverage(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Prove, per identity of a pack, that its generations tile every input it was admitted.

    Each identity's high-water ordinal, whether it is tiled (no gap, no overlap), its ranges
    by state (completed, in flight, queued, failed, replayed, skipped, pruned) and its first
    exceptions; paged by identity. Exit 9 when an identity on the page is not tiled.
    """
    request = cn_pb.GetCoverageRequest(pack_install_id=args.pack, page_size=args.page_size, page_token=args.page_token)
    _identities(args, request)
    response = clients.connectors.GetCoverage(request, timeout=RPC_TIMEOUT)
    rows = [
        (
            i.route.source_lane,
            i.route.work_type,
            i.high_water_ordinal,
            "yes" if i.tiled else "NO",
            _runs(i),
            _exceptions(i),
        )
        for i in response.identities
    ]
    broken = sum(not i.tiled for i in response.identities)
    untiled = f" ({broken} not tiled)" if broken else ""
    title = f"coverage of {args.pack}{untiled}{_count(rows, response.next_page_token)}"
    columns = ("lane", "work type", "high water", "tiled", "ranges", "exceptions")
    code = ExitCode.CHECK_FAILED if broken else ExitCode.OK
    return Outcome(data=_dict(response), view=listing(title, columns, rows), code=code)


def _newest(identity: cn_pb.IdentityOverview) -> str:
    if not identity.HasField("newest"):
        return "- (all pruned)"
    return f"{identity.newest.work_id}: {_range(identity.newest)}, {_listed_status(identity.newest)}"


def _coverage_state(identity: cn_pb.IdentityOverview) -> str:
    if not identity.HasField("coverage"):
        return "old protocol: no proof"
    state = identity.coverage
    if state.tiled:
        return f"tiled up to {state.high_water_ordinal}"
    return f"NOT tiled: {plural(state.exception_count, 'exception')} (nexuscrm coverage)"


def pack_identities(clients: Clients, args: argparse.Namespace) -> Outcome:
    """A pack's identities by projection key: the identity flags' values, depth, newest generation and coverage.

    Depth counts its generations not terminal yet; coverage says whether its generations tile
    its inputs (``coverage`` shows the ranges). Paged by identity.
    """
    response = clients.connectors.ListIdentities(
        cn_pb.ListIdentitiesRequest(pack_install_id=args.pack, page_size=args.page_size, page_token=args.page_token),
        timeout=RPC_TIMEOUT,
    )
    rows = [
        (
            i.route.event_kind,
            i.route.route_version,
            i.route.companion_version,
            i.route.work_type,
            i.route.source_lane,
            i.depth,
            _newest(i),
            _coverage_state(i),
        )
        for i in response.identities
    ]
    title = f"identities of {args.pack}{_count(rows, response.next_page_token)}"
    columns = ("event kind", "route version", "companion version", "work type", "lane", "depth", "newest", "coverage")
    return Outcome(data=_dict(response), view=listing(title, columns, rows))


def send(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Send test deliveries of one identity through the SDK's pipelined ingest, each answered on its own.

    PAYLOAD is the text itself, @PATH the bytes of a file, - those of standard input. The
    identity flags name one identity of the pack, as everywhere (a new identity takes all
    five). Exit 8 when a delivery was rejected, 9 when a duplicate's coverage is missing.
    """
    route = _identity(args)
    if route is None:  # --lane is required: the identity flags always name one
        raise UsageError(f"send needs {', '.join(IDENTITY_FLAGS)}")
    try:
        payloads = sending.read_payloads(args.payloads, sys.stdin.buffer)
        items = sending.deliveries(route, payloads, args.key or [], args.source_time)
    except sending.PayloadUnreadable as error:
        raise UsageError(str(error)) from None
    results = sending.send(clients.connectors_client, args.pack, items)
    rows = [(r.receipt_key, r.outcome, r.enqueue_ordinal or "-", r.work_id or "-", r.message) for r in results]
    outcomes = {r.outcome for r in results}
    code = ExitCode.OK
    if IngestOutcome.REJECTED in outcomes:
        code = ExitCode.REFUSED
    elif IngestOutcome.COVERAGE_MISSING in outcomes:
        code = ExitCode.CHECK_FAILED
    data = {
        "pack_install_id": args.pack,
        "route": dataclasses.asdict(route),
        "deliveries": [dataclasses.asdict(r) for r in results],
    }
    title = f"{plural(len(rows), 'delivery', 'deliveries')} to {args.pack}, {identities.describe(route)}"
    view = listing(title, ("receipt", "outcome", "ordinal", "work", "message"), rows)
    return Outcome(data=data, view=view, code=code)


def _instant(text: str) -> dt.datetime:
    """An ISO 8601 instant (``2026-12-03T05:00:00Z``); one without a zone is UTC."""
    value = dt.datetime.fromisoformat(text)
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


WORK_TYPE_OR_IDENTITY = "those naming one identity, or --work-type alone: one work type"


def _operating_commands(commands: Any, leaf: Callable[..., argparse.ArgumentParser]) -> None:
    """``claims pause|resume|list``, ``dead-letters list|count|replay|skip`` and ``order-policy set|show``."""
    claims = commands.add_parser("claims", help="claim pauses").add_subparsers(dest="action", required=True)
    for name, handler, text in (
        ("pause", claims_pause, "stop claims of a pack, identity or work type"),
        ("resume", claims_resume, "end a pause"),
    ):
        sub = leaf(claims, name, handler, text)
        sub.add_argument("pack")
        sub.add_argument("--scope", choices=tuple(PAUSE_SCOPES), default="pack", help="default: %(default)s")
        for flag in IDENTITY_FLAGS:
            sub.add_argument(flag, help="--scope identity: those naming one identity; --scope work_type: --work-type")
        sub.add_argument("--by", required=True, help="who, as recorded")
        if name == "pause":
            sub.add_argument("--reason", required=True, help="why, as recorded")
            sub.add_argument("--for", dest="duration", type=parse_duration, metavar="DURATION", help="ends by itself")
            sub.add_argument("--until", type=_instant, metavar="INSTANT", help="ends by itself then (ISO 8601)")
    leaf(claims, "list", claims_list, "a pack's active pauses").add_argument("pack")

    dead = commands.add_parser("dead-letters", help="work that failed for good").add_subparsers(
        dest="action", required=True
    )
    for name, handler, text in (
        ("list", dead_letters_list, "failed generations never replayed, oldest first"),
        ("count", dead_letters_count, "dead letters per identity"),
        ("replay", dead_letters_replay, "replay them page by page (or --dry-run)"),
        ("skip", dead_letters_skip, "skip one, or --pack those the filters keep; recorded (it stays failed)"),
    ):
        sub = leaf(dead, name, handler, text)
        if name == "skip":  # one WorkId, or a pack's dead letters by the filters below (decision 176)
            target = sub.add_mutually_exclusive_group(required=True)
            target.add_argument("work_id", nargs="?", help="the dead letter to skip")
            target.add_argument("--pack", help="skip the dead letters of PACK the filters keep")
            sub.add_argument("--by", required=True, help="who, as recorded")
            sub.add_argument("--reason", required=True, help="why, as recorded")
        else:
            sub.add_argument("pack")
        for flag in IDENTITY_FLAGS:
            sub.add_argument(flag, help=WORK_TYPE_OR_IDENTITY)
        sub.set_defaults(work_type_alone=True)
        sub.add_argument("--after", type=_instant, metavar="INSTANT", help="failed at or after (ISO 8601)")
        sub.add_argument("--before", type=_instant, metavar="INSTANT", help="failed before (ISO 8601)")
        sub.add_argument("--error", metavar="TEXT", help="last error contains TEXT")
        if name == "list":
            _paged(sub)
        if name in ("replay", "skip"):
            sub.add_argument("--dry-run", action="store_true", help="list what it would do, change nothing")
            sub.add_argument("--batch", type=int, default=0, metavar="N", help="per call (default: the service's)")

    order = commands.add_parser("order-policy", help="what a failure means for its identity").add_subparsers(
        dest="action", required=True
    )
    sub = leaf(order, "set", order_policy_set, "block or continue")
    sub.add_argument("pack")
    sub.add_argument("policy", choices=tuple(ORDER_POLICIES))
    sub.add_argument("--by", required=True, help="who, as recorded")
    sub.add_argument("--reason", required=True, help="why, as recorded")
    sub.add_argument("--work-type", help="set the policy of this work type of the pack, not the pack's")
    sub = leaf(order, "show", order_policy_show, "a pack's order policy")
    sub.add_argument("pack")
    sub.add_argument("--work-type", help="this work type's effective policy: its own, else the pack's")

    retry = commands.add_parser("retry-policy", help="attempts and backoff per work type").add_subparsers(
        dest="action", required=True
    )
    sub = leaf(retry, "set", retry_policy_set, "a work type's attempts and backoff")
    sub.add_argument("pack")
    sub.add_argument("--work-type", required=True, help="the work type of the pack it is for")
    sub.add_argument("--max-attempts", type=int, required=True, metavar="N", help="1 to 100")
    for flag, text in (("--backoff-base", "first delay, 0 to 86400"), ("--backoff-max", "longest delay, to 86400")):
        sub.add_argument(flag, type=int, metavar="SECONDS", help=f"{text} (default: the service's)")
    sub.add_argument("--by", required=True, help="who, as recorded")
    sub.add_argument("--reason", required=True, help="why, as recorded")
    sub = leaf(retry, "show", retry_policy_show, "Connectors' default and each work type's own")
    sub.add_argument("pack")
    sub.add_argument("--work-type", help="this work type's effective policy: its own, else Connectors' default")

    sub = leaf(commands, "coverage", coverage, "prove each identity's generations tile its inputs")
    sub.add_argument("pack")
    for flag in IDENTITY_FLAGS:
        sub.add_argument(flag, help=WORK_TYPE_OR_IDENTITY)
    sub.set_defaults(work_type_alone=True)
    _paged(sub)


def _identity_commands(commands: Any, leaf: Callable[..., argparse.ArgumentParser]) -> None:
    """``identities`` and ``send``."""
    sub = leaf(commands, "identities", pack_identities, "a pack's identities: depth, newest generation, coverage")
    sub.add_argument("pack")
    _paged(sub)
    sub = leaf(commands, "send", send, "send test deliveries through the SDK's pipelined ingest")
    sub.add_argument("pack")
    sub.add_argument("payloads", nargs="+", metavar="PAYLOAD", help="the text, @PATH (a file's bytes) or - (stdin)")
    for flag in IDENTITY_FLAGS:
        sub.add_argument(flag, required=flag == "--lane", help="those naming one identity; a new one: all five")
    sub.add_argument("--key", action="append", metavar="KEY", help="receipt key, one per PAYLOAD (default: new ones)")
    sub.add_argument("--source-time", type=_instant, metavar="INSTANT", help="of every delivery (ISO 8601)")


def _paged(parser: argparse.ArgumentParser, *, dest: str = "page_size") -> None:
    parser.add_argument(
        "--limit",
        "--page-size",
        dest=dest,
        type=int,
        default=0,
        metavar="N",
        help="rows per page (default: the service's)",
    )
    parser.add_argument("--page-token", default="", metavar="TOKEN", help="from the previous page's output")


def _help(text: str | None) -> str:
    """A docstring as --help shows it: without the reStructuredText backticks."""
    return (text or "").replace("``", "")


class UsageError(Exception):
    """Flags that parse but do not go together: exit 2 (usage error) with the message."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; each leaf sets ``handler``."""
    parser = argparse.ArgumentParser(
        prog="nexuscrm",
        description=_help(__doc__),
        epilog=help_epilog("nexuscrm"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    commands = parser.add_subparsers(dest="command", required=True)

    def leaf(group: Any, name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        sub: argparse.ArgumentParser = group.add_parser(
            name,
            help=help_text,
            description=_help(handler.__doc__),
            epilog=help_epilog("nexuscrm"),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        sub.set_defaults(handler=handler, command_parser=sub)  # a UsageError prints this one's usage
        # Also after the subcommand; SUPPRESS keeps an absent flag here from undoing one given before it.
        sub.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON instead of tables")
        return sub

    packs = commands.add_parser("packs", help="pack incarnations").add_subparsers(dest="action", required=True)
    sub = leaf(packs, "list", packs_list, "every incarnation with its protocol state")
    sub.add_argument("--namespace", default="", help="only this namespace (default: every namespace)")
    _paged(sub)
    sub = leaf(packs, "install", packs_install, "install a new pack incarnation")
    sub.add_argument("--namespace", required=True)
    sub.add_argument("--name", required=True)
    sub.add_argument("--version", required=True)
    leaf(packs, "activate", packs_activate, "greenfield activation (cutoff 0)").add_argument("pack")
    leaf(packs, "protocol", packs_protocol, "show the protocol row").add_argument("pack")
    leaf(packs, "show", packs_show, "incarnation, ordinal counter, protocol state").add_argument("pack")
    sub = leaf(packs, "find", packs_find, "incarnations by namespace, name and version")
    sub.add_argument("--namespace", required=True)
    sub.add_argument("--name", required=True)
    sub.add_argument("--version", required=True)

    fences = commands.add_parser("fences", help="admission fences").add_subparsers(dest="action", required=True)
    sub = leaf(fences, "arm", fences_arm, "arm a fence")
    sub.add_argument("--namespace", required=True)
    sub.add_argument("--scope", default=NAMESPACE_SCOPE, help=f'"{NAMESPACE_SCOPE}" (default) or a pack')
    sub.set_defaults(pack_fields=("scope",))
    sub.add_argument("--expires-in", type=parse_duration, metavar="DURATION", help="default: never expires")
    sub.add_argument("--reason", default="")
    leaf(fences, "disarm", fences_disarm, "disarm a fence").add_argument("fence")
    leaf(fences, "list", fences_list, "list fences").add_argument("--namespace", required=True)
    sub = leaf(fences, "override", fences_override, "add or remove a pack's release from a fence")
    sub.add_argument("action", choices=("add", "remove"))
    sub.add_argument("fence")
    sub.add_argument("pack")
    sub.add_argument("--expires-in", type=parse_duration, metavar="DURATION", help="default: until removed")

    drain = commands.add_parser("drain", help="old-protocol drain").add_subparsers(dest="action", required=True)
    leaf(drain, "status", drain_status, "what is not terminal yet").add_argument("pack")
    sub = leaf(drain, "wait", drain_wait, "wait until drained (never mutates)")
    sub.add_argument("pack")
    sub.add_argument("--timeout", type=parse_duration, required=True, metavar="DURATION", help="bound on the wait")
    sub.add_argument(
        "--interval", type=parse_duration, default="2s", metavar="DURATION", help="between checks (default %(default)s)"
    )

    queue = commands.add_parser("queue", help="a pack's native queue").add_subparsers(dest="action", required=True)
    leaf(queue, "state", queue_state, "depth, oldest waiting generation, drained or not").add_argument("pack")
    sub = leaf(queue, "wait", queue_wait, "wait until drained (never mutates)")
    sub.add_argument("pack")
    sub.add_argument("--timeout", type=parse_duration, required=True, metavar="DURATION", help="bound on the wait")

    cutover = commands.add_parser("cutover", help="the one-time cutover").add_subparsers(dest="action", required=True)
    for name, handler, text in (
        ("audit", cutover_audit, "audit only; writes nothing"),
        ("run", cutover_run, "audit and write the checkpoint"),
    ):
        sub = leaf(cutover, name, handler, text)
        sub.add_argument("pack")
        sub.add_argument(
            "--timeout", type=parse_duration, default="1m", metavar="DURATION", help="bound (default %(default)s)"
        )

    work = commands.add_parser("work", help="generations").add_subparsers(dest="action", required=True)
    leaf(work, "show", work_show, "range, members, status, attempts").add_argument("work_id")
    sub = leaf(work, "retry-now", work_retry_now, "end the backoff of a generation waiting in retry")
    sub.add_argument("work_id")
    sub.add_argument("--by", required=True, help="who, as logged")
    sub.add_argument("--reason", required=True, help="why, as logged")
    sub = leaf(work, "list", work_list, "a pack's (or one identity's) generations, newest first")
    sub.add_argument("pack")
    sub.add_argument("--status", choices=[s.value for s in WorkStatus], help="only generations with this status")
    for flag in IDENTITY_FLAGS:
        sub.add_argument(flag, help="all five identity flags together: one identity's generations")
    _paged(sub)
    sub = leaf(work, "members", work_members, "a generation's members, in ordinal order")
    sub.add_argument("work_id")
    _paged(sub)

    receipts = commands.add_parser("receipts", help="ingress receipts").add_subparsers(dest="action", required=True)
    sub = leaf(receipts, "list", receipts_list, "a pack's receipts in one state")
    sub.add_argument("pack")
    states = [s.value for s in ReceiptState]
    sub.add_argument("--state", choices=states, default=ReceiptState.CONFIRMED, help="default: %(default)s")
    _paged(sub, dest="limit")
    sub = leaf(receipts, "missing", receipts_missing, "receipts whose coverage is missing")
    sub.add_argument("--pack", default=None, help="only this pack (default: every pack)")
    _paged(sub, dest="limit")

    retention = commands.add_parser("retention", help="retention policies").add_subparsers(dest="action", required=True)
    sub = leaf(retention, "set", retention_set, "set a pack's retention policy")
    sub.add_argument("pack")
    sub.add_argument("--keep-generations", type=int, metavar="N", help="newest generations kept per identity")
    sub.add_argument("--keep-age", type=parse_duration, metavar="DURATION", help="keep generations finished since")
    sub.add_argument(
        "--duplicate-window",
        type=parse_duration,
        metavar="DURATION",
        help="expire tombstones of inputs whose source time is older (every delivery then needs a source time)",
    )
    leaf(retention, "show", retention_show, "a pack's policy and horizon").add_argument("pack")
    sub = leaf(retention, "prune", retention_prune, "one pruning pass now (or a dry-run report)")
    sub.add_argument("pack")
    sub.add_argument("--dry-run", action="store_true", help="count what would go, change nothing")
    sub.add_argument("--max-generations", type=int, default=0, metavar="N", help="default: the server's per-pass limit")

    schema = commands.add_parser("schema", help="the canonical schema").add_subparsers(dest="action", required=True)
    sub = leaf(
        schema, "contract-payloads", schema_contract_payloads, "after the v10 roll: move payloads out of Event.Payload"
    )
    sub.add_argument("--dry-run", action="store_true", help="count what would move, change nothing")
    sub.add_argument("--after-pack", default="", metavar="PACK", help="resume after this pack (default: the start)")
    sub.add_argument("--after-ordinal", type=int, default=-1, metavar="N", help="and this ordinal of it")
    sub.add_argument(
        "--batches-per-call",
        type=int,
        default=payload_contract.BATCHES_PER_CALL,
        metavar="N",
        help="batches each call empties (default %(default)s)",
    )

    sub = leaf(commands, "why", why, "why a receipt has (no) work")
    sub.add_argument("pack")
    sub.add_argument("receipt_key")
    leaf(commands, "activation", activation, "the host's activation gate")
    leaf(commands, "workers", workers, "the host's workers")
    leaf(commands, "version", version, "what each service is, and whether they fit together")
    sub = leaf(commands, "health", health, "each service's gRPC health: exit 3 when one is not SERVING")
    sub.add_argument("--service", choices=[s.name for s in SERVICES], help="only this one (default: each deployed one)")
    _operating_commands(commands, leaf)
    _identity_commands(commands, leaf)
    return parser


def _named_packs(clients: Clients, args: argparse.Namespace) -> None:
    """Put the PackInstallId in place of each pack argument given as ``NAMESPACE/NAME[@VERSION]`` (decision 178).

    The arguments are ``pack`` unless the command says otherwise (``fences arm --scope``);
    each name resolved is said on stderr.
    """
    for field in getattr(args, "pack_fields", ("pack",)):
        text = getattr(args, field, None)
        if text and text != NAMESPACE_SCOPE:
            resolved = pack_names.resolve(clients.controlplane, text, timeout=RPC_TIMEOUT)
            if resolved != text:
                print(f"nexuscrm: pack {text} is {resolved}", file=sys.stderr)
            setattr(args, field, resolved)


def _named_identity(clients: Clients, args: argparse.Namespace) -> None:
    """Fill in the identity flags a partial identity left out, from the one identity of the pack it names.

    ``identities.resolve``; nothing to do without identity flags or with all five. ``--work-type``
    alone is a work type where the command says so, and claims name an identity only with
    ``--scope identity``.
    """
    # No pack to look in: ``dead-letters skip WORK_ID``, which refuses identity flags.
    wanted = identities.given(args) if hasattr(args, "lane") and getattr(args, "pack", None) else {}
    if not wanted or len(wanted) == len(IDENTITY_FLAGS) or getattr(args, "scope", "identity") != "identity":
        return
    if set(wanted) == {"work_type"} and getattr(args, "work_type_alone", False):
        return
    route = identities.resolve(clients.connectors, args.pack, wanted, timeout=RPC_TIMEOUT)
    for flag, field in identities.FLAG_FIELDS.items():
        setattr(args, flag.removeprefix("--").replace("-", "_"), getattr(route, field))


def main(argv: list[str] | None = None) -> ExitCode:
    """Run one subcommand; return its exit code (``nexuscrm_tools.exits``)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    console = Console()
    clients = Clients(Targets.from_env())
    try:
        _named_packs(clients, args)
        _named_identity(clients, args)
        outcome: Outcome = args.handler(clients, args)
    except UsageError as error:
        args.command_parser.error(str(error))
    except (pack_names.PackNameError, identities.IdentityUnresolved) as error:
        print(f"nexuscrm: {error}", file=sys.stderr)
        return ExitCode.USAGE
    except ServiceCallFailed as error:
        print(f"nexuscrm: {error.message}", file=sys.stderr)
        return rpc_exit_code(error.code())
    finally:
        clients.close()
    if args.json:
        print(json.dumps(outcome.data, indent=2, sort_keys=True))
    elif isinstance(outcome.view, Table):
        tables.print_whole(console, outcome.view)
    else:
        console.print(outcome.view)
    return outcome.code


if __name__ == "__main__":
    raise SystemExit(main())
