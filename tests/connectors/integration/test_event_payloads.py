"""Event payloads kept apart from Event status (schema v8, decision 126), on every backend.

The v7 -> v8 migration adds the table and a NULL column and writes no existing row (decision
150: the payloads stay in Event.Payload until the operator's move, tests/system/integration/
test_payload_contract.py); admission writes each payload once into EventPayload; claims,
completions and failures write Event rows that carry no payload; LoadInputs reads a payload
still kept in Event (an Event a release older than v8 admitted) like any other.
"""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.facade import Connectors
from nexuscrm_schema import verification
from nexuscrm_schema.invariants import payload_storage_violations
from nexuscrm_schema.tables import Event, EventPayload, PackInstall
from nexuscrm_schema_catalog import migrations
from tests.support.checksums import row_checksums
from tests.support.factories import START, delivery, install_pack
from tests.support.invariants import assert_invariants
from tests.support.statements import capture

pytestmark = pytest.mark.database

# ordinal -> payload of the history seeded at v7: binary bytes, an empty payload, legacy ordinal 0
HISTORY = {0: b"\x00\xff legacy zero", 1: b"", 2: b"x" * 3000, 3: bytes(range(256)), 4: b"y" * 5000, 5: b"z"}
PACKS = ("pk-a", "pk-b")
V7_COLUMNS = [c.name for c in Event.columns if c.name != "PayloadBytes"]


def _seed_v7(engine: sa.Engine) -> None:
    assert migrations.apply_schema(engine, 7)[1] == 7
    with engine.begin() as connection:
        for pack in PACKS:
            connection.execute(
                sa.insert(PackInstall).values(
                    PackInstallId=pack, Namespace="acme", PackName="crm", PackVersion="1.0", CreatedAt=START
                )
            )
            v7_event = sa.Table("Event", sa.MetaData(), autoload_with=connection)
            for ordinal, payload in HISTORY.items():
                connection.execute(
                    sa.insert(v7_event).values(
                        PackInstallId=pack,
                        EnqueueOrdinal=ordinal,
                        ProjectionKey=f"pk1|key-{ordinal % 2}",
                        ReceiptKey=f"r-{ordinal}",
                        PayloadHash="h" * 64,
                        Payload=payload,
                        Status="processed",
                        CreatedAt=START,
                    )
                )


def _payload_rows(engine: sa.Engine) -> dict[tuple[str, int], bytes]:
    with engine.connect() as connection:
        return {
            (r.PackInstallId, r.EnqueueOrdinal): bytes(r.Payload) for r in connection.execute(sa.select(EventPayload))
        }


def _payload_problems(engine: sa.Engine) -> list[str]:
    """The checker's rule of where payloads are stored (P, decision 126), which also runs on schema v8."""
    return payload_storage_violations(engine)


def test_v7_to_v8_adds_the_table_and_column_and_writes_no_row(empty_engine: sa.Engine) -> None:
    _seed_v7(empty_engine)
    with empty_engine.connect() as connection:
        before = row_checksums(connection, "Event", V7_COLUMNS)

    assert migrations.apply_schema(empty_engine, 8) == (7, 8, ["v8_event_payload"])

    assert _payload_rows(empty_engine) == {}  # nothing copied: every payload stays in Event.Payload
    with empty_engine.connect() as connection:
        assert row_checksums(connection, "Event", V7_COLUMNS) == before
        assert set(connection.execute(sa.select(Event.c.PayloadBytes)).scalars()) == {None}
    missing = verification.verify_schema(empty_engine, verification.NATIVE_PROJECTION)
    assert not {"EventPayload", "Event.PayloadBytes"} & set(missing)  # only later steps' pieces remain
    assert _payload_problems(empty_engine) == []


