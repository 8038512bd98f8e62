"""A throwaway MariaDB server of one test's own, which the test may stop, crash and start again.

The shared server of a test machine must never be restarted (other runs use it), so a test
that restarts the database starts its own: a fresh datadir made by ``mariadb-install-db``
under the test's temporary directory, ``mariadbd`` on loopback with its own socket, pid file
and error log, and root without a password over TCP. The server keeps its port and datadir
across restarts, so a service configured with its DSN meets exactly what a production
restart looks like: every connection dropped, new ones refused, then the same server again
(after crash recovery, if it was killed).
"""

from __future__ import annotations

import contextlib
import getpass
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pymysql

# mariadbd lives in an sbin directory, which an unprivileged PATH may lack.
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
START_TIMEOUT = 60.0  # seconds to accept connections, crash recovery included
STOP_TIMEOUT = 60.0  # seconds for a graceful shutdown before the server is killed
POLL = 0.05  # seconds between connection attempts while the server starts
# A port below Linux's default ephemeral range (32768-60999): while the server is down, no
# outgoing connection (least of all the service reconnecting to it) can take its port.
PORT_RANGE = (20000, 32767)
PORT_ATTEMPTS = 50
# Small and durable: a commit is on disk when it is acknowledged, so a crash loses nothing
# acknowledged (the promise under test); innodb_log_file_size also keeps the datadir small.
SERVER_OPTIONS = (
    "--skip-log-bin",
    "--skip-name-resolve",
    "--innodb-buffer-pool-size=64M",
    "--innodb-log-file-size=16M",
    "--innodb-flush-log-at-trx-commit=1",
)


class PrivateServerError(RuntimeError):
    """The server could not be installed or started; the message says why."""


def _program(name: str) -> str:
    path = shutil.which(name, path=SEARCH_PATH)
    if path is None:
        raise PrivateServerError(f"{name} is not installed")
    return path


def _free_port() -> int:
    """A loopback port in ``PORT_RANGE`` that nothing listens on right now."""
    for _ in range(PORT_ATTEMPTS):
        port = random.randint(*PORT_RANGE)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise PrivateServerError(f"no free port in {PORT_RANGE} after {PORT_ATTEMPTS} tries")


class PrivateMariaDB:
    """One private server in ``workdir``: install once, then start, stop or crash, and start again."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.datadir = workdir / "data"
        self.error_log = workdir / "error.log"
        self.user = getpass.getuser()  # mariadbd run by root must be told to stay root
        self.port = 0  # chosen by the first start, kept by every later one
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def dsn(self) -> str:
        """The server's DSN, without a database name."""
        return f"mysql://root@127.0.0.1:{self.port}/"

    def install(self) -> None:
        """Create the datadir with root allowed in without a password."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        command = [
            _program("mariadb-install-db"),
            "--no-defaults",
            f"--datadir={self.datadir}",
            f"--user={self.user}",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            *SERVER_OPTIONS,
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise PrivateServerError(f"mariadb-install-db exited with {done.returncode}: {done.stderr[-2000:]}")

    def start(self) -> None:
        """Start the server (on a free port the first time) and return once it accepts connections."""
        assert self.process is None, "the private server is already running"
        self.port = self.port or _free_port()
        command = [
            _program("mariadbd"),
            "--no-defaults",
            f"--datadir={self.datadir}",
            f"--user={self.user}",
            "--bind-address=127.0.0.1",
            f"--port={self.port}",
            "--port-open-timeout=10",  # seconds to wait for the port a killed server just left
            f"--socket={self.workdir / 'mariadbd.sock'}",
            f"--pid-file={self.workdir / 'mariadbd.pid'}",
            f"--log-error={self.error_log}",
            *SERVER_OPTIONS,
        ]
        self.process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_accepting()

    def _wait_accepting(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT
        while not self._accepts():
            try:
                code = self.process.wait(POLL)  # returns within POLL only if the server exited
            except subprocess.TimeoutExpired:
                if time.monotonic() > deadline:
                    raise PrivateServerError(f"mariadbd accepts no connection after {START_TIMEOUT:.0f}s") from None
                continue
            self.process = None
            raise PrivateServerError(f"mariadbd exited with {code} during startup:\n{self._log_tail()}")

    def _accepts(self) -> bool:
        try:
            pymysql.connect(host="127.0.0.1", port=self.port, user="root", connect_timeout=1, read_timeout=1).close()
        except pymysql.err.OperationalError:
            return False
        return True

    def _log_tail(self) -> str:
        lines = self.error_log.read_text(errors="replace").splitlines() if self.error_log.exists() else []
        return "\n".join(lines[-15:])

    def stop(self) -> int:
        """Shut the server down gracefully (SIGTERM) and return its exit code."""
        return self._end(signal.SIGTERM)

    def crash(self) -> int:
        """Kill the server (SIGKILL): the next start runs InnoDB's crash recovery."""
        return self._end(signal.SIGKILL)

    def _end(self, signum: signal.Signals) -> int:
        assert self.process is not None, "the private server is not running"
        process, self.process = self.process, None
        process.send_signal(signum)
        try:
            return process.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            process.kill()
            return process.wait()

    def close(self) -> None:
        """Kill the server if it runs; nothing is kept."""
        if self.process is not None:
            self.crash()

    def create_database(self, name: str) -> str:
        """Create database ``name``; its DSN."""
        with contextlib.closing(pymysql.connect(host="127.0.0.1", port=self.port, user="root")) as connection:
            connection.cursor().execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        return f"{self.dsn}{name}"
