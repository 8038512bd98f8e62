"""The Integration host refuses a listen port another process holds, as a real process (decision 177).

The port is held the way a gRPC server of default options holds it (SO_REUSEPORT, with which
gRPC would bind it a second time): the host exits 3 in one log line naming the port, before
it opens its read-model database or asks any other service.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from nexuscrm_integration.main import EXIT_REFUSED
from tests.support.service_starts import Service, start_until_exit

pytestmark = pytest.mark.acceptance

INTEGRATION = Service(module="nexuscrm_integration.main", env_name="INTEGRATION")


def test_a_host_on_a_port_in_use_exits_3_in_one_line(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        address = f"127.0.0.1:{holder.getsockname()[1]}"
        read_model = tmp_path / "read-model.db"

        ended = start_until_exit(INTEGRATION, dsn=f"sqlite:///{read_model}", workdir=tmp_path, address=address)

    assert ended.process.returncode == EXIT_REFUSED == 3, ended.log
    (line,) = ended.log.splitlines()
    assert line.endswith(
        f" ERROR nexuscrm_runtime.server: refusing to start: port {address.rpartition(':')[2]} of {address} "
        "is already in use by another process; stop that process or choose another address"
    ), line
    assert not ended.port_file.exists() and not read_model.exists()
