"""Conversions between Connectors protobuf messages and workqueue values (both directions).

The client SDK and the services use the same functions, so a field is read as it was written.

The ``*_from_proto`` functions the client uses return timezone-aware UTC datetimes;
``item_from_proto``, which only the server uses, returns the naive UTC the services store.
"""

from __future__ import annotations

import datetime as dt

import grpc

from nexuscrm.connectors.v1 import connectors_pb2 as pb
from nexuscrm_wire.timestamps import from_timestamp, naive_utc, to_timestamp
from workqueue import WorkStatus, decode_projection_key
from workqueue.errors import DomainError, ErrorKind
from workqueue.statuses import AttemptOutcome
from workqueue.values import (
    Claim,
    Completion,
    CompletionResult,
    GenerationPage,
    IngestItem,
    IngestResult,
    InputPage,
    InputRow,
    MemberPage,
    Outcome,
    PruneReport,
    QueueState,
    ReceiptExplanation,
    ReceiptSummary,
    RetentionPolicy,
    Route,
    WorkAttemptRow,
    WorkDescription,
    WorkItemRow,
)

OUTCOMES = {
    Outcome.ADMITTED: pb.INGEST_OUTCOME_ADMITTED,
    Outcome.DUPLICATE_LEGACY: pb.INGEST_OUTCOME_DUPLICATE_LEGACY,
    Outcome.DUPLICATE_COVERED: pb.INGEST_OUTCOME_DUPLICATE_COVERED,
    Outcome.FENCED: pb.INGEST_OUTCOME_FENCED,
    Outcome.COVERAGE_MISSING: pb.INGEST_OUTCOME_COVERAGE_MISSING,
    Outcome.REJECTED: pb.INGEST_OUTCOME_REJECTED,
    Outcome.DUPLICATE_PRUNED: pb.INGEST_OUTCOME_DUPLICATE_PRUNED,
    Outcome.EXPIRED: pb.INGEST_OUTCOME_EXPIRED,
}
OUTCOMES_BACK = {value: key for key, value in OUTCOMES.items()}
STATUSES = {
    WorkStatus.PENDING: pb.WORK_STATUS_PENDING,
    WorkStatus.BLOCKED: pb.WORK_STATUS_BLOCKED,
    WorkStatus.PROCESSING: pb.WORK_STATUS_PROCESSING,
    WorkStatus.RETRY: pb.WORK_STATUS_RETRY,
    WorkStatus.COMPLETED: pb.WORK_STATUS_COMPLETED,
    WorkStatus.FAILED: pb.WORK_STATUS_FAILED,
}
STATUSES_BACK = {value: key for key, value in STATUSES.items()}
ATTEMPT_OUTCOMES = {
    AttemptOutcome.FAILED: pb.ATTEMPT_OUTCOME_FAILED,
    AttemptOutcome.RETRY: pb.ATTEMPT_OUTCOME_RETRY,
    AttemptOutcome.RETRY_LATER: pb.ATTEMPT_OUTCOME_RETRY_LATER,
    AttemptOutcome.EXPIRED: pb.ATTEMPT_OUTCOME_EXPIRED,
}
ATTEMPT_OUTCOMES_BACK = {value: key for key, value in ATTEMPT_OUTCOMES.items()}


def route_to_proto(route: Route) -> pb.ProjectionRoute:
    """Route -> ProjectionRoute."""
    return pb.ProjectionRoute(
        event_kind=route.event_kind,
        route_version=route.route_version,
        companion_version=route.companion_version,
        work_type=route.work_type,
        source_lane=route.source_lane,
    )


def route_from_proto(message: pb.ProjectionRoute) -> Route:
    """ProjectionRoute -> Route (validated later, with the pack, by the identity helper)."""
    return Route(
        event_kind=message.event_kind,
        route_version=message.route_version,
        companion_version=message.companion_version,
        work_type=message.work_type,
        source_lane=message.source_lane,
    )


def item_to_proto(item: IngestItem) -> pb.IngestItem:
    """IngestItem -> proto."""
    return pb.IngestItem(
        receipt_key=item.receipt_key,
        route=route_to_proto(item.route),
        payload=item.payload,
        source_time=to_timestamp(item.source_time),
    )


