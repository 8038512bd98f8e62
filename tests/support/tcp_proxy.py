"""A small loopback TCP proxy that can reset, refuse or blackhole the connections it carries.

Tests put it between a service process and the database server to inject network faults
without touching the server: ``reset()`` aborts every open connection with a TCP RST (both
ends see the connection die mid-whatever), ``refuse(True)`` resets new connections as soon
as they arrive (the server looks down or restarting), and ``blackhole(True)`` stops moving
bytes in both directions while keeping every socket open (a partition: peers wait until
their own timeouts fire). It listens on 127.0.0.1 on a port chosen by the OS, runs one
accept thread plus two pump threads per connection, and holds at most
``max_connections`` connections (more are reset on arrival and counted).
"""

from __future__ import annotations

import dataclasses
import select
import socket
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager

POLL_SECONDS = 0.05  # how often idle pumps and the acceptor notice a mode change or close
CHUNK_BYTES = 64 * 1024


@dataclasses.dataclass
class ProxyStats:
    """What the proxy did, for the figures of a run."""

    accepted: int = 0
    reset: int = 0  # connections aborted by reset() or refused on arrival
    over_limit: int = 0
    blackholes: int = 0  # times blackhole(True) was switched on


def _abort(sock: socket.socket) -> None:
    """Close with SO_LINGER 0: the kernel sends RST instead of FIN."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    sock.close()


class _Link:
    """One proxied connection: the client side and the upstream side."""

    def __init__(self, client: socket.socket, upstream: socket.socket) -> None:
        self.client = client
        self.upstream = upstream
        self.upstream_port: int = upstream.getsockname()[1]
        self.closed = threading.Event()
        self._lock = threading.Lock()

    def close(self, *, abort: bool) -> None:
        with self._lock:
            if self.closed.is_set():
                return
            self.closed.set()
            for sock in (self.client, self.upstream):
                if abort:
                    _abort(sock)
                else:
                    sock.close()


class TcpProxy:
    """Forwards 127.0.0.1:<port> to ``upstream``; see the module docstring for the faults."""

    def __init__(self, upstream_host: str, upstream_port: int, *, max_connections: int = 64) -> None:
        self._upstream = (upstream_host, upstream_port)
        self._max_connections = max_connections
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(POLL_SECONDS)
        self.port: int = self._listener.getsockname()[1]
        self._links: set[_Link] = set()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._flowing = threading.Event()
        self._flowing.set()
        self._refusing = False
        self.stats = ProxyStats()
        self._acceptor = threading.Thread(target=self._accept_loop, name="tcp-proxy-accept", daemon=True)

    def start(self) -> TcpProxy:
        """Start accepting; returns self."""
        self._acceptor.start()
        return self

    def close(self) -> None:
        """Stop accepting, close every connection and wait for every thread."""
        self._stopping.set()
        self._flowing.set()
        self._acceptor.join()
        self._listener.close()
        with self._lock:
            links = list(self._links)
            threads = list(self._threads)
        for link in links:
            link.close(abort=False)
        for thread in threads:
            thread.join()

    def reset(self) -> int:
        """Abort every open connection with RST; return how many were aborted."""
        with self._lock:
            links = list(self._links)
            self._links.clear()
        for link in links:
            link.close(abort=True)
        self.stats.reset += len(links)
        return len(links)

    def refuse(self, refusing: bool) -> None:
        """While on, reset every new connection at once (the server looks down)."""
        self._refusing = refusing

    def blackhole(self, on: bool) -> None:
        """While on, move no bytes in either direction; sockets stay open."""
        if on:
            self.stats.blackholes += 1
            self._flowing.clear()
        else:
            self._flowing.set()

    def upstream_ports(self) -> set[int]:
        """Local ports of the open upstream sockets: how the server names these clients."""
        with self._lock:
            return {link.upstream_port for link in self._links}

    def _accept_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            self.stats.accepted += 1
            if self._refusing:
                self.stats.reset += 1
                _abort(client)
                continue
            with self._lock:
                full = len(self._links) >= self._max_connections
            if full:
                self.stats.over_limit += 1
                _abort(client)
                continue
            try:
                upstream = socket.create_connection(self._upstream, timeout=5)
            except OSError:
                _abort(client)
                continue
            link = _Link(client, upstream)
            pumps = [
                threading.Thread(target=self._pump, args=(link, client, upstream), daemon=True),
                threading.Thread(target=self._pump, args=(link, upstream, client), daemon=True),
            ]
            with self._lock:
                self._links.add(link)
                self._threads = [t for t in self._threads if t.is_alive()] + pumps
            for pump in pumps:
                pump.start()

    def _pump(self, link: _Link, source: socket.socket, target: socket.socket) -> None:
        try:
            while not link.closed.is_set() and not self._stopping.is_set():
                if not self._flowing.wait(POLL_SECONDS):
                    continue  # blackholed: leave the bytes where they are
                readable, _, _ = select.select([source], [], [], POLL_SECONDS)
                if not readable:
                    continue
                data = source.recv(CHUNK_BYTES)
                if not data:
                    break
                target.sendall(data)
        except (OSError, ValueError):  # the other pump or reset() closed a socket
            pass
        link.close(abort=False)
        with self._lock:
            self._links.discard(link)


@contextmanager
def tcp_proxy(upstream_host: str, upstream_port: int, *, max_connections: int = 64) -> Iterator[TcpProxy]:
    """A started proxy, closed on exit."""
    proxy = TcpProxy(upstream_host, upstream_port, max_connections=max_connections).start()
    try:
        yield proxy
    finally:
        proxy.close()
