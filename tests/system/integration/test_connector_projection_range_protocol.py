"""The audited cutover: drain and ownership counterexamples, unchanged history, fences, idempotency.

Every refusal rule has an independent counterexample that is refused and a near twin that
passes. Old-protocol history is built with the legacy (v0) runtime; raw SQL only builds the
shapes that runtime cannot produce (a retained WorkItem whose Event was deleted, ordinal 0).
Every cutover call goes through ``history.cut``, which asserts that no historical Event or
WorkItem row changed, for refused and successful runs alike.
"""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.legacy.runtime import RETRY_SECONDS, LegacyRuntime
from nexuscrm_connectors.queries.retention import events_delete
from nexuscrm_controlplane import audit, cutover, fences
from nexuscrm_controlplane.audit import Rule
from nexuscrm_controlplane.cutover import Outcome
from nexuscrm_schema import verification
from nexuscrm_schema.tables import Event, PackInstall, WorkItem
from nexuscrm_schema_catalog import migrations
from nexuscrm_tools.exits import ExitCode
from tests.controlplane.integration.history import (
    NAMESPACE,
    FakeClock,
    arm,
    cut,
    history,
    install,
    items,
    protocol_rows,
    route,
    start_cli,
)
from tests.support.invariants import assert_invariants, check_invariants
from tests.system.integration.old_workers import run_old_workers
from workqueue import EventStatus, WorkStatus

pytestmark = pytest.mark.database


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def legacy(engine: sa.Engine, clock: FakeClock) -> LegacyRuntime:
    return LegacyRuntime(engine, clock)


def rules(result: cutover.CutoverResult) -> dict[Rule, audit.Finding]:
    return {f.rule: f for f in result.report.findings}


def last_ordinal(engine: sa.Engine, pack: str) -> int:
    with engine.connect() as connection:
        return int(
            connection.execute(sa.select(PackInstall.c.LastOrdinal).where(PackInstall.c.PackInstallId == pack)).scalar()
        )


# --- a clean history passes, and the cutoff is the last allocated ordinal ---------------------


def coalesced_then_covered(legacy: LegacyRuntime, pack: str, lane: str = "lane-a") -> None:
    """Event 1 (direct task A), Event 2 coalesced into A, A done; Event 3 (direct task B) infers Event 2."""
    legacy.ingest(pack, items([f"{lane}-1", f"{lane}-2"], lane))
    run_old_workers(legacy, pack)
    legacy.ingest(pack, items([f"{lane}-3"], lane))
    run_old_workers(legacy, pack)


def test_a_drained_history_is_cut_over_at_the_last_allocated_ordinal(
    engine: sa.Engine, legacy: LegacyRuntime, clock: FakeClock
) -> None:
    pack = install(engine, clock)
    coalesced_then_covered(legacy, pack)

    arm(engine, clock)
    result = cut(engine, pack, clock)

    assert result.outcome is Outcome.WRITTEN
    assert result.protocol.legacy_max_ordinal == last_ordinal(engine, pack) == 3
    assert (result.protocol.protocol_version, result.protocol.origin) == (1, "cutover")
    assert result.report.passed and result.report.events_audited == 3 and result.report.work_items_audited == 2
    # permitted: the coalesced Event 2 stays pending, without a direct task, inside the boundary
    assert result.report.permitted == {audit.PERMITTED_INDIRECT: 1, audit.PERMITTED_PENDING: 1}
    assert json.loads(result.protocol.audit_report)["passed"] is True
    assert protocol_rows(engine, pack) == [(1, 3, "cutover")]
    assert_invariants(engine)


def test_the_legacy_worker_infers_inputs_from_retained_history(
    engine: sa.Engine, legacy: LegacyRuntime, clock: FakeClock
) -> None:
    pack = install(engine, clock)
    first = legacy.ingest(pack, items(["k1", "k2"]))
    assert first[0].work_id is not None and first[1].work_id is None  # Event 2 coalesced: no direct task
    claim = legacy.claim("w", pack)
    assert [i.enqueue_ordinal for i in legacy.load_inputs(claim.work.work_id, claim.lease_token)] == [1]
    legacy.complete(claim.work.work_id, claim.lease_token)
    legacy.ingest(pack, items(["k3"]))
    claim = legacy.claim("w", pack)
    assert claim.work.input_start_ordinal is None and claim.work.lane_ordinal == 3
    assert [i.enqueue_ordinal for i in legacy.load_inputs(claim.work.work_id, claim.lease_token)] == [2, 3]
    assert_invariants(engine)


