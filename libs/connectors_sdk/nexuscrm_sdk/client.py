"""A ConnectorsService client with the same methods as the in-process ``Connectors`` facade.

Every argument after the first is keyword-only; durations are ``timedelta``s; every datetime
it returns is timezone-aware UTC (datetimes it is given may be aware, or naive UTC). Every
call carries a deadline. Status codes come back as ``grpc.RpcError``; a zero or fractional
lease is refused before any call (``InvalidArgument``), its range by the server.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Sequence

import grpc

from nexuscrm.connectors.v1 import connectors_pb2 as pb
from nexuscrm.connectors.v1 import connectors_pb2_grpc as pb_grpc
from nexuscrm_wire import convert
from workqueue import WorkStatus
from workqueue.draining import wait_until_drained
from workqueue.values import (
    Claim,
    ClaimAnswer,
    Completion,
    GenerationPage,
    IngestItem,
    IngestResult,
    InputPage,
    MemberPage,
    PruneReport,
    QueueState,
    ReceiptExplanation,
    ReceiptSummary,
    ReplayResult,
    RetentionPolicy,
    Route,
    WorkDescription,
    WorkItemRow,
    lease_seconds,
)

DEFAULT_TIMEOUT = dt.timedelta(seconds=30)  # per unary call
STREAM_TIMEOUT = dt.timedelta(seconds=600)  # for a whole LoadInputs stream
MAX_WAIT_MS = 2**31 - 1  # WaitQueueDrainedRequest.wait_ms is an int32; the server cuts it to its own bound


class ConnectorsClient:
    """ConnectorsService over a channel; usable wherever ``Connectors`` is (see ``worker.WorkSource``)."""

    def __init__(self, channel: grpc.Channel, *, timeout: dt.timedelta = DEFAULT_TIMEOUT) -> None:
        self._stub = pb_grpc.ConnectorsServiceStub(channel)
        self._timeout = timeout.total_seconds()

    def ingest(self, pack_install_id: str, *, items: Sequence[IngestItem]) -> list[IngestResult]:
        """Ingest a batch; one result per item."""
        response = self._stub.Ingest(
            pb.IngestRequest(pack_install_id=pack_install_id, items=[convert.item_to_proto(i) for i in items]),
            timeout=self._timeout,
        )
        return [convert.result_from_proto(r) for r in response.results]

    def claim(
        self,
        worker_id: str,
        *,
        pack_install_ids: Sequence[str] = (),
        work_types: Sequence[str] = (),
        max_items: int = 1,
        lease: dt.timedelta | None = None,
        wait: dt.timedelta = dt.timedelta(0),
        inline_inputs: bool = False,
        flow_versions: Sequence[str] = (),
    ) -> list[Claim]:
        """Claim up to ``max_items`` generations, waiting up to ``wait`` for work when there is none.

        ``lease``: how long each claim is held before a heartbeat (None: the server's default).
        ``inline_inputs``: ask for small generations' inputs in the answer (``Claim.inputs``); a
        server that predates it answers without them. ``flow_versions``: claim these Flow
        versions' generations; empty: those of the inputs' own version (contract 1.7.0).
        """
        return self.complete_and_claim(
            worker_id,
            completions=(),
            pack_install_ids=pack_install_ids,
            work_types=work_types,
            max_items=max_items,
            lease=lease,
            wait=wait,
            inline_inputs=inline_inputs,
            flow_versions=flow_versions,
        ).claims

    def complete_and_claim(
        self,
        worker_id: str,
        *,
        completions: Sequence[Completion],
        pack_install_ids: Sequence[str] = (),
        work_types: Sequence[str] = (),
        max_items: int = 1,
        lease: dt.timedelta | None = None,
        wait: dt.timedelta = dt.timedelta(0),
        inline_inputs: bool = False,
        flow_versions: Sequence[str] = (),
    ) -> ClaimAnswer:
        """Complete ``completions`` and claim as ``claim``, in one call; each completion is answered on its own.

        A refused completion's ``CompletionResult.error`` is a ``DomainError`` of the kind
        Complete would have answered. A server that predates completions in Claim ignores them
        and answers none: the caller then completes them with ``complete`` (``Worker`` does).
        """
        seconds = lease_seconds(lease)
        response = self._stub.Claim(
            pb.ClaimRequest(
                worker_id=worker_id,
                pack_install_ids=list(pack_install_ids),
                work_types=list(work_types),
                max_items=max_items,
                lease_seconds=seconds,
                wait_ms=wait // dt.timedelta(milliseconds=1),
                inline_inputs=inline_inputs,
                completions=[convert.completion_to_proto(c) for c in completions],
                flow_versions=list(flow_versions),
            ),
            timeout=self._timeout + wait.total_seconds(),  # the server's wait is not its processing time
        )
        return ClaimAnswer(
            claims=[convert.claim_from_proto(c) for c in response.claims],
            completed=[convert.completion_result_from_proto(r) for r in response.completions],
        )

    def load_inputs(self, work_id: str, *, lease_token: str, page_size: int = 0) -> Iterator[InputPage]:
        """Stream a held generation's members."""
        stream = self._stub.LoadInputs(
            pb.LoadInputsRequest(work_id=work_id, lease_token=lease_token, page_size=page_size),
            timeout=STREAM_TIMEOUT.total_seconds(),
        )
        for message in stream:
            yield convert.page_from_proto(message)

    def load_replayed_inputs(self, work_id: str, *, lease_token: str, page_size: int = 0) -> Iterator[InputPage]:
        """Stream the inputs a held replay generation runs again: the replayed generations' members, oldest first."""
        stream = self._stub.LoadReplayedInputs(
            pb.LoadReplayedInputsRequest(work_id=work_id, lease_token=lease_token, page_size=page_size),
            timeout=STREAM_TIMEOUT.total_seconds(),
        )
        for message in stream:
            yield convert.page_from_proto(message)

    def heartbeat(self, work_id: str, *, lease_token: str, lease: dt.timedelta | None = None) -> dt.datetime:
        """Extend a held lease by ``lease`` from now (None: the server's default); return the new expiry (aware UTC)."""
        seconds = lease_seconds(lease)
        response = self._stub.Heartbeat(
            pb.HeartbeatRequest(work_id=work_id, lease_token=lease_token, lease_seconds=seconds),
            timeout=self._timeout,
        )
        expires: dt.datetime = response.lease_expires_at.ToDatetime(tzinfo=dt.UTC)
        return expires

    def complete(self, work_id: str, *, lease_token: str) -> WorkItemRow:
        """Complete a held generation."""
        response = self._stub.Complete(
            pb.CompleteRequest(work_id=work_id, lease_token=lease_token), timeout=self._timeout
        )
        return convert.work_from_proto(response.work)

    def fail(
        self,
        work_id: str,
        *,
        lease_token: str,
        error: str,
        retryable: bool = True,
        retry_after: dt.timedelta | None = None,
        traceback: str | None = None,
    ) -> WorkItemRow:
        """Record a failed attempt: retried after backoff, else (not ``retryable``, no attempts left) failed.

        ``retry_after``: retry after that delay instead, the attempt not counted (``RetryLater``).
        ``traceback``: the Flow's, stored with the attempt (at most ``workqueue.limits.TRACEBACK_MAX_BYTES``).
        """
        request = pb.FailRequest(
            work_id=work_id, lease_token=lease_token, error=error, retryable=retryable, traceback=traceback or ""
        )
        if retry_after is not None:
            request.retry_after.FromTimedelta(retry_after)
        response = self._stub.Fail(request, timeout=self._timeout)
        return convert.work_from_proto(response.work)

    def replay(self, work_id: str) -> ReplayResult:
        """Replay terminal work: the new generation and its replay Event's ordinal."""
        response = self._stub.Replay(pb.ReplayRequest(work_id=work_id), timeout=self._timeout)
        return ReplayResult(
            work=convert.work_from_proto(response.work), replay_event_ordinal=response.replay_event_ordinal
        )

    def get_work(self, work_id: str) -> WorkDescription:
        """A generation, its member count and its newest attempts that did not complete it."""
        response = self._stub.GetWork(pb.GetWorkRequest(work_id=work_id), timeout=self._timeout)
        return convert.work_description_from_proto(response)

    def explain_receipt(self, pack_install_id: str, *, receipt_key: str) -> ReceiptExplanation:
        """Where a receipt stands and which generation covers it (NOT_FOUND: no such receipt)."""
        response = self._stub.ExplainReceipt(
            pb.ExplainReceiptRequest(pack_install_id=pack_install_id, receipt_key=receipt_key), timeout=self._timeout
        )
        return convert.explanation_from_proto(response)

    def list_receipts(
        self, state: str, *, pack_install_id: str = "", page_size: int = 0, page_token: str = ""
    ) -> tuple[list[ReceiptSummary], str]:
        """One page of receipts in ``state`` (of one pack, or every pack) and the next page's token ("" at the end)."""
        response = self._stub.ListReceipts(
            pb.ListReceiptsRequest(
                state=state, pack_install_id=pack_install_id, page_size=page_size, page_token=page_token
            ),
            timeout=self._timeout,
        )
        return [convert.receipt_from_proto(r) for r in response.receipts], response.next_page_token

    def queue_state(self, pack_install_id: str) -> QueueState:
        """The pack's native queue: depth per status, receipts waiting, its oldest waiting generation and age."""
        response = self._stub.GetQueueState(
            pb.GetQueueStateRequest(pack_install_id=pack_install_id), timeout=self._timeout
        )
        return convert.queue_state_from_proto(response.state)

    def wait_queue_drained(self, pack_install_id: str, *, timeout: dt.timedelta) -> QueueState:
        """The pack's queue state once it is drained, or the last one read when ``timeout`` passes first.

        Check ``QueueState.drained``: the deadline is an answer, not an error. Each
        WaitQueueDrained call waits at most the server's bound; this calls it again until
        ``timeout`` (``workqueue.draining``).
        """

        def step(wait: dt.timedelta) -> QueueState:
            response = self._stub.WaitQueueDrained(
                pb.WaitQueueDrainedRequest(
                    pack_install_id=pack_install_id, wait_ms=min(wait // dt.timedelta(milliseconds=1), MAX_WAIT_MS)
                ),
                timeout=self._timeout + wait.total_seconds(),  # the server's wait is not its processing time
            )
            return convert.queue_state_from_proto(response.state)

        return wait_until_drained(step, timeout=timeout)

    def list_generations(
        self,
        pack_install_id: str,
        *,
        route: Route | None,
        page_size: int = 0,
        page_token: str = "",
        status: WorkStatus | None = None,
    ) -> GenerationPage:
        """One page of generations, newest first, and the next page's token ("" at the end).

        ``route`` names one identity; None lists the pack's, identity after identity. ``status``
        keeps only generations in that status (None: every status).
        """
        response = self._stub.ListGenerations(
            pb.ListGenerationsRequest(
                pack_install_id=pack_install_id,
                route=convert.route_to_proto(route) if route is not None else None,
                page_size=page_size,
                page_token=page_token,
                status=convert.STATUSES[status] if status is not None else pb.WORK_STATUS_UNSPECIFIED,
            ),
            timeout=self._timeout,
        )
        return convert.generations_from_proto(response)

    def list_members(self, work_id: str, *, page_size: int = 0, page_token: str = "") -> MemberPage:
        """One page of a generation's members in ordinal order, without a lease, and the next page's token."""
        response = self._stub.ListMembers(
            pb.ListMembersRequest(work_id=work_id, page_size=page_size, page_token=page_token), timeout=self._timeout
        )
        return convert.members_from_proto(response)

    def set_retention_policy(
        self,
        pack_install_id: str,
        *,
        keep_generations: int | None,
        keep_seconds: int | None,
        duplicate_window_seconds: int | None = None,
    ) -> RetentionPolicy:
        """Set a pack's retention policy (both limits None: pruning off; no window: tombstones kept forever)."""
        request = pb.SetRetentionPolicyRequest(
            pack_install_id=pack_install_id,
            keep_generations=keep_generations,
            keep_seconds=keep_seconds,
            duplicate_window_seconds=duplicate_window_seconds,
        )
        response = self._stub.SetRetentionPolicy(request, timeout=self._timeout)
        return convert.policy_from_proto(response.policy)

    def get_retention_policy(self, pack_install_id: str) -> RetentionPolicy:
        """A pack's retention policy and horizons (off when none was set)."""
        response = self._stub.GetRetentionPolicy(
            pb.GetRetentionPolicyRequest(pack_install_id=pack_install_id), timeout=self._timeout
        )
        return convert.policy_from_proto(response.policy)

    def prune(self, pack_install_id: str, *, dry_run: bool = False, max_generations: int = 0) -> PruneReport:
        """One bounded pruning and expiry pass over a pack now; ``dry_run`` only counts what would go."""
        response = self._stub.Prune(
            pb.PruneRequest(pack_install_id=pack_install_id, dry_run=dry_run, max_generations=max_generations),
            timeout=self._timeout,
        )
        return convert.prune_report_from_proto(response)
