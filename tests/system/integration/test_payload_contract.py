"""The payload contract of schema v10 (decision 130), on every backend.

A database ApplySchema creates has the contract at once: Event.Payload stays empty. An
upgraded one has it unset until the operator sets it: Connectors then also writes each
payload into Event.Payload and status changes keep it, so a v7 Connectors (which reads only
Event.Payload) serving the same database hands workers the real payloads. The operator
command sets the flag and moves every payload out of Event.Payload (empties the old copies;
copies a payload held only there into EventPayload first, decision 150) in bounded,
resumable batches; its dry run counts and changes nothing.
"""

from __future__ import annotations

import datetime as dt
import json

import pytest
import sqlalchemy as sa

from nexuscrm_connectors import payload_contract as cached_contract
from nexuscrm_connectors.facade import Connectors
from nexuscrm_schema.invariants import payload_storage_violations
from nexuscrm_schema.tables import Event, EventPayload, PayloadContract, WorkItem
from nexuscrm_schema.verification import NEWEST_VERSION
from nexuscrm_schema_catalog import migrations, payload_contract, payload_move
from nexuscrm_tools import cli
from nexuscrm_tools.exits import ExitCode
from tests.support.checksums import database_digest
from tests.support.factories import delivery, install_pack
from tests.support.invariants import assert_invariants
from tests.support.schema_catalog_server import serving_schema_catalog
from tests.support.statements import capture
from workqueue.errors import DomainError

pytestmark = pytest.mark.database

START = ("", payload_move.FIRST_ORDINAL)


def _contract_rows(engine: sa.Engine) -> list[tuple[str, str]]:
    with engine.connect() as connection:
        return [(r.Contract, r.SetBy) for r in connection.execute(sa.select(PayloadContract))]


def _event_payloads(engine: sa.Engine, pack: str) -> dict[int, tuple[bytes, bytes]]:
    """Ordinal -> (Event.Payload, the EventPayload row's payload)."""
    with engine.connect() as connection:
        rows = connection.execute(
            sa.select(Event.c.EnqueueOrdinal, Event.c.Payload, EventPayload.c.Payload.label("Stored"))
            .join(
                EventPayload,
                sa.and_(
                    EventPayload.c.PackInstallId == Event.c.PackInstallId,
                    EventPayload.c.EnqueueOrdinal == Event.c.EnqueueOrdinal,
                ),
            )
            .where(Event.c.PackInstallId == pack)
        )
        return {r.EnqueueOrdinal: (bytes(r.Payload), bytes(r.Stored)) for r in rows}


def _v7_load_inputs(engine: sa.Engine, work_id: str) -> list[bytes]:
    """What a v7 Connectors hands a worker: Event.Payload of the generation's members, nothing else."""
    with engine.connect() as connection:
        rows = connection.execute(
            sa.select(Event.c.Payload)
            .select_from(
                WorkItem.join(
                    Event,
                    sa.and_(
                        Event.c.PackInstallId == WorkItem.c.PackInstallId,
                        Event.c.ProjectionKey == WorkItem.c.ProjectionKey,
                        Event.c.EnqueueOrdinal.between(WorkItem.c.InputStartOrdinal, WorkItem.c.LaneOrdinal),
                    ),
                )
            )
            .where(WorkItem.c.WorkId == work_id)
            .order_by(Event.c.EnqueueOrdinal)
        )
        return [bytes(r.Payload) for r in rows]


def _upgraded(engine: sa.Engine) -> tuple[str, list[bytes]]:
    """A database created before v10 (at v9), migrated to the newest: the contract unset, admission dual-writes."""
    assert migrations.apply_schema(engine, 9)[1] == 9
    pack = install_pack(engine)
    assert migrations.apply_schema(engine)[:2] == (9, NEWEST_VERSION)
    assert _contract_rows(engine) == []
    payloads = [b"first" * 50, b"\x00second", b"third" * 20]
    Connectors(engine).ingest(pack, items=[delivery(lane="a", payload=p) for p in payloads])
    return pack, payloads


def test_a_fresh_database_has_the_contract_and_admits_with_an_empty_event_payload(engine: sa.Engine) -> None:
    assert _contract_rows(engine) == [("event_payload_elsewhere", migrations.SET_BY_EMPTY_DATABASE)]
    connectors = Connectors(engine)
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane="a", payload=b"one"), delivery(lane="a", payload=b"two")])
    assert _event_payloads(engine, pack) == {1: (b"", b"one"), 2: (b"", b"two")}
    assert_invariants(engine)