def item_from_proto(message: pb.IngestItem) -> IngestItem:
    """Proto -> IngestItem, for the server: ``source_time`` is naive UTC, as the services store it."""
    source_time = from_timestamp(message, "source_time")
    return IngestItem(
        receipt_key=message.receipt_key,
        route=route_from_proto(message.route),
        payload=message.payload,
        source_time=naive_utc(source_time) if source_time is not None else None,
    )


def result_to_proto(result: IngestResult) -> pb.IngestResult:
    """IngestResult -> proto."""
    return pb.IngestResult(
        receipt_key=result.receipt_key,
        outcome=OUTCOMES[result.outcome],
        enqueue_ordinal=result.enqueue_ordinal or 0,
        work_id=result.work_id or "",
        message=result.message,
    )


def result_from_proto(message: pb.IngestResult) -> IngestResult:
    """Proto -> IngestResult."""
    return IngestResult(
        receipt_key=message.receipt_key,
        outcome=OUTCOMES_BACK[message.outcome],
        enqueue_ordinal=message.enqueue_ordinal or None,
        work_id=message.work_id or None,
        message=message.message,
    )


def work_to_proto(work: WorkItemRow) -> pb.WorkItem:
    """WorkItemRow -> proto (the lease token is never sent here: only the claim carries it)."""
    return pb.WorkItem(
        work_id=work.work_id,
        pack_install_id=work.pack_install_id,
        projection_key=work.projection_key,
        route=route_to_proto(Route.of(decode_projection_key(work.projection_key))),
        input_start_ordinal=work.input_start_ordinal or 0,
        lane_ordinal=work.lane_ordinal,
        replay_of_work_id=work.replay_of_work_id or "",
        status=STATUSES[work.status],
        attempt=work.attempt,
        max_attempts=work.max_attempts,
        next_attempt_at=to_timestamp(work.claimable_at if work.status is WorkStatus.RETRY else None),
        lease_owner=work.lease_owner or "",
        lease_expires_at=to_timestamp(work.lease_expires_at),
        last_error=work.last_error or "",
        created_at=to_timestamp(work.created_at),
        finished_at=to_timestamp(work.finished_at),
        flow_version=work.flow_version or "",
        build_run=work.build_run,
    )


def work_from_proto(message: pb.WorkItem) -> WorkItemRow:
    """Proto -> WorkItemRow (lease token not included)."""
    status = STATUSES_BACK[message.status]
    return WorkItemRow(
        work_id=message.work_id,
        pack_install_id=message.pack_install_id,
        projection_key=message.projection_key,
        work_type=message.route.work_type,
        input_start_ordinal=message.input_start_ordinal or None,
        lane_ordinal=message.lane_ordinal,
        replay_of_work_id=message.replay_of_work_id or None,
        status=status,
        attempt=message.attempt,
        max_attempts=message.max_attempts,
        claimable_at=from_timestamp(message, "next_attempt_at"),
        lease_owner=message.lease_owner or None,
        lease_token=None,
        lease_expires_at=from_timestamp(message, "lease_expires_at"),
        last_error=message.last_error or None,
        created_at=from_timestamp(message, "created_at") or dt.datetime.min.replace(tzinfo=dt.UTC),
        finished_at=from_timestamp(message, "finished_at"),
        flow_version=message.flow_version or None,
        build_run=message.build_run,
    )


def attempt_to_proto(attempt: WorkAttemptRow) -> pb.WorkAttempt:
    """WorkAttemptRow -> proto."""
    return pb.WorkAttempt(
        attempt=attempt.attempt,
        worker_id=attempt.worker_id,
        started_at=to_timestamp(attempt.started_at),
        finished_at=to_timestamp(attempt.finished_at),
        outcome=ATTEMPT_OUTCOMES[attempt.outcome],
        error=attempt.error,
        traceback=attempt.traceback or "",
    )


