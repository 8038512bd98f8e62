"""A port another process holds is refused, never shared (``nexuscrm_runtime.listening``, decision 177).

gRPC's listeners set SO_REUSEPORT by default, with which a second server binds the same port
and both accept connections; the check and the servers' ``grpc.so_reuseport`` = 0 refuse it.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from nexuscrm_runtime.listening import PortUnavailable, refuse_if_in_use
from nexuscrm_runtime.server import create_server


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port listened on with SO_REUSEPORT, as a gRPC server of default options holds it."""
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        yield int(holder.getsockname()[1])


def _closed_port() -> int:
    with socket.socket() as probe:  # bound then closed: nothing listens there
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0", "[::]", "localhost"])
def test_an_address_whose_port_is_held_is_refused_naming_it(held_port: int, host: str) -> None:
    address = f"{host}:{held_port}"
    with pytest.raises(PortUnavailable) as refused:
        refuse_if_in_use("", address)
    assert str(refused.value) == (
        f"port {held_port} of {address} is already in use by another process; "
        "stop that process or choose another address"
    )


def test_a_free_port_port_zero_and_an_unset_address_pass() -> None:
    refuse_if_in_use(f"127.0.0.1:{_closed_port()}", "127.0.0.1:0", "")


def test_a_second_grpc_server_on_a_servers_port_is_refused() -> None:
    first = create_server([], "127.0.0.1:0")
    try:
        with pytest.raises(PortUnavailable, match=f"cannot listen on 127.0.0.1:{first.port}"):
            create_server([], f"127.0.0.1:{first.port}")
    finally:
        first.stop(0)
