"""Per-generation idempotence for a Flow's read model: each input applied once, however often it runs.

A generation can run more than once: a retry after a failed attempt, or a worker whose lease
expired while its writes were committing. A Flow stays correct when it writes its read model
and a ledger of the inputs it applied **in one transaction of its own database**, skipping
inputs the ledger already holds. ``AppliedInputs`` is that ledger: a table (the name is the
Flow's) keyed by pack and ordinal, with the WorkId that applied each input, the input's source
time and the commit time (their difference is the end-to-end lag)::

    metadata = sa.MetaData()
    applied = AppliedInputs("MyFlowApplied", metadata)

    def my_flow(context: FlowContext) -> Flow:
        engine = sa.create_engine(context.settings["database"])
        metadata.create_all(engine)

        def project(generation: Generation) -> None:
            inputs = list(generation.inputs)  # read the whole set before writing
            applied.apply(engine, generation.work, inputs, write_read_model)

        return project

``write_read_model(connection, fresh)`` gets only the inputs not applied before, in ordinal
order, on the transaction's connection. ``apply`` opens the transaction; a Flow that runs its
own (to retry conflicts, say) calls ``fresh`` and ``record`` inside it instead.

Needs SQLAlchemy (``pip install sqlalchemy``), imported when a ledger is made: the rest of the
SDK does not.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

from workqueue.limits import PACK_ID_LENGTH, WORK_ID_LENGTH
from workqueue.values import InputRow, WorkItemRow

if TYPE_CHECKING:
    import sqlalchemy as sa
    from sqlalchemy.engine import Connection, Engine

__all__ = ["AppliedInputs"]

IN_CHUNK = 500  # ordinals per IN list: bounded statements on every backend


class AppliedInputs:
    """The ledger table ``name`` in ``metadata``: which inputs of which pack a Flow applied.

    ``fresh`` and ``record`` must run in the transaction that writes the read model, so that
    the ledger and the read model commit together or not at all. Recording an ordinal twice
    violates the primary key: two concurrent runs of one generation cannot both commit.
    """

    def __init__(self, name: str, metadata: sa.MetaData) -> None:
        import sqlalchemy as sa

        mysql_options: dict[str, Any] = {
            "mysql_engine": "InnoDB",
            "mysql_charset": "utf8mb4",
            "mysql_collate": "utf8mb4_bin",
        }
        self.table = sa.Table(
            name,
            metadata,
            sa.Column("PackInstallId", sa.String(PACK_ID_LENGTH), primary_key=True),
            sa.Column("EnqueueOrdinal", sa.BigInteger, primary_key=True, autoincrement=False),
            sa.Column("WorkId", sa.String(WORK_ID_LENGTH), nullable=False),
            sa.Column("SourceTime", sa.Float(precision=53), nullable=True),  # the input's source time, epoch seconds
            sa.Column("AppliedAt", sa.Float(precision=53), nullable=False),  # commit time, epoch seconds
            **mysql_options,
        )

    def fresh(self, connection: Connection, pack_install_id: str, inputs: Iterable[InputRow]) -> list[InputRow]:
        """The inputs of ``pack_install_id`` among ``inputs`` not applied yet, in the order given."""
        rows = list(inputs)
        ordinals = sorted({row.enqueue_ordinal for row in rows})
        done: set[int] = set()
        for start in range(0, len(ordinals), IN_CHUNK):
            chunk = ordinals[start : start + IN_CHUNK]
            done.update(connection.execute(self._ordinals(pack_install_id).where(self._ordinal.in_(chunk))).scalars())
        return [row for row in rows if row.enqueue_ordinal not in done]

    def record(self, connection: Connection, work: WorkItemRow, inputs: Sequence[InputRow]) -> None:
        """Record ``inputs`` as applied by generation ``work``, now."""
        import sqlalchemy as sa

        if not inputs:
            return
        now = time.time()
        rows = [
            {
                "PackInstallId": work.pack_install_id,
                "EnqueueOrdinal": row.enqueue_ordinal,
                "WorkId": work.work_id,
                "SourceTime": row.source_time.timestamp() if row.source_time is not None else None,
                "AppliedAt": now,
            }
            for row in inputs
        ]
        connection.execute(sa.insert(self.table), rows)

    def apply(
        self,
        engine: Engine,
        work: WorkItemRow,
        inputs: Iterable[InputRow],
        write: Callable[[Connection, list[InputRow]], Any],
    ) -> int:
        """In one transaction: ``write`` the inputs not applied yet, record them; return how many.

        ``write`` is not called when every input was applied before. An exception from it
        rolls back the transaction (the attempt fails and Connectors retries it).
        """
        with engine.begin() as connection:
            fresh = self.fresh(connection, work.pack_install_id, inputs)
            if fresh:
                write(connection, fresh)
                self.record(connection, work, fresh)
            return len(fresh)

    def applied(self, connection: Connection, pack_install_id: str) -> set[int]:
        """Every ordinal of the pack applied so far (for checks and tests)."""
        return set(connection.execute(self._ordinals(pack_install_id)).scalars())

    def lags(self, connection: Connection, pack_install_id: str) -> list[float]:
        """Seconds from source time to commit of every applied input of the pack that had a source time."""
        lag = self.table.c.AppliedAt - self.table.c.SourceTime
        statement = self._select(lag, pack_install_id).where(self.table.c.SourceTime.is_not(None))
        return [float(value) for value in connection.execute(statement).scalars()]

    @property
    def _ordinal(self) -> Any:
        return self.table.c.EnqueueOrdinal

    def _ordinals(self, pack_install_id: str) -> Any:
        return self._select(self._ordinal, pack_install_id)

    def _select(self, column: Any, pack_install_id: str) -> Any:
        import sqlalchemy as sa

        return sa.select(column).where(self.table.c.PackInstallId == pack_install_id)
