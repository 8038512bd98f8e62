"""The order policy per pack, enforced by Claim, and the operator's recorded skip, on every backend (decision 160)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any, cast

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.errors import UnknownPack, WorkNotFound, WorkPruned
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.operating.dead_letters import filter_of
from nexuscrm_connectors.operating.order_policy import (
    HoldInProgress,
    Policy,
    SkipRefused,
    Source,
    UnknownWorkType,
    hold_reason,
)
from nexuscrm_connectors.queries import claims as claims_sql
from nexuscrm_connectors.queries import order_policy as order_policy_sql
from nexuscrm_connectors.wire import policy_from_proto
from nexuscrm_schema.tables import WorkItem
from tests.support.checksums import database_digest
from tests.support.factories import FakeClock, delivery, install_pack, route
from tests.support.invariants import assert_invariants, check_invariants
from tests.support.plans import explain_problems
from tests.support.statements import capture
from workqueue import WorkStatus
from workqueue.errors import ErrorKind, InvalidArgument
from workqueue.values import Claim, IngestItem

pytestmark = pytest.mark.database


def _lane(claim: Claim) -> str:
    return claim.work.projection_key.rsplit(":", 1)[1]


def _failed_with_successor(connectors: Connectors, pack: str) -> tuple[str, str]:
    """Lane a's first generation failed for good, its successor admitted behind it; lane b pending. Their WorkIds."""
    connectors.ingest(pack, items=[delivery(lane="a")])
    (first,) = connectors.claim("w", pack_install_ids=[pack])
    (successor,) = [r.work_id for r in connectors.ingest(pack, items=[delivery(lane="a")])]
    connectors.ingest(pack, items=[delivery(lane="b")])
    connectors.fail(first.work.work_id, lease_token=first.lease_token, error="boom", retryable=False)
    assert successor is not None
    return first.work.work_id, successor


def _held(engine: sa.Engine, connectors: Connectors) -> tuple[str, str, str]:
    """A pack under "block" whose lane a is held behind its dead letter (lane b claimed and left running)."""
    pack = install_pack(engine)
    connectors.set_order_policy(pack, Policy.BLOCK, set_by="ops", reason="order")
    failed, successor = _failed_with_successor(connectors, pack)
    assert [_lane(c) for c in connectors.claim("w", pack_install_ids=[pack], max_items=10)] == ["b"]
    return pack, failed, successor


