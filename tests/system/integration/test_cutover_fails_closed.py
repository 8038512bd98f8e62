"""The cutover fails closed: counterexamples at every rule's boundary (issue 15, "Cutover").

Each history is otherwise clean (its near twin passes), and one row is pushed past a rule's
boundary with raw SQL: a status that is not exactly a known one (casing, padding, empty, a
blob on SQLite), an ordinal that is zero, negative, extreme or above the pack's counter, a
row of another pack's identity, native work before any protocol row. The cutover must refuse
every one of them, name why, and change no historical row (``history.cut``).
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.legacy.runtime import LegacyRuntime
from nexuscrm_controlplane import audit, cutover, drain
from nexuscrm_controlplane.audit import Category, Rule
from nexuscrm_controlplane.cutover import Outcome
from nexuscrm_controlplane.runbook import outcome_exit_code
from nexuscrm_schema.tables import PackInstall, WorkItem
from nexuscrm_tools.exits import ExitCode
from tests.controlplane.integration.history import (
    FakeClock,
    arm,
    cut,
    install,
    items,
    protocol_rows,
    route,
    run_cli,
)
from tests.support.factories import START
from tests.support.invariants import assert_invariants
from tests.system.integration.old_workers import run_old_workers
from workqueue import EventStatus, WorkStatus

pytestmark = pytest.mark.database

MAX_BIGINT = 2**63 - 1
MIN_BIGINT = -(2**63)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def legacy(engine: sa.Engine, clock: FakeClock) -> LegacyRuntime:
    return LegacyRuntime(engine, clock)


def rules(result: cutover.CutoverResult) -> dict[Rule, audit.Finding]:
    return {f.rule: f for f in result.report.findings}


def clean_history(legacy: LegacyRuntime, pack: str) -> None:
    """Events 1 and 2 of lane-a, each with its completed direct task: a history that cuts over."""
    for key in ("k1", "k2"):
        legacy.ingest(pack, items([key]))
        run_old_workers(legacy, pack)


def set_work_status(engine: sa.Engine, pack: str, lane_ordinal: int, status: Any) -> str:
    """Overwrite one old WorkItem's status with ``status`` (raw SQL; a blob is bound as bytes)."""
    with engine.begin() as connection:
        work_id = connection.execute(
            sa.select(WorkItem.c.WorkId).where(WorkItem.c.PackInstallId == pack, WorkItem.c.LaneOrdinal == lane_ordinal)
        ).scalar_one()
        connection.execute(sa.text("UPDATE WorkItem SET Status = :s WHERE WorkId = :w"), {"s": status, "w": work_id})
    return str(work_id)


def add_event(
    engine: sa.Engine,
    pack: str,
    ordinal: int,
    clock: FakeClock,
    *,
    status: Any = EventStatus.PROCESSED,
    key: str | None = None,
    direct_task: str | None = WorkStatus.COMPLETED,
    input_start: int | None = None,
    work_pack: str | None = None,
) -> str | None:
    """An Event of ``pack`` at ``ordinal`` (raw SQL) and, unless ``direct_task`` is None, its direct task."""
    key = route().identity(pack).key if key is None else key
    with engine.begin() as connection:
        connection.execute(
            sa.text(
                "INSERT INTO Event (PackInstallId, EnqueueOrdinal, ProjectionKey, ReceiptKey, PayloadHash, Payload,"
                " Status, IsReplay, CreatedAt) VALUES (:p, :o, :k, :r, :h, :b, :s, :i, :c)"
            ),
            {
                "p": pack,
                "o": ordinal,
                "k": key,
                "r": f"raw-{uuid.uuid4().hex}",
                "h": "0" * 64,
                "b": b"raw",
                "s": status,
                "i": False,
                "c": START,
            },
        )
        if direct_task is None:
            return None
        work_id = str(uuid.uuid4())
        connection.execute(
            sa.insert(WorkItem).values(
                WorkId=work_id,
                PackInstallId=work_pack or pack,
                ProjectionKey=key,
                WorkType="project",
                InputStartOrdinal=input_start,
                LaneOrdinal=ordinal,
                Status=direct_task,
                Attempt=0,
                MaxAttempts=3,
                CreatedAt=clock.now(),
                FinishedAt=clock.now(),
            )
        )
    return work_id