# --- audit rule: missing owner ----------------------------------------------------------------


@pytest.mark.parametrize("delete_selected_event", [True, False], ids=["refused", "twin"])
def test_missing_owner_a_work_item_whose_selected_event_is_gone(
    engine: sa.Engine, legacy: LegacyRuntime, clock: FakeClock, delete_selected_event: bool
) -> None:
    pack = install(engine, clock)
    legacy.ingest(pack, items(["k1"]))
    run_old_workers(legacy, pack)
    legacy.ingest(pack, items(["k2"]))
    run_old_workers(legacy, pack)
    with engine.begin() as connection:
        orphan = connection.execute(
            sa.select(WorkItem.c.WorkId).where(WorkItem.c.PackInstallId == pack, WorkItem.c.LaneOrdinal == 1)
        ).scalar_one()
        if delete_selected_event:  # retention deleted the Event a retained WorkItem selected
            events_delete(connection, pack, [1])

    arm(engine, clock)
    result = cut(engine, pack, clock)

    if delete_selected_event:
        assert result.outcome is Outcome.REFUSED_AUDIT
        finding = rules(result)[Rule.MISSING_OWNER]
        assert (finding.count, finding.sample_ids) == (1, (orphan,))
        assert protocol_rows(engine, pack) == []
        # the planted damage, and nothing else: the acknowledged input k1 has no Event
        assert check_invariants(engine) == [
            f"D: receipt ('{pack}', 'k1') is confirmed but has no Event (an acknowledged input was lost)"
        ]
    else:
        assert result.outcome is Outcome.WRITTEN
        assert_invariants(engine)


@pytest.mark.parametrize("fail_only", [True, False], ids=["refused", "twin"])
def test_missing_owner_every_generation_of_the_identity_failed(
    engine: sa.Engine, legacy: LegacyRuntime, clock: FakeClock, fail_only: bool
) -> None:
    pack = install(engine, clock)
    legacy.ingest(pack, items(["only"], "lane-f"))
    claim = legacy.claim("w", pack)
    if fail_only:
        legacy.fail(claim.work.work_id, claim.lease_token, "flow error", retryable=False)
    else:
        legacy.complete(claim.work.work_id, claim.lease_token)

    arm(engine, clock)
    result = cut(engine, pack, clock)

    if fail_only:
        assert result.outcome is Outcome.REFUSED_AUDIT
        finding = rules(result)[Rule.MISSING_OWNER]
        assert (finding.count, finding.sample_ids) == (1, ("event:1",))
    else:
        assert result.outcome is Outcome.WRITTEN
    assert_invariants(engine)


# --- audit rule: input beyond the retained completed boundary ---------------------------------


@pytest.mark.parametrize("later_direct_task", [False, True], ids=["refused", "twin"])
def test_input_beyond_the_completed_boundary_without_a_direct_task(
    engine: sa.Engine, legacy: LegacyRuntime, clock: FakeClock, later_direct_task: bool
) -> None:
    pack = install(engine, clock)
    legacy.ingest(pack, items(["k1", "k2"]))  # Event 2 coalesced into task A (LaneOrdinal 1)
    run_old_workers(legacy, pack)  # A completes: boundary 1, Event 2 above it with no task
    if later_direct_task:
        legacy.ingest(pack, items(["k3"]))  # task B (LaneOrdinal 3) infers Event 2
        run_old_workers(legacy, pack)

    arm(engine, clock)
    result = cut(engine, pack, clock)

    if later_direct_task:
        assert result.outcome is Outcome.WRITTEN
        assert result.report.permitted[audit.PERMITTED_PENDING] == 1
    else:
        assert result.outcome is Outcome.REFUSED_AUDIT
        finding = rules(result)[Rule.BEYOND_COMPLETED_BOUNDARY]
        assert (finding.count, finding.sample_ids) == (1, ("event:2",))
        assert set(rules(result)) == {Rule.BEYOND_COMPLETED_BOUNDARY}
    assert_invariants(engine)


