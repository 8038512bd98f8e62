"""The operator dashboard in a real browser, served by a real Controlplane on the real database.

A scripted workload (deliveries, claims, a completion, a retry, a failure, a coverage gap)
runs through the Connectors service; the page must show exactly what the database holds,
explain a WorkId and a ReceiptKey, and show a fence armed through the CLI after its own
refresh, without a reload and without console errors. Its operating panels show the claim
pause and order policy set through the CLI, the dead letter, and the identity the gap left
not tiled, first; the coverage of a pack of 11 identities takes two pages. The metrics endpoints agree. The page
asks Connectors (its own process) over gRPC for the explanations and receipt lists; once
Connectors stops, those parts and the operating panels say "Connectors unavailable" and the
pack cards keep refreshing.
It lists the workers of the Integration hosts it is given: a real host whose clock is 90 s
ahead of the database's shows its worker's skew flagged, and a host that does not answer is
shown unreachable while the rest of the page refreshes.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families
from selenium import webdriver
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from nexuscrm_connectors.facade import Connectors
from nexuscrm_runtime.database import create_engine
from nexuscrm_schema.relations import EVENT_PAYLOAD, EVENT_WITH_PAYLOAD
from nexuscrm_schema.tables import Event, IngressReceipt, WorkItem
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_tools.launcher import (
    CONNECTORS,
    CONTROLPLANE,
    SCHEMA_CATALOG,
    ServiceProcess,
    start_services,
    stop_services,
    target_env,
)
from nexuscrm_tools.run import install_demo_pack
from nexuscrm_tools.simulator import Simulator, WorkloadConfig
from tests.support.factories import delivery, install_pack
from tests.support.invariants import assert_invariants
from tests.support.waiting import wait_until
from tests.system.dashboard.browser import ARTIFACTS, browser_session, console_errors
from tests.system.dashboard.integration_host import SkewedHost
from workqueue import decode_projection_key
from workqueue.values import IngestItem, Outcome, Route

pytestmark = [pytest.mark.acceptance, pytest.mark.database, pytest.mark.browser]

NAMESPACE = "acme"
QUEUE_STATES = ("pending", "blocked", "processing", "retry")


@pytest.fixture(scope="module")
def browser() -> Iterator[webdriver.Chrome]:
    yield from browser_session()


@pytest.fixture
def skewed_host() -> Iterator[SkewedHost]:
    """An Integration host in this process, 90 s ahead of the database; activated by the test."""
    host = SkewedHost(dt.timedelta(seconds=90))
    yield host
    assert host.stop()


@pytest.fixture
def system(
    empty_dsn: str, tmp_path: Path, skewed_host: SkewedHost, unreachable_target: str
) -> Iterator[list[ServiceProcess]]:
    env = {
        "NEXUSCRM_DSN": empty_dsn,
        "NEXUSCRM_DASHBOARD_ADDRESS": "127.0.0.1:0",
        "NEXUSCRM_CONTROLPLANE_METRICS_ADDRESS": "127.0.0.1:0",
        "NEXUSCRM_CONNECTORS_METRICS_ADDRESS": "127.0.0.1:0",
        "NEXUSCRM_LOG_FORMAT": "json",
    }
    # Connectors first: the Controlplane's dashboard finds it through NEXUSCRM_CONNECTORS_TARGET.
    services = start_services((SCHEMA_CATALOG,), env=env, workdir=tmp_path)
    try:
        services += start_services((CONNECTORS,), env={**env, "NEXUSCRM_OTEL": "console"}, workdir=tmp_path)
        hosts = {"NEXUSCRM_DASHBOARD_INTEGRATION_TARGETS": f"{skewed_host.target},{unreachable_target}"}
        services += start_services((CONTROLPLANE,), env={**env, **target_env(services), **hosts}, workdir=tmp_path)
    except BaseException:
        stop_services(services)
        raise
    yield services
    assert set(stop_services(services).values()) == {0}
    # Logs and spans are flushed at exit: JSON lines without the DSN, and Connectors' spans.
    logs = {service.spec.name: service.log_path.read_text() for service in services}
    assert not [name for name, text in logs.items() if empty_dsn in text]
    assert all(json.loads(line)["level"] for line in logs["controlplane"].splitlines())
    assert '"name": "/nexuscrm.connectors.v1.ConnectorsService/Ingest"' in logs["connectors"]
    assert '"db.system": "' in logs["connectors"]  # SQLAlchemy statements are traced too


@pytest.fixture
def page(browser: webdriver.Chrome, system: list[ServiceProcess]) -> Iterator[webdriver.Chrome]:
    """The browser for one test: an empty console before, off the page before the services stop."""
    console_errors(browser)
    yield browser
    browser.get("about:blank")


def service(services: list[ServiceProcess], spec: object) -> ServiceProcess:
    return next(s for s in services if s.spec is spec)


def scripted_workload(connectors: ConnectorsClient, pack: str) -> dict[str, str]:
    """Deliveries on 6 lanes; one generation completed, one retrying, one failed for good."""
    config = WorkloadConfig(lanes=6, inputs=60, rate=0, seed=8)
    assert Simulator(connectors, pack, config, threading.Event()).run().admitted == 60
    done, retrying, failed = connectors.claim("dashboard-test", pack_install_ids=[pack], max_items=3)
    connectors.complete(done.work.work_id, lease_token=done.lease_token)
    connectors.fail(
        retrying.work.work_id, lease_token=retrying.lease_token, error="the CRM answered 503", retryable=True
    )
    connectors.fail(
        failed.work.work_id, lease_token=failed.lease_token, error="contact schema rejected", retryable=False
    )
    return {"completed": done.work.work_id, "retry": retrying.work.work_id, "failed": failed.work.work_id}


def open_coverage_gap(
    engine: sa.Engine, connectors: ConnectorsClient, pack: str, work_id: str
) -> tuple[str, list[tuple[str, int]]]:
    """Delete a completed generation (what a broken retention job would do); redeliver its selected input.

    Returns the redelivered ReceiptKey and the (pack, ordinal) inputs left without a
    generation. The payload comes from the Event: an admitted receipt keeps only its digest.
    """
    with engine.begin() as connection:
        work = connection.execute(sa.select(WorkItem).where(WorkItem.c.WorkId == work_id)).one()
        receipt_key, payload = connection.execute(
            sa.select(Event.c.ReceiptKey, EVENT_PAYLOAD)
            .select_from(EVENT_WITH_PAYLOAD)
            .where(Event.c.PackInstallId == pack, Event.c.EnqueueOrdinal == work.LaneOrdinal)
        ).one()
        members = connection.execute(
            sa.select(Event.c.EnqueueOrdinal).where(
                Event.c.PackInstallId == pack,
                Event.c.ProjectionKey == work.ProjectionKey,
                Event.c.EnqueueOrdinal.between(work.InputStartOrdinal, work.LaneOrdinal),
            )
        ).scalars()
        damaged = [(pack, int(ordinal)) for ordinal in members]
        connection.execute(sa.delete(WorkItem).where(WorkItem.c.WorkId == work_id))
    again = IngestItem(
        receipt_key=receipt_key, route=Route.of(decode_projection_key(work.ProjectionKey)), payload=payload
    )
    [result] = connectors.ingest(pack, items=[again])
    assert result.outcome is Outcome.COVERAGE_MISSING
    return str(receipt_key), damaged


def database_numbers(engine: sa.Engine, pack: str) -> dict[str, int]:
    with engine.connect() as connection:
        statuses: dict[str, int] = dict(
            connection.execute(
                sa.select(WorkItem.c.Status, sa.func.count())
                .where(WorkItem.c.PackInstallId == pack)
                .group_by(WorkItem.c.Status)
            ).all()
        )
        receipts: dict[str, int] = dict(
            connection.execute(
                sa.select(IngressReceipt.c.State, sa.func.count())
                .where(IngressReceipt.c.PackInstallId == pack)
                .group_by(IngressReceipt.c.State)
            ).all()
        )
    return {
        **{state: statuses.get(state, 0) for state in (*QUEUE_STATES, "failed")},
        "receipts_waiting": receipts.get("stored", 0),
        "coverage_missing": receipts.get("coverage_missing", 0),
    }


def page_numbers(driver: webdriver.Chrome, pack: str) -> dict[str, int]:
    """The pack card's numbers, read in one script (a refresh may redraw the card between two reads)."""
    shown: dict[str, str] = driver.execute_script(
        """const card = document.querySelector(`[data-pack="${arguments[0]}"]`);
        return Object.fromEntries([...card.querySelectorAll("[data-metric]")]
          .map((s) => [s.dataset.metric, s.querySelector(".value").textContent]));""",
        pack,
    )
    names = (*QUEUE_STATES, "failed", "receipts_waiting", "coverage_missing")
    return {name: int(shown[name]) for name in names}


