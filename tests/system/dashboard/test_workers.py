"""The dashboard's worker list: each Integration host asked over ListWorkers, skew flagged against the lease.

Two real Integration hosts (``integration_host.SkewedHost``: IntegrationService over a
``WorkerHost`` whose workers claim from a real ConnectorsService over gRPC) run in this
process on OS-chosen ports, each with its own wall clock: one 90 s ahead, one 5 s behind the
database's. A third configured host does not answer. The page's worker list must show every
worker's measured skew, flag exactly those beyond a third of their own lease, and mark the
silent host unreachable without failing.
"""

from __future__ import annotations

import datetime as dt
import json
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.facade import Connectors
from nexuscrm_controlplane.dashboard.app import create_app
from nexuscrm_controlplane.dashboard.connectors import ConnectorsReads
from nexuscrm_controlplane.dashboard.server import DashboardServer
from nexuscrm_controlplane.dashboard.workers import integration_hosts, integration_targets, skew_flagged
from nexuscrm_runtime.config import ConfigError
from tests.support.factories import delivery, install_pack
from tests.support.invariants import assert_invariants
from tests.support.waiting import wait_until
from tests.system.dashboard.integration_host import SkewedHost

pytestmark = pytest.mark.database

AHEAD = dt.timedelta(seconds=90)
BEHIND = dt.timedelta(seconds=-5)
CLOCK_RESOLUTION = 0.001  # seconds: SQLite's clock reads milliseconds, so a grant may read up to one early


@pytest.fixture
def skewed_hosts(engine: sa.Engine, connectors_target: str) -> Iterator[Callable[[dt.timedelta, dict[str, int]], str]]:
    """Start an Integration host whose clock is off by a skew, one worker per pack (pack -> lease seconds).

    Returns its target; every host drains and stops after the test.
    """
    started: list[SkewedHost] = []

    def start(skew: dt.timedelta, leases: dict[str, int]) -> str:
        host = SkewedHost(skew)
        started.append(host)
        host.activate(engine, connectors_target, leases)
        return host.target

    yield start
    drained = [host.stop() for host in started]  # every host stops, whatever another did
    assert all(drained)


def test_each_hosts_workers_show_their_skew_flagged_against_their_lease_and_a_silent_host_is_unreachable(
    engine: sa.Engine,
    connectors: ConnectorsReads,
    skewed_hosts: Callable[[dt.timedelta, dict[str, int]], str],
    unreachable_target: str,
) -> None:
    short, long, ahead_pack = install_pack(engine), install_pack(engine), install_pack(engine)
    facade = Connectors(engine)
    for pack in (short, long, ahead_pack):
        facade.ingest(pack, items=[delivery(lane="a"), delivery(lane="b")])
    # Every grant a worker times and every arrival it times it on come after this (one machine, one clock).
    started = dt.datetime.now(dt.UTC)
    # 5 s behind: beyond a third of a 12 s lease, within a third of a 30 s one. 90 s ahead: beyond 30 s / 3.
    behind = skewed_hosts(BEHIND, {short: 12, long: 30})
    ahead = skewed_hosts(AHEAD, {ahead_pack: 30})
    silent = unreachable_target

    with integration_hosts(integration_targets(f"{behind}, {silent},{ahead}", "unused:1"), None) as hosts:

        def every_worker_measured() -> dict[str, Any] | None:
            shown = {host["target"]: host for host in hosts.workers()["hosts"]}
            answered = [shown[behind], shown[ahead]]
            measured = all(
                w["clock_skew_seconds"] is not None and w["executions"] for h in answered for w in h["workers"]
            )
            return shown if measured else None

        shown = wait_until(every_worker_measured, "every worker to run work and measure its skew")
        window = (dt.datetime.now(dt.UTC) - started).total_seconds() + CLOCK_RESOLUTION
        assert list(shown) == [behind, silent, ahead]  # configuration order
        assert shown[silent]["state"] == "unreachable" and str(shown[silent]["error"]).startswith("UNAVAILABLE")
        assert shown[silent]["workers"] == []

        by_pack = {w["pack_install_id"]: w for t in (behind, ahead) for w in shown[t]["workers"]}
        assert {t: shown[t]["state"] for t in (behind, ahead)} == {behind: "answered", ahead: "answered"}
        offsets = {short: BEHIND, long: BEHIND, ahead_pack: AHEAD}
        errors = {pack: float(w["clock_skew_seconds"]) - offsets[pack].total_seconds() for pack, w in by_pack.items()}
        # A skew is the host's offset plus the time between the grant and the arrival it was timed on;
        # both happened between the start and the read above, so the error is within that window.
        assert all(abs(error) <= window for error in errors.values()), (errors, window)
        assert {pack: (w["lease_seconds"], w["skew_flagged"]) for pack, w in by_pack.items()} == {
            short: (12.0, True),
            long: (30.0, False),
            ahead_pack: (30.0, True),
        }

        # Served: the page's endpoint answers 200 with the silent host marked, not a failed page.
        server = DashboardServer(create_app(engine, connectors=connectors, workers=hosts), "127.0.0.1:0")
        server.start()
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/api/workers", timeout=30) as response:
                assert response.status == 200
                body = json.loads(response.read())
        finally:
            server.stop()
    assert [(h["target"], h["state"]) for h in body["hosts"]] == [
        (behind, "answered"),
        (silent, "unreachable"),
        (ahead, "answered"),
    ]
    assert_invariants(engine)


def test_the_skew_flag_is_relative_to_the_lease() -> None:
    assert not skew_flagged(None, 30)  # not measured yet
    assert not skew_flagged(10.0, 30) and skew_flagged(10.5, 30) and skew_flagged(-10.5, 30)
    assert skew_flagged(1.5, 3) and not skew_flagged(0.5, 3)


def test_integration_targets_default_dedupe_and_refuse_what_is_not_host_port() -> None:
    assert integration_targets("", "127.0.0.1:50054") == ("127.0.0.1:50054",)
    assert integration_targets(" a:1, b:2 ,a:1,", "unused:1") == ("a:1", "b:2")
    with pytest.raises(ConfigError, match="NEXUSCRM_DASHBOARD_INTEGRATION_TARGETS must be host:port, got 'b'"):
        integration_targets("a:1,b", "unused:1")
    with pytest.raises(ConfigError, match="NEXUSCRM_INTEGRATION_TARGET must be host:port"):
        integration_targets(" ", "nowhere")
