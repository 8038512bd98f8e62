"""One owner's previous release with the current others, on a database the current schema catalog migrated.

``integration``: the previous Integration host and its SDK worker claim from the current
Connectors and run the previous tools' demo Flow (``demo-contacts``); the current SDK client
ingests. ``connectors``: the previous Connectors serves Ingest, Claim and Complete to the
current SDK client and the current host. The whole tier only (``make compat``); CI runs the
rolling upgrade (test_rolling_connectors.py).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from nexuscrm_runtime.database import create_engine
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_tools.launcher import CONNECTORS, CONTROLPLANE, INTEGRATION, SCHEMA_CATALOG, target_env
from nexuscrm_tools.run import demo_pools, executions, install_demo_pack, settled
from nexuscrm_tools.simulator import Simulator, WorkloadConfig
from tests.compatibility.previous import PreviousRelease, PreviousReleases
from tests.compatibility.scenario import assert_end_state, scenario
from tests.support.waiting import wait_until

pytestmark = [
    pytest.mark.acceptance,
    pytest.mark.database,
    pytest.mark.compat_full,
    pytest.mark.parametrize("empty_dsn", ["mysql"], indirect=True),  # the real MariaDB only
]

WORKLOAD = WorkloadConfig(lanes=30, inputs=600, rate=0, duplicate_ratio=0.1, burst_chance=0.3, seed=1471)


@pytest.mark.parametrize("previous_owner", ["integration", "connectors"])
def test_the_previous_release_of_one_owner_works_with_the_current_others(
    dsn: str, tmp_path: Path, previous_releases: PreviousReleases, previous_owner: str
) -> None:
    release = previous_releases.of(previous_owner)
    engine = create_engine(dsn)

    def built(owner: str) -> PreviousRelease | None:
        """The previous release for ``owner``'s processes, or None: the current one."""
        return release if owner == previous_owner else None

    with scenario(dsn, tmp_path) as running:
        catalog = running.start(SCHEMA_CATALOG, label="schema-catalog")
        connectors = running.start(CONNECTORS, label="connectors", release=built("connectors"))
        controlplane = running.start(CONTROLPLANE, label="controlplane", env=target_env([catalog, connectors]))
        with controlplane.channel() as channel:
            pack = install_demo_pack(channel, "compat")
        env = {**target_env([catalog, connectors, controlplane]), "NEXUSCRM_INTEGRATION_POOLS": demo_pools(pack, 2)}
        host = running.start(INTEGRATION, label="integration", env=env, release=built("integration"))
        with connectors.channel() as channel:
            stats = Simulator(ConnectorsClient(channel), pack, WORKLOAD, threading.Event()).run()
        wait_until(lambda: settled(engine, pack, stats), "every admitted input projected")
        ran = executions(host)
    assert running.exit_codes == dict.fromkeys(running.exit_codes, 0) and len(running.exit_codes) == 4

    assert stats.admitted == WORKLOAD.inputs
    assert stats.duplicates_acknowledged == stats.duplicates_sent > 0
    state = assert_end_state(engine, pack, inputs=WORKLOAD.inputs)
    assert ran >= state.generations["completed"]  # the host of this scenario ran every generation's Flow
    print(f"previous {previous_owner}: {stats.admitted} admitted, {stats.duplicates_sent} duplicates, {ran} runs")
    print(state)
    engine.dispose()