def test_continue_is_the_default_and_lets_successors_run(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    policy = connectors.get_order_policy(pack)
    assert (policy.policy, policy.set_at) == (Policy.CONTINUE, None)
    _, successor = _failed_with_successor(connectors, pack)
    claims = connectors.claim("w", pack_install_ids=[pack], max_items=10)
    assert sorted(_lane(c) for c in claims) == ["a", "b"] and successor in {c.work.work_id for c in claims}
    for claim in claims:
        connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    assert_invariants(engine)


def test_block_holds_the_identity_until_its_dead_letter_is_replayed(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    set_ = connectors.set_order_policy(pack, Policy.BLOCK, set_by="ops@acme", reason="ledger order matters")
    assert connectors.get_order_policy(pack) == set_ and set_.set_at is not None
    failed, successor = _failed_with_successor(connectors, pack)
    assert connectors.get_work(successor).work.status is WorkStatus.PENDING  # unblocked, but held by the claim
    claims = connectors.claim("w", pack_install_ids=[pack], max_items=10)
    assert [_lane(c) for c in claims] == ["b"]
    connectors.complete(claims[0].work.work_id, lease_token=claims[0].lease_token)
    connectors.ingest(pack, items=[delivery(lane="a")])  # admission goes on: it extends the held generation
    assert connectors.claim("w", pack_install_ids=[pack], max_items=10) == []

    # The head first (decision 174): the replay runs in the dead letter's place, the successor after it.
    replay = connectors.replay(failed)
    assert replay.work.status is WorkStatus.PENDING
    assert connectors.order_holds([successor]) == {
        successor: (replay.work.work_id, hold_reason(replay.work.work_id, dead_letter=False))
    }
    (later,) = [r.work_id for r in connectors.ingest(pack, items=[delivery(lane="a")])]
    assert later not in (replay.work.work_id, successor)  # neither the replay nor the held one is extended
    assert connectors.get_work(later).work.status is WorkStatus.BLOCKED  # behind the held successor
    assert_invariants(engine)
    order = []
    while claims := connectors.claim("w", pack_install_ids=[pack], max_items=10):
        assert len(claims) == 1, [
            (c.work.work_id, c.work.input_start_ordinal, c.work.lane_ordinal) for c in claims
        ]  # one at a time
        order.append(claims[0].work.work_id)
        assert_invariants(engine)  # X with the replay processing while its held successor waits
        connectors.complete(claims[0].work.work_id, lease_token=claims[0].lease_token)
    assert order == [replay.work.work_id, successor, later]
    assert_invariants(engine)


def _head_first(engine: sa.Engine, connectors: Connectors) -> tuple[str, str, str]:
    """A pack under "block" whose dead letter's replay runs before its held successor: pack, successor, replay."""
    pack, failed, successor = _held(engine, connectors)
    return pack, successor, connectors.replay(failed).work.work_id


def test_a_replay_run_first_that_fails_for_good_again_still_holds_and_its_replay_runs_first(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack, successor, replay = _head_first(engine, connectors)
    (claim,) = connectors.claim("w", pack_install_ids=[pack], max_items=10)
    assert claim.work.work_id == replay
    connectors.fail(replay, lease_token=claim.lease_token, error="still broken", retryable=False)
    assert connectors.claim("w", pack_install_ids=[pack], max_items=10) == []  # the successor stays held
    assert connectors.order_holds([successor]) == {successor: (replay, hold_reason(replay, dead_letter=True))}
    again = connectors.replay(replay).work.work_id  # runs before the same held successor
    assert_invariants(engine)
    order = []
    while claims := connectors.claim("w", pack_install_ids=[pack], max_items=10):
        (claimed,) = claims
        order.append(claimed.work.work_id)
        connectors.complete(claimed.work.work_id, lease_token=claimed.lease_token)
    assert order == [again, successor]
    assert_invariants(engine)


def test_a_skipped_replay_run_first_releases_what_it_held(engine: sa.Engine, connectors: Connectors) -> None:
    pack, successor, replay = _head_first(engine, connectors)
    (claim,) = connectors.claim("w", pack_install_ids=[pack], max_items=10)
    connectors.fail(replay, lease_token=claim.lease_token, error="still broken", retryable=False)
    connectors.skip_dead_letter(replay, skipped_by="ops@acme", reason="inputs re-sent upstream")
    (released,) = connectors.claim("w", pack_install_ids=[pack], max_items=10)
    assert released.work.work_id == successor
    connectors.complete(successor, lease_token=released.lease_token)
    assert_invariants(engine)


def test_continue_is_refused_while_a_replay_runs_first_and_changes_nothing(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack, successor, replay = _head_first(engine, connectors)
    with engine.connect() as connection:
        before = database_digest(connection)
    for work_type in ("", "project"):
        with pytest.raises(HoldInProgress, match=f"replay {replay} runs before held generation {successor}") as refused:
            connectors.set_order_policy(pack, Policy.CONTINUE, set_by="o", reason="r", work_type=work_type)
        assert refused.value.kind is ErrorKind.FAILED_PRECONDITION
    with engine.connect() as connection:
        assert database_digest(connection) == before
    (claim,) = connectors.claim("w", pack_install_ids=[pack], max_items=10)
    connectors.complete(replay, lease_token=claim.lease_token)
    assert connectors.set_order_policy(pack, Policy.CONTINUE, set_by="o", reason="r").policy is Policy.CONTINUE
    (released,) = connectors.claim("w", pack_install_ids=[pack], max_items=10)
    assert released.work.work_id == successor
    assert_invariants(engine)


def test_the_checker_sees_a_held_generation_that_ran_before_its_replay(
    engine: sa.Engine, connectors: Connectors
) -> None:
    _pack, successor, replay = _head_first(engine, connectors)
    assert check_invariants(engine) == []
    with engine.begin() as connection:  # the damage: the held generation finished first
        connection.execute(sa.update(WorkItem).where(WorkItem.c.WorkId == successor).values(Status="completed"))
    assert check_invariants(engine) == [
        f"X: {successor} is completed before replay {replay}, which runs first, finished"
    ]


def test_a_skip_is_recorded_releases_the_identity_and_leaves_the_dead_letters(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack, failed, successor = _held(engine, connectors)
    skipped = connectors.skip_dead_letter(failed, skipped_by="ops@acme", reason="bad input, fixed upstream")
    assert (skipped.work_id, skipped.pack_install_id, skipped.skipped_by) == (failed, pack, "ops@acme")
    assert connectors.get_work(failed).work.status is WorkStatus.FAILED  # no status rewritten
    assert connectors.list_dead_letters(pack, filter_of(pack)).dead_letters == ()
    (released,) = connectors.claim("w", pack_install_ids=[pack], max_items=10)
    assert released.work.work_id == successor
    connectors.complete(released.work.work_id, lease_token=released.lease_token)
    with engine.connect() as connection:
        before = database_digest(connection)
    refusals: list[tuple[type[Exception], str, Callable[[], object]]] = [
        (SkipRefused, "was skipped at", lambda: connectors.skip_dead_letter(failed, skipped_by="o", reason="r")),
        (
            SkipRefused,
            "only work that failed for good",
            lambda: connectors.skip_dead_letter(successor, skipped_by="o", reason="r"),
        ),
        (WorkNotFound, "does not exist", lambda: connectors.skip_dead_letter("w-nosuch", skipped_by="o", reason="r")),
        (InvalidArgument, "reason is required", lambda: connectors.skip_dead_letter(failed, skipped_by="o", reason="")),
        (
            InvalidArgument,
            "policy is required",
            lambda: connectors.set_order_policy(pack, None, set_by="o", reason="r"),
        ),
        (
            UnknownPack,
            "not installed",
            lambda: connectors.set_order_policy("pk-none", Policy.BLOCK, set_by="o", reason="r"),
        ),
        (UnknownPack, "not installed", lambda: connectors.get_order_policy("pk-none")),
    ]
    for error, message, call in refusals:
        with pytest.raises(error, match=message):
            call()
    with engine.connect() as connection:
        assert database_digest(connection) == before
    assert_invariants(engine)


def test_a_replayed_dead_letter_cannot_be_skipped_and_continue_releases_a_held_identity(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack, failed, successor = _held(engine, connectors)
    connectors.set_order_policy(pack, Policy.CONTINUE, set_by="ops", reason="progress first")
    (released,) = connectors.claim("w", pack_install_ids=[pack], max_items=10)
    assert released.work.work_id == successor
    connectors.complete(released.work.work_id, lease_token=released.lease_token)
    connectors.replay(failed)
    with pytest.raises(SkipRefused, match="was replayed as"):
        connectors.skip_dead_letter(failed, skipped_by="o", reason="r")
    (replayed,) = connectors.claim("w", pack_install_ids=[pack])
    connectors.complete(replayed.work.work_id, lease_token=replayed.lease_token)
    assert_invariants(engine)


def test_the_held_probe_is_index_seeks(engine: sa.Engine, connectors: Connectors, clock: FakeClock) -> None:
    pack = install_pack(engine)
    connectors.set_order_policy(pack, Policy.BLOCK, set_by="ops", reason="order")
    connectors.ingest(pack, items=[delivery(lane=f"l{n}") for n in range(30)])
    for claim in connectors.claim("w", pack_install_ids=[pack], max_items=30):
        connectors.fail(claim.work.work_id, lease_token=claim.lease_token, error="boom", retryable=False)
    connectors.ingest(pack, items=[delivery(lane=f"l{n}") for n in range(30)])  # 30 held successors
    with engine.begin() as connection, capture(engine) as captured:
        assert claims_sql.work_items_claimable(connection, [pack], [], clock, 10) == []
    (read,) = captured.statements
    with engine.connect() as connection:
        assert explain_problems(connection, read.statement, read.parameters) == []
    assert_invariants(engine)


def _invoice(lane: str) -> IngestItem:
    return IngestItem(receipt_key=f"inv-{uuid.uuid4().hex[:8]}", route=route(lane, work_type="invoice"), payload=b"i")


def _failed_invoice_with_successor(connectors: Connectors, pack: str) -> tuple[str, str]:
    """Invoice lane x's first generation failed for good, its successor admitted behind it. Their WorkIds."""
    connectors.ingest(pack, items=[_invoice("x")])
    (first,) = connectors.claim("w", pack_install_ids=[pack])
    (successor,) = [r.work_id for r in connectors.ingest(pack, items=[_invoice("x")])]
    connectors.fail(first.work.work_id, lease_token=first.lease_token, error="boom", retryable=False)
    assert successor is not None
    return first.work.work_id, successor


def test_a_work_types_policy_holds_only_that_types_successors_and_overrides_the_packs(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    invoice_failed, invoice_next = _failed_invoice_with_successor(connectors, pack)
    assert connectors.get_order_policy(pack, "invoice").source is Source.DEFAULT
    set_ = connectors.set_order_policy(pack, Policy.BLOCK, set_by="ops@acme", reason="ledger", work_type="invoice")
    project_failed, project_next = _failed_with_successor(connectors, pack)  # lane a (project) and lane b
    assert (set_.work_type, set_.source, set_.policy) == ("invoice", Source.WORK_TYPE, Policy.BLOCK)
    assert connectors.get_order_policy(pack, "invoice") == set_
    assert connectors.get_order_policy(pack).policy is Policy.CONTINUE  # the pack's own is unchanged
    assert connectors.work_type_order_policies(pack) == [set_]
    project = connectors.get_order_policy(pack, "project")
    assert (project.policy, project.source, project.work_type) == (Policy.CONTINUE, Source.DEFAULT, "project")

    # Only the invoice successor is held; the project lane a successor runs under the pack's continue.
    assert connectors.order_holds([invoice_next, project_next]) == {
        invoice_next: (invoice_failed, hold_reason(invoice_failed, dead_letter=True))
    }
    assert connectors.order_held_count(pack) == 1
    claims = connectors.claim("w", pack_install_ids=[pack], max_items=10)
    assert sorted(c.work.work_id for c in claims if _lane(c) == "a") == [project_next]
    assert invoice_next not in {c.work.work_id for c in claims}
    for claim in claims:
        connectors.complete(claim.work.work_id, lease_token=claim.lease_token)

    # The pack under block, its invoice type overriding with continue: invoice runs, project holds.
    connectors.set_order_policy(pack, Policy.BLOCK, set_by="ops", reason="order", work_type="")
    connectors.set_order_policy(pack, Policy.CONTINUE, set_by="ops", reason="progress", work_type="invoice")
    assert connectors.get_order_policy(pack, "project").source is Source.PACK
    (released,) = connectors.claim("w", pack_install_ids=[pack], max_items=10)
    assert released.work.work_id == invoice_next
    connectors.complete(released.work.work_id, lease_token=released.lease_token)
    (held_project,) = [r.work_id for r in connectors.ingest(pack, items=[delivery(lane="a")])]
    assert held_project is not None
    # lane a's newest completed, its predecessor is no dead letter: nothing of project is held
    assert connectors.order_holds([held_project]) == {}
    assert project_failed in {d.work_id for d in connectors.list_dead_letters(pack, filter_of(pack)).dead_letters}
    for claim in connectors.claim("w", pack_install_ids=[pack], max_items=10):
        connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    assert_invariants(engine)


def test_a_policy_of_an_unknown_work_type_or_a_bad_value_is_refused_and_changes_nothing(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    _failed_invoice_with_successor(connectors, pack)
    connectors.set_order_policy(pack, Policy.BLOCK, set_by="ops", reason="ledger", work_type="invoice")
    with engine.connect() as connection:
        before = database_digest(connection)
    refusals: list[tuple[type[Exception], str, Callable[[], object]]] = [
        (
            UnknownWorkType,
            "work type 'refund' of pack .* has no generation of it",
            lambda: connectors.set_order_policy(pack, Policy.BLOCK, set_by="o", reason="r", work_type="refund"),
        ),
        (UnknownWorkType, "has no generation of it", lambda: connectors.get_order_policy(pack, "refund")),
        (
            UnknownPack,
            "not installed",
            lambda: connectors.set_order_policy("pk-none", Policy.BLOCK, set_by="o", reason="r", work_type="invoice"),
        ),
        (UnknownPack, "not installed", lambda: connectors.get_order_policy("pk-none", "invoice")),
        (
            InvalidArgument,
            "policy is required",
            lambda: connectors.set_order_policy(pack, None, set_by="o", reason="r", work_type="invoice"),
        ),
        (
            InvalidArgument,
            "work_type",
            lambda: connectors.set_order_policy(pack, Policy.BLOCK, set_by="o", reason="r", work_type="x" * 1000),
        ),
        (InvalidArgument, "not an OrderPolicyKind", lambda: policy_from_proto(cast(Any, 7))),
    ]
    for error, message, call in refusals:
        with pytest.raises(error, match=message):
            call()
    assert UnknownWorkType.kind is ErrorKind.NOT_FOUND
    with engine.connect() as connection:
        assert database_digest(connection) == before
    assert_invariants(engine)


def test_retention_keeps_a_dead_letter_that_holds_its_identity_under_block(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock
) -> None:
    pack = install_pack(engine)
    failed, successor = _failed_invoice_with_successor(connectors, pack)
    connectors.set_order_policy(pack, Policy.BLOCK, set_by="ops", reason="ledger", work_type="invoice")
    connectors.set_retention_policy(pack, keep_generations=1, keep_seconds=None)
    clock.advance(5)
    report = connectors.prune(pack)
    assert (report.generations, report.kept) == (0, 1)  # the dead letter would go without the hold
    assert connectors.get_work(failed).work.status is WorkStatus.FAILED
    assert connectors.order_holds([successor]) == {successor: (failed, hold_reason(failed, dead_letter=True))}
    assert connectors.prune(pack, dry_run=True).kept == 1
    # Under continue the failed range is listed for replay and retention lets it go as before.
    connectors.set_order_policy(pack, Policy.CONTINUE, set_by="ops", reason="progress", work_type="invoice")
    assert connectors.prune(pack).generations == 1
    with pytest.raises(WorkPruned):
        connectors.get_work(failed)
    (released,) = connectors.claim("w", pack_install_ids=[pack], max_items=10)
    assert released.work.work_id == successor
    connectors.complete(released.work.work_id, lease_token=released.lease_token)
    assert_invariants(engine)


def test_the_held_probe_of_a_work_type_policy_is_index_seeks(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane=f"l{n}") for n in range(30)])
    connectors.set_order_policy(pack, Policy.BLOCK, set_by="ops", reason="order", work_type="project")
    for claim in connectors.claim("w", pack_install_ids=[pack], max_items=30):
        connectors.fail(claim.work.work_id, lease_token=claim.lease_token, error="boom", retryable=False)
    held = [r.work_id for r in connectors.ingest(pack, items=[delivery(lane=f"l{n}") for n in range(30)])]
    with engine.begin() as connection, capture(engine) as captured:
        assert claims_sql.work_items_claimable(connection, [pack], [], clock, 10) == []
        assert len(order_policy_sql.work_items_held(connection, [w for w in held if w])) == 30
        assert order_policy_sql.work_items_held_count(connection, pack, 10_000) == 30
    with engine.connect() as connection:
        for read in captured.statements:
            assert explain_problems(connection, read.statement, read.parameters) == [], read.statement
    assert_invariants(engine)