def attempt_from_proto(message: pb.WorkAttempt) -> WorkAttemptRow:
    """Proto -> WorkAttemptRow."""
    return WorkAttemptRow(
        attempt=message.attempt,
        worker_id=message.worker_id,
        started_at=from_timestamp(message, "started_at"),
        finished_at=from_timestamp(message, "finished_at") or dt.datetime.min.replace(tzinfo=dt.UTC),
        outcome=ATTEMPT_OUTCOMES_BACK[message.outcome],
        error=message.error,
        traceback=message.traceback or None,
    )


def work_description_to_proto(described: WorkDescription) -> pb.GetWorkResponse:
    """WorkDescription -> GetWorkResponse."""
    return pb.GetWorkResponse(
        work=work_to_proto(described.work),
        member_count=described.member_count,
        attempts=[attempt_to_proto(a) for a in described.attempts],
        attempt_count=described.attempt_count,
    )


def work_description_from_proto(message: pb.GetWorkResponse) -> WorkDescription:
    """GetWorkResponse -> WorkDescription (a server before contract 1.6.0 sends no attempts)."""
    return WorkDescription(
        work=work_from_proto(message.work),
        member_count=message.member_count,
        attempts=tuple(attempt_from_proto(a) for a in message.attempts),
        attempt_count=message.attempt_count,
    )


def claim_to_proto(claim: Claim) -> pb.ClaimedWork:
    """Claim -> proto."""
    return pb.ClaimedWork(
        work=work_to_proto(claim.work),
        lease_token=claim.lease_token,
        inputs=page_to_proto(claim.inputs) if claim.inputs is not None else None,
    )


def claim_from_proto(message: pb.ClaimedWork) -> Claim:
    """Proto -> Claim."""
    return Claim(
        work=work_from_proto(message.work),
        lease_token=message.lease_token,
        inputs=page_from_proto(message.inputs) if message.HasField("inputs") else None,
    )


# The google.rpc.Code of each error kind (their names are the same), and back.
_CODES = {kind: grpc.StatusCode[kind.value].value[0] for kind in ErrorKind}
_KINDS = {code: kind for kind, code in _CODES.items()}


def completion_to_proto(completion: Completion) -> pb.CompleteRequest:
    """Completion -> proto (a ClaimRequest's completion is a CompleteRequest)."""
    return pb.CompleteRequest(work_id=completion.work_id, lease_token=completion.lease_token)


def completion_from_proto(message: pb.CompleteRequest) -> Completion:
    """Proto -> Completion."""
    return Completion(work_id=message.work_id, lease_token=message.lease_token)


def completion_result_to_proto(result: CompletionResult) -> pb.CompletionResult:
    """CompletionResult -> proto: the work, or the refusal's code and message."""
    if result.error is not None:
        return pb.CompletionResult(
            work_id=result.work_id, error_code=_CODES[result.error.kind], error_message=str(result.error)
        )
    return pb.CompletionResult(
        work_id=result.work_id, work=work_to_proto(result.work) if result.work is not None else None
    )


def completion_result_from_proto(message: pb.CompletionResult) -> CompletionResult:
    """Proto -> CompletionResult; a refusal becomes a ``DomainError`` of its kind (unknown: FAILED_PRECONDITION)."""
    if message.error_code:
        kind = _KINDS.get(message.error_code, ErrorKind.FAILED_PRECONDITION)
        return CompletionResult(work_id=message.work_id, error=DomainError(message.error_message, kind=kind))
    return CompletionResult(
        work_id=message.work_id, work=work_from_proto(message.work) if message.HasField("work") else None
    )


def explanation_to_proto(explained: ReceiptExplanation) -> pb.ExplainReceiptResponse:
    """ReceiptExplanation -> ExplainReceiptResponse (no ordinal and no covering work are left unset)."""
    return pb.ExplainReceiptResponse(
        receipt_state=explained.receipt_state,
        enqueue_ordinal=explained.enqueue_ordinal or 0,
        covered_by=work_to_proto(explained.covered_by) if explained.covered_by else None,
        explanation=explained.explanation,
    )


def explanation_from_proto(message: pb.ExplainReceiptResponse) -> ReceiptExplanation:
    """ExplainReceiptResponse -> ReceiptExplanation."""
    return ReceiptExplanation(
        receipt_state=message.receipt_state,
        enqueue_ordinal=message.enqueue_ordinal or None,
        covered_by=work_from_proto(message.covered_by) if message.HasField("covered_by") else None,
        explanation=message.explanation,
    )