def present(driver: webdriver.Chrome, selector: str) -> list[str]:
    """The text of every element matching ``selector``, read in one script."""
    texts: list[str] = driver.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map((e) => e.textContent)", selector
    )
    return texts


def explain(driver: webdriver.Chrome, text: str, answer: str = "") -> str:
    """Search for ``text``; the text of the first result naming it (or ``answer``, when given)."""
    box = driver.find_element(By.ID, "search-input")
    box.clear()
    box.send_keys(text, Keys.ENTER)
    expected = answer or text
    found = wait_until(
        lambda: [r for r in present(driver, "#search-results .result") if expected in r], f"an answer for {text}"
    )
    return str(found[0])


def nexuscrm(system: list[ServiceProcess], *args: str) -> dict[str, object]:
    """Run the operator CLI with ``--json`` against ``system``; its JSON answer."""
    done = subprocess.run(
        [str(Path(sys.executable).with_name("nexuscrm")), "--json", *args],
        env={**os.environ, **target_env(system)},
        capture_output=True,
        text=True,
        check=True,
    )
    answer: dict[str, object] = json.loads(done.stdout)
    return answer


def operating_panels(browser: webdriver.Chrome, system: list[ServiceProcess], pack: str, work: dict[str, str]) -> None:
    """Issue 37 on the page: a pause and the order policy set through the CLI, the dead letter, the gap."""
    nexuscrm(system, "claims", "pause", pack, "--by", "ops", "--reason", "CRM <maintenance>", "--for", "1h")
    nexuscrm(system, "order-policy", "set", pack, "block", "--by", "ops", "--reason", "keep order")
    shown = f'[data-pauses-pack="{pack}"][data-paused="true"]'
    [paused] = wait_until(lambda: present(browser, f'{shown}:has([data-order-policy="block"])'), "the paused pack")
    assert "the whole pack" in paused and "CRM <maintenance>" in paused and "until resumed" not in paused
    assert "block set by ops" in paused and "keep order" in paused
    [letter] = wait_until(lambda: present(browser, f'[data-dead-letter="{work["failed"]}"]'), "the dead letter")
    assert "contact schema rejected" in letter and "failed for good after" in letter
    assert "dead-letters replay" in browser.find_element(By.ID, "replay-command").text
    rows = wait_until(lambda: present(browser, "#coverage tr[data-tiled]"), "the coverage proof")
    tiled: list[str] = browser.execute_script(
        "return [...document.querySelectorAll('#coverage tr[data-tiled]')].map((r) => r.dataset.tiled)"
    )
    assert tiled[0] == "false" and tiled.count("false") == 1 and len(tiled) == len(rows)
    assert "gap" in rows[0] and "not tiled" in rows[0]