# --- audit rule: indirect input in mixed zero/positive history --------------------------------


def add_ordinal_zero(engine: sa.Engine, pack: str, clock: FakeClock) -> None:
    """Old history from before positive ordinals: Event 0 with its completed direct task (raw SQL)."""
    key = route().identity(pack).key
    with engine.begin() as connection:
        connection.execute(
            sa.insert(Event).values(
                PackInstallId=pack,
                EnqueueOrdinal=0,
                ProjectionKey=key,
                ReceiptKey="k0",
                PayloadHash="0" * 64,
                Payload=b"zero",
                Status=EventStatus.PROCESSED,
                CreatedAt=clock.now(),
            )
        )
        connection.execute(
            sa.insert(WorkItem).values(
                WorkId="00000000-0000-0000-0000-000000000000",
                PackInstallId=pack,
                ProjectionKey=key,
                WorkType="project",
                InputStartOrdinal=None,
                LaneOrdinal=0,
                Status=WorkStatus.COMPLETED,
                Attempt=0,
                MaxAttempts=3,
                CreatedAt=clock.now(),
                FinishedAt=clock.now(),
            )
        )


@pytest.mark.parametrize("coalesced", [True, False], ids=["refused", "twin"])
def test_indirect_input_in_mixed_zero_and_positive_history(
    engine: sa.Engine, legacy: LegacyRuntime, clock: FakeClock, coalesced: bool
) -> None:
    pack = install(engine, clock)
    add_ordinal_zero(engine, pack, clock)
    if coalesced:
        coalesced_then_covered(legacy, pack)  # Event 2 is indirect
    else:
        for key in ("lane-a-1", "lane-a-2", "lane-a-3"):  # every Event gets its direct task
            legacy.ingest(pack, items([key]))
            run_old_workers(legacy, pack)

    arm(engine, clock)
    result = cut(engine, pack, clock)

    if coalesced:
        assert result.outcome is Outcome.REFUSED_AUDIT
        finding = rules(result)[Rule.MIXED_ZERO_HISTORY]
        assert (finding.count, finding.sample_ids) == (1, ("event:2",))
    else:
        assert result.outcome is Outcome.WRITTEN
        assert result.protocol.legacy_max_ordinal == 3
    assert_invariants(engine)


# --- drain gate: pending, blocked, retry and processing each block alone ----------------------


@pytest.mark.parametrize("state", ["pending", "blocked", "retry", "processing"])
def test_each_nonterminal_state_alone_blocks_the_cutover(
    engine: sa.Engine, legacy: LegacyRuntime, clock: FakeClock, state: str
) -> None:
    pack = install(engine, clock)
    work_id = legacy.ingest(pack, items(["k1"]))[0].work_id
    claim = None if state == "pending" else legacy.claim("w", pack)
    if state == "blocked":
        legacy.wait_for_dependency(claim.work.work_id, claim.lease_token, "crm-account-lookup")
    elif state == "retry":
        legacy.fail(claim.work.work_id, claim.lease_token, "timeout calling the CRM")

    arm(engine, clock)
    result = cut(engine, pack, clock)

    assert result.outcome is Outcome.REFUSED_GATE
    finding = rules(result)[Rule.NONTERMINAL_WORK]
    assert (finding.count, finding.sample_ids) == (1, (work_id,))
    assert f"{state} 1" in finding.detail
    with engine.connect() as connection:
        assert connection.execute(sa.select(WorkItem.c.Status).where(WorkItem.c.WorkId == work_id)).scalar() == state

    # the near twin: the old runtime finishes the same work, and the cutover passes
    if state == "blocked":
        legacy.resolve_dependency(work_id)
    if state == "retry":
        clock.advance(RETRY_SECONDS)
    if claim is not None and state == "processing":
        legacy.complete(claim.work.work_id, claim.lease_token)
    run_old_workers(legacy, pack)
    assert cut(engine, pack, clock).outcome is Outcome.WRITTEN
    assert_invariants(engine)


