"""Section ``retention``: bytes per admitted input, steady-state size under a policy, pruner cost per row.

The Integration simulator's walking workload (400 lanes, bursts, demo contact-update payloads
of about 100 B, duplicates left out) is admitted in-process through ``Connectors.ingest``
and every generation completed (claims of 100, no Flow), in rounds of ``ROUND_INPUTS``
inputs. After the first round: the canonical tables' bytes per admitted input, without a
policy. Then a policy keeping the newest generation of each lane, pruned by
``Connectors.prune`` passes until nothing is left to let go: the seconds per pruned Event
(with its receipt) and per pruned generation, and the bytes after each round: the retained
rows stay about one generation per lane while only the compact tombstones grow. Then the same
rounds again with a duplicate window of one round (decision 127): the database clock moves
on by the window between rounds (and the inputs' source times with it), so each prune also
expires the tombstones of the rounds before: the tombstones stay about one round's worth.

Sizes on MariaDB are InnoDB's allocated data + index bytes per table after ``ANALYZE
TABLE`` (page granular; freed pages are reused by later rows, not returned to the file
system); on SQLite, the pages of each table and index (``dbstat``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import time

import sqlalchemy as sa

from bench.environment import Backend, Report, scratch_database
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.operating import retention
from nexuscrm_runtime.database import create_engine, is_sqlite
from nexuscrm_schema.tables import Event, IngressReceipt, PrunedReceipt, PrunedWork, RetentionPolicy, WorkItem
from nexuscrm_tools.simulator import WorkloadConfig, workload
from tests.support.factories import FakeClock, install_pack

ROUND_INPUTS = 20_000  # quick: 4 000
ROUNDS = 3
WINDOW = dt.timedelta(hours=1)  # the database clock moves on by this much (and a second) between rounds
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


def _admit_and_complete(connectors: Connectors, pack: str, round_: int, inputs: int, shift: dt.timedelta) -> None:
    """Admit and complete one round; source times move with the database clock's ``shift`` (``FakeClock``)."""
    config = WorkloadConfig(inputs=inputs, rate=0, duplicate_ratio=0, seed=round_)
    for batch in workload(config):  # the simulator's keys restart each run: prefix them with the round
        items = [
            dataclasses.replace(
                d.item,
                receipt_key=f"{round_}-{d.item.receipt_key}",
                source_time=d.item.source_time + shift if d.item.source_time is not None else None,
            )
            for d in batch
        ]
        connectors.ingest(pack, items=items)
        while claims := connectors.claim("bench", pack_install_ids=[pack], max_items=100):
            for claim in claims:
                connectors.complete(claim.work.work_id, lease_token=claim.lease_token)


@dataclasses.dataclass
class _Swept:
    seconds: float = 0.0
    generations: int = 0
    events: int = 0
    expired: int = 0


def _prune_all(connectors: Connectors, pack: str) -> _Swept:
    """Sweep the pack's candidates (the background pass's keyset walk) until a sweep lets nothing go.

    The seconds include the last, empty sweep, and the expiry of tombstones the window lets go.
    """
    total = _Swept()
    while True:
        swept, after = 0, None
        started = time.perf_counter()
        while True:
            report, after = retention.prune(connectors.context, pack, after=after)
            swept += report.generations + report.expired_receipts
            total.generations += report.generations
            total.events += report.events
            total.expired += report.expired_receipts
            if after is None:
                break
        total.seconds += time.perf_counter() - started
        if not swept:
            return total


def run(backend: Backend, report: Report, *, quick: bool) -> None:
    """Admit, measure, prune, measure; ``ROUNDS`` rounds under the policy, without and with a duplicate window."""
    per_round = 4_000 if quick else ROUND_INPUTS
    section = "retention"
    for window in (None, WINDOW):
        with scratch_database(backend) as dsn:
            engine = create_engine(dsn)
            try:
                clock = FakeClock()
                connectors = Connectors(engine, clock=clock)
                pack = install_pack(engine)
                _admit_and_complete(connectors, pack, 1, per_round, clock.offset)
                if window is None:
                    before = table_bytes(engine)
                    retained = sum(before[name] for name in RETAINED)
                    report.add(
                        section,
                        backend.name,
                        f"bytes per admitted input, no policy ({per_round} inputs)",
                        f"{retained / per_round:.0f} B "
                        f"({', '.join(f'{n} {before[n] / per_round:.0f}' for n in RETAINED)})",
                    )
                seconds = None if window is None else int(window.total_seconds())
                connectors.set_retention_policy(
                    pack, keep_generations=1, keep_seconds=None, duplicate_window_seconds=seconds
                )
                policy = "keep 1 generation per lane" + ("" if window is None else ", duplicate window 1 round")
                for round_ in range(1, ROUNDS + 1):
                    if round_ > 1:
                        if window is not None:  # a round later: the rounds before it fall out of the window
                            clock.advance(window.total_seconds() + 1)
                        _admit_and_complete(connectors, pack, round_, per_round, clock.offset)
                    swept = _prune_all(connectors, pack)
                    _report_round(report, backend, section, policy, round_, round_ * per_round, engine, swept)
            finally:
                engine.dispose()


def _report_round(
    report: Report,
    backend: Backend,
    section: str,
    policy: str,
    round_: int,
    admitted: int,
    engine: sa.Engine,
    swept: _Swept,
) -> None:
    sizes = table_bytes(engine)
    kept = sum(sizes[name] for name in RETAINED)
    tombstones = sizes["PrunedReceipt"] + sizes["PrunedWork"]
    report.add(
        section,
        backend.name,
        f"after round {round_} ({admitted} inputs admitted), {policy}",
        f"retained rows {kept / 2**20:.1f} MiB, tombstones {tombstones / 2**20:.1f} MiB "
        f"({tombstones / admitted:.0f} B per admitted input)",
    )
    expired = f", {swept.expired} tombstones expired" if swept.expired else ""
    report.add(
        section,
        backend.name,
        f"pruner cost, round {round_}, {policy}",
        f"{swept.seconds * 1e6 / max(swept.events, 1):.0f} us per Event+receipt, "
        f"{swept.seconds * 1e3 / max(swept.generations, 1):.1f} ms per generation "
        f"({swept.generations} generations, {swept.events} Events{expired} in {swept.seconds:.1f} s)",
    )
