"""``nexuscrm versions`` against a real ConnectorsService, on every backend (decision 185).

The example Flow with a side effect (``examples/deal_alerts.py``) runs live over gRPC, as a
host's pool does; ``versions build`` starts version 2 beside it, whose pool (``flow_versions``)
runs the history in a build: its read model is written, no outbox row. ``versions verify``
compares the two read models identity by identity (equal, recorded); a switch, a rollback and
a retire follow, each recorded; bad input is refused with nothing changed. The final database
keeps every invariant.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import sqlalchemy as sa

from examples import deal_alerts
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.servicer import registration
from nexuscrm_runtime.server import create_server
from nexuscrm_sdk import FlowContext, Worker
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_tools import cli
from nexuscrm_tools.clients import CONNECTORS, SERVICES
from nexuscrm_tools.commands import flow_versions
from tests.support.checksums import database_digest
from tests.support.factories import install_pack, route
from tests.support.invariants import assert_invariants
from tests.system.acceptance.test_cli_discovery_and_exit_codes import run
from tests.system.acceptance.test_operating_cli import refused
from workqueue.values import IngestItem

pytestmark = [pytest.mark.acceptance, pytest.mark.database]

WORK_TYPE = "project"  # tests.support.factories.route's, delivered with companion version crm-1.0
V1, V2 = "crm-1.0", "crm-2.0"
BY = ("--by", "ops@acme", "--reason", "read model v2")


@pytest.fixture
def client(engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> Iterator[ConnectorsClient]:
    """A ConnectorsService over ``engine`` that ``nexuscrm`` is pointed at, and an SDK client of it."""
    running = create_server([registration(Connectors(engine))], "127.0.0.1:0")
    for service in SERVICES:
        monkeypatch.delenv(service.variable, raising=False)
    target = f"127.0.0.1:{running.port}"
    monkeypatch.setenv(CONNECTORS.variable, target)
    monkeypatch.setattr(flow_versions, "POLL_INTERVAL", 0.05)
    with grpc.insecure_channel(target) as channel:
        yield ConnectorsClient(channel)
    running.stop(0)


def deals(start: int, count: int) -> list[IngestItem]:
    """Deal updates over two lanes; every third deal is won (the live version e-mails it)."""
    items = []
    for n in range(start, start + count):
        body = {"deal_id": f"d-{n}", "stage": "won" if n % 3 == 0 else "open", "amount": f"{n}.50"}
        items.append(IngestItem(receipt_key=f"r-{n}", route=route(f"lane-{n % 2}"), payload=json.dumps(body).encode()))
    return items


def pool(client: ConnectorsClient, pack: str, database: str, versions: list[str]) -> deal_alerts.DealAlerts:
    """Run the example Flow as a host pool of ``versions`` would until nothing is claimable; return the Flow."""
    context = FlowContext(
        pack_install_id=pack, work_type=WORK_TYPE, engine=sa.create_engine("sqlite://"), settings={"database": database}
    )
    flow = deal_alerts.deal_alerts(context)
    worker = Worker(client, flow, worker_id=f"pool-{versions}", pack_install_ids=[pack], flow_versions=versions)
    while worker.run_once():
        pass
    return flow


def outbox(flow: deal_alerts.DealAlerts) -> list[int]:
    with flow.engine.connect() as connection:
        return sorted(connection.execute(sa.select(deal_alerts.DealAlertOutbox.c.EnqueueOrdinal)).scalars())


def test_build_verify_switch_rollback_retire_over_the_example_flow(
    engine: sa.Engine, client: ConnectorsClient, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    pack = install_pack(engine)
    databases = {version: f"sqlite:///{tmp_path / version}.db" for version in (V1, V2)}
    client.ingest(pack, items=deals(0, 12))
    live = pool(client, pack, databases[V1], [])
    assert outbox(live) == [1, 4, 7, 10]  # ordinals of d-0, d-3, d-6, d-9: one e-mail each

    before = database_digest(engine)
    bad_version = refused(
        capsys, "versions", "build", pack, "--work-type", WORK_TYPE, "--version", "x" * 65, *BY, code=2
    )
    assert "version" in bad_version and database_digest(engine) == before  # refused, nothing changed
    built = run(capsys, "versions", "build", pack, "--work-type", WORK_TYPE, "--version", V2, *BY)
    assert built["version"]["source_version"] == V1 and built["catch_up_inputs"] == 12
    again = refused(capsys, "versions", "build", pack, "--work-type", WORK_TYPE, "--version", V2, *BY, code=8)
    assert V2 in again
    client.ingest(pack, items=deals(12, 3))  # admitted to both versions
    live = pool(client, pack, databases[V1], [])  # first: a build yields to live work that is due
    assert outbox(live) == [1, 4, 7, 10, 13]
    built_flow = pool(client, pack, databases[V2], [V2])
    assert outbox(built_flow) == []  # the build ran every input and caused no side effect

    listed = run(capsys, "versions", "list", pack, "--work-type", WORK_TYPE, "--watch", "--timeout", "30s")
    progress = {v["version"]: (v["state"], v["inputs_done"], v["inputs_total"]) for v in listed["versions"]}
    assert progress == {V1: ("live", 15, 15), V2: ("standby", 15, 15)}

    verify = ("versions", "verify", pack, "--work-type", WORK_TYPE, "--version", V2, "--against", V1)
    flows = ("--flow", "examples.deal_alerts:deal_alerts", "--against-flow", "examples.deal_alerts:deal_alerts")
    settings = ("--setting", f"database={databases[V2]}", "--against-setting", f"database={databases[V1]}")
    verified = run(capsys, *verify, *flows, *settings, "--dsn", "sqlite://", "--by", "ops@acme", "--timeout", "30s")
    assert (verified["verdict"], verified["through_ordinal"], verified["identities"]) == ("equal", 15, 2)
    assert verified["version"]["verdict"] == "equal" and verified["version"]["verified_against"] == V1

    switched = run(capsys, "versions", "switch", pack, "--work-type", WORK_TYPE, "--version", V2, *BY)
    assert (switched["live"]["version"], switched["previous"]["version"]) == (V2, V1)
    client.ingest(pack, items=deals(15, 3))  # d-15 is won: version 2 now e-mails it
    assert outbox(pool(client, pack, databases[V2], [V2])) == [16]
    rolled = run(capsys, "versions", "rollback", pack, "--work-type", WORK_TYPE, *BY)
    assert rolled["live"]["version"] == V1
    assert outbox(pool(client, pack, databases[V1], [])) == [1, 4, 7, 10, 13]  # its catch-up runs in a build
    retired = run(capsys, "versions", "retire", pack, "--work-type", WORK_TYPE, "--version", V2, *BY)
    assert retired["state"] == "retired"
    final = run(capsys, "versions", "list", pack)["versions"]
    steps = {v["version"]: [(c["action"], c["actor"]) for c in v["changes"]] for v in final}
    assert [action for action, _ in steps[V2]] == ["build", "verify", "switch", "retire"]
    assert ("rollback", "ops@acme") in steps[V1]
    assert {v["version"]: v["state"] for v in final} == {V1: "live", V2: "retired"}
    # Retention says it does not prune a work type with Flow versions, in JSON and in words.
    assert run(capsys, "retention", "show", pack)["not_pruned_work_types"] == [WORK_TYPE]
    assert cli.main(["retention", "show", pack]) == 0
    shown = capsys.readouterr().out
    assert f"work type {WORK_TYPE} ({V1} live, {V2} retired): a work type with Flow versions keeps" in shown
    assert_invariants(engine)
