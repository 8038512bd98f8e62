"""Connectors' start-up schema gate, as a real process on each backend (decision 144).

Connectors serves schema 15..15 with a forward window of 1 (``nexuscrm_connectors.release``):
an empty database, one at v7 and one two versions past the newest are refused (one line,
exit 3, no port ever published, so nothing ever answers SERVING); the newest serves; one
version past it serves with one warning. A database that cannot be reached is refused alike.
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from nexuscrm.connectors.v1 import connectors_pb2, connectors_pb2_grpc
from nexuscrm_connectors.release import RELEASE
from nexuscrm_runtime.database import create_engine
from nexuscrm_schema.support import read_version
from nexuscrm_schema.verification import NEWEST_VERSION
from tests.support.service_starts import Service, health, schema_at, serving, start_until_exit

INVARIANTS_NOT_CHECKED = "the start-up schema gate only: a process accepts or refuses a schema and admits no input"

pytestmark = [pytest.mark.acceptance, pytest.mark.database]

CONNECTORS = Service(module="nexuscrm_connectors.main", env_name="CONNECTORS")
WHO = f"nexuscrm-connectors {RELEASE.version}"


@pytest.mark.parametrize(
    ("version", "found"),
    [
        pytest.param(0, "the database has no canonical schema (version 0)", id="empty"),
        pytest.param(7, "the database is at schema 7", id="v7"),
        pytest.param(NEWEST_VERSION + 2, f"the database is at schema {NEWEST_VERSION + 2}, past what", id="beyond"),
    ],
)
def test_a_database_it_cannot_serve_is_refused_in_one_line_before_anything_serves(
    empty_dsn: str, tmp_path: Path, version: int, found: str
) -> None:
    schema_at(empty_dsn, version)
    ended = start_until_exit(CONNECTORS, dsn=empty_dsn, workdir=tmp_path)
    assert ended.process.returncode == 3, ended.log
    assert not ended.port_file.exists()  # never bound: no health service, nothing SERVING
    (refusal,) = ended.lines("ERROR")
    assert found in refusal
    assert f"{WHO} serves schema 15..15 +1" in refusal or f"{WHO} serves (15..15 +1)" in refusal
    assert "nexuscrm-schema " in refusal  # what to run: migrate, or status for a newer schema
    assert "Traceback" not in ended.log and "materializer" not in ended.log
    engine = create_engine(empty_dsn)
    try:
        assert read_version(engine) == version  # nothing written
    finally:
        engine.dispose()


def test_a_database_at_the_newest_version_serves(empty_dsn: str, tmp_path: Path) -> None:
    schema_at(empty_dsn, NEWEST_VERSION)
    with serving(CONNECTORS, dsn=empty_dsn, workdir=tmp_path) as (started, address):
        assert health(address) == "SERVING"
        assert started.lines("WARNING") == []
        assert f"{WHO} (contract {RELEASE.contract_version}, schema 15..15 +1, database at 15)" in started.log
        with grpc.insecure_channel(address) as channel:
            build = (
                connectors_pb2_grpc.ConnectorsServiceStub(channel)
                .GetBuildInfo(connectors_pb2.GetBuildInfoRequest(), timeout=10)
                .build
            )
    assert (build.owner, build.package, build.package_version) == ("connectors", "nexuscrm-connectors", RELEASE.version)
    assert (build.schema_support.minimum, build.schema_support.newest, build.schema_support.forward_window) == (
        15,
        15,
        1,
    )
    assert build.database_schema_version == NEWEST_VERSION


def test_a_newer_database_inside_the_forward_window_serves_with_one_warning(empty_dsn: str, tmp_path: Path) -> None:
    schema_at(empty_dsn, NEWEST_VERSION + 1)
    with serving(CONNECTORS, dsn=empty_dsn, workdir=tmp_path) as (started, address):
        assert health(address) == "SERVING"
        (warning,) = started.lines("WARNING")
        assert f"the database is at schema {NEWEST_VERSION + 1}, newer than {WHO} knows (15)" in warning
        assert f"database at {NEWEST_VERSION + 1})" in started.log


def _closed_port() -> int:
    with socket.socket() as probe:  # bound then closed: nothing listens there
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize(
    ("dsn", "says"),
    [
        pytest.param(
            lambda: f"mysql://root@127.0.0.1:{_closed_port()}/nexuscrm", "nothing is listening", id="no-server"
        ),
        pytest.param(lambda: "sqlite:////proc/no-such-dir/nexuscrm.db", "cannot use the sqlite file", id="no-folder"),
    ],
)
def test_a_database_that_cannot_be_reached_is_refused_in_one_line(
    tmp_path: Path, dsn: Callable[[], str], says: str
) -> None:
    ended = start_until_exit(CONNECTORS, dsn=dsn(), workdir=tmp_path)
    assert ended.process.returncode == 3, ended.log
    assert not ended.port_file.exists()
    (refusal,) = ended.lines("ERROR")
    assert f"refusing to start: {says}" in refusal
    assert "Traceback" not in ended.log
