"""A throwaway 3-node MariaDB Galera cluster on loopback, for the multi-writer tests.

Modelled on ``private_mariadb``: every node is a ``mariadbd`` of the test's own, with its own
datadir, socket, pid file and error log under one temporary directory, its own SQL port and
its own group-communication (gcomm), IST and SST ports, all chosen free on 127.0.0.1 (the
shared server of the machine is never touched). Node 1 is installed with
``mariadb-install-db`` and bootstraps the cluster (``--wsrep-new-cluster``); nodes 2 and 3
start from empty datadirs and receive their state from it by rsync SST. The cluster is ready
when every node reports ``wsrep_cluster_size`` = 3 and ``wsrep_ready`` = ON.

The nodes are kept small for a shared 2-core machine: a 64 MB buffer pool, 16 MB redo log,
performance_schema off, a 32 MB gcache. ``GaleraCluster.close`` kills every node and removes
the directory; it is safe to call after a failed start.
"""

from __future__ import annotations

import contextlib
import dataclasses
import getpass
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pymysql

from tests.support.private_mariadb import PrivateServerError, _free_port, _program
from tests.support.waiting import wait_until

PROVIDER = Path("/usr/lib/galera/libgalera_smm.so")
NODES = 3
START_TIMEOUT = 120.0  # seconds for one node to accept connections, SST included
READY_TIMEOUT = 60.0  # seconds for the whole cluster to report size 3 and ready
STOP_TIMEOUT = 30.0  # seconds for a graceful shutdown before a node is killed
POLL = 0.1  # seconds between status polls
CLUSTER_NAME = "nexuscrm-test"
SERVER_ACCOUNT = "mysql"  # the nodes' account when the tests run as root (Debian's mariadb-server creates it)
# Settings Galera requires (row binlog, interleaved auto-increment locks, InnoDB) and the
# small footprint of a test node.
NODE_OPTIONS = (
    "--skip-name-resolve",
    "--binlog-format=ROW",
    "--default-storage-engine=InnoDB",
    "--innodb-autoinc-lock-mode=2",
    "--innodb-buffer-pool-size=64M",
    "--innodb-log-file-size=16M",
    "--innodb-flush-log-at-trx-commit=2",  # durability comes from the cluster; the tests crash nothing
    "--performance-schema=OFF",
    "--max-connections=200",
)


class GaleraError(PrivateServerError):
    """The cluster could not be installed or started; the message says why (with log tails)."""


@dataclasses.dataclass
class GaleraNode:
    """One node: its directory, ports and process."""

    number: int
    workdir: Path
    port: int = 0  # SQL
    gcomm_port: int = 0
    ist_port: int = 0
    sst_port: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def datadir(self) -> Path:
        return self.workdir / "data"

    @property
    def error_log(self) -> Path:
        return self.workdir / "error.log"

    @property
    def dsn(self) -> str:
        """The node's DSN, without a database name."""
        return f"mysql://root@127.0.0.1:{self.port}/"

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the node's error log."""
        if not self.error_log.exists():
            return "(no error log)"
        return "\n".join(self.error_log.read_text(errors="replace").splitlines()[-lines:])

    def status(self, name: str) -> str | None:
        """A global status value of the node; None when it does not answer."""
        try:
            connection = pymysql.connect(
                host="127.0.0.1", port=self.port, user="root", connect_timeout=1, read_timeout=2
            )
        except pymysql.err.OperationalError:
            return None
        with contextlib.closing(connection):
            cursor = connection.cursor()
            cursor.execute("SHOW GLOBAL STATUS LIKE %s", (name,))
            row = cursor.fetchone()
        return None if row is None else str(row[1])


