"""One compatibility scenario: previous and current service processes on one database, and its end state.

A ``Scenario`` starts each service as a process on an OS-chosen port (``nexuscrm_tools.launcher``):
a current one with this interpreter, a previous release's with that release's virtualenv,
running the module its console script (``nexuscrm-<service>``) names. Every Connectors
publishes its Prometheus counters, so a test can tell which replica answered the claims.
``assert_end_state`` is how every scenario ends: every receipt admitted once, every generation
completed, the demo projection equal to the fold of its inputs, and the invariants of
docs/design.md (M, O, B, D, X, P and R) over the whole database.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from nexuscrm_schema.tables import Event, IngressReceipt
from nexuscrm_tools import demo
from nexuscrm_tools import demo_queries as queries
from nexuscrm_tools.launcher import CONNECTORS, ServiceProcess, ServiceSpec, start_services, stop_services
from tests.compatibility.previous import PreviousRelease
from tests.support.invariants import assert_invariants
from workqueue import WorkStatus


@dataclasses.dataclass(kw_only=True)
class Scenario:
    """The processes of one scenario, on the database ``dsn`` (migrated by the current schema catalog)."""

    dsn: str
    workdir: Path
    running: list[ServiceProcess] = dataclasses.field(default_factory=list)
    exit_codes: dict[str, int] = dataclasses.field(default_factory=dict)  # "<label>": code, as each stopped

    def start(
        self,
        spec: ServiceSpec,
        *,
        label: str,
        release: PreviousRelease | None = None,
        env: dict[str, str] | None = None,
    ) -> ServiceProcess:
        """Start ``spec`` (from ``release``'s virtualenv when given, else current) and wait until it is SERVING.

        ``label`` names its working directory (logs, port files) and its exit code.
        """
        settings = {
            "NEXUSCRM_DSN": self.dsn,
            "NEXUSCRM_APPLY_SCHEMA_ON_START": "0",  # the current schema catalog migrated the database already
            **({"NEXUSCRM_CONNECTORS_METRICS_ADDRESS": "127.0.0.1:0"} if spec.name == CONNECTORS.name else {}),
            **(env or {}),
        }
        interpreters = {}
        if release is not None:
            spec = dataclasses.replace(spec, module=release.console_module(f"nexuscrm-{spec.name}"))
            interpreters[spec.name] = release.python
            settings["PYTHONPATH"] = ""  # nothing of this checkout may shadow the release's own packages
        service = start_services((spec,), env=settings, workdir=self.workdir / label, interpreters=interpreters)[0]
        self.running.append(service)
        return service

    def stop(self, service: ServiceProcess, label: str) -> int:
        """SIGTERM ``service`` and wait for it to exit; its code is also kept under ``label``."""
        self.running.remove(service)
        code = stop_services([service])[service.spec.name]
        self.exit_codes[label] = code
        return code

    def stop_all(self) -> None:
        """Stop every running service, last started first."""
        while self.running:
            service = self.running[-1]
            self.stop(service, service.log_path.parent.name)


@contextmanager
def scenario(dsn: str, workdir: Path) -> Iterator[Scenario]:
    """A scenario whose processes are all stopped on exit, whatever happened."""
    running = Scenario(dsn=dsn, workdir=workdir)
    try:
        yield running
    finally:
        running.stop_all()


def nexuscrm_version(targets: dict[str, str]) -> dict[str, dict[str, Any]]:
    """``nexuscrm --json version`` of the current tools against ``targets``: each service's entry by name."""
    done = subprocess.run(
        [sys.executable, "-m", "nexuscrm_tools.cli", "--json", "version"],
        env={**os.environ, **targets},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return {entry["service"]: entry for entry in json.loads(done.stdout)["services"]}


@dataclasses.dataclass(frozen=True, kw_only=True)
class EndState:
    """What a scenario left in the database for its pack."""

    receipts: int
    events: int
    distinct_receipt_keys: int
    generations: dict[str, int]  # by status


def end_state(engine: sa.Engine, pack_install_id: str) -> EndState:
    """Count the pack's receipts, Events and generations."""
    with engine.connect() as connection:
        receipts = connection.scalar(
            sa.select(sa.func.count()).where(IngressReceipt.c.PackInstallId == pack_install_id)
        )
        events, keys = connection.execute(
            sa.select(sa.func.count(), sa.func.count(sa.distinct(Event.c.ReceiptKey))).where(
                Event.c.PackInstallId == pack_install_id
            )
        ).one()
        generations = queries.work_item_status_counts(connection, pack_install_id)
    return EndState(receipts=receipts or 0, events=events, distinct_receipt_keys=keys, generations=generations)


def assert_end_state(engine: sa.Engine, pack_install_id: str, *, inputs: int) -> EndState:
    """Fail unless ``inputs`` receipts were each admitted once and everything they made was completed and projected."""
    state = end_state(engine, pack_install_id)
    assert state.receipts == state.events == state.distinct_receipt_keys == inputs, state
    assert set(state.generations) == {WorkStatus.COMPLETED}, state
    assert demo.verify_projection(engine, pack_install_id) == []  # every admitted input projected, in order
    assert_invariants(engine)
    return state