def set_last_ordinal(engine: sa.Engine, pack: str, value: int) -> None:
    with engine.begin() as connection:
        connection.execute(sa.update(PackInstall).where(PackInstall.c.PackInstallId == pack).values(LastOrdinal=value))


# --- the drain gate: live unless exactly terminal ---------------------------------------------

NOT_TERMINAL = [
    "Completed",
    "COMPLETED",
    "Failed",
    "completed ",  # MySQL's PAD SPACE collations compare this equal to 'completed'
    " completed",
    "completed\t",
    "failed\n",
    "",
    " ",
    "done",
    "cancelled",
    "completedx",
]


@pytest.mark.parametrize("status", NOT_TERMINAL, ids=repr)
def test_any_status_that_is_not_exactly_terminal_is_live_work(
    engine: sa.Engine, legacy: LegacyRuntime, clock: FakeClock, status: str
) -> None:
    pack = install(engine, clock)
    clean_history(legacy, pack)
    work_id = set_work_status(engine, pack, 2, status)
    arm(engine, clock)

    with engine.connect() as connection:
        state = drain.drain_status_read(connection, pack, clock)
    assert not state.drained and state.nonterminal == 1 and work_id in state.sample_work_ids
    result = cut(engine, pack, clock)

    assert result.outcome is Outcome.REFUSED_GATE, result.report.summary()
    finding = rules(result)[Rule.NONTERMINAL_WORK]
    assert (finding.count, finding.sample_ids) == (1, (work_id,))
    assert "unknown 1" in finding.detail
    assert protocol_rows(engine, pack) == []


@pytest.mark.parametrize("empty_dsn", ["sqlite"], indirect=True)  # only SQLite stores a blob in a text column
def test_a_blob_status_on_sqlite_is_live_work(engine: sa.Engine, legacy: LegacyRuntime, clock: FakeClock) -> None:
    pack = install(engine, clock)
    clean_history(legacy, pack)
    work_id = set_work_status(engine, pack, 2, b"completed")  # same bytes, another type
    arm(engine, clock)
    result = cut(engine, pack, clock)
    assert result.outcome is Outcome.REFUSED_GATE
    assert rules(result)[Rule.NONTERMINAL_WORK].sample_ids == (work_id,)


@pytest.mark.parametrize("status", [WorkStatus.COMPLETED, WorkStatus.FAILED])
def test_the_twin_exact_terminal_statuses_pass_the_gate(
    engine: sa.Engine, legacy: LegacyRuntime, clock: FakeClock, status: str
) -> None:
    pack = install(engine, clock)
    clean_history(legacy, pack)
    set_work_status(engine, pack, 2, str(status))
    arm(engine, clock)
    result = cut(engine, pack, clock)
    # a failed direct task leaves its Event above the completed boundary with a direct task: permitted
    assert result.outcome is Outcome.WRITTEN, result.report.summary()
    assert_invariants(engine)


# --- the audit covers every retained Event, whatever its ordinal ------------------------------


@pytest.mark.parametrize("ordinal", [-1, -2, MIN_BIGINT], ids=["-1", "-2", "min_bigint"])
@pytest.mark.parametrize("direct_task", [True, False], ids=["direct", "indirect"])
def test_a_negative_ordinal_is_refused(
    engine: sa.Engine, legacy: LegacyRuntime, clock: FakeClock, ordinal: int, direct_task: bool
) -> None:
    pack = install(engine, clock)
    clean_history(legacy, pack)
    add_event(engine, pack, ordinal, clock, direct_task=WorkStatus.COMPLETED if direct_task else None)
    arm(engine, clock)
    result = cut(engine, pack, clock)
    assert result.outcome is Outcome.REFUSED_AUDIT, result.report.summary()
    finding = rules(result)[Rule.UNCLASSIFIABLE]
    assert f"event:{ordinal}" in finding.sample_ids
    assert result.report.events_audited == 3


