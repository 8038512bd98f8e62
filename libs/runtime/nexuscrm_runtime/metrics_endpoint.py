"""The Prometheus endpoint of a service, under the same trust as its gRPC port.

Without security it is plain HTTP, as before. With security it is HTTPS with the service's
certificate and speaks **mutual TLS only**: a scraper presents a client certificate the CA
signed, and its principal (read by the same ``identity`` rules as a gRPC caller) must span
every namespace (``*``), because the metrics name every tenant's packs. Certificates and
policy follow ``Security.reload``. Each connection's handshake and reads run in its own
thread with a timeout, so a slow or silent client neither blocks other scrapes nor the
service's shutdown.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import socketserver
import ssl
import threading
from collections.abc import Iterable, Iterator
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer
from wsgiref.types import StartResponse, WSGIApplication, WSGIEnvironment

from prometheus_client import REGISTRY, make_wsgi_app
from prometheus_client.registry import CollectorRegistry

from nexuscrm_runtime.config import check_address
from nexuscrm_runtime.security import Security
from nexuscrm_runtime.tls import TlsFiles
from workqueue.errors import DomainError

log = logging.getLogger(__name__)
SOCKET_TIMEOUT = 10.0  # seconds a client may take per handshake step or read
PEER_CERTIFICATE = "nexuscrm.peer_certificate"  # WSGI environ key: the client's DER certificate
REFUSAL = b"the metrics need a client certificate of a principal of every namespace ('*')\n"


class _Handler(WSGIRequestHandler):
    timeout = SOCKET_TIMEOUT

    def setup(self) -> None:
        if isinstance(self.request, ssl.SSLSocket):  # the handshake runs here, not in the accept loop
            self.request.settimeout(self.timeout)
            self.request.do_handshake()
        super().setup()

    def get_environ(self) -> WSGIEnvironment:
        environ = super().get_environ()
        if isinstance(self.connection, ssl.SSLSocket):
            environ[PEER_CERTIFICATE] = self.connection.getpeercert(binary_form=True)
        return environ

    def log_message(self, format: str, *args: Any) -> None:  # the base class names it
        """Scrapes are not logged (one line every few seconds per scraper says nothing)."""


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True
    tls: ssl.SSLContext | None = None  # replaced on reload; each accepted connection takes the current one

    def get_request(self) -> tuple[socket.socket, Any]:
        connection, client_address = self.socket.accept()
        if self.tls is not None:
            connection = self.tls.wrap_socket(connection, server_side=True, do_handshake_on_connect=False)
        return connection, client_address

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("metrics connection from %s failed", client_address, exc_info=True)


def _guarded(app: WSGIApplication, security: Security) -> WSGIApplication:
    def guarded(environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        try:
            principal = security.policy.for_certificate(environ.get(PEER_CERTIFICATE))
        except DomainError:
            principal = None
        if principal is None or not principal.spans_namespaces:
            start_response("403 Forbidden", [("Content-Type", "text/plain; charset=utf-8")])
            return [REFUSAL]
        return app(environ, start_response)

    return guarded


@contextlib.contextmanager
def metrics_server(
    address: str, registry: CollectorRegistry = REGISTRY, *, security: Security | None = None
) -> Iterator[int]:
    """Serve ``registry`` in Prometheus text format on ``address`` (host:port, 0 = any) while inside; yield the port.

    With ``security``: HTTPS, mutual TLS, principals of every namespace only (module docstring).
    """
    host, _, port = check_address("the metrics address", address).rpartition(":")
    host = host.strip("[]")
    app: WSGIApplication = make_wsgi_app(registry)
    server_class = type("_Server6", (_Server,), {"address_family": socket.AF_INET6}) if ":" in host else _Server
    server = server_class((host, int(port)), _Handler)
    if security is not None:
        server.tls = security.tls.server_context(require_client_certificate=True)

        def follow(tls: TlsFiles) -> None:
            server.tls = tls.server_context(require_client_certificate=True)

        security.on_reload(follow)
        app = _guarded(app, security)
    server.set_app(app)
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    try:
        yield int(server.server_port)
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
