"""Replicas whose process clocks disagree by more than a lease agree on every time decision (decision 118).

Three Connectors processes serve one database: one on the host's clock, one 90 s ahead and
one 90 s behind (libfaketime, Debian's ``faketime`` package), with 60 s and 5 s leases.
Every decision is taken on the database's clock, so the skewed replicas never reclaim a
lease early, never run a retry before its backoff and see a fence expire at the same instant
as everyone else. Embedded SQLite is not a shared server: its time is the clock of the host
whose processes open the file, so the scenario runs on the MySQL-protocol server only.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import sqlalchemy as sa

from nexuscrm_controlplane import fences
from nexuscrm_runtime.clock import DATABASE_CLOCK
from nexuscrm_runtime.database import create_engine, is_sqlite
from nexuscrm_schema.tables import WorkItem
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_tools.launcher import CONNECTORS, ServiceProcess, start_service, stop_services
from tests.conftest import REQUIRED
from tests.support.factories import delivery, install_pack
from tests.support.invariants import assert_invariants
from tests.support.waiting import wait_until
from workqueue.values import Claim, Outcome

pytestmark = [pytest.mark.acceptance, pytest.mark.database, pytest.mark.slow]

SKEW = dt.timedelta(seconds=90)  # more than either lease below
LONG_LEASE = dt.timedelta(seconds=60)
SHORT_LEASE = dt.timedelta(seconds=5)
BACKOFF_SECONDS = 5  # NEXUSCRM_RETRY_BASE_SECONDS: the first retry waits this long
CLAIM_WAIT = dt.timedelta(seconds=15)  # longer than the short lease and the backoff
FAKETIME = sorted(Path("/usr/lib").glob("*/faketime/libfaketime.so.1"))


def skewed(offset: dt.timedelta) -> dict[str, str]:
    """Environment that shifts a process's wall clock by ``offset`` (its monotonic clock stays true)."""
    seconds = int(offset.total_seconds())
    return {"LD_PRELOAD": str(FAKETIME[0]), "FAKETIME": f"{seconds:+d}s", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}


