"""The invariant checker sees damage that only the legacy guards used to hide (issue 59).

Inputs are admitted through the product (native Connectors, the legacy v0 runtime), then
exactly one damage is planted with raw SQL and the checker must report exactly it: a native
input without its receipt (D), ordinal 0 in a greenfield pack (O), a coverage-missing receipt
whose Event is gone (D), old-protocol work above the cutoff (M), a tombstone that outlived its
record above the retention horizon (R). Old-protocol history at or below LegacyMaxOrdinal
(ordinal 0, no receipt, no recorded range) stays accepted.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.legacy.runtime import LegacyRuntime
from nexuscrm_connectors.queries.retention import events_delete
from nexuscrm_connectors.settings import Settings
from nexuscrm_schema.tables import (
    ConnectorProjectionProtocol,
    Event,
    IngressReceipt,
    PackInstall,
    PrunedReceipt,
    PrunedWork,
    WorkItem,
)
from tests.support.factories import START, FakeClock, delivery, install_pack
from tests.support.invariants import check_invariants
from workqueue import WorkStatus
from workqueue.values import IngestItem, Outcome

pytestmark = pytest.mark.database


def _delete_receipt(engine: sa.Engine, pack: str, key: str) -> None:
    with engine.begin() as connection:
        deleted = connection.execute(
            sa.delete(IngressReceipt).where(IngressReceipt.c.PackInstallId == pack, IngressReceipt.c.ReceiptKey == key)
        ).rowcount
    assert deleted == 1


def _copy_event(engine: sa.Engine, pack: str, ordinal: int, *, to: int, key: str) -> None:
    """Insert a copy of Event ``ordinal`` at ordinal ``to``: receipt key ``key`` without a receipt, payload in Event."""
    with engine.begin() as connection:
        row: dict[str, Any] = dict(
            connection.execute(sa.select(Event).where(Event.c.PackInstallId == pack, Event.c.EnqueueOrdinal == ordinal))
            .one()
            ._mapping
        )
        connection.execute(
            sa.insert(Event).values(
                {**row, "EnqueueOrdinal": to, "ReceiptKey": key, "Payload": b"old payload", "PayloadBytes": None}
            )
        )


def _cut_over(engine: sa.Engine, pack: str) -> int:
    """Write the protocol row a cutover writes: LegacyMaxOrdinal = the pack's LastOrdinal; returns it."""
    with engine.begin() as connection:
        last = int(
            connection.execute(
                sa.select(PackInstall.c.LastOrdinal).where(PackInstall.c.PackInstallId == pack)
            ).scalar_one()
        )
        connection.execute(
            sa.insert(ConnectorProjectionProtocol).values(
                PackInstallId=pack, ProtocolVersion=1, LegacyMaxOrdinal=last, Origin="cutover", CreatedAt=START
            )
        )
    return last


@pytest.mark.parametrize("cutoff", [0, 3], ids=["greenfield", "cut-over"])
def test_a_native_input_that_lost_its_receipt_is_a_d_violation(
    engine: sa.Engine, connectors: Connectors, cutoff: int
) -> None:
    pack = install_pack(engine, legacy_max_ordinal=cutoff, last_ordinal=cutoff)
    results = connectors.ingest(pack, items=[delivery(), delivery()])
    assert check_invariants(engine) == []
    lost = results[1]
    assert lost.enqueue_ordinal == cutoff + 2
    _delete_receipt(engine, pack, lost.receipt_key)
    assert check_invariants(engine) == [
        f"D: Event {pack}/{cutoff + 2} (receipt key {lost.receipt_key}) has no receipt "
        f"though admitted above LegacyMaxOrdinal {cutoff}"
    ]


def test_ordinal_zero_in_a_greenfield_pack_is_an_o_violation(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery()])
    _copy_event(engine, pack, 1, to=0, key="zero")
    assert check_invariants(engine) == [f"O: Event {pack}/0 outside (0, LastOrdinal 1]"]


