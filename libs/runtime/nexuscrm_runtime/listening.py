"""Whether a server may listen on its address: a port another process holds is a start refusal.

gRPC sets SO_REUSEPORT on its listeners by default, so a second service started on a port
already in use would bind it too and share its connections silently. ``SERVER_OPTIONS`` turns
that off for every server (``server.create_server``); ``refuse_if_in_use`` checks the address
first, so that the refusal is the service's one log line instead of gRPC core's own error line
(decision 177). A bind that still fails (the port taken since the check) is a ``PortUnavailable``
too.
"""

from __future__ import annotations

import errno
import socket

from nexuscrm_runtime.prerequisites import StartRefused

# A listener shares its port with no other socket: a second process's bind fails.
SERVER_OPTIONS = (("grpc.so_reuseport", 0),)


class PortUnavailable(StartRefused):
    """The listen address cannot be bound: another process listens there, or gRPC could not bind it."""


def refuse_if_in_use(*addresses: str) -> None:
    """Raise ``PortUnavailable`` when a socket already listens on one of ``addresses`` (host:port).

    An empty address (a side server not configured) and port 0 are never in use. Each address
    a host resolves to is bound once, as gRPC binds it (SO_REUSEADDR, so the TIME_WAIT
    connections of a stopped predecessor are no conflict; IPv6 sockets dual-stack), and
    released at once. Errors other than "in use" are left to the server's own bind.
    """
    for address in addresses:
        if address:
            _refuse_if_in_use(address)


def _refuse_if_in_use(address: str) -> None:
    host, _, port = address.rpartition(":")
    if int(port) == 0:
        return
    try:
        resolved = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return  # gRPC refuses a name it cannot resolve itself
    for family, kind, protocol, _, socket_address in resolved:
        with socket.socket(family, kind, protocol) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            try:
                probe.bind(socket_address)
            except OSError as error:
                if error.errno == errno.EADDRINUSE:
                    raise PortUnavailable(
                        f"port {port} of {address} is already in use by another process; "
                        "stop that process or choose another address"
                    ) from None
