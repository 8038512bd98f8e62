"""A Controlplane whose dashboard port is in use is refused in one line, as a real process (decision 177).

The dashboard is a side server of the Controlplane process: its address is checked with the
gRPC and metrics addresses, before the database is touched, so the refusal is the one log line
and exit 3 every service gives for a port in use (it was a traceback and exit 1).
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from nexuscrm_schema.verification import NEWEST_VERSION
from tests.support.service_starts import Service, schema_at, start_until_exit

INVARIANTS_NOT_CHECKED = "a start-up refusal only: no input is admitted"

pytestmark = pytest.mark.acceptance

CONTROLPLANE = Service(module="nexuscrm_controlplane.main", env_name="CONTROLPLANE")


def test_a_dashboard_port_in_use_exits_3_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dsn = f"sqlite:///{tmp_path / 'nexuscrm.db'}"
    schema_at(dsn, NEWEST_VERSION)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        monkeypatch.setenv("NEXUSCRM_DASHBOARD_ADDRESS", address)
        refused = start_until_exit(CONTROLPLANE, dsn=dsn, workdir=tmp_path)

    assert refused.process.returncode == 3, refused.log
    (line,) = refused.log.splitlines()
    assert line.endswith(
        f" ERROR nexuscrm_runtime.server: refusing to start: port {address.rpartition(':')[2]} of {address} is "
        "already in use by another process; stop that process or choose another address"
    ), line
    assert not refused.port_file.exists()