class GaleraCluster:
    """Three Galera nodes on loopback under ``workdir``: ``start()``, use ``dsns``, ``close()``."""

    def __init__(self, workdir: Path, nodes: int = NODES) -> None:
        self.workdir = workdir
        self.nodes = [GaleraNode(number=n, workdir=workdir / f"node{n}") for n in range(1, nodes + 1)]
        self.started_in = 0.0  # seconds the last start took

    @property
    def dsns(self) -> list[str]:
        """The nodes' DSNs (node 1 first), without a database name."""
        return [node.dsn for node in self.nodes]

    def start(self) -> None:
        """Install node 1, bootstrap it, join the others, and wait until the cluster is ready."""
        begun = time.monotonic()
        if not PROVIDER.exists():
            raise GaleraError(f"the Galera provider {PROVIDER} is not installed (Debian: galera-4)")
        for program in ("rsync", "wsrep_sst_rsync"):
            _program(program)
        taken: set[int] = set()
        for node in self.nodes:
            node.workdir.mkdir(parents=True, exist_ok=True)
            node.datadir.mkdir(exist_ok=True)
            if os.geteuid() == 0:
                for path in (self.workdir, node.workdir, node.datadir):
                    shutil.chown(path, SERVER_ACCOUNT, SERVER_ACCOUNT)
            node.port, node.gcomm_port, node.ist_port, node.sst_port = (_distinct_port(taken) for _ in range(4))
        self._install(self.nodes[0])
        self._launch(self.nodes[0], bootstrap=True)
        for node in self.nodes[1:]:
            self._launch(node, bootstrap=False)  # one joiner at a time: one SST donor at a time
        self._wait_ready()
        self.started_in = time.monotonic() - begun

    def _install(self, node: GaleraNode) -> None:
        command = [
            _program("mariadb-install-db"),
            "--no-defaults",
            f"--datadir={node.datadir}",
            f"--user={_user()}",
            "--auth-root-authentication-method=normal",
            "--skip-test-db",
            "--innodb-log-file-size=16M",
            "--innodb-buffer-pool-size=64M",
        ]
        done = subprocess.run([c for c in command if c], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise GaleraError(f"mariadb-install-db exited with {done.returncode}: {done.stderr[-2000:]}")

    def _launch(self, node: GaleraNode, *, bootstrap: bool) -> None:
        members = ",".join(f"127.0.0.1:{other.gcomm_port}" for other in self.nodes)
        provider_options = ";".join(
            [
                f"base_port={node.gcomm_port}",
                f"gmcast.listen_addr=tcp://127.0.0.1:{node.gcomm_port}",
                f"ist.recv_addr=127.0.0.1:{node.ist_port}",
                "gcache.size=32M",
                "gcs.fc_limit=64",
                "evs.suspect_timeout=PT5S",
            ]
        )
        command = [
            _program("mariadbd"),
            "--no-defaults",
            f"--datadir={node.datadir}",
            f"--user={_user()}",
            "--bind-address=127.0.0.1",
            f"--port={node.port}",
            f"--socket={node.workdir / 'mariadbd.sock'}",
            f"--pid-file={node.workdir / 'mariadbd.pid'}",
            f"--log-error={node.error_log}",
            *NODE_OPTIONS,
            "--wsrep-on=ON",
            f"--wsrep-provider={PROVIDER}",
            f"--wsrep-cluster-name={CLUSTER_NAME}",
            f"--wsrep-cluster-address=gcomm://{members}",
            f"--wsrep-node-name=node{node.number}",
            f"--wsrep-node-address=127.0.0.1:{node.gcomm_port}",
            f"--wsrep-node-incoming-address=127.0.0.1:{node.port}",
            f"--wsrep-provider-options={provider_options}",
            "--wsrep-sst-method=rsync",
            f"--wsrep-sst-receive-address=127.0.0.1:{node.sst_port}",
            "--wsrep-slave-threads=2",
            *(["--wsrep-new-cluster"] if bootstrap else []),
        ]
        node.process = subprocess.Popen(
            [c for c in command if c], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
        )

        def ready() -> bool:
            if node.process is not None and (code := node.process.poll()) is not None:
                node.process = None
                raise GaleraError(f"node {node.number} exited with {code} during startup:\n{node.log_tail()}")
            return node.status("wsrep_ready") == "ON"

        wait_until(
            ready,
            f"node {node.number} to be ready",
            START_TIMEOUT,
            poll=POLL,
            failure=lambda message: GaleraError(f"{message}:\n{node.log_tail()}"),
        )

    def _wait_ready(self) -> None:
        def states() -> list[tuple[str | None, str | None]]:
            return [(node.status("wsrep_cluster_size"), node.status("wsrep_ready")) for node in self.nodes]

        def failure(message: str) -> GaleraError:
            tails = "\n".join(f"-- node {node.number}:\n{node.log_tail()}" for node in self.nodes)
            return GaleraError(f"{message}: {states()}\n{tails}")

        wait_until(
            lambda: all(size == str(len(self.nodes)) and ready == "ON" for size, ready in states()),
            "every node in the cluster and ready",
            READY_TIMEOUT,
            poll=POLL,
            failure=failure,
        )

    def close(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL after ``STOP_TIMEOUT``) and remove the directory.

        Joiners first, so the last node standing is the one that bootstrapped; nothing is kept.
        Also kills what a node left in its process group (the rsync of a state transfer).
        """
        for node in reversed(self.nodes):
            process, node.process = node.process, None
            if process is None:
                continue
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def kill(self, node: GaleraNode) -> None:
        """SIGKILL the node's ``mariadbd`` (no shutdown: a crash) and wait for it to exit."""
        process, node.process = node.process, None
        assert process is not None, f"node {node.number} is not running"
        process.kill()
        process.wait()

    def restart(self, node: GaleraNode) -> str:
        """Start a stopped node again and wait until it is ready; how it rejoined: "IST" or "SST".

        It joins the running members (no bootstrap) and receives what it missed from a donor:
        the write-sets from the donor's gcache (IST) when its position is known and still
        cached, else a copy of the donor's datadir (SST).
        """
        logged = node.error_log.stat().st_size if node.error_log.exists() else 0
        self._launch(node, bootstrap=False)
        self._wait_ready()
        with node.error_log.open(errors="replace") as log:
            log.seek(logged)
            text = log.read()
        return "SST" if "SST received" in text else "IST" if "IST received" in text else "neither (nothing missed)"

    def isolate(self, node: GaleraNode, isolated: bool) -> None:
        """Cut the node's group communication off (``gmcast.isolate``), or restore it.

        Cut off, the node keeps running and accepting connections but leaves the primary
        component: its queries fail with 1047 until it is restored and has caught up by IST.
        """
        connection = pymysql.connect(host="127.0.0.1", port=node.port, user="root")
        with contextlib.closing(connection):
            connection.cursor().execute(f"SET GLOBAL wsrep_provider_options='gmcast.isolate={int(isolated)}'")

    def wait_size(self, size: int, nodes: list[GaleraNode]) -> None:
        """Wait until each of ``nodes`` reports a primary component of ``size`` members."""
        wait_until(
            lambda: all(node.status("wsrep_cluster_size") == str(size) for node in nodes),
            f"a primary component of {size} nodes",
            READY_TIMEOUT,
            poll=POLL,
            failure=GaleraError,
        )

    def failover_dsn(self, database: str, first: int) -> str:
        """The DSN a replica beside node ``first`` (0-based) uses: that node, then the others in order."""
        order = self.nodes[first:] + self.nodes[:first]
        return f"mysql://root@/{database}?" + "&".join(f"host=127.0.0.1:{node.port}" for node in order)

    def create_database(self, name: str) -> list[str]:
        """Create database ``name`` (replicated to every node); its DSN on each node."""
        connection = pymysql.connect(host="127.0.0.1", port=self.nodes[0].port, user="root")
        with contextlib.closing(connection):
            connection.cursor().execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        return [f"{dsn}{name}" for dsn in self.dsns]

    def drop_database(self, name: str) -> None:
        """Drop database ``name`` on every node (if the cluster still answers)."""
        with contextlib.suppress(pymysql.err.OperationalError):
            connection = pymysql.connect(host="127.0.0.1", port=self.nodes[0].port, user="root")
            with contextlib.closing(connection):
                connection.cursor().execute(f"DROP DATABASE IF EXISTS `{name}`")


def _user() -> str:
    """The account the nodes run as: ``mysql`` when the tests run as root, else the caller.

    The rsync daemon of a state transfer drops root to ``nobody``, which may not write a
    root-owned datadir; as ``mysql`` (owning the cluster's directory) every step runs as one user.
    """
    return SERVER_ACCOUNT if os.geteuid() == 0 else getpass.getuser()


def _distinct_port(taken: set[int]) -> int:
    while True:
        port = _free_port()
        if port not in taken:
            taken.add(port)
            return port


@contextlib.contextmanager
def galera_cluster(parent: Path | None = None) -> Iterator[GaleraCluster]:
    """A started cluster, stopped and removed on exit (also when the start fails)."""
    cluster = GaleraCluster(Path(tempfile.mkdtemp(prefix="galera-", dir=parent)))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()
