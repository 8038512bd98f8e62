"""The walking workload with aggressive retention: the database stays bounded and every check passes.

The whole system runs (four services, the demo Flow on the host, the simulator's walking
window with bursts and duplicates) with a policy that keeps only the newest generation of
each lane, pruned by Connectors' background pass every second while the workload runs
(paced at 300 deliveries/s, so that duplicates of already pruned inputs come too).
"""

from __future__ import annotations

import datetime as dt
import json
import threading
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from nexuscrm_connectors import retention
from nexuscrm_connectors.settings import Settings
from nexuscrm_runtime.clock import DATABASE_CLOCK
from nexuscrm_runtime.database import create_engine
from nexuscrm_schema.tables import Event, IngressReceipt, PrunedReceipt, PrunedWork, WorkItem
from nexuscrm_tools import cli, demo
from nexuscrm_tools import demo_queries as queries
from nexuscrm_tools.exits import ExitCode
from nexuscrm_tools.launcher import ServiceProcess, stop_services, target_env
from nexuscrm_tools.run import run_demo, start_system
from nexuscrm_tools.simulator import WorkloadConfig
from tests.acceptance.test_integration_service import expected_contacts
from tests.support.invariants import assert_invariants
from tests.support.waiting import DEADLINE, wait_until
from workqueue.values import Outcome

pytestmark = [pytest.mark.acceptance, pytest.mark.database]

LANES = 30


def _counts(engine: sa.Engine) -> dict[str, int]:
    with engine.connect() as connection:
        return {
            table.name: int(connection.execute(sa.select(sa.func.count()).select_from(table)).scalar_one())
            for table in (Event, WorkItem, IngressReceipt, PrunedWork, PrunedReceipt)
        }


def test_walking_workload_with_aggressive_retention_stays_bounded_and_correct(
    empty_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    config = WorkloadConfig(
        lanes=LANES, inputs=1500, rate=300, window=6, duplicate_ratio=0.1, burst_chance=0.2, burst_size=20, seed=7
    )
    services, pack = start_system(
        empty_dsn, tmp_path, namespace="acme", workers=3, extra_env={"NEXUSCRM_MATERIALIZE_INTERVAL_SECONDS": "1"}
    )
    engine = create_engine(empty_dsn)
    try:
        retention.set_policy(engine, DATABASE_CLOCK, pack, keep_generations=1, keep_seconds=0)
        summary = run_demo(
            engine, services, pack, config, stop=threading.Event(), timeout=dt.timedelta(seconds=DEADLINE)
        )
        wait_until(
            lambda: retention.prune(engine, Settings(), DATABASE_CLOCK, pack, dry_run=True)[0].generations == 0,
            "the background pass to prune every generation the policy lets go",
        )
        _operator_sees_retention(engine, services, pack, monkeypatch, capsys)
    finally:
        assert set(stop_services(services).values()) == {0}
    counts = _counts(engine)
    assert summary.complete and summary.problems == (), summary.problems
    assert summary.stats.admitted == config.inputs
    assert summary.stats.duplicates_acknowledged == summary.stats.duplicates_sent > 0
    assert (
        summary.stats.outcomes[Outcome.DUPLICATE_PRUNED] > 0
    )  # duplicates of pruned inputs came and were acknowledged
    assert summary.stats.outcomes[Outcome.COVERAGE_MISSING] == 0
    # Bounded: one generation per lane is left, holding only that generation's inputs.
    assert counts["WorkItem"] <= LANES and counts["Event"] < config.inputs // 4, counts
    assert counts["Event"] + counts["PrunedReceipt"] == config.inputs
    assert counts["IngressReceipt"] == counts["Event"]
    with engine.connect() as connection:
        rows = queries.demo_contacts_get(connection, pack)
    projected = {
        r.ContactId: ({"name": r.Name, "email": r.Email, "company": r.Company, "stage": r.Stage}, r.Updates)
        for r in rows
    }
    assert projected == expected_contacts(config)  # the fold of every input, pruned ones included
    assert demo.verify_projection(engine, pack) == []
    assert_invariants(engine)
    engine.dispose()


def _operator_sees_retention(
    engine: sa.Engine,
    services: list[ServiceProcess],
    pack: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``nexuscrm retention`` and ``why``/``work show`` of pruned rows, over the running services."""
    for name, address in target_env(services).items():
        monkeypatch.setenv(name, address)
    capsys.readouterr()

    def run_cli(*argv: str) -> Any:
        assert cli.main(["--json", *argv]) == ExitCode.OK
        return json.loads(capsys.readouterr().out)

    shown = run_cli("retention", "show", pack)
    assert shown["keep_generations"] == 1 and int(shown["horizon_ordinal"]) > 0
    assert int(run_cli("retention", "prune", pack, "--dry-run")["generations"]) == 0
    with engine.connect() as connection:
        tombstone = connection.execute(sa.select(PrunedReceipt).where(PrunedReceipt.c.PackInstallId == pack)).first()
    assert tombstone is not None
    explained = run_cli("why", pack, tombstone.ReceiptKey)
    assert explained["receipt_state"] == "pruned" and explained["explanation"].startswith("pruned at ")
    assert cli.main(["work", "show", tombstone.WorkId]) == ExitCode.REFUSED
    assert "FAILED_PRECONDITION" in capsys.readouterr().err
