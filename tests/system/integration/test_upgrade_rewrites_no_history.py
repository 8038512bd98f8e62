"""Applying the newest schema to a v2 history rewrites none of it (decision 150), on every backend.

A database at schema v2 holds a pack of old-protocol history waiting for its cutover (the
prior WorkItem-only handoff recorded, every generation completed) and a pack already served
natively at v2 (a completed range generation). Its rows are written as the v2 releases wrote
them, through tables reflected at v2: the payloads in Event.Payload. The newest schema then
leaves every Event and WorkItem row byte for byte as it was on the columns it had, with the
new columns NULL; the cutover succeeds and the runtime serves the pack (new inputs, claims
with inline inputs, LoadInputs); a replay of the generation completed at v2 reads its old
payloads where they are. Then the operator's move: its dry run changes nothing, the move
empties every Event.Payload (copying the old payloads into EventPayload first), a second run
moves nothing, and every read answers the same payloads.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.facade import Connectors
from nexuscrm_controlplane import drain, fences
from nexuscrm_controlplane.cutover import Outcome as CutoverOutcome
from nexuscrm_schema.relations import EVENT_PAYLOAD, EVENT_WITH_PAYLOAD
from nexuscrm_schema.tables import Event, EventPayload
from nexuscrm_schema.verification import NEWEST_VERSION
from nexuscrm_schema_catalog import migrations
from nexuscrm_tools import cli
from nexuscrm_tools.exits import ExitCode
from tests.controlplane.integration.history import NAMESPACE, FakeClock, arm, cut, items
from tests.controlplane.integration.history import route as history_route
from tests.support.checksums import Checksums, database_digest, row_checksums
from tests.support.invariants import assert_invariants
from tests.support.schema_catalog_server import serving_schema_catalog
from workqueue.values import Outcome

pytestmark = pytest.mark.database

LEGACY, NATIVE = "pk-legacy", "pk-native"
HISTORY_TABLES = ("Event", "WorkItem")
AT = dt.datetime(2025, 6, 1, 12, 0, 0)


def _key(pack: str, lane: str) -> str:
    """The projection key ``tests.controlplane.integration.history.items`` deliveries of ``lane`` get."""
    return history_route(lane).identity(pack).key


A, B, C = _key(LEGACY, "lane-a"), _key(LEGACY, "lane-b"), _key(NATIVE, "lane-c")
# (pack, ordinal) -> (projection key, payload, status) of the v2 history: binary, empty and large payloads.
EVENTS = {
    (LEGACY, 1): (A, b"\x00\xff legacy one", "processed"),
    (LEGACY, 2): (B, b"", "processed"),  # coalesced into ordinal 3's generation
    (LEGACY, 3): (B, b"x" * 3000, "processed"),
    (LEGACY, 4): (A, bytes(range(256)), "processed"),
    (NATIVE, 1): (C, b"native one", "pending"),  # a native claim changes the selected Event only
    (NATIVE, 2): (C, b"\x01" * 5000, "pending"),
    (NATIVE, 3): (C, b"native three", "processed"),
}
# WorkId -> (pack, projection key, InputStartOrdinal, LaneOrdinal): every one completed at v2.
WORK = {
    "w-legacy-1": (LEGACY, A, None, 1),
    "w-legacy-2": (LEGACY, B, None, 3),
    "w-legacy-3": (LEGACY, A, None, 4),
    "w-native-1": (NATIVE, C, 1, 3),
}


def _seed_v2_history(engine: sa.Engine) -> dict[str, list[str]]:
    """Write the v2 history through tables reflected at v2; return the columns Event and WorkItem had."""
    assert migrations.apply_schema(engine, 2) == (0, 2, ["v1_pre_upgrade_schema", "v2_projection_input_ranges"])
    with engine.begin() as connection:
        v2 = sa.MetaData()
        v2.reflect(connection)
        pack, event, work = v2.tables["PackInstall"], v2.tables["Event"], v2.tables["WorkItem"]
        protocol = v2.tables["_System_ConnectorProjectionProtocol"]
        for pack_id, last in ((LEGACY, 4), (NATIVE, 3)):
            connection.execute(
                sa.insert(pack).values(
                    PackInstallId=pack_id,
                    Namespace=NAMESPACE,
                    PackName=pack_id,
                    PackVersion="1.0.0",
                    LastOrdinal=last,
                    WorkItemHandoffAt=AT,
                    CreatedAt=AT,
                )
            )
        connection.execute(
            sa.insert(protocol).values(
                PackInstallId=NATIVE, ProtocolVersion=1, LegacyMaxOrdinal=0, Origin="greenfield", CreatedAt=AT
            )
        )
        connection.execute(
            sa.insert(event),
            [
                {
                    "PackInstallId": pack_id,
                    "EnqueueOrdinal": ordinal,
                    "ProjectionKey": key,
                    "ReceiptKey": f"r-{pack_id}-{ordinal}",
                    "PayloadHash": hashlib.sha256(payload).hexdigest(),
                    "Payload": payload,
                    "SourceTime": AT,
                    "Status": status,
                    "CreatedAt": AT,
                }
                for (pack_id, ordinal), (key, payload, status) in EVENTS.items()
            ],
        )
        connection.execute(
            sa.insert(v2.tables["IngressReceipt"]),
            [  # v2's native admission stored each receipt with its payload, then confirmed it
                {
                    "PackInstallId": pack_id,
                    "ReceiptKey": f"r-{pack_id}-{ordinal}",
                    "ProjectionKey": key,
                    "PayloadHash": hashlib.sha256(payload).hexdigest(),
                    "Payload": payload,
                    "SourceTime": AT,
                    "State": "confirmed",
                    "ReceivedAt": AT,
                    "ConfirmedAt": AT,
                }
                for (pack_id, ordinal), (key, payload, _) in EVENTS.items()
                if pack_id == NATIVE
            ],
        )
        connection.execute(
            sa.insert(work),
            [
                {
                    "WorkId": work_id,
                    "PackInstallId": pack_id,
                    "ProjectionKey": key,
                    "WorkType": "project",
                    "InputStartOrdinal": start,
                    "LaneOrdinal": lane,
                    "Status": "completed",
                    "Attempt": 1,
                    "MaxAttempts": 5,
                    "CreatedAt": AT,
                    "FinishedAt": AT,
                }
                for work_id, (pack_id, key, start, lane) in WORK.items()
            ],
        )
        return {name: [c.name for c in v2.tables[name].columns] for name in HISTORY_TABLES}


def _digests(engine: sa.Engine, columns: dict[str, list[str]], rows: Checksums | None = None) -> Checksums:
    """Digests of Event's and WorkItem's rows on ``columns``; only the rows of ``rows`` when given (the history)."""
    with engine.connect() as connection:
        found = {name: row_checksums(connection, name, columns[name]) for name in HISTORY_TABLES}
    if rows is None:
        return found
    return {name: {key: digest for key, digest in found[name].items() if key in rows[name]} for name in found}


def _added_columns(engine: sa.Engine, columns: dict[str, list[str]]) -> dict[str, set[object]]:
    """The distinct values of every column added after v2 to Event and WorkItem, by ``table.column``."""
    found: dict[str, set[object]] = {}
    with engine.connect() as connection:
        for name in HISTORY_TABLES:
            table = sa.Table(name, sa.MetaData(), autoload_with=connection)
            for column in table.columns:
                if column.name not in columns[name]:
                    found[f"{name}.{column.name}"] = set(connection.execute(sa.select(column).distinct()).scalars())
    return found


def _payloads(engine: sa.Engine) -> dict[tuple[str, int], bytes]:
    """Every Event's payload wherever it is stored, as the whole-table readers read it."""
    with engine.connect() as connection:
        rows = connection.execute(
            sa.select(Event.c.PackInstallId, Event.c.EnqueueOrdinal, EVENT_PAYLOAD).select_from(EVENT_WITH_PAYLOAD)
        )
        return {(r.PackInstallId, r.EnqueueOrdinal): bytes(r.Payload) for r in rows}