def test_an_upgraded_database_dual_writes_and_a_v7_reader_sees_every_payload(
    empty_engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    pack, payloads = _upgraded(empty_engine)
    connectors = Connectors(empty_engine)
    with capture(empty_engine) as admission:
        connectors.ingest(pack, items=[delivery(lane="b", payload=b"fourth")])
    assert not [
        c for c in admission.statements if PayloadContract.name in c.statement
    ]  # the cached flag: no read per admission
    payloads.append(b"fourth")
    assert _event_payloads(empty_engine, pack) == {n: (p, p) for n, p in enumerate(payloads, start=1)}

    claims = connectors.claim("w1", pack_install_ids=[pack], max_items=2, lease=dt.timedelta(seconds=30))
    loaded = {
        c.work.work_id: [
            i.payload for page in connectors.load_inputs(c.work.work_id, lease_token=c.lease_token) for i in page.inputs
        ]
        for c in claims
    }
    assert sorted(loaded.values()) == sorted([payloads[:3], [b"fourth"]])
    assert {work_id: _v7_load_inputs(empty_engine, work_id) for work_id in loaded} == loaded
    lane_a, lane_b = sorted(claims, key=lambda c: loaded[c.work.work_id] != payloads[:3])
    connectors.complete(lane_a.work.work_id, lease_token=lane_a.lease_token)
    connectors.fail(lane_b.work.work_id, lease_token=lane_b.lease_token, error="boom", retryable=False)
    # Status changes (claims, a completion, a failure) kept every copy for v7.
    assert {work_id: _v7_load_inputs(empty_engine, work_id) for work_id in loaded} == loaded
    connectors.ingest(pack, items=[delivery(lane="d", payload=b"fifth")])
    payloads.append(b"fifth")
    assert _event_payloads(empty_engine, pack) == {n: (p, p) for n, p in enumerate(payloads, start=1)}
    assert_invariants(empty_engine)

    # Once set (and seen by the cache's next read), admission and status changes store payloads once.
    with empty_engine.begin() as connection:
        assert payload_contract.set_contract(connection, "test").newly_set
    monkeypatch.setattr(cached_contract, "REFRESH_SECONDS", 0.0)
    connectors.ingest(pack, items=[delivery(lane="c", payload=b"sixth")])
    assert {c.work.lane_ordinal for c in connectors.claim("w1", pack_install_ids=[pack], max_items=10)} == {5, 6}
    stored = _event_payloads(empty_engine, pack)
    assert stored[6] == (b"", b"sixth")
    assert stored[5] == (b"", b"fifth")  # its claim emptied the old copy
    assert [stored[n] for n in (1, 2, 3, 4)] == [(p, p) for p in payloads[:4]]  # until the operator's pass
    assert_invariants(empty_engine)


def test_the_operator_command_counts_then_sets_the_flag_empties_copies_in_batches_and_is_idempotent(
    empty_engine: sa.Engine, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pack, payloads = _upgraded(empty_engine)
    other = install_pack(empty_engine)
    Connectors(empty_engine).ingest(other, items=[delivery(lane="z", payload=b"z" * 4000) for _ in range(3)])
    monkeypatch.setattr(payload_move, "MOVE_BATCH_ROWS", 2)
    monkeypatch.setattr(payload_move, "MAX_TRANSACTION_BYTES", 5000)  # the other pack's 4000-byte copies go alone
    copies = sum(map(len, payloads)) + 3 * 4000
    with serving_schema_catalog(empty_engine, monkeypatch):
        with empty_engine.connect() as connection:
            before = database_digest(connection)
        capsys.readouterr()
        assert cli.main(["--json", "schema", "contract-payloads", "--dry-run"]) == ExitCode.OK
        counted = json.loads(capsys.readouterr().out)
        assert counted == {
            "dry_run": True,
            "set_at": "",
            "set_by": "",
            "emptied": 6,
            "emptied_bytes": copies,
            "moved": 0,
        }
        with empty_engine.connect() as connection:
            assert database_digest(connection) == before

        assert cli.main(["--json", "schema", "contract-payloads", "--batches-per-call", "1"]) == ExitCode.OK
        captured = capsys.readouterr()
        first = json.loads(captured.out)
        assert first["newly_set"] is True and first["set_by"].startswith("ContractPayloads from ")
        assert (first["emptied"], first["emptied_bytes"], first["moved"]) == (6, copies, 0)  # every one in EventPayload
        # One progress line per call: pack batches of 2 and 1 ordinals, the other pack's one by one, the last empty.
        progress = [line for line in captured.err.splitlines() if line.startswith("emptied ")]
        assert progress[-1].startswith("emptied 6 of 6 Event payloads (0 moved into EventPayload, "), progress
        assert len(progress) == 2 + 3 + 1, captured.err

        assert cli.main(["--json", "schema", "contract-payloads"]) == ExitCode.OK
        again = json.loads(capsys.readouterr().out)
        assert again == {**first, "newly_set": False, "emptied": 0, "emptied_bytes": 0, "moved": 0}
    assert _contract_rows(empty_engine) == [("event_payload_elsewhere", first["set_by"])]
    for each in (pack, other):
        assert all(copy == b"" and stored for copy, stored in _event_payloads(empty_engine, each).values())
    assert_invariants(empty_engine)


def test_an_interrupted_pass_resumes_and_empties_each_copy_once(
    empty_engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    pack, payloads = _upgraded(empty_engine)
    monkeypatch.setattr(payload_move, "MOVE_BATCH_ROWS", 1)
    real_move = payload_move._move
    emptied: list[tuple[int, int]] = []

    def move_then_fail(connection: sa.Connection, batch: sa.ColumnElement[bool]) -> tuple[int, int]:
        if len(emptied) == 1:
            raise ConnectionError("the schema catalog stopped mid-pass")
        emptied.append(real_move(connection, batch))
        return emptied[-1]

    monkeypatch.setattr(payload_move, "_move", move_then_fail)
    with pytest.raises(ConnectionError):
        payload_contract.contract_payloads(empty_engine, "op", start=START, max_batches=10)
    assert [copy for copy, _ in _event_payloads(empty_engine, pack).values()] == [b"", *payloads[1:]]
    assert payload_storage_violations(empty_engine) == []

    monkeypatch.setattr(payload_move, "_move", real_move)
    state, batches, done = payload_contract.contract_payloads(empty_engine, "op", start=START, max_batches=1)
    assert (state.newly_set, state.set_by, done) == (False, "op", False)  # set by the interrupted call
    assert [(b.pack, b.through, b.emptied) for b in batches] == [(pack, 2, 1)]  # ordinal 1 was done: skipped
    # Resume from the position the last batch reached.
    state, batches, done = payload_contract.contract_payloads(empty_engine, "op", start=(pack, 2), max_batches=5)
    assert ([(b.pack, b.through, b.emptied) for b in batches], done) == ([(pack, 3, 1)], True)
    assert all(copy == b"" for copy, _ in _event_payloads(empty_engine, pack).values())
    assert_invariants(empty_engine)


def test_the_operator_command_refuses_a_schema_older_than_v10(
    empty_engine: sa.Engine, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    migrations.apply_schema(empty_engine, 9)
    with empty_engine.connect() as connection:
        before = database_digest(connection)
    with pytest.raises(DomainError, match="needs schema v10; the database is at v9"):
        payload_contract.contract_payloads(empty_engine, "op", start=START, max_batches=1)
    with serving_schema_catalog(empty_engine, monkeypatch):
        capsys.readouterr()
        assert cli.main(["schema", "contract-payloads"]) == ExitCode.REFUSED
    assert (
        "FAILED_PRECONDITION: the payload contract needs schema v10; the database is at v9" in capsys.readouterr().err
    )
    with empty_engine.connect() as connection:
        assert database_digest(connection) == before


def test_the_checker_flags_an_old_copy_that_differs_from_its_payload_row(empty_engine: sa.Engine) -> None:
    pack, _ = _upgraded(empty_engine)
    assert payload_storage_violations(empty_engine) == []  # equal copies are allowed
    with empty_engine.begin() as connection:
        connection.execute(
            sa.update(Event)
            .where(Event.c.PackInstallId == pack, Event.c.EnqueueOrdinal == 2)
            .values(Payload=b"\x00secoND")  # same length, other bytes
        )
    assert payload_storage_violations(empty_engine) == [
        f"P: Event ('{pack}', 2) keeps a copy in Event.Payload that differs from its EventPayload row"
    ]
