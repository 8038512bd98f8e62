"""Factories for old-protocol history, built with the legacy (v0) runtime, and cutover helpers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import sqlalchemy as sa

from nexuscrm_controlplane import cutover, fences, lifecycle
from tests.support.checksums import Checksums, database_checksums, database_digest
from tests.support.factories import FakeClock as FakeClock  # the controlplane tests share one clock type
from tests.support.factories import record_work_item_handoff
from workqueue.values import IngestItem, Route

NAMESPACE = "acme"
HISTORY_TABLES = ("Event", "WorkItem")
BIN = Path(sys.executable).parent


def route(lane: str = "lane-a") -> Route:
    return Route(
        event_kind="contact.updated",
        route_version="v1",
        companion_version="flow-1",
        work_type="project",
        source_lane=lane,
    )


def items(keys: Sequence[str], lane: str = "lane-a") -> list[IngestItem]:
    return [IngestItem(receipt_key=key, route=route(lane), payload=f"payload {key}".encode()) for key in keys]


def install(engine: sa.Engine, clock: FakeClock, *, handoff: bool = True) -> str:
    """A pack of NAMESPACE, by default switched to WorkItem-only execution (the prior v2 handoff)."""
    pack = lifecycle.install_pack(engine, NAMESPACE, "crm-sync", "1.0.0", clock).pack_install_id
    if handoff:
        record_work_item_handoff(engine, pack, clock)
    return pack


def arm(engine: sa.Engine, clock: FakeClock) -> str:
    """Runbook step 1: a namespace-wide fence that never expires; returns its id."""
    return fences.arm_fence(engine, NAMESPACE, "*", reason="cutover", clock=clock).fence_id


def history(engine: sa.Engine) -> Checksums:
    with engine.connect() as connection:
        return database_checksums(connection, HISTORY_TABLES)


def cut(engine: sa.Engine, pack: str, clock: FakeClock, *, dry_run: bool = False) -> cutover.CutoverResult:
    """Run the cutover and assert that it changed no historical Event or WorkItem row.

    Only a written checkpoint may change anything: a refusal, a dry run or a repeated call
    leaves every row of every table as it was.
    """
    before, everything = history(engine), database_digest(engine)
    result = cutover.run_cutover(engine, pack, deadline=time.monotonic() + 120, dry_run=dry_run, clock=clock)
    assert history(engine) == before, "the cutover changed a historical Event or WorkItem row"
    if result.outcome is not cutover.Outcome.WRITTEN:
        assert database_digest(engine) == everything, f"a cutover that ended {result.outcome} changed a row"
    return result


def protocol_rows(engine: sa.Engine, pack: str) -> list[tuple[int, int, str]]:
    """(ProtocolVersion, LegacyMaxOrdinal, Origin) of every protocol row of the pack."""
    with engine.connect() as connection:
        rows = connection.execute(
            sa.text(
                "SELECT ProtocolVersion, LegacyMaxOrdinal, Origin FROM _System_ConnectorProjectionProtocol "
                "WHERE PackInstallId = :p"
            ),
            {"p": pack},
        )
        return [(int(row[0]), int(row[1]), str(row[2])) for row in rows]


def run_cli(
    command: str, args: Sequence[str], dsn: str | None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run a console command of ours with CONNECTOR_CUTOVER_DSN set (or unset when ``dsn`` is None)."""
    env = {k: v for k, v in os.environ.items() if k != "CONNECTOR_CUTOVER_DSN"}
    if dsn is not None:
        env["CONNECTOR_CUTOVER_DSN"] = dsn
    return subprocess.run(
        [str(BIN / command), *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def start_cli(command: str, args: Sequence[str], dsn: str) -> subprocess.Popen[str]:
    """Start a console command of ours without waiting for it."""
    env = {**os.environ, "CONNECTOR_CUTOVER_DSN": dsn}
    return subprocess.Popen(
        [str(BIN / command), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
