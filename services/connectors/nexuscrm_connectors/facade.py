"""The Connectors domain facade: every operation of ConnectorsService, without gRPC.

The servicer and in-process workers call this class; it only binds the engine, settings
and clock to the modules that own each operation, counts what they return
(``nexuscrm_connectors.metrics``), and wakes waiting claims when an operation may have made
work claimable (``nexuscrm_connectors.reservations``). Counting and waking follow a committed
transaction (``database.follow_up``): their failure is logged, never the caller's answer,
so an answer never hides committed work; waiting claims poll anyway
(``settings.claim_poll_ms``).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator, Mapping, Sequence

from sqlalchemy.engine import Engine

from nexuscrm_connectors import metrics, payload_contract
from nexuscrm_connectors.context import Context
from nexuscrm_connectors.operating import (
    claim_pauses,
    coverage,
    dead_letters,
    generations,
    identities,
    operator_reads,
    order_policy,
    queue_state,
    retention,
    retry_policy,
)
from nexuscrm_connectors.operating.claim_pauses import ClaimPause
from nexuscrm_connectors.queries.dead_letters import Filter
from nexuscrm_connectors.queue import admission, claims, liveness, materializer, payloads, replay, retries
from nexuscrm_connectors.queue.deliveries import RefusedItem
from nexuscrm_connectors.reservations import Reservations
from nexuscrm_connectors.settings import Settings
from nexuscrm_runtime.clock import DATABASE_CLOCK, DatabaseClock
from nexuscrm_runtime.database import follow_up
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
    Outcome,
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


class Connectors:
    """Admission, duplicates, replay, claims and payload reads over one database.

    The operations it shares with ``nexuscrm_sdk.client.ConnectorsClient`` have the same
    signatures (a test compares them), so either serves as a ``WorkSource``. Unlike the
    client's, the datetimes it returns are naive UTC, as the services store them.
    """

    def __init__(self, engine: Engine, settings: Settings | None = None, clock: DatabaseClock = DATABASE_CLOCK) -> None:
        self.engine = engine
        self.settings = settings or Settings()
        self.clock = clock
        self.admission = admission.Admission(engine, self.settings, clock)
        self.reservations = Reservations(self.settings.max_claim_waiters)
        self.context = Context(engine, self.settings, clock, self.reservations)
        self.stranded = liveness.StrandedSweep()
        self.pruner = retention.Pruner()
        payload_contract.refresh(engine)  # read at start; refreshed before writes of Events while unset

    def _refresh_payload_contract(self) -> None:
        """Refresh the payload contract's cached flag when stale, outside the operation's transaction."""
        payload_contract.refresh(self.engine)

    def ingest(self, pack_install_id: str, *, items: Sequence[IngestItem]) -> list[IngestResult]:
        """See ``admission.Admission.ingest``."""
        return self.ingest_received(pack_install_id, items=items)

    def ingest_received(self, pack_install_id: str, *, items: Sequence[IngestItem | RefusedItem]) -> list[IngestResult]:
        """``ingest`` as the servicer calls it: an item the transport refused stands as its ``RefusedItem``."""
        self._refresh_payload_contract()
        results = self.admission.ingest(pack_install_id, items)
        follow_up("admission", lambda: metrics.record_ingest(results))
        if any(result.outcome is Outcome.ADMITTED for result in results):
            follow_up("admission", self.reservations.notify)
        return results

    def materialize(self, limit: int = 500) -> int:
        """See ``materializer.materialize``."""
        self._refresh_payload_contract()
        admitted = materializer.materialize(self.admission, limit)
        if admitted:
            follow_up("admission", self.reservations.notify)
        return admitted

    def heal_stranded(self) -> int:
        """One pass of ``liveness.StrandedSweep``, counted by ``nexuscrm_stranded_generations_healed_total``."""
        healed = self.stranded.run(self.engine, self.clock)
        if healed:
            follow_up("heal stranded", lambda: metrics.STRANDED_HEALED.inc(healed))
            follow_up("heal stranded", self.reservations.notify)
        return healed

    def prune_pass(self) -> list[PruneReport]:
        """One background pass of ``retention.Pruner``, counted by ``nexuscrm_retention_*``.

        Rounds go on while candidates remain, for up to the background loop's interval: the
        loop sleeps as long again, so retention takes at most about half of its thread's time.
        """
        with metrics.PRUNE_PASS_SECONDS.time():
            reports = self.pruner.run(self.context, self.settings.materialize_interval_seconds)
        follow_up("retention", lambda: metrics.record_prune(reports, self.pruner.backlog))
        return reports

    def prune(self, pack_install_id: str, *, dry_run: bool = False, max_generations: int = 0) -> PruneReport:
        """See ``retention.prune`` (one pass from the start of the pack's candidates)."""
        report, _ = retention.prune(self.context, pack_install_id, dry_run=dry_run, max_generations=max_generations)
        follow_up("retention", lambda: metrics.record_prune([report]))
        return report

    def set_retention_policy(
        self,
        pack_install_id: str,
        *,
        keep_generations: int | None,
        keep_seconds: int | None,
        duplicate_window_seconds: int | None = None,
    ) -> RetentionPolicy:
        """See ``retention.set_policy``."""
        return retention.set_policy(
            self.context,
            pack_install_id,
            keep_generations=keep_generations,
            keep_seconds=keep_seconds,
            duplicate_window_seconds=duplicate_window_seconds,
        )

    def get_retention_policy(self, pack_install_id: str) -> RetentionPolicy:
        """See ``retention.describe_policy``: the policy, its horizons and the pruner's backlog."""
        return retention.describe_policy(self.context, pack_install_id)

    def replay(self, work_id: str) -> ReplayResult:
        """See ``replay.replay``."""
        self._refresh_payload_contract()
        replayed = replay.replay(self.context, work_id)
        follow_up("replay", metrics.GENERATIONS_CREATED.labels("replay").inc)
        follow_up("replay", self.reservations.notify)
        return replayed

    def claim(
        self,
        worker_id: str,
        *,
        pack_install_ids: Sequence[str] = (),
        work_types: Sequence[str] = (),
        flow_versions: Sequence[str] = (),
        max_items: int = 1,
        lease: dt.timedelta | None = None,
        wait: dt.timedelta = dt.timedelta(0),
        inline_inputs: bool = False,
    ) -> list[Claim]:
        """See ``claims.claim``; ``inline_inputs``: claims carry inputs that fit (``payloads.whole_pages``)."""
        return self.complete_and_claim(
            worker_id,
            completions=(),
            pack_install_ids=pack_install_ids,
            work_types=work_types,
            flow_versions=flow_versions,
            max_items=max_items,
            lease=lease,
            wait=wait,
            inline_inputs=inline_inputs,
        ).claims

    def complete_and_claim(
        self,
        worker_id: str,
        *,
        completions: Sequence[Completion],
        pack_install_ids: Sequence[str] = (),
        work_types: Sequence[str] = (),
        flow_versions: Sequence[str] = (),
        max_items: int = 1,
        lease: dt.timedelta | None = None,
        wait: dt.timedelta = dt.timedelta(0),
        inline_inputs: bool = False,
    ) -> ClaimAnswer:
        """Complete ``completions`` (each answered on its own, one transaction), then claim as ``claim``.

        See ``claims.complete_all`` and ``claims.claim``.
        """
        claims.validate_completions(completions, self.settings.max_claim_items)
        self._refresh_payload_contract()
        batch = claims.claim(
            self.context,
            worker_id=worker_id,
            pack_install_ids=pack_install_ids,
            work_types=work_types,
            flow_versions=flow_versions,
            max_items=max_items,
            lease_seconds=lease_seconds(lease),
            wait=wait,
            read_inputs=(lambda c, works: payloads.whole_pages(c, self.settings, works)) if inline_inputs else None,
            complete_first=(lambda c: claims.complete_all(c, self.clock, completions)) if completions else None,
        )
        follow_up("claim", lambda: metrics.record_claim(batch))  # the leases are the caller's: never lose them
        done = [result.work for result in batch.completed if result.work is not None]
        if done:

            def count() -> None:
                for work in done:
                    metrics.record_finish(work)

            follow_up("complete", count)  # the claim woke waiting claims once they committed
        return ClaimAnswer(claims=batch.claims, completed=batch.completed)

    def load_inputs(self, work_id: str, *, lease_token: str, page_size: int = 0) -> Iterator[InputPage]:
        """See ``payloads.load_inputs``."""
        return metrics.observed_pages(payloads.load_inputs(self.context, work_id, lease_token, page_size))

    def load_replayed_inputs(self, work_id: str, *, lease_token: str, page_size: int = 0) -> Iterator[InputPage]:
        """See ``payloads.load_replayed_inputs``."""
        return payloads.load_replayed_inputs(self.context, work_id, lease_token, page_size)

    def heartbeat(self, work_id: str, *, lease_token: str, lease: dt.timedelta | None = None) -> dt.datetime:
        """See ``claims.heartbeat``."""
        return claims.heartbeat(self.context, work_id, lease_token, lease_seconds(lease))

    def complete(self, work_id: str, *, lease_token: str) -> WorkItemRow:
        """See ``claims.complete``."""
        self._refresh_payload_contract()
        work = claims.complete(self.context, work_id, lease_token)
        follow_up("complete", lambda: metrics.record_finish(work))
        follow_up("complete", self.reservations.notify)  # its successor may have become claimable
        return work

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
        """See ``claims.fail``."""
        self._refresh_payload_contract()
        work = claims.fail(
            self.context,
            work_id,
            lease_token,
            error,
            retryable=retryable,
            retry_after=retry_after,
            traceback=traceback,
        )
        follow_up("fail", lambda: metrics.record_finish(work, retryable=retryable))
        if work.status is WorkStatus.FAILED:
            follow_up("fail", self.reservations.notify)  # its successor may have become claimable
        return work

    def get_work(self, work_id: str) -> WorkDescription:
        """See ``operator_reads.get_work``."""
        return operator_reads.get_work(self.context, work_id)

    def list_receipts(
        self, state: str, *, pack_install_id: str = "", page_size: int = 0, page_token: str = ""
    ) -> tuple[list[ReceiptSummary], str]:
        """See ``operator_reads.list_receipts``."""
        return operator_reads.list_receipts(self.context, state, pack_install_id, page_size, page_token)

    def explain_receipt(self, pack_install_id: str, *, receipt_key: str) -> ReceiptExplanation:
        """See ``operator_reads.explain_receipt``."""
        return operator_reads.explain_receipt(self.engine, pack_install_id, receipt_key)

    def queue_state(self, pack_install_id: str) -> QueueState:
        """See ``queue_state.queue_state``."""
        return queue_state.queue_state(self.context, pack_install_id)

    def wait_queue_drained(self, pack_install_id: str, *, timeout: dt.timedelta) -> QueueState:
        """The pack's queue state once drained, or the last one read when ``timeout`` passes (as the client's)."""
        return wait_until_drained(
            lambda wait: self.wait_queue_drained_once(pack_install_id, wait=wait), timeout=timeout
        )

    def wait_queue_drained_once(
        self, pack_install_id: str, *, wait: dt.timedelta, active: Callable[[], bool] = lambda: True
    ) -> QueueState:
        """One wait of WaitQueueDrained, at most ``settings.max_claim_wait_ms``: see ``queue_state.wait_drained``."""
        return queue_state.wait_drained(self.context, pack_install_id, wait, active)

    def list_generations(
        self,
        pack_install_id: str,
        *,
        route: Route | None,
        page_size: int = 0,
        page_token: str = "",
        status: WorkStatus | None = None,
    ) -> GenerationPage:
        """See ``generations.list_generations``."""
        return generations.list_generations(self.context, pack_install_id, route, page_size, page_token, status)

    def list_members(self, work_id: str, *, page_size: int = 0, page_token: str = "") -> MemberPage:
        """See ``generations.list_members``."""
        return generations.list_members(self.context, work_id, page_size, page_token)

    # Operating projections (issue 37): claim pauses and the dead-letter queue.

    def pause_claims(
        self, scope: claim_pauses.Scope, *, paused_by: str, reason: str, expires_at: dt.datetime | None = None
    ) -> ClaimPause:
        """See ``claim_pauses.pause``."""
        paused = claim_pauses.pause(self.context, scope, paused_by=paused_by, reason=reason, expires_at=expires_at)
        follow_up("pause claims", metrics.CLAIM_PAUSES.labels("pause", scope.scope.value).inc)
        return paused

    def resume_claims(self, scope: claim_pauses.Scope, *, resumed_by: str) -> ClaimPause:
        """See ``claim_pauses.resume``; waiting claims are woken: the scope's work is claimable again."""
        resumed = claim_pauses.resume(self.context, scope, resumed_by=resumed_by)
        follow_up("resume claims", metrics.CLAIM_PAUSES.labels("resume", scope.scope.value).inc)
        follow_up("resume claims", self.reservations.notify)
        return resumed

    def list_claim_pauses(self, pack_install_id: str) -> list[ClaimPause]:
        """See ``claim_pauses.list_pauses``."""
        return claim_pauses.list_pauses(self.context, pack_install_id)

    def list_dead_letters(
        self, pack_install_id: str, wanted: Filter, *, page_size: int = 0, page_token: str = ""
    ) -> dead_letters.DeadLetterPage:
        """See ``dead_letters.list_dead_letters``."""
        return dead_letters.list_dead_letters(self.context, pack_install_id, wanted, page_size, page_token)

    def get_coverage(
        self, pack_install_id: str, wanted: Filter, *, page_size: int = 0, page_token: str = ""
    ) -> coverage.CoveragePage:
        """See ``coverage.get_coverage``."""
        return coverage.get_coverage(self.context, pack_install_id, wanted, page_size, page_token)

    def list_identities(
        self, pack_install_id: str, wanted: Mapping[str, str], *, page_size: int = 0, page_token: str = ""
    ) -> identities.IdentityPage:
        """See ``identities.list_identities``."""
        return identities.list_identities(self.context, pack_install_id, wanted, page_size, page_token)

    def count_dead_letters(self, pack_install_id: str, wanted: Filter) -> dead_letters.DeadLetterCount:
        """See ``dead_letters.count_dead_letters``."""
        return dead_letters.count_dead_letters(self.engine, pack_install_id, wanted)

    def replay_dead_letters(
        self, pack_install_id: str, wanted: Filter, *, dry_run: bool, max_generations: int = 0, page_token: str = ""
    ) -> dead_letters.BulkCall:
        """See ``dead_letters.replay_dead_letters``: each dead letter replayed as ``replay`` replays one."""
        handled = dead_letters.replay_dead_letters(
            self.context,
            pack_install_id,
            wanted,
            lambda work_id: self.replay(work_id).work.work_id,
            dry_run=dry_run,
            max_generations=max_generations,
            page_token=page_token,
        )
        follow_up("replay dead letters", lambda: metrics.record_bulk(metrics.DEAD_LETTERS_REPLAYED, handled))
        return handled

    def skip_dead_letters(
        self,
        pack_install_id: str,
        wanted: Filter,
        *,
        skipped_by: str,
        reason: str,
        dry_run: bool,
        max_generations: int = 0,
        page_token: str = "",
    ) -> dead_letters.BulkCall:
        """See ``dead_letters.skip_dead_letters``: each dead letter skipped as ``skip_dead_letter`` skips one.

        The operator and reason are checked first (``InvalidArgument``), a dry run's too: they are
        the request's, not one dead letter's.
        """
        order_policy.validate_skip(skipped_by, reason)
        handled = dead_letters.skip_dead_letters(
            self.context,
            pack_install_id,
            wanted,
            lambda work_id: self.skip_dead_letter(work_id, skipped_by=skipped_by, reason=reason),
            dry_run=dry_run,
            max_generations=max_generations,
            page_token=page_token,
        )
        follow_up("skip dead letters", lambda: metrics.record_bulk(metrics.DEAD_LETTERS_SKIPPED, handled))
        return handled

    def set_order_policy(
        self,
        pack_install_id: str,
        policy: order_policy.Policy | None,
        *,
        set_by: str,
        reason: str,
        work_type: str = "",
    ) -> order_policy.OrderPolicy:
        """See ``order_policy.set_policy``; waiting claims are woken: held work may be claimable now."""
        changed = order_policy.set_policy(
            self.context, pack_install_id, policy, set_by=set_by, reason=reason, work_type=work_type
        )
        follow_up("set order policy", self.reservations.notify)
        return changed

    def get_order_policy(self, pack_install_id: str, work_type: str = "") -> order_policy.OrderPolicy:
        """See ``order_policy.get_policy``."""
        return order_policy.get_policy(self.engine, pack_install_id, work_type)

    def work_type_order_policies(self, pack_install_id: str) -> list[order_policy.OrderPolicy]:
        """See ``order_policy.work_type_policies``."""
        return order_policy.work_type_policies(self.engine, pack_install_id)

    def order_holds(self, work_ids: Sequence[str]) -> dict[str, tuple[str, str]]:
        """See ``order_policy.holds``: what each held generation waits for, with the reason an operator reads."""
        return order_policy.holds(self.engine, work_ids)

    def failure_tally(self, pack_install_id: str) -> tuple[int, int]:
        """See ``dead_letters.failure_tally``."""
        return dead_letters.failure_tally(self.engine, pack_install_id)

    def order_held_count(self, pack_install_id: str) -> int:
        """See ``order_policy.held_count``."""
        return order_policy.held_count(self.engine, pack_install_id)

    def skip_dead_letter(self, work_id: str, *, skipped_by: str, reason: str) -> order_policy.Skip:
        """See ``order_policy.skip``; waiting claims are woken: the successor it held may be claimable."""
        skipped = order_policy.skip(self.context, work_id, skipped_by=skipped_by, reason=reason)
        follow_up("skip dead letter", self.reservations.notify)
        return skipped

    def skips(self, work_ids: Sequence[str]) -> dict[str, order_policy.Skip]:
        """See ``order_policy.skips``."""
        return order_policy.skips(self.engine, work_ids)

    def set_retry_policy(
        self,
        pack_install_id: str,
        work_type: str,
        *,
        max_attempts: int,
        backoff_base_seconds: int | None = None,
        backoff_max_seconds: int | None = None,
        set_by: str,
        reason: str,
    ) -> retries.RetryPolicy:
        """See ``retry_policy.set_policy``."""
        return retry_policy.set_policy(
            self.context,
            pack_install_id,
            work_type,
            max_attempts=max_attempts,
            backoff_base_seconds=backoff_base_seconds,
            backoff_max_seconds=backoff_max_seconds,
            set_by=set_by,
            reason=reason,
        )

    def get_retry_policy(self, pack_install_id: str, work_type: str = "") -> retries.RetryPolicy:
        """See ``retry_policy.get_policy``."""
        return retry_policy.get_policy(self.context, pack_install_id, work_type)

    def work_type_retry_policies(self, pack_install_id: str) -> list[retries.RetryPolicy]:
        """See ``retry_policy.work_type_policies``."""
        return retry_policy.work_type_policies(self.engine, pack_install_id)

    def retry_now(self, work_id: str, *, retried_by: str, reason: str) -> WorkItemRow:
        """See ``retry_policy.retry_now``; waiting claims are woken: the generation is claimable now."""
        work = retry_policy.retry_now(self.context, work_id, retried_by=retried_by, reason=reason)
        follow_up("retry now", self.reservations.notify)
        return work