def receipt_to_proto(receipt: ReceiptSummary) -> pb.Receipt:
    """ReceiptSummary -> Receipt."""
    return pb.Receipt(
        pack_install_id=receipt.pack_install_id,
        receipt_key=receipt.receipt_key,
        state=receipt.state,
        route=route_to_proto(receipt.route),
        received_at=to_timestamp(receipt.received_at),
    )


def receipt_from_proto(message: pb.Receipt) -> ReceiptSummary:
    """Receipt -> ReceiptSummary."""
    return ReceiptSummary(
        pack_install_id=message.pack_install_id,
        receipt_key=message.receipt_key,
        state=message.state,
        route=route_from_proto(message.route),
        received_at=from_timestamp(message, "received_at") or dt.datetime.min.replace(tzinfo=dt.UTC),
    )


def input_to_proto(row: InputRow) -> pb.Input:
    """InputRow -> proto."""
    return pb.Input(
        enqueue_ordinal=row.enqueue_ordinal,
        receipt_key=row.receipt_key or "",
        payload=row.payload,
        source_time=to_timestamp(row.source_time),
        replay=row.is_replay,
        replayed_work_id=row.replayed_work_id or "",
    )


def input_from_proto(message: pb.Input) -> InputRow:
    """Proto -> InputRow."""
    return InputRow(
        enqueue_ordinal=message.enqueue_ordinal,
        receipt_key=message.receipt_key or None,
        payload=message.payload,
        source_time=from_timestamp(message, "source_time"),
        is_replay=message.replay,
        replayed_work_id=message.replayed_work_id or None,
    )


def page_to_proto(page: InputPage) -> pb.LoadInputsResponse:
    """InputPage -> proto."""
    return pb.LoadInputsResponse(
        inputs=[input_to_proto(i) for i in page.inputs], last=page.last, member_count=page.member_count
    )


def replayed_page_to_proto(page: InputPage) -> pb.LoadReplayedInputsResponse:
    """InputPage of replayed inputs -> proto."""
    return pb.LoadReplayedInputsResponse(
        inputs=[input_to_proto(i) for i in page.inputs], last=page.last, member_count=page.member_count
    )


def page_from_proto(message: pb.LoadInputsResponse | pb.LoadReplayedInputsResponse) -> InputPage:
    """Proto -> InputPage."""
    return InputPage(
        inputs=tuple(input_from_proto(i) for i in message.inputs),
        last=message.last,
        member_count=message.member_count,
    )


def members_to_proto(page: MemberPage) -> pb.ListMembersResponse:
    """MemberPage -> ListMembersResponse."""
    return pb.ListMembersResponse(
        inputs=[input_to_proto(i) for i in page.inputs],
        next_page_token=page.next_page_token,
        member_count=page.member_count,
    )


def members_from_proto(message: pb.ListMembersResponse) -> MemberPage:
    """ListMembersResponse -> MemberPage."""
    return MemberPage(
        inputs=tuple(input_from_proto(i) for i in message.inputs),
        next_page_token=message.next_page_token,
        member_count=message.member_count,
    )


def generations_to_proto(page: GenerationPage) -> pb.ListGenerationsResponse:
    """GenerationPage -> ListGenerationsResponse."""
    return pb.ListGenerationsResponse(
        generations=[work_to_proto(w) for w in page.generations], next_page_token=page.next_page_token
    )


def generations_from_proto(message: pb.ListGenerationsResponse) -> GenerationPage:
    """ListGenerationsResponse -> GenerationPage."""
    return GenerationPage(
        generations=tuple(work_from_proto(w) for w in message.generations), next_page_token=message.next_page_token
    )


def queue_state_to_proto(state: QueueState) -> pb.QueueState:
    """QueueState -> proto (no waiting generation leaves its three fields unset)."""
    message = pb.QueueState(
        pack_install_id=state.pack_install_id,
        drained=state.drained,
        pending=state.pending,
        blocked=state.blocked,
        retry=state.retry,
        processing=state.processing,
        receipts_waiting=state.receipts_waiting,
        oldest_waiting_work_id=state.oldest_waiting_work_id or "",
        oldest_waiting_since=to_timestamp(state.oldest_waiting_since),
        read_at=to_timestamp(state.read_at),
        held=state.held,
        failed=state.failed,
        dead_letters=state.dead_letters,
    )
    if state.oldest_waiting_age is not None:
        message.oldest_waiting_age.FromTimedelta(state.oldest_waiting_age)
    return message


