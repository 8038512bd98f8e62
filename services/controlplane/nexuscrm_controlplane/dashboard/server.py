"""Running the dashboard on its own port, in a thread of the Controlplane process.

Uvicorn serves the app on a socket bound here (so port 0 works and the bound port is known
before serving); it does not install signal handlers off the main thread, so SIGTERM stays
with the gRPC server's graceful shutdown, which stops the dashboard through ``stop``.
"""

from __future__ import annotations

import socket
import threading
import time

import uvicorn
from starlette.applications import Starlette

from nexuscrm_runtime.config import check_address
from nexuscrm_runtime.tls import TlsFiles

STARTUP_TIMEOUT = 10.0  # seconds for uvicorn to start serving the bound socket
STARTUP_POLL = 0.01  # seconds


class DashboardServer:
    """Serves ``app`` on ``address`` (host:port, 0 = any free port) until ``stop``; HTTPS with ``tls``.

    ``stop`` waits up to ``grace`` seconds for requests in progress (the service's grace period).
    """

    def __init__(self, app: Starlette, address: str, tls: TlsFiles | None = None, *, grace: int = 5) -> None:
        host, _, port = check_address("NEXUSCRM_DASHBOARD_ADDRESS", address).rpartition(":")
        self._socket = socket.create_server((host.strip("[]"), int(port)))
        self.port: int = self._socket.getsockname()[1]
        config = uvicorn.Config(
            app,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=grace,  # seconds for open requests once stopping
            ssl_certfile=tls.cert_path if tls else None,
            ssl_keyfile=tls.key_path if tls else None,
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name="dashboard", daemon=True
        )

    def start(self) -> None:
        """Start serving; return once uvicorn accepts connections (RuntimeError if it did not start)."""
        self._thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the dashboard did not start; see the log")
            time.sleep(STARTUP_POLL)

    def follow(self, tls: TlsFiles) -> None:
        """Present the rotated certificate on new connections (``Security.on_reload``)."""
        context = self._server.config.ssl
        if context is not None:
            context.load_cert_chain(tls.cert_path, tls.key_path)

    def stop(self) -> None:
        """Stop serving and wait for the server thread."""
        self._server.should_exit = True
        self._thread.join()
        self._socket.close()
