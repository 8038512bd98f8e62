"""Connectors' plans on every backend: what a claim reads, and the seeded database the plan tests share.

The table of every service's hot queries (no full table scan, no filesort over a table) runs on
``seed`` in ``tests/system/integration/test_hot_query_plans.py``, Controlplane's queries being
in it; the tests here read Connectors' own statements only.

On TiDB the plan is read in TiDB's format (``tests/support/plans.py``): also no hash join over
a range, and no GROUP BY over a whole range.

The statements are the real ones: each hot query runs through the function the runtime calls
while ``tests/support/statements.py`` captures what reaches the driver, and the test then
asks the database to EXPLAIN exactly that statement with exactly those parameters. The data is
seeded through the real admission, claim and completion paths (plus old-protocol rows for the
drain and audit scans) and the tables are analyzed, so the optimizer sees realistic
statistics. docs/performance.md lists the expected TiDB operator of each query.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.queries import claims as claims_sql
from nexuscrm_connectors.queries import events as events_sql
from nexuscrm_connectors.queries import receipts as receipts_sql
from nexuscrm_connectors.queries import work_items as work_items_sql
from nexuscrm_connectors.queue.deliveries import generation_row
from nexuscrm_runtime.database import is_sqlite
from nexuscrm_schema.tables import Event, WorkItem
from tests.support.factories import START, FakeClock, delivery, install_pack, route
from tests.support.invariants import assert_invariants
from tests.support.statements import Captured, capture
from workqueue import EventStatus, ReceiptState, WorkStatus

pytestmark = pytest.mark.database

LANES = 40
ROUNDS = 3  # admission rounds through the real path, over the bulk-inserted history
HISTORY = 4000  # retained native inputs (one completed generation each)
LEGACY_HISTORY = 600  # retained old-protocol inputs
ORPHANED_ORDINAL = LEGACY_HISTORY // 2 + 1  # its Event is gone, so the audit samples orphaned work
MEMBER_COUNT_BATCHES, MEMBER_COUNT_LANES = 25, 200  # a pack grown by admission: 5 000 Events, 200 identities
LEGACY_TAIL_STATUSES = (WorkStatus.PENDING, WorkStatus.RETRY, WorkStatus.BLOCKED, WorkStatus.PROCESSING)


@dataclasses.dataclass(frozen=True)
class Seeded:
    """What the hot queries are run against."""

    native_pack: str
    legacy_pack: str
    projection_keys: list[str]
    legacy_key: str
    start: int
    end: int
    claimed_key: str
    claimed_work_id: str


def seed(engine: sa.Engine) -> Seeded:
    """A native pack with retained, claimed and pending generations and stored receipts; an old-protocol pack.

    Retained history is bulk-inserted (completed one-input generations), then the real
    admission, claim and completion paths add live generations on top.
    """
    clock = FakeClock()
    connectors = Connectors(engine, clock=clock)
    native = install_pack(engine, last_ordinal=HISTORY)
    keys: list[str] = [route(f"lane-{lane}").identity(native).key for lane in range(LANES)]
    _insert_history(engine, native, keys, legacy=False)
    for round_ in range(ROUNDS):
        connectors.ingest(native, items=[delivery(f"n-{round_}-{lane}", lane=f"lane-{lane}") for lane in range(LANES)])
        for claim in connectors.claim("seed", pack_install_ids=[native], max_items=LANES // 4):
            for _ in connectors.load_inputs(claim.work.work_id, lease_token=claim.lease_token):
                pass
            connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
        clock.advance(1)
    claim = connectors.claim("seed", pack_install_ids=[native])[0]
    with engine.begin() as connection:
        receipts_sql.receipts_insert(
            connection,
            [
                {
                    "PackInstallId": native,
                    "ReceiptKey": f"stored-{n}",
                    "ProjectionKey": keys[0],
                    "PayloadHash": "0" * 64,
                    "Payload": b"x",
                    "SourceTime": None,
                    "State": ReceiptState.STORED,
                    "ReceivedAt": START,
                }
                for n in range(3)
            ],
        )
    # Retention pruned part of the history (up to one pass), so the tombstone tables have rows.
    connectors.set_retention_policy(native, keep_generations=HISTORY // LANES - 10, keep_seconds=None)
    assert connectors.prune(native).generations > 0
    legacy = install_pack(engine, legacy_max_ordinal=None, last_ordinal=LEGACY_HISTORY)
    _insert_history(engine, legacy, [str(route(f"lane-{lane}").identity(legacy).key) for lane in range(4)], legacy=True)
    _analyze(engine)
    return Seeded(
        native_pack=native,
        legacy_pack=legacy,
        projection_keys=keys,
        legacy_key=route("lane-0").identity(legacy).key,
        start=claim.work.input_start_ordinal or 0,
        end=claim.work.lane_ordinal,
        claimed_key=claim.work.projection_key,
        claimed_work_id=claim.work.work_id,
    )


def _insert_history(engine: sa.Engine, pack: str, keys: list[str], *, legacy: bool) -> None:
    """Confirmed receipts and completed one-input generations, round-robin over ``keys``; old-protocol when ``legacy``.

    Old-protocol history also has a tail of nonterminal work (drain), coalesced inputs
    without a direct task and a WorkItem whose selected Event is gone (audit).
    """
    size = LEGACY_HISTORY if legacy else HISTORY
    events, work = [], []
    for ordinal in range(1, size + 1):
        key = keys[ordinal % len(keys)]
        events.append(
            {
                "PackInstallId": pack,
                "EnqueueOrdinal": ordinal,
                "ProjectionKey": key,
                "ReceiptKey": f"h-{ordinal}",
                "PayloadHash": "0" * 64,
                "Payload": b"x",
                "Status": EventStatus.PROCESSED,
                "CreatedAt": START,
            }
        )
        if legacy and ordinal % 3 == 0:
            continue  # a coalesced input: no direct task
        row = generation_row(
            work_id=str(uuid.uuid4()),
            pack_install_id=pack,
            projection_key=key,
            start=ordinal,
            end=ordinal,
            members=1,
            blocked=False,
            now=START,
            max_attempts=5,
        )
        nonterminal = legacy and ordinal > size - 40
        status = LEGACY_TAIL_STATUSES[ordinal % 4] if nonterminal else WorkStatus.COMPLETED
        seeded: dict[str, Any] = {
            **row,
            "InputStartOrdinal": None if legacy else ordinal,
            "Status": status,
            "ClaimableAt": START if status in (WorkStatus.PENDING, WorkStatus.RETRY) else None,
            "FinishedAt": None if nonterminal else START,
        }
        work.append(seeded)
    if legacy:  # one WorkItem's selected Event is gone
        events = [row for row in events if row["EnqueueOrdinal"] != ORPHANED_ORDINAL]
    receipts = [
        {
            "PackInstallId": pack,
            "ReceiptKey": row["ReceiptKey"],
            "ProjectionKey": row["ProjectionKey"],
            "PayloadHash": row["PayloadHash"],
            "Payload": row["Payload"],
            "SourceTime": None,
            "State": ReceiptState.CONFIRMED,
            "ReceivedAt": START,
        }
        for row in events
    ]
    with engine.begin() as connection:
        receipts_sql.receipts_insert(connection, receipts)
        events_sql.events_insert(connection, events)
        work_items_sql.work_items_insert(connection, work)


def _analyze(engine: sa.Engine) -> None:
    with engine.begin() as connection:
        if is_sqlite(engine):
            connection.exec_driver_sql("ANALYZE")
        else:
            connection.exec_driver_sql(
                "ANALYZE TABLE Event, EventPayload, WorkItem, IngressReceipt, PackInstall, PrunedReceipt, PrunedWork"
            )


def ranges(seeded: Seeded) -> list[events_sql.EventRange]:
    """Member ranges of three identities of the native pack."""
    return [
        events_sql.EventRange(seeded.native_pack, key, seeded.start - 1, seeded.end)
        for key in list(seeded.projection_keys)[:3]
    ]


def _session_counters(connection: sa.Connection, like: str) -> int:
    """The sum of the MySQL-protocol session's status counters named ``like`` (0 on SQLite, which keeps none)."""
    if connection.dialect.name == "sqlite":
        return 0
    counters = connection.exec_driver_sql("SHOW SESSION STATUS LIKE %s", (like,)).all()
    return sum(int(value) for _name, value in counters)


