"""A rolling upgrade of Connectors replicas: the previous and the current release on one database.

The smoke test of the N-1 tier (it runs in CI): admission alternates between the two replicas,
every batch is sent again through the other one (the same receipts: duplicates across
releases), two Integration hosts claim through both, then the previous replica gets SIGTERM
half-way and everything continues on the current one. While both run, ``nexuscrm version``
reports the previous Connectors as a release from before 0.2.0 (it has no GetBuildInfo).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Sequence
from importlib.metadata import version
from pathlib import Path

import pytest

from nexuscrm_runtime.database import create_engine
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_tools.launcher import CONNECTORS, CONTROLPLANE, INTEGRATION, SCHEMA_CATALOG, ServiceProcess, target_env
from nexuscrm_tools.run import demo_pools, install_demo_pack, settled
from nexuscrm_tools.simulator import Simulator, WorkloadConfig
from tests.compatibility.previous import PreviousReleases
from tests.compatibility.scenario import assert_end_state, nexuscrm_version, scenario
from tests.support.metrics import counter
from tests.support.waiting import wait_until
from workqueue.values import IngestItem, IngestResult, Outcome

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.database,
    pytest.mark.parametrize("empty_dsn", ["mysql"], indirect=True),  # the real MariaDB only
]

# A few hundred deliveries in batches of 30, a tenth of them repeats: bounded for CI.
WORKLOAD = WorkloadConfig(lanes=20, inputs=300, rate=600, tick_seconds=0.05, duplicate_ratio=0.1, seed=147)
RETIRE_AFTER = 5  # batches admitted through both replicas before the previous one is stopped


class RollingIngestor:
    """Ingests each batch through the replicas in turn, then again through the next one (one call at a time).

    Before batch ``retire_after + 1`` it calls ``retire`` (which stops the first replica) and
    from then on uses the others only. ``echoes`` counts the outcomes of the repeated sends.
    """

    def __init__(self, replicas: Sequence[ConnectorsClient], *, retire_after: int, retire: Callable[[], None]) -> None:
        self._replicas = list(replicas)
        self._retire_after = retire_after
        self._retire = retire
        self.batches = 0
        self.echoes: collections.Counter[Outcome] = collections.Counter()

    def ingest(self, pack_install_id: str, *, items: Sequence[IngestItem]) -> list[IngestResult]:
        if self.batches == self._retire_after:
            self._retire()
            self._replicas.pop(0)
        first = self._replicas[self.batches % len(self._replicas)]
        self.batches += 1
        results = first.ingest(pack_install_id, items=items)
        if len(self._replicas) > 1:
            echo = self._replicas[self.batches % len(self._replicas)].ingest(pack_install_id, items=items)
            self.echoes.update(result.outcome for result in echo)
        return results


def claims_answered(connectors: ServiceProcess) -> float:
    """The claims a Connectors process has answered so far (its metrics endpoint)."""
    return counter(connectors.side_port("metrics"), "nexuscrm_claims_total")


def test_admission_and_claims_across_a_rolling_upgrade_of_connectors(
    dsn: str, tmp_path: Path, previous_releases: PreviousReleases
) -> None:
    release = previous_releases.of("connectors")
    engine = create_engine(dsn)
    claims: dict[str, float] = {}
    with scenario(dsn, tmp_path) as running:
        catalog = running.start(SCHEMA_CATALOG, label="schema-catalog")
        previous = running.start(CONNECTORS, label="connectors-previous", release=release)
        current = running.start(CONNECTORS, label="connectors-current")
        controlplane = running.start(CONTROLPLANE, label="controlplane", env=target_env([catalog, current]))
        with controlplane.channel() as channel:
            pack = install_demo_pack(channel, "compat")
        # The first host's channel prefers the previous replica and falls over to the current one
        # once it is gone (gRPC pick_first over both addresses); the second uses the current one.
        for label, connectors in (
            ("integration-via-both", f"ipv4:{previous.address},{current.address}"),
            ("integration-via-current", current.address),
        ):
            env = {
                **target_env([catalog, controlplane]),
                "NEXUSCRM_CONNECTORS_TARGET": connectors,
                "NEXUSCRM_INTEGRATION_POOLS": demo_pools(pack, 2),
            }
            host = running.start(INTEGRATION, label=label, env=env)
        reported = nexuscrm_version(target_env([catalog, previous, controlplane, host]))

        def retire() -> None:
            wait_until(lambda: claims_answered(previous) > 0, "a claim answered by the previous one")
            claims["previous"] = claims_answered(previous)
            claims["current at retirement"] = claims_answered(current)
            assert running.stop(previous, "connectors-previous") == 0

        with previous.channel() as to_previous, current.channel() as to_current:
            replicas = [ConnectorsClient(to_previous), ConnectorsClient(to_current)]
            ingestor = RollingIngestor(replicas, retire_after=RETIRE_AFTER, retire=retire)
            # One batch at a time (the simulator's default): the ingestor sends each through the
            # replicas in turn.
            stats = Simulator(ingestor, pack, WORKLOAD, threading.Event()).run()
        wait_until(lambda: settled(engine, pack, stats), "every admitted input projected")
        claims["current"] = claims_answered(current)
    assert running.exit_codes == dict.fromkeys(running.exit_codes, 0) and len(running.exit_codes) == 6

    # The previous Connectors predates GetBuildInfo; the current others say what they are.
    assert reported["connectors"]["reply"] == "before 0.2.0"
    for service in ("schema-catalog", "controlplane", "integration"):
        assert reported[service]["reply"] == "answered"
        assert reported[service]["package_version"] == version(f"nexuscrm-{service}")

    assert ingestor.batches > RETIRE_AFTER + 1  # batches went in after the previous replica stopped
    assert stats.admitted == WORKLOAD.inputs and stats.duplicates_sent > 0
    # Every batch sent again through the other release was acknowledged as covered, nothing admitted twice.
    assert set(ingestor.echoes) == {Outcome.DUPLICATE_COVERED} and ingestor.echoes.total() > 0
    assert claims["previous"] > 0 and claims["current"] > claims["current at retirement"]
    state = assert_end_state(engine, pack, inputs=WORKLOAD.inputs)
    print(f"rolling upgrade: {stats.admitted} admitted, {ingestor.echoes.total()} sent again across releases, {claims}")
    print(state)
    print("nexuscrm version:", {name: entry.get("package_version", entry["reply"]) for name, entry in reported.items()})
    engine.dispose()