def test_a_successor_blocked_behind_live_work_is_counted_as_blocked(
    engine: sa.Engine, legacy: LegacyRuntime, clock: FakeClock
) -> None:
    pack = install(engine, clock)
    legacy.ingest(pack, items(["k1"]))
    claim = legacy.claim("w", pack)
    successor = legacy.ingest(pack, items(["k2"]))[0].work_id  # A is processing: B is blocked behind it
    arm(engine, clock)
    result = cut(engine, pack, clock)
    assert result.outcome is Outcome.REFUSED_GATE
    assert "blocked 1" in rules(result)[Rule.NONTERMINAL_WORK].detail
    assert "processing 1" in rules(result)[Rule.NONTERMINAL_WORK].detail
    legacy.complete(claim.work.work_id, claim.lease_token)  # B becomes pending, then drains
    assert run_old_workers(legacy, pack) == 1
    with engine.connect() as connection:
        assert connection.execute(sa.select(WorkItem.c.Status).where(WorkItem.c.WorkId == successor)).scalar() == (
            WorkStatus.COMPLETED
        )
    assert cut(engine, pack, clock).outcome is Outcome.WRITTEN
    assert_invariants(engine)


# --- fence gate ---------------------------------------------------------------------------------


@pytest.mark.parametrize("state", ["missing", "pack_scoped", "expiring", "overridden"])
def test_the_cutover_requires_a_non_expiring_namespace_fence_without_overrides(
    engine: sa.Engine, legacy: LegacyRuntime, clock: FakeClock, state: str
) -> None:
    pack = install(engine, clock)
    coalesced_then_covered(legacy, pack)
    if state == "pack_scoped":
        fences.arm_fence(engine, NAMESPACE, pack, clock=clock)
    elif state == "expiring":
        fences.arm_fence(engine, NAMESPACE, "*", expires_in_seconds=3600, clock=clock)
    elif state == "overridden":
        fence = fences.arm_fence(engine, NAMESPACE, "*", clock=clock)
        other = install(engine, clock)
        fences.add_override(engine, fence.fence_id, other, expires_in_seconds=3600, clock=clock)

    result = cut(engine, pack, clock)

    expected = {
        "missing": Rule.FENCE_MISSING,
        "pack_scoped": Rule.FENCE_MISSING,
        "expiring": Rule.FENCE_EXPIRING,
        "overridden": Rule.FENCE_OVERRIDDEN,
    }[state]
    assert result.outcome is Outcome.REFUSED_GATE
    assert set(rules(result)) == {expected}
    assert protocol_rows(engine, pack) == []

    # the near twin: the same history under a qualifying fence (an expired override does not count)
    if state == "overridden":
        clock.advance(3600)
    else:
        fences.arm_fence(engine, NAMESPACE, "*", clock=clock)
    assert cut(engine, pack, clock).outcome is Outcome.WRITTEN
    assert_invariants(engine)


# --- the WorkItem-only handoff prerequisite and the schema gate -------------------------------


@pytest.mark.parametrize("handoff", [False, True], ids=["refused", "twin"])
def test_the_work_item_only_handoff_is_a_prerequisite(
    engine: sa.Engine, legacy: LegacyRuntime, clock: FakeClock, handoff: bool
) -> None:
    pack = install(engine, clock, handoff=handoff)
    if handoff:
        coalesced_then_covered(legacy, pack)
    else:
        legacy.ingest(pack, items(["k1", "k2"]))  # the Event-status era: backlog without WorkItems

    arm(engine, clock)
    result = cut(engine, pack, clock)

    if handoff:
        assert result.outcome is Outcome.WRITTEN
    else:
        assert result.outcome is Outcome.REFUSED_PREREQUISITE
        assert set(rules(result)) == {Rule.WORK_ITEM_HANDOFF_MISSING}
        with engine.connect() as connection:  # the Event backlog was not retired to fake the handoff
            statuses = connection.execute(sa.select(Event.c.Status).where(Event.c.PackInstallId == pack)).scalars()
            assert list(statuses) == [EventStatus.PENDING, EventStatus.PENDING]
    assert_invariants(engine)