def _sqlite_plan(connection: sa.Connection, statement: Captured) -> list[str]:
    """SQLite's plan of a captured statement, one detail per step (empty on other backends)."""
    if connection.dialect.name != "sqlite":
        return []
    explained = connection.exec_driver_sql("EXPLAIN QUERY PLAN " + statement.statement, statement.one_row_parameters)
    return [row[3] for row in explained]


def test_a_claims_member_count_reads_the_members_identity_not_the_pack(engine: sa.Engine) -> None:
    """The recorded member count reads the claimed identity's index range, never every Event of the pack.

    On a pack grown through admission with the statistics InnoDB keeps by itself (no ANALYZE,
    as in production and the peer benchmark), MariaDB planned the correlated count on the
    primary key by PackInstallId alone, every Event of the pack for each claimed generation,
    until the statement named ix_event_source_lane. EXPLAIN shows only ``ref`` either way, so on
    MySQL-protocol servers the handler counters show what the statement read; SQLite keeps none,
    and its plan shows the range.
    """
    connectors = Connectors(engine, clock=FakeClock())
    pack = install_pack(engine)
    for batch in range(MEMBER_COUNT_BATCHES):
        items = [delivery(f"m-{batch}-{n}", lane=f"lane-{n}") for n in range(MEMBER_COUNT_LANES)]
        connectors.ingest(pack, items=items)
    with engine.begin() as connection:
        work = connection.execute(
            sa.select(WorkItem.c.WorkId, WorkItem.c.ProjectionKey).where(WorkItem.c.PackInstallId == pack).limit(1)
        ).one()
        connection.execute(sa.update(WorkItem).where(WorkItem.c.WorkId == work.WorkId).values(LeaseToken="t"))

        def rows_read() -> int:
            return _session_counters(connection, "Handler_read_%")

        overhead = -rows_read() + rows_read()  # what reading the counters itself adds
        before = rows_read()
        with capture(engine) as captured:
            assert claims_sql.work_items_record_member_count(connection, [work.WorkId], "t") == 1
        read = rows_read() - before - overhead
        (statement,) = captured.statements
        sqlite_plan = _sqlite_plan(connection, statement)
        recorded = connection.execute(
            sa.select(WorkItem.c.ClaimedMemberCount).where(WorkItem.c.WorkId == work.WorkId)
        ).scalar_one()
        identity_events = connection.execute(
            sa.select(sa.func.count()).where(Event.c.PackInstallId == pack, Event.c.ProjectionKey == work.ProjectionKey)
        ).scalar_one()
        pack_events = connection.execute(sa.select(sa.func.count()).where(Event.c.PackInstallId == pack)).scalar_one()
    assert recorded == identity_events == MEMBER_COUNT_BATCHES  # one generation per identity, never claimed
    assert pack_events == MEMBER_COUNT_BATCHES * MEMBER_COUNT_LANES
    if is_sqlite(engine):
        assert [detail for detail in sqlite_plan if detail.split()[:2] == ["SEARCH", "Event"]] == [
            "SEARCH Event USING COVERING INDEX ix_event_source_lane "
            "(PackInstallId=? AND ProjectionKey=? AND EnqueueOrdinal>? AND EnqueueOrdinal<?)"
        ], sqlite_plan
    else:
        assert read <= identity_events + 10, f"read {read} rows to count {identity_events} members of {pack_events}"
    assert_invariants(engine)


