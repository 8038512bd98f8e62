"""Proto conversions of the operating RPCs (claim pauses, dead letters, coverage, identities): requests in, answers out.

The servicer stays thin: it calls these and the facade. Timestamps come in as the naive UTC
the services store.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import TypeVar

from google.protobuf.message import Message

from nexuscrm.connectors.v1 import connectors_pb2 as pb
from nexuscrm_connectors.operating import claim_pauses, coverage, dead_letters, flow_versions, identities, order_policy
from nexuscrm_connectors.operating.claim_pauses import ClaimPause, PauseScope
from nexuscrm_connectors.queries.dead_letters import Filter
from nexuscrm_connectors.queue import retries
from nexuscrm_runtime.status import STATUS_CODES
from nexuscrm_wire import convert
from nexuscrm_wire.timestamps import from_timestamp, naive_utc, to_timestamp
from workqueue.errors import ErrorKind, InvalidArgument

_SCOPES = {
    pb.PAUSE_SCOPE_PACK: PauseScope.PACK,
    pb.PAUSE_SCOPE_IDENTITY: PauseScope.IDENTITY,
    pb.PAUSE_SCOPE_WORK_TYPE: PauseScope.WORK_TYPE,
}
_SCOPES_BACK = {scope: number for number, scope in _SCOPES.items()}
_POLICIES = {
    pb.ORDER_POLICY_KIND_BLOCK: order_policy.Policy.BLOCK,
    pb.ORDER_POLICY_KIND_CONTINUE: order_policy.Policy.CONTINUE,
}
_POLICIES_BACK = {policy: number for number, policy in _POLICIES.items()}
_VERDICTS = {
    dead_letters.Verdict.REPLAYED: pb.DEAD_LETTER_VERDICT_REPLAYED,
    dead_letters.Verdict.WOULD_REPLAY: pb.DEAD_LETTER_VERDICT_WOULD_REPLAY,
    dead_letters.Verdict.SKIPPED: pb.DEAD_LETTER_VERDICT_SKIPPED,
    dead_letters.Verdict.WOULD_SKIP: pb.DEAD_LETTER_VERDICT_WOULD_SKIP,
    dead_letters.Verdict.REFUSED: pb.DEAD_LETTER_VERDICT_REFUSED,
}
# ReplayDeadLetters and SkipDeadLetters answer alike.
BulkResponse = TypeVar("BulkResponse", pb.ReplayDeadLettersResponse, pb.SkipDeadLettersResponse)


def _naive(message: Message, field: str) -> dt.datetime | None:
    value = from_timestamp(message, field)
    return naive_utc(value) if value is not None else None


def scope_from_proto(message: pb.ClaimScope) -> claim_pauses.Scope:
    """ClaimScope -> a validated scope (``InvalidArgument`` naming the field at fault)."""
    return claim_pauses.scope_of(
        message.pack_install_id,
        _SCOPES.get(message.scope),
        convert.route_from_proto(message.route) if message.HasField("route") else None,
        message.work_type,
    )


def expiry_from_proto(request: pb.PauseClaimsRequest) -> dt.datetime | None:
    """A PauseClaims request's expiry, naive UTC; None when unset."""
    return _naive(request, "expires_at")


def pause_to_proto(pause: ClaimPause) -> pb.ClaimPause:
    """ClaimPause -> proto."""
    return pb.ClaimPause(
        pause_id=pause.pause_id,
        scope=pb.ClaimScope(
            pack_install_id=pause.pack_install_id,
            scope=_SCOPES_BACK[pause.scope],
            route=convert.route_to_proto(pause.route) if pause.route is not None else None,
            work_type=pause.work_type,
        ),
        paused_by=pause.paused_by,
        reason=pause.reason,
        paused_at=to_timestamp(pause.paused_at),
        expires_at=to_timestamp(pause.expires_at),
        resumed_at=to_timestamp(pause.resumed_at),
        resumed_by=pause.resumed_by,
    )


def filter_from_proto(message: pb.DeadLetterFilter) -> tuple[str, Filter]:
    """DeadLetterFilter -> (its pack, a validated filter)."""
    return message.pack_install_id, dead_letters.filter_of(
        message.pack_install_id,
        route=convert.route_from_proto(message.route) if message.HasField("route") else None,
        work_type=message.work_type,
        finished_after=_naive(message, "finished_after"),
        finished_before=_naive(message, "finished_before"),
        error_contains=message.error_contains,
    )


def dead_letter_page_to_proto(page: dead_letters.DeadLetterPage) -> pb.ListDeadLettersResponse:
    """DeadLetterPage -> ListDeadLettersResponse."""
    return pb.ListDeadLettersResponse(
        dead_letters=[convert.work_to_proto(work) for work in page.dead_letters],
        next_page_token=page.next_page_token,
        examined=page.examined,
    )