def _members(connectors: Connectors, work_id: str) -> list[bytes]:
    return [i.payload for i in connectors.list_members(work_id).inputs]


def _everything(engine: sa.Engine) -> Checksums:
    return database_digest(engine)


def test_a_v2_history_keeps_every_row_through_the_newest_schema_the_cutover_and_the_payload_move(
    empty_engine: sa.Engine, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    engine, clock = empty_engine, FakeClock()
    v2_columns = _seed_v2_history(engine)
    before = _digests(engine, v2_columns)
    assert [len(before[name]) for name in HISTORY_TABLES] == [len(EVENTS), len(WORK)]

    # Runbook step 1: the newest schema. Every row as it was; the new columns NULL; nothing copied.
    start, end, _ = migrations.apply_schema(engine)
    assert (start, end) == (2, NEWEST_VERSION)
    assert _digests(engine, v2_columns) == before
    added = _added_columns(engine, v2_columns)
    assert {"Event.PayloadBytes", "WorkItem.SuccessorWorkId", "WorkItem.ClaimedMemberCount"} <= set(added)
    assert {column: values for column, values in added.items() if values != {None}} == {}
    with engine.connect() as connection:
        assert connection.execute(sa.select(sa.func.count()).select_from(EventPayload)).scalar_one() == 0
    old_payloads = {key: payload for key, (_, payload, _) in EVENTS.items()}
    assert _payloads(engine) == old_payloads
    assert_invariants(engine)

    # Steps 1-4: the fence, nothing to drain, the checkpoint (``cut`` asserts it changed no history row).
    fence = arm(engine, clock)
    assert drain.drain_status(engine, LEGACY, clock).drained
    assert cut(engine, LEGACY, clock).outcome is CutoverOutcome.WRITTEN
    fences.disarm_fence(engine, fence)
    assert _digests(engine, v2_columns) == before

    # Step 5: the runtime serves the pack: new inputs, a claim with inline inputs, LoadInputs.
    connectors = Connectors(engine, clock=clock)
    admitted = connectors.ingest(LEGACY, items=items(["new-1", "new-2"]))
    assert [(r.outcome, r.enqueue_ordinal) for r in admitted] == [(Outcome.ADMITTED, 5), (Outcome.ADMITTED, 6)]
    (claim,) = connectors.claim("w1", pack_install_ids=[LEGACY], inline_inputs=True)
    new_payloads = [b"payload new-1", b"payload new-2"]
    assert claim.inputs is not None and [i.payload for i in claim.inputs.inputs] == new_payloads
    pages = connectors.load_inputs(claim.work.work_id, lease_token=claim.lease_token)
    assert [i.payload for page in pages for i in page.inputs] == new_payloads
    connectors.complete(claim.work.work_id, lease_token=claim.lease_token)

    # A replay of the generation completed at v2: its members are read where v2 wrote them.
    replayed = connectors.replay("w-native-1")
    (again,) = connectors.claim("w1", pack_install_ids=[NATIVE])
    assert again.work.work_id == replayed.work.work_id and again.work.replay_of_work_id == "w-native-1"
    (page,) = connectors.load_inputs(again.work.work_id, lease_token=again.lease_token)
    assert json.loads(page.inputs[0].payload)["input_start_ordinal"] == 1
    native = [old_payloads[(NATIVE, n)] for n in (1, 2, 3)]
    assert _members(connectors, "w-native-1") == native
    connectors.complete(again.work.work_id, lease_token=again.lease_token)
    assert _digests(engine, v2_columns, before) == before  # serving changed no history row either
    assert_invariants(engine)
    served = _payloads(engine)
    assert {key: served[key] for key in old_payloads} == old_payloads

    # The operator's move: a dry run changes nothing, then the move, then a second run moves nothing.
    new_events = len(served) - len(old_payloads)  # admitted by the dual write: copies to empty, none to move
    with serving_schema_catalog(engine, monkeypatch):
        untouched = _everything(engine)
        capsys.readouterr()
        assert cli.main(["--json", "schema", "contract-payloads", "--dry-run"]) == ExitCode.OK
        counted = json.loads(capsys.readouterr().out)
        assert (counted["emptied"], counted["moved"]) == (len(EVENTS) + new_events, len(EVENTS))
        assert counted["emptied_bytes"] == sum(map(len, served.values()))
        assert _everything(engine) == untouched

        assert cli.main(["--json", "schema", "contract-payloads"]) == ExitCode.OK
        moved = json.loads(capsys.readouterr().out)
        assert moved["newly_set"] is True
        assert {k: moved[k] for k in ("emptied", "emptied_bytes", "moved")} == {
            k: counted[k] for k in ("emptied", "emptied_bytes", "moved")
        }
        after_move = _everything(engine)
        assert cli.main(["--json", "schema", "contract-payloads"]) == ExitCode.OK
        second = json.loads(capsys.readouterr().out)
        assert (second["newly_set"], second["emptied"], second["moved"]) == (False, 0, 0)
        assert _everything(engine) == after_move

    assert _payloads(engine) == served
    assert _members(connectors, "w-native-1") == native
    with engine.connect() as connection:
        rows = connection.execute(sa.select(Event.c.Payload, Event.c.PayloadBytes)).all()
    assert {bytes(r.Payload) for r in rows} == {b""} and None not in {r.PayloadBytes for r in rows}
    assert_invariants(engine)