def _event_columns(engine: sa.Engine, pack: str) -> list[tuple[int, str, bytes, int | None]]:
    with engine.connect() as connection:
        rows = connection.execute(
            sa.select(Event.c.EnqueueOrdinal, Event.c.Status, Event.c.Payload, Event.c.PayloadBytes)
            .where(Event.c.PackInstallId == pack)
            .order_by(Event.c.EnqueueOrdinal)
        )
        return [(r.EnqueueOrdinal, r.Status, bytes(r.Payload), r.PayloadBytes) for r in rows]


def test_admission_writes_each_payload_once_and_status_changes_never_touch_it(engine: sa.Engine) -> None:
    connectors = Connectors(engine)
    pack = install_pack(engine)
    payloads = [b"first" * 100, b"second" * 100, b"\x00third"]
    connectors.ingest(pack, items=[delivery(lane="a", payload=p) for p in payloads])
    assert _payload_rows(engine) == {(pack, n): p for n, p in enumerate(payloads, start=1)}
    stored = _payload_rows(engine)

    with capture(engine) as claim_and_finish:
        (claim,) = connectors.claim("w1", pack_install_ids=[pack], lease=dt.timedelta(seconds=30))
        pages = list(connectors.load_inputs(claim.work.work_id, lease_token=claim.lease_token))
        connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    assert [i.payload for page in pages for i in page.inputs] == payloads
    writes = [c.statement for c in claim_and_finish.statements if c.verb in ("INSERT", "UPDATE", "DELETE")]
    assert writes and not [s for s in writes if "EventPayload" in s], writes  # no payload row is written
    assert [s for s in writes if s.lstrip().upper().startswith("UPDATE") and "Status" in s and "Event" in s]
    assert _payload_rows(engine) == stored
    # The selected Event went processing, then processed, as a row without payload bytes.
    assert _event_columns(engine, pack) == [
        (1, "pending", b"", len(payloads[0])),
        (2, "pending", b"", len(payloads[1])),
        (3, "processed", b"", len(payloads[2])),
    ]
    assert_invariants(engine)


def test_payloads_kept_in_event_are_read_and_released_by_a_status_change(engine: sa.Engine) -> None:
    """Events admitted before v8 (or by a v7 release since) keep their payload in Event, where it is read."""
    connectors = Connectors(engine)
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane="a", payload=b"one"), delivery(lane="a", payload=b"two")])
    with engine.begin() as connection:
        # Ordinal 1 as a release older than v8 admitted it: the payload in Event only.
        connection.execute(
            sa.update(Event)
            .where(Event.c.PackInstallId == pack, Event.c.EnqueueOrdinal == 1)
            .values(Payload=b"one", PayloadBytes=None)
        )
        connection.execute(
            sa.delete(EventPayload).where(EventPayload.c.PackInstallId == pack, EventPayload.c.EnqueueOrdinal == 1)
        )
        # Ordinal 2 as the dual write (decision 130) leaves it: in both places until its first status change.
        connection.execute(
            sa.update(Event).where(Event.c.PackInstallId == pack, Event.c.EnqueueOrdinal == 2).values(Payload=b"two")
        )
    assert _payload_problems(engine) == []

    (claim,) = connectors.claim("w1", pack_install_ids=[pack])
    (page,) = connectors.load_inputs(claim.work.work_id, lease_token=claim.lease_token)
    assert [(i.enqueue_ordinal, i.payload) for i in page.inputs] == [(1, b"one"), (2, b"two")]
    assert _event_columns(engine, pack) == [(1, "pending", b"one", None), (2, "processing", b"", 3)]
    assert_invariants(engine)


def test_the_checker_reports_a_missing_or_orphan_payload_row(engine: sa.Engine) -> None:
    connectors = Connectors(engine)
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane="a", payload=b"abc")])
    with engine.begin() as connection:
        connection.execute(sa.delete(EventPayload))
        connection.execute(sa.insert(EventPayload).values(PackInstallId=pack, EnqueueOrdinal=9, Payload=b"stray"))
    assert sorted(_payload_problems(engine)) == [
        f"P: Event ('{pack}', 1) records a 3-byte payload but has no EventPayload row",
        f"P: EventPayload ('{pack}', 9) has no Event",
    ]