def test_a_coverage_missing_receipt_whose_event_is_gone_is_a_d_violation(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    admitted = connectors.ingest(pack, items=[delivery("lost")])[0]
    with engine.begin() as connection:  # its generation goes first: the redelivery finds no coverage
        connection.execute(sa.delete(WorkItem).where(WorkItem.c.WorkId == admitted.work_id))
    assert [r.outcome for r in connectors.ingest(pack, items=[delivery("lost")])] == [Outcome.COVERAGE_MISSING]
    with engine.begin() as connection:
        events_delete(connection, pack, [int(admitted.enqueue_ordinal)])
    assert check_invariants(engine) == [
        f"D: receipt {(pack, 'lost')} is coverage_missing but has no Event (its input was lost)"
    ]


def test_old_protocol_work_above_the_cutoff_is_an_m_violation(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    work_id = connectors.ingest(pack, items=[delivery()])[0].work_id
    with engine.begin() as connection:  # a twin of the generation without its range, as the v0 runtime writes
        row: dict[str, Any] = dict(
            connection.execute(sa.select(WorkItem).where(WorkItem.c.WorkId == work_id)).one()._mapping
        )
        twin = {**row, "WorkId": "legacy-twin", "InputStartOrdinal": None, "Status": WorkStatus.COMPLETED}
        connection.execute(sa.insert(WorkItem).values(twin))
    assert check_invariants(engine) == [
        f"M: WorkItem legacy-twin of pack {pack} has no InputStartOrdinal but its LaneOrdinal 1 "
        "is above LegacyMaxOrdinal 0"
    ]


def _completed(connectors: Connectors, pack: str, items: list[IngestItem]) -> str:
    """Admit ``items`` of one identity as one generation and complete it; its WorkId."""
    connectors.ingest(pack, items=items)
    claim = connectors.claim("w", pack_install_ids=[pack])[0]
    connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    return claim.work.work_id


def test_a_tombstone_that_outlived_its_record_above_the_horizon_is_an_r_violation(
    engine: sa.Engine, clock: FakeClock
) -> None:
    """A generation pruned in chunks: its recent first member keeps its tombstone after the record expired."""
    connectors = Connectors(engine, Settings(prune_batch_events=2), clock=clock)
    pack = install_pack(engine)
    with engine.connect() as connection:
        now = clock.read(connection)
    ages = [30, 180, 180]  # seconds: with a 60 s window the last chunk (ordinals 2 and 3) expires, ordinal 1 not
    pruned = _completed(connectors, pack, [delivery(lane="a", source_time=now - dt.timedelta(seconds=a)) for a in ages])
    _completed(connectors, pack, [delivery(lane="a", source_time=now)])  # the newest of the identity is kept
    connectors.set_retention_policy(pack, keep_generations=1, keep_seconds=None, duplicate_window_seconds=60)
    report = connectors.prune(pack)
    assert (report.generations, report.expired_receipts, report.expired_generations) == (1, 2, 1)
    assert report.horizon_ordinal == 3
    with engine.connect() as connection:
        assert connection.execute(sa.select(sa.func.count()).select_from(PrunedWork)).scalar_one() == 0
        outlived = connection.execute(sa.select(PrunedReceipt.c.ReceiptKey)).scalar_one()
    assert check_invariants(engine) == []
    with engine.begin() as connection:  # an ordinal no pruning reached (above the counter too)
        connection.execute(sa.update(PrunedReceipt).values(EnqueueOrdinal=9))
    assert check_invariants(engine) == [
        f"R: tombstone {(pack, outlived)} (input 9) outlived its record {pruned} but lies above the horizon 3"
    ]


def test_old_protocol_history_at_or_below_the_cutoff_stays_accepted(
    engine: sa.Engine, connectors: Connectors, clock: FakeClock
) -> None:
    """Ordinal 0, Events without receipts and work without a range: legacy history, before and after the cutover."""
    pack = install_pack(engine, legacy_max_ordinal=None)
    legacy = LegacyRuntime(engine, clock)
    legacy.record_work_item_handoff(pack)  # the v0 runtime writes a direct task per input
    old = legacy.ingest(pack, [delivery(), delivery()])
    _delete_receipt(engine, pack, old[0].receipt_key)  # history from before receipts
    _copy_event(engine, pack, 1, to=0, key="from-before-positive-ordinals")
    assert check_invariants(engine) == []  # a pack still on the old protocol

    while (claim := legacy.claim("w", pack)) is not None:  # drained, as the cutover requires
        legacy.complete(claim.work.work_id, claim.lease_token)
    assert _cut_over(engine, pack) == 2
    native = connectors.ingest(pack, items=[delivery()])[0]
    assert native.enqueue_ordinal == 3
    assert check_invariants(engine) == []  # all of it lies at or below LegacyMaxOrdinal 2
    _delete_receipt(engine, pack, native.receipt_key)  # only above it is a receipt required
    assert check_invariants(engine) == [
        f"D: Event {pack}/3 (receipt key {native.receipt_key}) has no receipt though admitted above LegacyMaxOrdinal 2"
    ]
