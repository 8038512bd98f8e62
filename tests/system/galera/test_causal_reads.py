"""Causal reads on Galera (issue 58 item 2, decision 187): the barrier waits for what the node has not applied.

Node 2's applier is held by ``FLUSH TABLES WITH READ LOCK`` (a Galera node so locked applies
nothing, while the cluster goes on committing through node 1). A row updated through node 1
is then read through node 2: a plain read answers the old value at once; a causal read waits
until the lock is released and answers the new one. Then the cost: the same read of the
queue counts (and the pack row a writer updates through node 1) through node 2, plain and causal
in turns: every causal read must see every write acknowledged before it started; the ratio of
their medians, and how many plain reads were behind, are printed and recorded (docs/galera.md,
"Causal reads").
"""

from __future__ import annotations

import statistics
import threading
import time

import pymysql
import pytest
import sqlalchemy as sa

from nexuscrm_connectors.queries import operator_reads as operator_reads_sql
from nexuscrm_runtime.causal import causal_read, is_galera
from nexuscrm_runtime.database import create_engine
from nexuscrm_schema.tables import PackInstall
from tests.support.factories import install_pack
from tests.system.reliability.conftest import record_figures

INVARIANTS_NOT_CHECKED = "updates one pack row's ordinal and reads queue counts; no generation is made"

pytestmark = [pytest.mark.slow]

HELD = 1.0  # seconds node 2's applier is held
READS = 300  # reads of each kind in the measurement


def _last_ordinal(connection: sa.Connection, pack: str) -> int:
    return int(
        connection.execute(sa.select(PackInstall.c.LastOrdinal).where(PackInstall.c.PackInstallId == pack)).scalar_one()
    )


def test_a_causal_read_waits_for_a_write_its_node_has_not_applied(node_dsns: list[str]) -> None:
    first, second = create_engine(node_dsns[0]), create_engine(node_dsns[1])
    node2 = sa.make_url(node_dsns[1])
    lock = pymysql.connect(host=node2.host, port=node2.port, user="root")
    try:
        pack = install_pack(first)
        with second.connect() as connection:
            assert is_galera(connection) is True
            assert _last_ordinal(connection, pack) == 0  # node 2 has the pack row
        lock.cursor().execute("FLUSH TABLES WITH READ LOCK")
        with first.begin() as connection:
            connection.execute(sa.update(PackInstall).where(PackInstall.c.PackInstallId == pack).values(LastOrdinal=7))
        with second.connect() as connection:
            assert _last_ordinal(connection, pack) == 0, "node 2 applied the write although its applier was held"
        released = threading.Timer(HELD, lambda: lock.cursor().execute("UNLOCK TABLES"))
        started = time.monotonic()
        released.start()
        with second.connect() as connection:
            seen = _last_ordinal(causal_read(connection), pack)
        waited = time.monotonic() - started
        released.join()
        assert seen == 7
        assert waited >= HELD * 0.9, f"the causal read answered after {waited:.2f}s, before the applier was released"
    finally:
        lock.close()
        first.dispose()
        second.dispose()


def test_what_a_causal_read_costs_on_galera(node_dsns: list[str]) -> None:
    first, second = create_engine(node_dsns[0]), create_engine(node_dsns[1])
    stop = threading.Event()
    pack = install_pack(first)
    acknowledged = [0]  # the writer's last committed LastOrdinal

    def write() -> None:  # a steady stream of write sets for node 2 to apply
        while not stop.is_set():
            with first.begin() as connection:
                connection.execute(
                    sa.update(PackInstall)
                    .where(PackInstall.c.PackInstallId == pack)
                    .values(LastOrdinal=PackInstall.c.LastOrdinal + 1)
                )
            acknowledged[0] += 1

    def timed(causal: bool) -> tuple[float, bool]:
        """How long the read took, and whether it saw every write acknowledged before it started."""
        before = acknowledged[0]
        started = time.perf_counter()
        with second.connect() as connection:
            if causal:
                causal_read(connection)
            seen = _last_ordinal(connection, pack)
            operator_reads_sql.work_queue_counts(connection, pack)
        return time.perf_counter() - started, seen >= before

    writer = threading.Thread(target=write)
    writer.start()
    try:
        plain: list[tuple[float, bool]] = []
        causal: list[tuple[float, bool]] = []
        for _ in range(READS):  # in turns, so both kinds see the same load
            plain.append(timed(False))
            causal.append(timed(True))
    finally:
        stop.set()
        writer.join()
        first.dispose()
        second.dispose()
    plain_times, causal_times = [t for t, _ in plain], [t for t, _ in causal]
    figures = {
        "reads": READS,
        "writes": acknowledged[0],
        "plain_median_ms": round(statistics.median(plain_times) * 1000, 3),
        "causal_median_ms": round(statistics.median(causal_times) * 1000, 3),
        "plain_p99_ms": round(statistics.quantiles(plain_times, n=100)[98] * 1000, 3),
        "causal_p99_ms": round(statistics.quantiles(causal_times, n=100)[98] * 1000, 3),
        "ratio_median": round(statistics.median(causal_times) / statistics.median(plain_times), 2),
        "plain_reads_behind": sum(1 for _, fresh in plain if not fresh),
        "causal_reads_behind": sum(1 for _, fresh in causal if not fresh),
    }
    record_figures("galera-causal-read-cost", figures)
    assert figures["causal_reads_behind"] == 0
