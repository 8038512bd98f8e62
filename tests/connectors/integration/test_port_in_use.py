"""A second Connectors started on the first one's port is refused, as a real process (decision 177).

gRPC would let it bind the same port (SO_REUSEPORT) and both would take connections; it exits
3 instead, in one log line naming the port, before it touches the database or binds anything,
while the first one serves on. The check precedes every database read, so SQLite alone suffices.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nexuscrm_schema.verification import NEWEST_VERSION
from tests.support.service_starts import Service, health, schema_at, serving, start_until_exit

INVARIANTS_NOT_CHECKED = "a start-up refusal only: no input is admitted"

pytestmark = pytest.mark.acceptance

CONNECTORS = Service(module="nexuscrm_connectors.main", env_name="CONNECTORS")


def test_a_second_instance_on_a_port_in_use_exits_3_in_one_line(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path / 'nexuscrm.db'}"
    schema_at(dsn, NEWEST_VERSION)
    with serving(CONNECTORS, dsn=dsn, workdir=tmp_path / "first") as (_first, address):
        second = start_until_exit(CONNECTORS, dsn=dsn, workdir=tmp_path / "second", address=address)

        assert second.process.returncode == 3, second.log
        port = address.rpartition(":")[2]
        (line,) = second.log.splitlines()
        assert line.endswith(
            f" ERROR nexuscrm_runtime.server: refusing to start: port {port} of {address} is already in use by "
            "another process; stop that process or choose another address"
        ), line
        assert not second.port_file.exists()
        assert health(address) == "SERVING"  # the first one, untouched