def test_the_twin_ordinal_zero_with_its_completed_direct_task_passes(
    engine: sa.Engine, legacy: LegacyRuntime, clock: FakeClock
) -> None:
    pack = install(engine, clock)
    clean_history(legacy, pack)
    add_event(engine, pack, 0, clock)
    arm(engine, clock)
    result = cut(engine, pack, clock)
    assert result.outcome is Outcome.WRITTEN, result.report.summary()
    assert result.report.events_audited == 3
    assert_invariants(engine)


@pytest.mark.parametrize("status", ["Processed", "PROCESSED", "processed ", "", " ", "done", "pending\n"], ids=repr)
def test_an_event_status_that_is_not_exactly_known_is_refused(
    engine: sa.Engine, legacy: LegacyRuntime, clock: FakeClock, status: str
) -> None:
    pack = install(engine, clock)
    clean_history(legacy, pack)
    with engine.begin() as connection:
        connection.execute(
            sa.text("UPDATE Event SET Status = :s WHERE PackInstallId = :p AND EnqueueOrdinal = 2"),
            {"s": status, "p": pack},
        )
    arm(engine, clock)
    result = cut(engine, pack, clock)
    assert result.outcome is Outcome.REFUSED_AUDIT, result.report.summary()
    assert rules(result)[Rule.UNCLASSIFIABLE].sample_ids == ("event:2",)


@pytest.mark.parametrize("key", ["", "not-a-key", "other-pack"])
def test_an_event_of_another_or_no_identity_is_refused(
    engine: sa.Engine, legacy: LegacyRuntime, clock: FakeClock, key: str
) -> None:
    pack = install(engine, clock)
    other = install(engine, clock)
    clean_history(legacy, pack)
    foreign = route().identity(other).key if key == "other-pack" else key
    add_event(engine, pack, 0, clock, key=foreign)  # with a completed direct task of the same key
    arm(engine, clock)
    result = cut(engine, pack, clock)
    assert result.outcome is Outcome.REFUSED_AUDIT, result.report.summary()
    assert "event:0" in rules(result)[Rule.UNCLASSIFIABLE].sample_ids


def test_native_work_before_any_protocol_row_is_refused(
    engine: sa.Engine, legacy: LegacyRuntime, clock: FakeClock
) -> None:
    pack = install(engine, clock)
    clean_history(legacy, pack)
    set_last_ordinal(engine, pack, 3)
    work_id = add_event(engine, pack, 3, clock, input_start=3)  # a range WorkItem: not old-protocol work
    arm(engine, clock)
    result = cut(engine, pack, clock)
    assert result.outcome is Outcome.REFUSED_AUDIT, result.report.summary()
    assert work_id in rules(result)[Rule.UNCLASSIFIABLE].sample_ids


def test_work_of_another_pack_does_not_own_this_packs_event(
    engine: sa.Engine, legacy: LegacyRuntime, clock: FakeClock
) -> None:
    pack = install(engine, clock)
    other = install(engine, clock)
    clean_history(legacy, pack)
    set_last_ordinal(engine, pack, 5)
    add_event(engine, pack, 5, clock, status=EventStatus.PENDING, work_pack=other)  # its "task" is in another pack
    arm(engine, clock)
    result = cut(engine, pack, clock)
    assert result.outcome is Outcome.REFUSED_AUDIT, result.report.summary()
    assert rules(result)[Rule.BEYOND_COMPLETED_BOUNDARY].sample_ids == ("event:5",)