def test_an_incomplete_schema_refuses_the_cutover(empty_engine: sa.Engine, clock: FakeClock) -> None:
    migrations.apply_schema(empty_engine, 1)  # the pre-upgrade schema
    with empty_engine.begin() as connection:
        connection.execute(
            sa.insert(PackInstall).values(
                PackInstallId="pk-old", Namespace=NAMESPACE, PackName="p", PackVersion="1", CreatedAt=clock.now()
            )
        )
    result = cut(empty_engine, "pk-old", clock)
    assert result.outcome is Outcome.REFUSED_GATE
    finding = rules(result)[Rule.SCHEMA_INCOMPLETE]
    missing = verification.verify_schema(empty_engine, verification.NATIVE_PROJECTION)
    assert finding.count == len(missing) > audit.SAMPLE_LIMIT
    # The specification's pieces (schema v2) come first, whatever the checker's order; then the
    # later versions' pieces, in it.
    specification = ("WorkItem.InputStartOrdinal", "_System_ConnectorProjectionProtocol")
    assert finding.sample_ids[:2] == specification
    later = [piece for piece in missing if piece not in specification]
    assert finding.sample_ids[2:] == tuple(later[: audit.SAMPLE_LIMIT - 2])
    assert finding.detail == (
        f"the database's schema is at version 1, the cutover needs version {verification.NEWEST_VERSION}: "
        "run `nexuscrm-schema migrate` (or the schema catalog's ApplySchema), then the cutover again"
    )
    assert result.report.summary().startswith(
        f"gate schema_incomplete: {len(missing)} (WorkItem.InputStartOrdinal, _System_ConnectorProjectionProtocol, "
    )
    # No invariant check: the checker reads the newest schema, which this v1 database lacks;
    # ``cut`` proved the refusal changed no row.


# --- idempotency: one checkpoint, never advanced ----------------------------------------------


def test_repeated_calls_return_the_same_checkpoint_and_never_advance_the_cutoff(
    engine: sa.Engine, legacy: LegacyRuntime, clock: FakeClock
) -> None:
    pack = install(engine, clock)
    coalesced_then_covered(legacy, pack)
    arm(engine, clock)
    dry = cut(engine, pack, clock, dry_run=True)
    assert dry.outcome is Outcome.WOULD_WRITE and protocol_rows(engine, pack) == []
    first = cut(engine, pack, clock)
    with engine.begin() as connection:  # later native admissions allocate further ordinals
        connection.execute(
            sa.update(PackInstall)
            .where(PackInstall.c.PackInstallId == pack)
            .values(LastOrdinal=PackInstall.c.LastOrdinal + 5)
        )
    clock.advance(60)
    again = cut(engine, pack, clock)
    assert again.outcome is Outcome.ALREADY_WRITTEN
    assert again.protocol == first.protocol and again.protocol.legacy_max_ordinal == 3
    assert again.report == first.report
    assert_invariants(engine)


def test_eight_concurrent_cutover_processes_write_one_checkpoint(
    engine: sa.Engine, dsn: str, legacy: LegacyRuntime, clock: FakeClock
) -> None:
    pack = install(engine, clock)
    coalesced_then_covered(legacy, pack)
    coalesced_then_covered(legacy, pack, "lane-b")
    arm(engine, clock)
    before = history(engine)

    processes = [
        start_cli("connector-projection-cutover", ["-pack-install-id", pack, "-timeout", "2m", "-json"], dsn)
        for _ in range(8)
    ]
    outputs = [process.communicate(timeout=180) for process in processes]

    assert [process.returncode for process in processes] == [ExitCode.OK] * 8, [err for _, err in outputs]
    results = [json.loads(stdout) for stdout, _ in outputs]
    assert sorted(r["outcome"] for r in results) == ["already_written"] * 7 + ["written"]
    assert len({json.dumps(r["protocol"], sort_keys=True) for r in results}) == 1
    assert len({json.dumps(r["report"], sort_keys=True) for r in results}) == 1
    assert results[0]["protocol"]["legacy_max_ordinal"] == 6
    assert protocol_rows(engine, pack) == [(1, 6, "cutover")]
    assert history(engine) == before
    assert_invariants(engine)