def coverage_pages(browser: webdriver.Chrome, engine: sa.Engine) -> None:
    """A pack of 11 identities, selected on its card: the coverage panel's first page lists 10, "next page" the 11th."""
    paged = install_pack(engine, namespace=NAMESPACE)
    Connectors(engine).ingest(paged, items=[delivery(lane=f"lane-{n:02}") for n in range(11)])
    select = (
        "const head = document.querySelector(`[data-pack='${arguments[0]}'] .pack-head`); head?.click(); return !!head"
    )
    wait_until(lambda: browser.execute_script(select, paged), "the new pack's card, selected")

    def rows(count: int, *, following: bool) -> bool:
        shown = browser.find_element(By.ID, "coverage-pack").text == paged
        listed = len(present(browser, "#coverage tr[data-tiled='true']")) == count
        return shown and listed and browser.find_element(By.ID, "coverage-next").is_displayed() is following

    wait_until(lambda: rows(10, following=True), "the first coverage page of 10 identities, with a next page")
    browser.find_element(By.ID, "coverage-next").click()
    wait_until(lambda: rows(1, following=False), "the second coverage page: the 11th identity")
    assert browser.find_element(By.ID, "coverage-first").is_displayed()


def scrape(port: int | None) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    assert port is not None
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_dashboard_shows_the_database_explains_and_follows_a_fence(
    page: webdriver.Chrome,
    system: list[ServiceProcess],
    empty_dsn: str,
    request: pytest.FixtureRequest,
    skewed_host: SkewedHost,
    unreachable_target: str,
) -> None:
    browser = page
    controlplane, connectors_process = service(system, CONTROLPLANE), service(system, CONNECTORS)
    engine = create_engine(empty_dsn)
    with grpc.insecure_channel(controlplane.address) as channel:
        pack = install_demo_pack(channel, NAMESPACE)
    with grpc.insecure_channel(connectors_process.address) as channel:
        connectors = ConnectorsClient(channel)
        work = scripted_workload(connectors, pack)
        missing_key, damaged = open_coverage_gap(engine, connectors, pack, work["completed"])
    expected = database_numbers(engine, pack)
    assert expected["retry"] == expected["failed"] == expected["coverage_missing"] == 1

    browser.get(f"http://127.0.0.1:{controlplane.side_port('dashboard')}/")
    wait_until(lambda: present(browser, f'[data-pack="{pack}"]'), "the pack card")
    assert page_numbers(browser, pack) == expected
    assert present(browser, f'[data-pack="{pack}"] [data-protocol="greenfield"]')
    wait_until(lambda: present(browser, f'#receipts-missing [data-receipt="{missing_key}"]'), "the coverage gap")
    wait_until(
        lambda: (
            {"pending", "retry", "failed"}
            <= set(
                browser.execute_script(
                    "return [...document.querySelectorAll('#timeline .gen')].map((b) => b.dataset.status)"
                )
            )
        ),
        "the timeline's pending, retrying and failed generations",
    )

    failed = explain(browser, work["failed"])
    with engine.connect() as connection:
        row = connection.execute(sa.select(WorkItem).where(WorkItem.c.WorkId == work["failed"])).one()
    assert f"{row.InputStartOrdinal} to {row.LaneOrdinal}" in failed and "failed for good after" in failed
    with engine.connect() as connection:
        covered_key, covered_ordinal = connection.execute(
            sa.select(Event.c.ReceiptKey, Event.c.EnqueueOrdinal).where(
                Event.c.PackInstallId == pack, Event.c.EnqueueOrdinal == row.LaneOrdinal
            )
        ).one()
    receipt = explain(browser, covered_key)
    assert f"input {covered_ordinal} is a member of" in receipt and work["failed"] in receipt
    assert "coverage" in explain(browser, missing_key)

    browser.execute_script("window.sameDocument = true")
    armed = nexuscrm(system, "fences", "arm", "--namespace", NAMESPACE, "--scope", pack, "--reason", "dashboard test")
    fence_id = armed["fence_id"]
    [fence_row] = wait_until(lambda: present(browser, f'[data-fence="{fence_id}"]'), "the armed fence")
    assert browser.execute_script("return window.sameDocument") is True  # refreshed in place, not reloaded
    assert "holds admission" in fence_row
    operating_panels(browser, system, pack, work)
    assert console_errors(browser) == []

    ARTIFACTS.mkdir(exist_ok=True)
    backend = request.node.callspec.params["empty_dsn"]
    browser.save_screenshot(str(ARTIFACTS / f"dashboard-{backend}.png"))

    gauges = scrape(controlplane.side_port("metrics"))
    for state in QUEUE_STATES:
        assert gauges[("nexuscrm_queue_depth", (("pack", pack), ("state", state)))] == expected[state]
    assert gauges[("nexuscrm_receipts", (("pack", pack), ("state", "coverage_missing")))] == 1
    counters = scrape(connectors_process.side_port("metrics"))
    assert counters[("nexuscrm_inputs_admitted_total", ())] == 60
    assert counters[("nexuscrm_claims_total", ())] == 3
    assert counters[("nexuscrm_coverage_missing_total", ())] == 1
    assert counters[("nexuscrm_retries_total", (("attempt", "1"),))] == 1
    assert counters[("nexuscrm_failures_total", (("reason", "not_retryable"),))] == 1
    with engine.connect() as connection:
        generations = connection.execute(sa.select(sa.func.count()).select_from(WorkItem)).scalar_one()
    created = counters[("nexuscrm_generations_created_total", (("origin", "admission"),))]
    assert created == generations + 1  # and the completed one the gap deleted
    ingest = (
        "nexuscrm_rpc_server_duration_seconds_count",
        (("code", "OK"), ("method", "/nexuscrm.connectors.v1.ConnectorsService/Ingest")),
    )
    assert counters[ingest] >= 1
    coverage_pages(browser, engine)  # its generations are admitted in this process, past Connectors' counters

    # Issue 17 item 3: the skewed host's worker runs a generation of another pack (the numbers
    # above stay the database's) and the page flags its measured skew; the silent host is marked.
    other = install_pack(engine, namespace=NAMESPACE)
    Connectors(engine).ingest(other, items=[delivery()])
    skewed_host.activate(engine, connectors_process.address, {other: 30})
    [skew] = wait_until(
        lambda: present(browser, f'[data-host="{skewed_host.target}"] [data-skew-flagged="true"] [data-skew]'),
        "the skewed worker's flagged clock skew",
    )
    assert abs(float(skew.removesuffix(" s")) - 90) < 5, skew
    [silent] = wait_until(
        lambda: present(browser, f'[data-host="{unreachable_target}"][data-host-state="unreachable"]'),
        "the silent Integration host marked unreachable",
    )
    assert "UNAVAILABLE" in silent
    assert console_errors(browser) == []
    browser.execute_script("document.getElementById('workers-panel').scrollIntoView()")
    browser.save_screenshot(str(ARTIFACTS / f"dashboard-workers-{backend}.png"))
    browser.execute_script("document.getElementById('pauses-panel').scrollIntoView()")
    browser.save_screenshot(str(ARTIFACTS / f"dashboard-operations-{backend}.png"))

    stop_services([connectors_process])
    refreshes = int(browser.find_element(By.ID, "refreshed").get_attribute("data-count") or 0)
    wait_until(
        lambda: (
            "Connectors unavailable" in " ".join(present(browser, "#receipts-missing [data-error]"))
            and "Connectors unavailable" in " ".join(present(browser, "#receipts-waiting [data-error]"))
        ),
        "the receipt lists to say Connectors is unavailable",
    )

    def operating_panels_say_unavailable() -> bool:
        browser.find_element(By.ID, "coverage-again").click()  # the proof is read again every 30 s, or now
        return all(
            "Connectors unavailable" in " ".join(present(browser, f"#{panel} [data-error]"))
            for panel in ("pauses", "dead-letters", "coverage")
        )

    wait_until(operating_panels_say_unavailable, "the pauses, dead letters and coverage panels to say so too")
    assert "Connectors unavailable" in explain(browser, work["failed"], "Connectors unavailable")
    wait_until(
        lambda: int(browser.find_element(By.ID, "refreshed").get_attribute("data-count") or 0) > refreshes + 1,
        "the pack cards to keep refreshing",
    )
    assert page_numbers(browser, pack) == expected
    assert_invariants(engine, damaged=damaged)
    engine.dispose()