# --- the checkpoint is proven against the retained history ------------------------------------


@pytest.mark.parametrize("ordinal", [3, 4, 1000, MAX_BIGINT], ids=["next", "gap", "far", "max_bigint"])
def test_an_event_above_the_counter_is_refused(
    engine: sa.Engine, legacy: LegacyRuntime, clock: FakeClock, ordinal: int
) -> None:
    pack = install(engine, clock)
    clean_history(legacy, pack)  # LastOrdinal 2
    add_event(engine, pack, ordinal, clock)  # with its completed direct task: otherwise clean
    arm(engine, clock)
    result = cut(engine, pack, clock)
    assert result.outcome is Outcome.REFUSED_AUDIT, result.report.summary()
    finding = rules(result)[Rule.HISTORY_ABOVE_COUNTER]
    assert finding.category is Category.AUDIT
    assert f"event:{ordinal}" in finding.sample_ids and "LastOrdinal 2" in finding.detail
    assert outcome_exit_code(result.outcome) == ExitCode.REFUSED_AUDIT
    assert protocol_rows(engine, pack) == []


def test_a_work_item_range_above_the_counter_is_refused(
    engine: sa.Engine, legacy: LegacyRuntime, clock: FakeClock
) -> None:
    pack = install(engine, clock)
    clean_history(legacy, pack)
    with engine.begin() as connection:  # the last direct task claims a range past the counter
        connection.execute(
            sa.update(WorkItem)
            .where(WorkItem.c.PackInstallId == pack, WorkItem.c.LaneOrdinal == 2)
            .values(LaneOrdinal=7)
        )
    add_event(engine, pack, 7, clock, direct_task=None)
    set_last_ordinal(engine, pack, 6)
    arm(engine, clock)
    result = cut(engine, pack, clock)
    assert result.outcome is Outcome.REFUSED_AUDIT, result.report.summary()
    assert {"event:7"} <= set(rules(result)[Rule.HISTORY_ABOVE_COUNTER].sample_ids)


@pytest.mark.parametrize("counter", [-1, MIN_BIGINT], ids=["-1", "min_bigint"])
def test_a_negative_counter_is_refused_even_without_history(engine: sa.Engine, clock: FakeClock, counter: int) -> None:
    pack = install(engine, clock)
    set_last_ordinal(engine, pack, counter)
    arm(engine, clock)
    result = cut(engine, pack, clock)
    assert result.outcome is Outcome.REFUSED_AUDIT, result.report.summary()
    assert "negative LastOrdinal" in rules(result)[Rule.UNCLASSIFIABLE].detail


@pytest.mark.parametrize("counter", [2, 3, MAX_BIGINT], ids=["equal", "above", "max_bigint"])
def test_the_twin_a_counter_at_or_above_the_history_passes(
    engine: sa.Engine, legacy: LegacyRuntime, clock: FakeClock, counter: int
) -> None:
    pack = install(engine, clock)
    clean_history(legacy, pack)
    set_last_ordinal(engine, pack, counter)
    arm(engine, clock)
    result = cut(engine, pack, clock)
    assert result.outcome is Outcome.WRITTEN, result.report.summary()
    assert result.protocol.legacy_max_ordinal == counter
    assert_invariants(engine)


def test_the_command_exits_with_the_audit_refusal_code(
    engine: sa.Engine, dsn: str, legacy: LegacyRuntime, clock: FakeClock
) -> None:
    pack = install(engine, clock)
    clean_history(legacy, pack)
    add_event(engine, pack, 3, clock)
    arm(engine, clock)
    result = run_cli("connector-projection-cutover", ["-pack-install-id", pack, "-timeout", "1m"], dsn)
    assert result.returncode == ExitCode.REFUSED_AUDIT, result.stderr
    assert "history_above_counter" in result.stderr
    assert protocol_rows(engine, pack) == []
