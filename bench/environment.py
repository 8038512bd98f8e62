"""The machine, scratch databases and the statistics every section reports."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import platform
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from nexuscrm_runtime.database import create_engine, normalize_dsn
from nexuscrm_schema_catalog.migrations import apply_schema

DEFAULT_MYSQL_DSN = "mysql://root@127.0.0.1:3306/"
MYSQL_SETTINGS = (
    "innodb_flush_log_at_trx_commit",
    "innodb_buffer_pool_size",
    "innodb_doublewrite",
    "innodb_flush_method",
    "innodb_log_file_size",
    "sync_binlog",
    "log_bin",
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Backend:
    """A database backend to benchmark: ``mysql`` (a server DSN without database) or ``sqlite``."""

    name: str
    server_dsn: str = ""


def machine() -> dict[str, str]:
    """Cores, memory and Python of this machine."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "cores": str(os.cpu_count()),
        "memory": f"{memory:.0f} GiB",
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


def database_settings(backend: Backend) -> dict[str, str]:
    """The server version and the durability settings in force (recorded with every run)."""
    if backend.name == "sqlite":
        return {"version": f"SQLite {sqlite3.sqlite_version}", "journal": "WAL, synchronous=FULL"}
    engine = create_engine(str(normalize_dsn(backend.server_dsn).set(database=None)))
    try:
        with engine.connect() as connection:
            version = connection.exec_driver_sql("SELECT VERSION()").scalar_one()
            rows = connection.exec_driver_sql(
                "SHOW GLOBAL VARIABLES WHERE Variable_name IN (" + ", ".join(f"'{n}'" for n in MYSQL_SETTINGS) + ")"
            ).all()
    finally:
        engine.dispose()
    return {"version": str(version), **{str(name): str(value) for name, value in rows}}


@contextlib.contextmanager
def scratch_database(backend: Backend) -> Iterator[str]:
    """A fresh, uniquely named database at the newest schema; dropped (or deleted) afterwards."""
    if backend.name == "sqlite":
        with tempfile.TemporaryDirectory(prefix="nxbench-") as folder:
            dsn = f"sqlite:///{Path(folder) / 'bench.db'}"
            _migrate(dsn)
            yield dsn
        return
    name = f"nxbench_{uuid.uuid4().hex[:12]}"
    admin = create_engine(str(normalize_dsn(backend.server_dsn).set(database=None)))
    with admin.begin() as connection:
        connection.exec_driver_sql(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    try:
        dsn = normalize_dsn(backend.server_dsn).set(database=name).render_as_string(hide_password=False)
        _migrate(dsn)
        yield dsn
    finally:
        with admin.begin() as connection:
            connection.exec_driver_sql(f"DROP DATABASE IF EXISTS `{name}`")
        admin.dispose()


def _migrate(dsn: str) -> None:
    engine = create_engine(dsn)
    try:
        apply_schema(engine)
    finally:
        engine.dispose()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Timings:
    """Durations of repeated operations, in seconds."""

    samples: tuple[float, ...]

    @property
    def p50(self) -> float:
        """Median."""
        return statistics.median(self.samples)

    @property
    def p99(self) -> float:
        """99th percentile (nearest rank)."""
        ordered = sorted(self.samples)
        return ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]

    def describe(self) -> str:
        """``p50 x ms, p99 y ms (n=...)``."""
        return f"p50 {self.p50 * 1000:.1f} ms, p99 {self.p99 * 1000:.1f} ms (n={len(self.samples)})"


def timed(operations: Iterator[Callable[[], Any]]) -> Timings:
    """Run each operation and time it."""
    samples = []
    for operation in operations:
        started = time.perf_counter()
        operation()
        samples.append(time.perf_counter() - started)
    return Timings(samples=tuple(samples))


@dataclasses.dataclass(kw_only=True)
class Report:
    """What one run measured: rows of (section, backend, measure, value, target) and notes."""

    rows: list[tuple[str, str, str, str, str]] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    def add(self, section: str, backend: str, measure: str, value: str, target: str = "") -> None:
        """Record one figure (and print it, so long runs show progress)."""
        self.rows.append((section, backend, measure, value, target))
        print(f"  [{section} {backend}] {measure}: {value} {target}".rstrip(), flush=True)

    def markdown(self, header: dict[str, str]) -> str:
        """The run as a Markdown section, to copy into a pass of docs/performance-log.md."""
        lines = [f"- {key}: {value}" for key, value in header.items()]
        lines += ["", "| section | backend | measure | value | target |", "|---|---|---|---|---|"]
        lines += [f"| {' | '.join(row)} |" for row in self.rows]
        lines += [""] + [f"- {note}" for note in self.notes]
        return "\n".join(lines) + "\n"


def verdict(ok: bool) -> str:
    """The target column: met or missed."""
    return "met" if ok else "MISSED"
