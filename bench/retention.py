"""Section ``retention``: bytes per admitted input, steady-state size under a policy, pruner cost per row.

The Integration simulator's walking workload (400 lanes, bursts, demo contact-update payloads
of about 100 B, duplicates left out) is admitted in-process through ``Connectors.ingest``
and every generation completed (claims of 100, no Flow), in rounds of ``ROUND_INPUTS``
inputs. After the first round: the canonical tables' bytes per admitted input, without a
policy. Then a policy keeping the newest generation of each lane, pruned by
``Connectors.prune`` passes until nothing is left to let go: the seconds per pruned Event
(with its receipt) and per pruned generation, and the bytes after each round: the retained
rows stay about one generation per lane while only the compact tombstones grow.

Sizes on MariaDB are InnoDB's allocated data + index bytes per table after ``ANALYZE
TABLE`` (page granular; freed pages are reused by later rows, not returned to the file
system); on SQLite, the pages of each table and index (``dbstat``).
"""

from __future__ import annotations

import dataclasses
import time

import sqlalchemy as sa

from bench.environment import Backend, Report, scratch_database
from nexuscrm_connectors import retention
from nexuscrm_connectors.service import Connectors
from nexuscrm_runtime.database import create_engine, is_sqlite
from nexuscrm_schema.tables import Event, IngressReceipt, PrunedReceipt, PrunedWork, RetentionPolicy, WorkItem
from nexuscrm_tools.simulator import WorkloadConfig, workload
from tests.support.factories import install_pack

ROUND_INPUTS = 20_000  # quick: 4 000
ROUNDS = 3
TABLES = (Event, IngressReceipt, WorkItem, PrunedReceipt, PrunedWork, RetentionPolicy)
RETAINED = ("Event", "IngressReceipt", "WorkItem")


def table_bytes(engine: sa.Engine) -> dict[str, int]:
    """Bytes each canonical table of retention takes, indexes included."""
    names = [table.name for table in TABLES]
    with engine.begin() as connection:
        if is_sqlite(engine):
            rows = connection.exec_driver_sql(
                "SELECT coalesce(m.tbl_name, d.name), sum(d.pgsize) FROM dbstat d "
                "LEFT JOIN sqlite_master m ON m.name = d.name GROUP BY 1"
            ).all()
        else:
            connection.exec_driver_sql("ANALYZE TABLE " + ", ".join(f"`{name}`" for name in names))
            rows = connection.exec_driver_sql(
                "SELECT table_name, data_length + index_length FROM information_schema.tables "
                "WHERE table_schema = DATABASE()"
            ).all()
    sizes = {str(name): int(size or 0) for name, size in rows}
    return {name: sizes.get(name, 0) for name in names}


def _admit_and_complete(connectors: Connectors, pack: str, round_: int, inputs: int) -> None:
    config = WorkloadConfig(inputs=inputs, rate=0, duplicate_ratio=0, seed=round_)
    for batch in workload(config):  # the simulator's keys restart each run: prefix them with the round
        items = [dataclasses.replace(d.item, receipt_key=f"{round_}-{d.item.receipt_key}") for d in batch]
        connectors.ingest(pack, items=items)
        while claims := connectors.claim("bench", pack_install_ids=[pack], max_items=100):
            for claim in claims:
                connectors.complete(claim.work.work_id, lease_token=claim.lease_token)


def _prune_all(connectors: Connectors, pack: str) -> tuple[float, int, int]:
    """Sweep the pack's candidates (the background pass's keyset walk) until a sweep lets nothing go.

    Returns (seconds, generations, events); the seconds include the last, empty sweep.
    """
    seconds, generations, events = 0.0, 0, 0
    while True:
        swept, after = 0, None
        started = time.perf_counter()
        while True:
            report, after = retention.prune(connectors.engine, connectors.settings, connectors.clock, pack, after=after)
            swept += report.generations
            generations, events = generations + report.generations, events + report.events
            if after is None:
                break
        seconds += time.perf_counter() - started
        if not swept:
            return seconds, generations, events


def run(backend: Backend, report: Report, *, quick: bool) -> None:
    """Admit, measure, prune, measure; ``ROUNDS`` rounds under the policy."""
    per_round = 4_000 if quick else ROUND_INPUTS
    section = "retention"
    with scratch_database(backend) as dsn:
        engine = create_engine(dsn)
        try:
            connectors = Connectors(engine)
            pack = install_pack(engine)
            _admit_and_complete(connectors, pack, 1, per_round)
            before = table_bytes(engine)
            retained = sum(before[name] for name in RETAINED)
            report.add(
                section,
                backend.name,
                f"bytes per admitted input, no policy ({per_round} inputs)",
                f"{retained / per_round:.0f} B ({', '.join(f'{n} {before[n] / per_round:.0f}' for n in RETAINED)})",
            )
            connectors.set_retention_policy(pack, keep_generations=1, keep_seconds=None)
            for round_ in range(1, ROUNDS + 1):
                if round_ > 1:
                    _admit_and_complete(connectors, pack, round_, per_round)
                seconds, generations, events = _prune_all(connectors, pack)
                sizes = table_bytes(engine)
                kept = sum(sizes[name] for name in RETAINED)
                tombstones = sizes["PrunedReceipt"] + sizes["PrunedWork"]
                admitted = round_ * per_round
                report.add(
                    section,
                    backend.name,
                    f"after round {round_} ({admitted} inputs admitted), keep 1 generation per lane",
                    f"retained rows {kept / 2**20:.1f} MiB, tombstones {tombstones / 2**20:.1f} MiB "
                    f"({tombstones / admitted:.0f} B per admitted input)",
                )
                report.add(
                    section,
                    backend.name,
                    f"pruner cost, round {round_}",
                    f"{seconds * 1e6 / max(events, 1):.0f} us per Event+receipt, "
                    f"{seconds * 1e3 / max(generations, 1):.1f} ms per generation "
                    f"({generations} generations, {events} Events in {seconds:.1f} s)",
                )
        finally:
            engine.dispose()