def queue_state_from_proto(message: pb.QueueState) -> QueueState:
    """Proto -> QueueState."""
    return QueueState(
        pack_install_id=message.pack_install_id,
        pending=message.pending,
        blocked=message.blocked,
        retry=message.retry,
        processing=message.processing,
        receipts_waiting=message.receipts_waiting,
        oldest_waiting_work_id=message.oldest_waiting_work_id or None,
        oldest_waiting_since=from_timestamp(message, "oldest_waiting_since"),
        oldest_waiting_age=message.oldest_waiting_age.ToTimedelta() if message.HasField("oldest_waiting_age") else None,
        read_at=from_timestamp(message, "read_at") or dt.datetime.min.replace(tzinfo=dt.UTC),
        held=message.held,
        failed=message.failed,
        dead_letters=message.dead_letters,
    )


def policy_to_proto(policy: RetentionPolicy) -> pb.RetentionPolicy:
    """RetentionPolicy -> proto (an unset limit or window stays unset)."""
    return pb.RetentionPolicy(
        pack_install_id=policy.pack_install_id,
        keep_generations=policy.keep_generations,
        keep_seconds=policy.keep_seconds,
        duplicate_window_seconds=policy.duplicate_window_seconds,
        horizon_ordinal=policy.horizon_ordinal,
        horizon_source_time=to_timestamp(policy.horizon_source_time),
        expired_receipts=policy.expired_receipts,
        pruned_generations=policy.pruned_generations,
        last_pruned_at=to_timestamp(policy.last_pruned_at),
        backlog_generations=policy.backlog_generations,
        backlog_oldest_finished_at=to_timestamp(policy.backlog_oldest_finished_at),
    )


def policy_from_proto(message: pb.RetentionPolicy) -> RetentionPolicy:
    """Proto -> RetentionPolicy (timezone-aware UTC datetimes)."""

    def optional(field: str) -> int | None:
        return int(getattr(message, field)) if message.HasField(field) else None

    return RetentionPolicy(
        pack_install_id=message.pack_install_id,
        keep_generations=optional("keep_generations"),
        keep_seconds=optional("keep_seconds"),
        duplicate_window_seconds=optional("duplicate_window_seconds"),
        horizon_ordinal=message.horizon_ordinal,
        horizon_source_time=from_timestamp(message, "horizon_source_time"),
        expired_receipts=message.expired_receipts,
        pruned_generations=message.pruned_generations,
        last_pruned_at=from_timestamp(message, "last_pruned_at"),
        backlog_generations=message.backlog_generations,
        backlog_oldest_finished_at=from_timestamp(message, "backlog_oldest_finished_at"),
    )


def prune_report_to_proto(report: PruneReport) -> pb.PruneResponse:
    """PruneReport -> PruneResponse."""
    return pb.PruneResponse(
        pack_install_id=report.pack_install_id,
        dry_run=report.dry_run,
        generations=report.generations,
        events=report.events,
        receipts=report.receipts,
        kept=report.kept,
        horizon_ordinal=report.horizon_ordinal,
        expired_receipts=report.expired_receipts,
        expired_generations=report.expired_generations,
        horizon_source_time=to_timestamp(report.horizon_source_time),
    )


def prune_report_from_proto(message: pb.PruneResponse) -> PruneReport:
    """PruneResponse -> PruneReport (timezone-aware UTC datetimes)."""
    return PruneReport(
        pack_install_id=message.pack_install_id,
        dry_run=message.dry_run,
        generations=message.generations,
        events=message.events,
        receipts=message.receipts,
        kept=message.kept,
        horizon_ordinal=message.horizon_ordinal,
        expired_receipts=message.expired_receipts,
        expired_generations=message.expired_generations,
        horizon_source_time=from_timestamp(message, "horizon_source_time"),
    )