def wall_clock_of(env: dict[str, str]) -> float:
    """What ``time.time()`` says in a Python process started with ``env`` added."""
    done = subprocess.run(
        [sys.executable, "-c", "import time; print(time.time())"],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return float(done.stdout)


@pytest.fixture
def replicas(dsn: str, tmp_path: Path) -> Iterator[dict[str, ServiceProcess]]:
    if dsn.startswith("sqlite"):
        pytest.skip("SQLite is embedded: its time is the host's clock, the same for every process on that host")
    if not FAKETIME:
        if REQUIRED:
            pytest.fail("libfaketime is missing: apt-get install faketime (.ci/run installs it)")
        pytest.skip("libfaketime is missing: apt-get install faketime")
    base = {"NEXUSCRM_DSN": dsn, "NEXUSCRM_RETRY_BASE_SECONDS": str(BACKOFF_SECONDS)}
    started: dict[str, ServiceProcess] = {}
    try:
        for name, env in (("true", {}), ("ahead", skewed(SKEW)), ("behind", skewed(-SKEW))):
            workdir = tmp_path / name
            workdir.mkdir()
            started[name] = start_service(CONNECTORS, env={**base, **env}, workdir=workdir)
        yield started
    finally:
        codes = stop_services(list(started.values()))
    assert set(codes.values()) <= {0}


@pytest.fixture
def clients(replicas: dict[str, ServiceProcess]) -> Iterator[dict[str, ConnectorsClient]]:
    channels = {name: grpc.insecure_channel(service.address) for name, service in replicas.items()}
    try:
        yield {name: ConnectorsClient(channel, timeout=dt.timedelta(seconds=30)) for name, channel in channels.items()}
    finally:
        for channel in channels.values():
            channel.close()


def naive(value: dt.datetime | None) -> dt.datetime:
    assert value is not None
    return value.astimezone(dt.UTC).replace(tzinfo=None)


def claimed_at(claim: Claim, lease: dt.timedelta) -> dt.datetime:
    """The database's time at which ``claim`` was granted: its expiry less its lease."""
    return naive(claim.work.lease_expires_at) - lease


def lease_token(engine: sa.Engine, work_id: str) -> str | None:
    with engine.connect() as connection:
        token: str | None = connection.execute(
            sa.select(WorkItem.c.LeaseToken).where(WorkItem.c.WorkId == work_id)
        ).scalar_one()
        return token


def test_replicas_with_skewed_clocks_agree_on_leases_retries_and_fences(
    dsn: str, clients: dict[str, ConnectorsClient]
) -> None:
    engine = create_engine(dsn)
    assert not is_sqlite(engine)
    true, ahead, behind = clients["true"], clients["ahead"], clients["behind"]
    host = wall_clock_of({})
    assert wall_clock_of(skewed(SKEW)) - host >= SKEW.total_seconds() - 5, "libfaketime did not move the clock"
    assert host - wall_clock_of(skewed(-SKEW)) >= SKEW.total_seconds() - 5, "libfaketime did not move the clock"
    pack = install_pack(engine)

    # A 60 s lease is never reclaimed early, however far ahead the claiming replica's clock is.
    true.ingest(pack, items=[delivery(lane="held")])
    (held,) = true.claim("w-true", pack_install_ids=[pack], lease=LONG_LEASE)
    assert ahead.claim("w-ahead", pack_install_ids=[pack], lease=LONG_LEASE) == []
    assert lease_token(engine, held.work.work_id) == held.lease_token

    # A lease is reclaimed once it expired on the database's clock, even by a replica whose clock is behind.
    true.ingest(pack, items=[delivery(lane="expiring")])
    (short,) = true.claim("w-true", pack_install_ids=[pack], lease=SHORT_LEASE)
    assert ahead.claim("w-ahead", pack_install_ids=[pack], lease=SHORT_LEASE) == []
    (reclaimed,) = behind.claim("w-behind", pack_install_ids=[pack], lease=SHORT_LEASE, wait=CLAIM_WAIT)
    assert reclaimed.work.work_id == short.work.work_id and reclaimed.work.attempt == 1
    assert claimed_at(reclaimed, SHORT_LEASE) >= naive(short.work.lease_expires_at)
    behind.complete(reclaimed.work.work_id, lease_token=reclaimed.lease_token)

    # A retry waits its backoff on the database's clock, on every replica.
    true.ingest(pack, items=[delivery(lane="retried")])
    (failing,) = true.claim("w-true", pack_install_ids=[pack], lease=LONG_LEASE)
    waiting = true.fail(failing.work.work_id, lease_token=failing.lease_token, error="transient")
    assert ahead.claim("w-ahead", pack_install_ids=[pack], lease=LONG_LEASE) == []
    (retried,) = behind.claim("w-behind", pack_install_ids=[pack], lease=LONG_LEASE, wait=CLAIM_WAIT)
    assert retried.work.work_id == failing.work.work_id
    assert claimed_at(retried, LONG_LEASE) >= naive(waiting.claimable_at)
    behind.complete(retried.work.work_id, lease_token=retried.lease_token)

    # A fence expires once, at the database's instant, for every replica.
    fence = fences.arm_fence(engine, "acme", "*", expires_in_seconds=BACKOFF_SECONDS, reason="skew test")
    for name, client in clients.items():
        (result,) = client.ingest(pack, items=[delivery(f"fenced-{name}", lane=f"fenced-{name}")])
        assert result.outcome is Outcome.FENCED, f"the {name} replica admitted through a fence that still holds"
    expires = naive(fence.expires_at)
    with engine.connect() as connection:
        wait_until(lambda: DATABASE_CLOCK.read(connection) >= expires, "the fence to expire on the database's clock")
    for name, client in clients.items():
        (result,) = client.ingest(pack, items=[delivery(f"open-{name}", lane=f"open-{name}")])
        assert result.outcome is Outcome.ADMITTED, f"the {name} replica still sees an expired fence"

    true.complete(held.work.work_id, lease_token=held.lease_token)
    assert_invariants(engine)
    engine.dispose()
