"""The walking workload with aggressive retention: the database stays bounded and every check passes.

The whole system runs (four services, the demo Flow on the host, the simulator's walking
window with bursts and duplicates) with a policy that keeps only the newest generation of
each lane and a duplicate window of two seconds, pruned and expired by Connectors'
background pass every second while the workload runs (paced at 300 deliveries/s, so that
duplicates of already pruned and already expired inputs come too). At the end every input
is delivered again: none creates work.
"""

from __future__ import annotations

import collections
import datetime as dt
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.context import Context
from nexuscrm_connectors.operating import retention
from nexuscrm_runtime.database import create_engine
from nexuscrm_schema.tables import Event, IngressReceipt, PrunedReceipt, PrunedWork, WorkItem
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_tools import cli, demo, simulator
from nexuscrm_tools import demo_queries as queries
from nexuscrm_tools.exits import ExitCode
from nexuscrm_tools.launcher import CONNECTORS, ServiceProcess, stop_services, target_env
from nexuscrm_tools.run import run_demo, start_system
from nexuscrm_tools.simulator import WorkloadConfig, workload
from tests.support.invariants import assert_invariants, window_violations
from tests.support.waiting import DEADLINE, wait_until
from tests.system.acceptance.test_integration_service import expected_contacts
from workqueue.values import IngestItem, Outcome

pytestmark = [pytest.mark.acceptance, pytest.mark.database]

LANES = 30
WINDOW_SECONDS = 2


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
    fresh = _recording_fresh_inputs(monkeypatch)
    try:
        retention.set_policy(
            Context.of(engine), pack, keep_generations=1, keep_seconds=0, duplicate_window_seconds=WINDOW_SECONDS
        )
        summary = run_demo(
            engine, services, pack, config, stop=threading.Event(), timeout=dt.timedelta(seconds=DEADLINE)
        )
        wait_until(
            lambda: _nothing_more_to_let_go(engine, pack),
            "the background pass to prune every generation the policy lets go and expire every tombstone",
        )
        _operator_sees_retention(engine, services, pack, monkeypatch, capsys)
        counts = _counts(engine)
        redelivered = _deliver_again(services, pack, fresh)
        assert _counts(engine) == counts  # no Event, no work, no receipt, no tombstone
    finally:
        assert set(stop_services(services).values()) == {0}
    assert summary.complete and summary.problems == (), summary.problems
    assert summary.stats.admitted == config.inputs
    assert summary.stats.duplicates_acknowledged == summary.stats.duplicates_sent > 0
    assert summary.stats.outcomes[Outcome.COVERAGE_MISSING] == 0
    # Bounded by the policy, not by the number of inputs: the newest generation of each lane
    # (keep 1) with only its own inputs; every tombstone and pruned-generation record older
    # than the window expired.
    assert counts["WorkItem"] <= LANES and counts["Event"] == _newest_generation_members(engine), counts
    assert counts["PrunedReceipt"] == counts["PrunedWork"] == 0, counts
    assert counts["IngressReceipt"] == counts["Event"]
    # Every input delivered again: the retained ones are covered, the others expired.
    assert set(redelivered) == {Outcome.DUPLICATE_COVERED, Outcome.EXPIRED}, redelivered
    assert redelivered[Outcome.DUPLICATE_COVERED] == counts["Event"]
    acknowledged = {(pack, item.receipt_key): item.source_time for item in fresh if item.source_time is not None}
    assert len(acknowledged) == config.inputs and window_violations(engine, acknowledged) == []
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


def _newest_generation_members(engine: sa.Engine) -> int:
    """Events in the range of a retained generation that is the newest of its identity (all there should be)."""
    with engine.connect() as connection:
        newest = {}
        for row in connection.execute(sa.select(WorkItem).order_by(WorkItem.c.LaneOrdinal)):
            newest[row.ProjectionKey] = row
        events = connection.execute(sa.select(Event.c.ProjectionKey, Event.c.EnqueueOrdinal)).all()
    return sum(
        1
        for e in events
        if e.ProjectionKey in newest
        and newest[e.ProjectionKey].InputStartOrdinal <= e.EnqueueOrdinal <= newest[e.ProjectionKey].LaneOrdinal
    )


def _recording_fresh_inputs(monkeypatch: pytest.MonkeyPatch) -> list[IngestItem]:
    """The fresh inputs the simulator sends (as sent: their payloads carry the sending time)."""
    sent: list[IngestItem] = []

    def recorded(config: WorkloadConfig) -> Iterator[list[simulator.Delivery]]:
        for batch in workload(config):
            sent.extend(d.item for d in batch if not d.duplicate)
            yield batch

    monkeypatch.setattr(simulator, "workload", recorded)
    return sent


def _nothing_more_to_let_go(engine: sa.Engine, pack: str) -> bool:
    report = retention.prune(Context.of(engine), pack, dry_run=True)[0]
    counts = _counts(engine)
    return report.generations == report.expired_receipts == counts["PrunedReceipt"] == counts["PrunedWork"] == 0


def _deliver_again(services: list[ServiceProcess], pack: str, items: list[IngestItem]) -> collections.Counter[Outcome]:
    """Deliver ``items`` again, exactly as first sent; their outcomes."""
    (connectors,) = (s for s in services if s.spec is CONNECTORS)
    outcomes: collections.Counter[Outcome] = collections.Counter()
    with connectors.channel() as channel:
        client = ConnectorsClient(channel)
        for start in range(0, len(items), 200):
            outcomes.update(r.outcome for r in client.ingest(pack, items=items[start : start + 200]))
    return outcomes


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
    assert int(shown["duplicate_window_seconds"]) == WINDOW_SECONDS and shown["horizon_source_time"]
    dry = run_cli("retention", "prune", pack, "--dry-run")
    assert int(dry.get("generations", 0)) == int(dry.get("expired_receipts", 0)) == 0
    # Nothing left to let go: no backlog (decision 181), and the table says the pruner keeps up.
    assert int(shown.get("backlog_generations", 0)) == 0 and "backlog_oldest_finished_at" not in shown
    assert cli.main(["retention", "show", pack]) == ExitCode.OK
    assert "none (the pruner keeps up)" in capsys.readouterr().out
    assert cli.main(["why", pack, "r-00000001"]) == ExitCode.USAGE  # expired: an unknown receipt now
    refusal = capsys.readouterr().err
    assert "NOT_FOUND" in refusal and "duplicate window has expired the records" in refusal