def dead_letter_count_to_proto(count: dead_letters.DeadLetterCount) -> pb.CountDeadLettersResponse:
    """DeadLetterCount -> CountDeadLettersResponse."""
    return pb.CountDeadLettersResponse(
        identities=[
            pb.IdentityDeadLetters(route=convert.route_to_proto(i.route), dead_letters=i.dead_letters)
            for i in count.identities
        ],
        total=count.total,
        examined=count.examined,
        complete=count.complete,
    )


def bulk_call_to_proto(handled: dead_letters.BulkCall, response: type[BulkResponse]) -> BulkResponse:
    """BulkCall -> ReplayDeadLettersResponse or SkipDeadLettersResponse (a refusal carries its google.rpc code)."""
    return response(
        answers=[
            pb.DeadLetterReplay(
                work_id=answer.work_id,
                route=convert.route_to_proto(answer.route),
                lane_ordinal=answer.lane_ordinal,
                verdict=_VERDICTS[answer.verdict],
                replay_work_id=answer.replay_work_id,
                error_code=STATUS_CODES[ErrorKind(answer.error_kind)].value[0] if answer.error_kind else 0,
                message=answer.message,
            )
            for answer in handled.answers
        ],
        next_page_token=handled.next_page_token,
        examined=handled.examined,
        dry_run=handled.dry_run,
    )


def policy_from_proto(kind: pb.OrderPolicyKind) -> order_policy.Policy | None:
    """OrderPolicyKind -> Policy; None for unspecified (refused downstream); a value the contract lacks is refused."""
    if kind and kind not in _POLICIES:
        raise InvalidArgument(f"policy {kind} is not an OrderPolicyKind: block or continue", field="policy")
    return _POLICIES.get(kind)


def policy_to_proto(policy: order_policy.OrderPolicy) -> pb.OrderPolicy:
    """OrderPolicy -> proto (set_at unset while the default applies)."""
    return pb.OrderPolicy(
        pack_install_id=policy.pack_install_id,
        policy=_POLICIES_BACK[policy.policy],
        set_by=policy.set_by,
        reason=policy.reason,
        set_at=to_timestamp(policy.set_at),
        work_type=policy.work_type,
        source=policy.source.value,
    )


def retry_policy_to_proto(policy: retries.RetryPolicy) -> pb.RetryPolicy:
    """RetryPolicy -> proto (set_at unset for Connectors' default)."""
    return pb.RetryPolicy(
        pack_install_id=policy.pack_install_id,
        work_type=policy.work_type,
        max_attempts=policy.max_attempts,
        backoff_base_seconds=policy.backoff_base_seconds,
        backoff_max_seconds=policy.backoff_max_seconds,
        source=policy.source.value,
        set_by=policy.set_by,
        reason=policy.reason,
        set_at=to_timestamp(policy.set_at),
    )


def skip_record_to_proto(skip: order_policy.Skip) -> pb.Skip:
    """Skip -> the Skip a WorkItem carries (who, when, why)."""
    return pb.Skip(skipped_by=skip.skipped_by, reason=skip.reason, skipped_at=to_timestamp(skip.skipped_at))


def skip_to_proto(skip: order_policy.Skip) -> pb.SkipDeadLetterResponse:
    """Skip -> SkipDeadLetterResponse."""
    return pb.SkipDeadLetterResponse(
        work_id=skip.work_id,
        pack_install_id=skip.pack_install_id,
        skipped_by=skip.skipped_by,
        reason=skip.reason,
        skipped_at=to_timestamp(skip.skipped_at),
    )


_RANGE_STATES = {
    coverage.RangeState.COMPLETED: pb.COVERAGE_RANGE_STATE_COMPLETED,
    coverage.RangeState.IN_FLIGHT: pb.COVERAGE_RANGE_STATE_IN_FLIGHT,
    coverage.RangeState.QUEUED: pb.COVERAGE_RANGE_STATE_QUEUED,
    coverage.RangeState.FAILED: pb.COVERAGE_RANGE_STATE_FAILED,
    coverage.RangeState.REPLAYED: pb.COVERAGE_RANGE_STATE_REPLAYED,
    coverage.RangeState.SKIPPED: pb.COVERAGE_RANGE_STATE_SKIPPED,
    coverage.RangeState.PRUNED: pb.COVERAGE_RANGE_STATE_PRUNED,
}
_EXCEPTION_KINDS = {
    coverage.ExceptionKind.GAP: pb.COVERAGE_EXCEPTION_KIND_GAP,
    coverage.ExceptionKind.OVERLAP: pb.COVERAGE_EXCEPTION_KIND_OVERLAP,
}


def coverage_filter_from_proto(request: pb.GetCoverageRequest) -> tuple[str, Filter]:
    """GetCoverageRequest -> (its pack, a validated identity filter)."""
    return request.pack_install_id, dead_letters.filter_of(
        request.pack_install_id,
        route=convert.route_from_proto(request.route) if request.HasField("route") else None,
        work_type=request.work_type,
    )