def test_a_claims_inline_payloads_are_read_without_a_temporary_table(engine: sa.Engine) -> None:
    """A claim's inline inputs (``event_ranges_members``) come from one scan of the ranges' intervals.

    As a UNION ALL of LIMITed derived tables, MariaDB built a temporary table per range and
    one for the union, on disk because of the payload BLOB: 4 to 5 per claim, and the
    statement took three times as long. The MySQL-protocol servers' session counters show
    the temporary tables; on SQLite, which keeps no such counter, the plan must use the index
    and sort nothing.
    """
    connectors = Connectors(engine, clock=FakeClock())
    pack = install_pack(engine)
    lanes = [f"lane-{n}" for n in range(4)]
    for batch in range(3):
        connectors.ingest(pack, items=[delivery(f"p-{batch}-{lane}", lane=lane) for lane in lanes])
    with engine.begin() as connection:
        works = connection.execute(
            sa.select(WorkItem.c.ProjectionKey, WorkItem.c.InputStartOrdinal, WorkItem.c.LaneOrdinal)
            .where(WorkItem.c.PackInstallId == pack)
            .order_by(WorkItem.c.ProjectionKey)
        ).all()
        ranges = [events_sql.EventRange(pack, w.ProjectionKey, w.InputStartOrdinal - 1, w.LaneOrdinal) for w in works]

        def temporary_tables() -> int:
            return _session_counters(connection, "Created_tmp%tables")

        overhead = -temporary_tables() + temporary_tables()  # SHOW STATUS builds temporary tables itself
        before = temporary_tables()
        with capture(engine) as captured:
            members = events_sql.event_ranges_members(connection, ranges)
        built = temporary_tables() - before - overhead
        (statement,) = captured.statements
        sqlite_plan = _sqlite_plan(connection, statement)
        expected = [
            connection.execute(
                sa.select(Event.c.EnqueueOrdinal, Event.c.ReceiptKey)
                .where(Event.c.PackInstallId == pack, Event.c.ProjectionKey == members_of.projection_key)
                .order_by(Event.c.EnqueueOrdinal)
            ).all()
            for members_of in ranges
        ]
    assert len(works) == len(lanes)  # one unclaimed generation per identity, extended by each batch
    assert [[(row.EnqueueOrdinal, row.ReceiptKey) for row in rows] for rows in members] == [
        [tuple(row) for row in rows] for rows in expected
    ]
    assert all(len(rows) == 3 and all(row.Payload for row in rows) for rows in members)
    if is_sqlite(engine):
        assert not [detail for detail in sqlite_plan if "TEMP B-TREE" in detail], sqlite_plan
        assert any("ix_event_source_lane" in detail for detail in sqlite_plan), sqlite_plan
    else:
        assert built == 0, f"{built} temporary tables built for one claim's inline inputs"
    assert_invariants(engine)
