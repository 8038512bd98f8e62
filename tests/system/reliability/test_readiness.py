"""Readiness follows the database; liveness does not (issue 58 item 1, decision 187).

The schema catalog, Connectors and Controlplane run as processes whose DSN points at a TCP
proxy in front of the test's MariaDB database (``tests.support.tcp_proxy``). The test cuts the
database off (every connection reset, new ones refused: the server looks down), keeps it away
long enough for the materializer's back-off to grow past several seconds, then restores it,
recording every service's health over time with real gRPC health checks. Each service's
overall health ("" and its service name) must turn NOT_SERVING within a few seconds of the cut
and SERVING within about a second of the restore; liveness (``LIVENESS_NAME``) stays SERVING
throughout; the materializer's own health is back within about a second too (its back-off
ends when the database is usable again).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nexuscrm_connectors.queue.materializer import HEALTH_NAME as MATERIALIZER
from nexuscrm_runtime.database import normalize_dsn
from nexuscrm_runtime.readiness import LIVENESS_NAME
from nexuscrm_tools.launcher import CONNECTORS, CONTROLPLANE, SCHEMA_CATALOG, start_services, stop_services
from tests.support.health_timeline import HealthTimeline, Probe
from tests.support.tcp_proxy import tcp_proxy
from tests.support.waiting import wait_until
from tests.system.reliability.conftest import record_figures, service_dsn

INVARIANTS_NOT_CHECKED = "no work is admitted: the services only start, lose their database and get it back"

pytestmark = [
    pytest.mark.database,
    pytest.mark.acceptance,
    pytest.mark.parametrize("empty_dsn", ["mysql"], indirect=True),
]

INTERVAL_MS = 250  # the services' readiness probe interval
LOST_WITHIN = 5.0  # seconds from the cut to NOT_SERVING: the probe's timeout (3 s) plus an interval, with margin
BACK_WITHIN = 1.5  # seconds from the restore to SERVING: an interval, a reconnect and the poll
OUTAGE = 8.0  # seconds the database stays away: the materializer's back-off grows to 8 s meanwhile


def test_overall_health_follows_the_database_and_liveness_stays(empty_dsn: str, tmp_path: Path) -> None:
    url = normalize_dsn(empty_dsn)
    with tcp_proxy(url.host or "127.0.0.1", url.port or 3306) as proxy:
        env = {
            "NEXUSCRM_DSN": service_dsn(empty_dsn, proxy.port),
            "NEXUSCRM_READINESS_INTERVAL_MS": str(INTERVAL_MS),
            "NEXUSCRM_MATERIALIZE_INTERVAL_SECONDS": "1",
        }
        services = start_services([SCHEMA_CATALOG, CONNECTORS, CONTROLPLANE], env=env, workdir=tmp_path)
        try:
            readiness = [
                Probe(f"{s.spec.name} {name or '(overall)'}", s.address, name)
                for s in services
                for name in ("", s.spec.service_name)
            ]
            liveness = [Probe(f"{s.spec.name} liveness", s.address, LIVENESS_NAME) for s in services]
            connectors = next(s for s in services if s.spec is CONNECTORS)
            materializer = Probe("connectors materializer", connectors.address, MATERIALIZER)
            ready_labels = [p.label for p in readiness]
            timeline = HealthTimeline([*readiness, *liveness, materializer])
            with timeline.recording():
                assert timeline.all_are(ready_labels, "SERVING")
                cut = timeline.now()
                proxy.refuse(True)
                proxy.reset()
                wait_until(lambda: timeline.all_are(ready_labels, "NOT_SERVING"), "readiness lost", LOST_WITHIN)
                lost = timeline.now()
                wait_until(lambda: timeline.latest(materializer.label) == "NOT_SERVING", "a failed materializer pass")
                wait_until(lambda: timeline.now() - cut >= OUTAGE, "the outage's length", OUTAGE + 1)
                restored = timeline.now()
                proxy.refuse(False)
                wait_until(lambda: timeline.all_are(ready_labels, "SERVING"), "readiness back", BACK_WITHIN)
                back = timeline.now()
                wait_until(lambda: timeline.latest(materializer.label) == "SERVING", "the materializer back", 3.0)
                materializer_back = timeline.now()
            marks = [(cut, "database cut off"), (restored, "database restored")]
            print("\n".join(timeline.lines(marks)))
            record_figures(
                "readiness-follows-the-database",
                {
                    "not_serving_after_seconds": round(lost - cut, 2),
                    "serving_after_seconds": round(back - restored, 2),
                    "materializer_serving_after_seconds": round(materializer_back - restored, 2),
                },
            )
            assert all(timeline.statuses(p.label) == {"SERVING"} for p in liveness), timeline.lines(marks)
            assert materializer_back - restored <= 1.0 + INTERVAL_MS / 1000, "the materializer waited out its back-off"
        finally:
            stop_services(services)