def coverage_page_to_proto(page: coverage.CoveragePage) -> pb.GetCoverageResponse:
    """CoveragePage -> GetCoverageResponse."""
    return pb.GetCoverageResponse(
        identities=[
            pb.IdentityCoverage(
                route=convert.route_to_proto(identity.route),
                high_water_ordinal=identity.high_water_ordinal,
                tiled=identity.tiled,
                ranges=[
                    pb.CoverageRange(
                        start_ordinal=r.start_ordinal,
                        end_ordinal=r.end_ordinal,
                        state=_RANGE_STATES[r.state],
                        work_id=r.work_id,
                        replayed_by=r.replayed_by,
                    )
                    for r in identity.ranges
                ],
                exceptions=[
                    pb.CoverageException(
                        kind=_EXCEPTION_KINDS[e.kind],
                        start_ordinal=e.start_ordinal,
                        end_ordinal=e.end_ordinal,
                        work_ids=list(e.work_ids),
                    )
                    for e in identity.exceptions
                ],
                exception_count=identity.exception_count,
                inputs=identity.inputs,
            )
            for identity in page.identities
        ],
        next_page_token=page.next_page_token,
        examined=page.examined,
    )


def wanted_route_from_proto(request: pb.ListIdentitiesRequest) -> dict[str, str]:
    """ListIdentitiesRequest's partial identity: its route's non-empty fields (Route field -> value)."""
    route = dataclasses.asdict(convert.route_from_proto(request.route))
    return {name: value for name, value in route.items() if value}


def identities_page_to_proto(page: identities.IdentityPage) -> pb.ListIdentitiesResponse:
    """IdentityPage -> ListIdentitiesResponse."""
    response = pb.ListIdentitiesResponse(next_page_token=page.next_page_token, examined=page.examined)
    for identity in page.identities:
        listed = response.identities.add(route=convert.route_to_proto(identity.route), depth=identity.depth)
        if identity.newest is not None:
            listed.newest.CopyFrom(convert.work_to_proto(identity.newest))
        if identity.coverage is not None:
            listed.coverage.CopyFrom(
                pb.IdentityCoverageState(
                    tiled=identity.coverage.tiled,
                    high_water_ordinal=identity.coverage.high_water_ordinal,
                    exception_count=identity.coverage.exception_count,
                    inputs=identity.coverage.inputs,
                )
            )
    return response


_VERSION_STATES = {
    "building": pb.FLOW_VERSION_STATE_BUILDING,
    "standby": pb.FLOW_VERSION_STATE_STANDBY,
    "live": pb.FLOW_VERSION_STATE_LIVE,
    "stopped": pb.FLOW_VERSION_STATE_STOPPED,
    "retired": pb.FLOW_VERSION_STATE_RETIRED,
}
VERDICTS = {
    "equal": pb.FLOW_VERSION_VERDICT_EQUAL,
    "coverage_only": pb.FLOW_VERSION_VERDICT_COVERAGE_ONLY,
    "different": pb.FLOW_VERSION_VERDICT_DIFFERENT,
}
VERDICTS_BACK: dict[int, str] = {value: name for name, value in VERDICTS.items()}


def verdict_from_proto(verdict: int) -> str:
    """A FlowVersionVerdict -> its stored name; INVALID_ARGUMENT for UNSPECIFIED or unknown."""
    if verdict not in VERDICTS_BACK:
        raise InvalidArgument("verdict is required: EQUAL, COVERAGE_ONLY or DIFFERENT", field="verdict")
    return VERDICTS_BACK[verdict]


def flow_version_to_proto(view: flow_versions.VersionView) -> pb.FlowVersion:
    """A version with its progress -> proto."""
    track, progress = view.track, view.progress
    return pb.FlowVersion(
        pack_install_id=track.pack_install_id,
        work_type=track.work_type,
        version=track.version,
        source_version=track.source_version,
        state=_VERSION_STATES[view.state],
        cover_from_ordinal=track.cover_from_ordinal,
        cover_through_ordinal=track.cover_through_ordinal or 0,
        catch_up_through_ordinal=track.catch_up_through_ordinal,
        high_water_ordinal=view.high_water_ordinal,
        inputs_total=progress.inputs_total,
        inputs_done=progress.inputs_done,
        generations_total=progress.generations_total,
        generations_done=progress.generations_done,
        generations_failed=progress.generations_failed,
        inputs_per_second=view.inputs_per_second,
        seconds_left=view.seconds_left,
        max_inputs_per_second=track.max_inputs_per_second or 0,
        verified_against=track.verified_against or "",
        verified_through_ordinal=track.verified_through_ordinal or 0,
        verdict=VERDICTS.get(track.verify_outcome or "", pb.FLOW_VERSION_VERDICT_UNSPECIFIED),
        verified_at=to_timestamp(track.verified_at),
        created_at=to_timestamp(track.created_at),
        retired_at=to_timestamp(track.retired_at),
        changes=[
            pb.FlowVersionChange(
                version=change.version,
                action=change.action,
                actor=change.actor,
                reason=change.reason,
                forced=change.forced,
                at_ordinal=change.at_ordinal,
                changed_at=to_timestamp(change.changed_at),
            )
            for change in view.changes
        ],
    )
