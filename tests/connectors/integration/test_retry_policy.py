"""Retry policy per work type, attempt history and retry-now, on every backend (decision 175).

Backoff is read from the database: a retry's ClaimableAt less the failed attempt's FinishedAt,
both the database clock's instant of the Fail that wrote them; nothing sleeps.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.queue.retries import Source
from nexuscrm_connectors.settings import Settings
from nexuscrm_schema.tables import WorkAttempt, WorkItem
from nexuscrm_sdk import Generation, Worker
from tests.support.checksums import database_digest
from tests.support.factories import FakeClock, delivery, install_pack, route
from tests.support.invariants import assert_invariants
from workqueue import WorkStatus
from workqueue.errors import DomainError, ErrorKind
from workqueue.limits import TRACEBACK_MAX_BYTES
from workqueue.statuses import AttemptOutcome
from workqueue.values import Claim, IngestItem

pytestmark = pytest.mark.database


def _item(work_type: str, lane: str) -> IngestItem:
    return IngestItem(receipt_key=f"{work_type}-{lane}", route=route(lane, work_type=work_type), payload=b"{}")


def _claim_one(connectors: Connectors, pack: str, worker_id: str = "w", **options: object) -> Claim:
    (claim,) = connectors.claim(worker_id, pack_install_ids=[pack], **options)  # type: ignore[arg-type]
    return claim


def _attempts(engine: sa.Engine, work_id: str) -> list[sa.Row[tuple[object, ...]]]:
    with engine.connect() as connection:
        return list(
            connection.execute(
                sa.select(WorkAttempt).where(WorkAttempt.c.WorkId == work_id).order_by(WorkAttempt.c.Attempt)
            )
        )


def _backoff(engine: sa.Engine, work_id: str) -> float:
    """Seconds between the generation's last failed attempt (its Fail's instant) and its next claimable time."""
    with engine.connect() as connection:
        claimable = connection.execute(
            sa.select(WorkItem.c.ClaimableAt).where(WorkItem.c.WorkId == work_id)
        ).scalar_one()
    return float((claimable - _attempts(engine, work_id)[-1].FinishedAt).total_seconds())


def test_a_work_types_policy_decides_its_attempts_and_backoff_while_another_keeps_the_default(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[_item("fragile", "a"), _item("slow", "b"), _item("project", "c")])
    fragile = connectors.set_retry_policy(pack, "fragile", max_attempts=1, set_by="ops@acme", reason="poison inputs")
    assert (fragile.source, fragile.set_by, fragile.set_at is not None) == (Source.WORK_TYPE, "ops@acme", True)
    connectors.set_retry_policy(
        pack, "slow", max_attempts=3, backoff_base_seconds=60, backoff_max_seconds=90, set_by="o", reason="r"
    )
    assert connectors.get_retry_policy(pack, "fragile") == fragile
    default = connectors.get_retry_policy(pack, "project")
    assert (default.source, default.max_attempts, default.backoff_base_seconds) == (Source.DEFAULT, 5, 1)
    assert [p.work_type for p in connectors.work_type_retry_policies(pack)] == ["fragile", "slow"]

    claims = {c.work.work_type: c for c in connectors.claim("w", pack_install_ids=[pack], max_items=3)}
    failed = {
        work_type: connectors.fail(c.work.work_id, lease_token=c.lease_token, error=f"{work_type} broke")
        for work_type, c in claims.items()
    }
    assert (failed["fragile"].status, failed["fragile"].attempt, failed["fragile"].max_attempts) == (
        WorkStatus.FAILED,
        1,
        1,
    )
    assert (failed["project"].status, failed["project"].max_attempts) == (WorkStatus.RETRY, 5)
    assert connectors.get_work(claims["fragile"].work.work_id).work.max_attempts == 1
    assert connectors.get_work(claims["project"].work.work_id).work.max_attempts == 5
    assert [a.Outcome for a in _attempts(engine, claims["fragile"].work.work_id)] == [AttemptOutcome.FAILED]
    assert _backoff(engine, claims["project"].work.work_id) == connectors.settings.backoff_seconds(1) == 1
    slow = claims["slow"].work.work_id
    assert _backoff(engine, slow) == 60

    clock.advance(60)
    again = _claim_one(connectors, pack, work_types=["slow"])
    connectors.fail(again.work.work_id, lease_token=again.lease_token, error="slow broke again")
    assert _backoff(engine, slow) == 90  # 60 doubled, at most the policy's 90
    assert [a.Outcome for a in _attempts(engine, slow)] == [AttemptOutcome.RETRY, AttemptOutcome.RETRY]
    assert_invariants(engine)


def test_every_attempt_that_did_not_complete_is_recorded_with_worker_times_error_and_traceback(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock
) -> None:
    pack = install_pack(engine)
    (admitted,) = connectors.ingest(pack, items=[delivery(lane="a")])
    work_id = admitted.work_id
    assert work_id is not None

    def broken(generation: Generation) -> None:
        list(generation.inputs)
        raise ValueError("the CRM refused the contact")

    worker = Worker(connectors, broken, worker_id="w-1", pack_install_ids=[pack], claim_wait=dt.timedelta(0))
    assert worker.run_once()
    clock.advance(connectors.settings.backoff_seconds(1))
    lost = _claim_one(connectors, pack, "w-2", lease=dt.timedelta(seconds=5))
    clock.advance(6)  # w-2 stopped: its lease expires and w-3 takes the generation over
    later = _claim_one(connectors, pack, "w-3")
    assert later.lease_token != lost.lease_token
    connectors.fail(
        work_id,
        lease_token=later.lease_token,
        error="RetryLater: maintenance",
        retry_after=dt.timedelta(minutes=1),
        traceback="Traceback (most recent call last):\n  ...\nRetryLater: maintenance\n",
    )
    clock.advance(60)
    done = _claim_one(connectors, pack, "w-4")
    connectors.complete(work_id, lease_token=done.lease_token)

    rows = _attempts(engine, work_id)
    assert [(r.Attempt, r.WorkerId, r.Outcome) for r in rows] == [
        (1, "w-1", AttemptOutcome.RETRY),
        (2, "w-2", AttemptOutcome.EXPIRED),
        (3, "w-3", AttemptOutcome.RETRY_LATER),
    ]  # and none of w-4's, which completed it
    assert all(r.StartedAt is not None and r.StartedAt <= r.FinishedAt for r in rows)
    assert rows[0].Error == "ValueError: the CRM refused the contact"
    assert rows[0].Traceback.startswith("Traceback (most recent call last):")
    assert rows[0].Traceback.rstrip().endswith("ValueError: the CRM refused the contact")
    assert rows[1].FinishedAt == rows[1].StartedAt + dt.timedelta(seconds=5)  # the lease's expiry
    assert (rows[1].Traceback, rows[2].Traceback) == (
        None,
        "Traceback (most recent call last):\n  ...\nRetryLater: maintenance\n",
    )

    described = connectors.get_work(work_id)
    assert described.attempt_count == 3
    assert [(a.attempt, a.worker_id, a.outcome, a.error) for a in described.attempts] == [
        (r.Attempt, r.WorkerId, r.Outcome, r.Error) for r in rows
    ]
    with engine.connect() as connection:
        claimed_at = connection.execute(sa.select(WorkItem.c.ClaimedAt).where(WorkItem.c.WorkId == work_id)).scalar()
    assert claimed_at is not None and rows[2].FinishedAt < claimed_at  # w-4's lease, after w-3's attempt
    assert_invariants(engine)


def test_expired_leases_taken_over_together_and_retired_on_the_last_attempt_are_recorded_expired(
    engine: sa.Engine, clock: FakeClock
) -> None:
    twice = Connectors(engine, Settings(max_attempts=2), clock=clock)
    pack = install_pack(engine)
    work_ids = [str(r.work_id) for r in twice.ingest(pack, items=[delivery(lane="a"), delivery(lane="b")])]
    lease = dt.timedelta(seconds=5)
    assert len(twice.claim("w-gone", pack_install_ids=[pack], max_items=2, lease=lease)) == 2
    clock.advance(6)
    assert len(twice.claim("w-lost", pack_install_ids=[pack], max_items=2, lease=lease)) == 2  # both taken over
    clock.advance(6)
    assert twice.claim("w", pack_install_ids=[pack], max_items=2) == []  # retired: their last attempt expired
    for work_id in work_ids:
        assert twice.get_work(work_id).work.status is WorkStatus.FAILED
        assert [(r.Attempt, r.WorkerId, r.Outcome) for r in _attempts(engine, work_id)] == [
            (1, "w-gone", AttemptOutcome.EXPIRED),
            (2, "w-lost", AttemptOutcome.EXPIRED),
        ]
    assert_invariants(engine)


def test_retry_now_ends_a_backoff_and_retention_prunes_the_attempts_with_their_generation(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    (admitted,) = connectors.ingest(pack, items=[delivery(lane="a")])
    work_id = admitted.work_id
    assert work_id is not None
    connectors.set_retry_policy(pack, "project", max_attempts=3, backoff_base_seconds=3600, set_by="o", reason="r")
    claim = _claim_one(connectors, pack)
    connectors.fail(work_id, lease_token=claim.lease_token, error="boom", traceback="Traceback ...")
    assert connectors.claim("w", pack_install_ids=[pack]) == []  # an hour of backoff
    retried = connectors.retry_now(work_id, retried_by="ops@acme", reason="the CRM is back")
    assert retried.status is WorkStatus.RETRY
    again = _claim_one(connectors, pack)  # at once: no clock moved
    connectors.complete(work_id, lease_token=again.lease_token)
    connectors.ingest(pack, items=[delivery(lane="a")])
    newer = _claim_one(connectors, pack)
    connectors.complete(newer.work.work_id, lease_token=newer.lease_token)

    assert len(_attempts(engine, work_id)) == 1
    connectors.set_retention_policy(pack, keep_generations=1, keep_seconds=None)
    assert connectors.prune(pack).generations == 1
    assert _attempts(engine, work_id) == []
    assert_invariants(engine)


def test_out_of_range_policies_unknown_work_and_refused_retries_change_nothing(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane="a"), delivery(lane="b")])
    running = _claim_one(connectors, pack)
    pending = [
        g.work_id
        for g in connectors.list_generations(pack, route=None).generations
        if g.work_id != running.work.work_id
    ]

    def set_(**options: object) -> Callable[[], object]:
        chosen: dict[str, object] = {"max_attempts": 3, "set_by": "o", "reason": "r", **options}
        work_type = str(chosen.pop("work_type", "project"))
        return lambda: connectors.set_retry_policy(pack, work_type, **chosen)  # type: ignore[arg-type]

    refusals: list[tuple[ErrorKind, str, str, Callable[[], object]]] = [
        (ErrorKind.INVALID_ARGUMENT, "max_attempts", "between 1 and 100, got 0", set_(max_attempts=0)),
        (ErrorKind.INVALID_ARGUMENT, "max_attempts", "between 1 and 100, got 101", set_(max_attempts=101)),
        (ErrorKind.INVALID_ARGUMENT, "backoff_base_seconds", "between 0 and 86400", set_(backoff_base_seconds=-1)),
        (ErrorKind.INVALID_ARGUMENT, "backoff_base_seconds", "got 86401", set_(backoff_base_seconds=86401)),
        (
            ErrorKind.INVALID_ARGUMENT,
            "backoff_max_seconds",
            "between backoff_base_seconds (60) and 86400, got 30",
            set_(backoff_base_seconds=60, backoff_max_seconds=30),
        ),
        (ErrorKind.INVALID_ARGUMENT, "backoff_max_seconds", "got 86401", set_(backoff_max_seconds=86401)),
        (ErrorKind.INVALID_ARGUMENT, "work_type", "work_type is required", set_(work_type="")),
        (ErrorKind.INVALID_ARGUMENT, "reason", "reason is required", set_(reason="")),
        (ErrorKind.NOT_FOUND, "work_type", "the pack has no generation of it", set_(work_type="nosuch")),
        (ErrorKind.NOT_FOUND, "work_type", "no generation of it", lambda: connectors.get_retry_policy(pack, "nosuch")),
        (
            ErrorKind.NOT_FOUND,
            "pack_install_id",
            "not installed",
            lambda: connectors.set_retry_policy("pk-none", "project", max_attempts=1, set_by="o", reason="r"),
        ),
        (
            ErrorKind.FAILED_PRECONDITION,
            "work_id",
            f"work {running.work.work_id} is processing; only a generation waiting in retry",
            lambda: connectors.retry_now(running.work.work_id, retried_by="o", reason="r"),
        ),
        (
            ErrorKind.FAILED_PRECONDITION,
            "work_id",
            f"work {pending[0]} is pending",
            lambda: connectors.retry_now(pending[0], retried_by="o", reason="r"),
        ),
        (
            ErrorKind.NOT_FOUND,
            "work_id",
            "does not exist",
            lambda: connectors.retry_now("w-x", retried_by="o", reason="r"),
        ),
        (
            ErrorKind.INVALID_ARGUMENT,
            "traceback",
            f"at most {TRACEBACK_MAX_BYTES} bytes of UTF-8, got {TRACEBACK_MAX_BYTES + 2}",
            lambda: connectors.fail(
                running.work.work_id,
                lease_token=running.lease_token,
                error="x",
                traceback="é" * (TRACEBACK_MAX_BYTES // 2 + 1),
            ),
        ),
    ]
    before = database_digest(engine)
    for kind, field, message, call in refusals:
        with pytest.raises(DomainError, match=re.escape(message)) as refused:
            call()
        assert (refused.value.kind, refused.value.field) == (kind, field), message
    assert database_digest(engine) == before
    connectors.complete(running.work.work_id, lease_token=running.lease_token)
    assert_invariants(engine)
