"""The Flow of the "peer" section's own side: a per-lane sum, loaded by the Integration host.

The host resolves ``bench.laneflow:lane_sum_flow`` like any ``module:function`` Flow reference
(``nexuscrm_sdk.flows.resolve_flow``), so this module imports only what a Flow author has: the
Connectors SDK, ``workqueue``, the runtime and SQLAlchemy (never ``bench``'s other modules,
which pull in procrastinate and the services' launcher).

The Flow folds a generation's inputs into ``BenchLaneSum`` (per pack and source lane: the sum
of the inputs' values, how many there were, the newest ordinal folded in) and records every
folded input in ``BenchLaneApplied`` with the source's send time and the fold's time (the
end-to-end lag of goal 5, and the counterpart of the peer marking its events processed). Both
writes share one transaction. Generations of one lane run one at a time in ordinal order
(invariant X), so skipping inputs at or below ``LastOrdinal`` makes a re-run of a generation
(a retry after a lost lease) change nothing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from nexuscrm_runtime.database import run_transaction
from nexuscrm_schema.tables import MYSQL_TABLE_OPTIONS, PACK_ID_LENGTH
from nexuscrm_sdk.flows import Flow, FlowContext, Generation
from workqueue.identity import FIELD_MAX_LENGTHS, decode_projection_key

FLOW_REFERENCE = "bench.laneflow:lane_sum_flow"  # how the host's pool configuration names this Flow

metadata = sa.MetaData()

BenchLaneSum = sa.Table(
    "BenchLaneSum",
    metadata,
    sa.Column("PackInstallId", sa.String(PACK_ID_LENGTH), primary_key=True),
    sa.Column("SourceLane", sa.String(FIELD_MAX_LENGTHS["source_lane"]), primary_key=True),
    sa.Column("Total", sa.BigInteger, nullable=False),  # sum of the folded inputs' values
    sa.Column("Inputs", sa.Integer, nullable=False),  # inputs folded in
    sa.Column("LastOrdinal", sa.BigInteger, nullable=False),  # newest input folded in: the re-run guard
    **MYSQL_TABLE_OPTIONS,
)

BenchLaneApplied = sa.Table(
    "BenchLaneApplied",
    metadata,
    sa.Column("PackInstallId", sa.String(PACK_ID_LENGTH), primary_key=True),
    sa.Column("EnqueueOrdinal", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("SentAt", sa.Float(precision=53), nullable=False),  # the source's send time, epoch seconds
    sa.Column("AppliedAt", sa.Float(precision=53), nullable=False),  # the fold's time, epoch seconds
    **MYSQL_TABLE_OPTIONS,
)


def input_value(receipt_key: str) -> int:
    """The value a delivery contributes to its lane's sum: its receipt number (``r-00000042`` -> 42).

    The simulator numbers fresh deliveries, so a lost or doubled input changes the sum.
    """
    return int(receipt_key.removeprefix("r-"))


def sent_at(payload: bytes) -> float:
    """The simulator's send time of a delivery (the ``sent_at`` of its JSON payload), epoch seconds."""
    return float(json.loads(payload)["sent_at"])


# The fold's statements, built once with bind parameters, as a Flow author would who measured
# it (docs/performance-log.md, "Eighteenth pass").
_LANE = (BenchLaneSum.c.PackInstallId == sa.bindparam("pack"), BenchLaneSum.c.SourceLane == sa.bindparam("lane"))
_LANE_SUM_GET = (
    sa.select(BenchLaneSum.c.Total, BenchLaneSum.c.Inputs, BenchLaneSum.c.LastOrdinal).where(*_LANE).with_for_update()
)
_LANE_SUM_INSERT = sa.insert(BenchLaneSum).values(PackInstallId=sa.bindparam("pack"), SourceLane=sa.bindparam("lane"))
_LANE_SUM_UPDATE = (
    sa.update(BenchLaneSum)
    .where(*_LANE, BenchLaneSum.c.LastOrdinal == sa.bindparam("last"))
    .values(
        Total=sa.bindparam("total"),
        Inputs=sa.bindparam("inputs"),
        LastOrdinal=sa.bindparam("new_last"),
    )
)
_APPLIED_INSERT = sa.insert(BenchLaneApplied)


def lane_sum_get(connection: Connection, pack_install_id: str, lane: str) -> Any:
    """The lane's sum row, locked until the transaction ends (None before its first fold)."""
    return connection.execute(_LANE_SUM_GET, {"pack": pack_install_id, "lane": lane}).first()


def apply_inputs(
    connection: Connection, pack_install_id: str, lane: str, inputs: Sequence[tuple[int, int, float]]
) -> int:
    """Fold (ordinal, value, sent_at) inputs, in ordinal order, into the lane's sum; return how many were new."""
    current = lane_sum_get(connection, pack_install_id, lane)
    last = current.LastOrdinal if current is not None else 0
    fresh = [row for row in inputs if row[0] > last]
    if not fresh:
        return 0
    total = sum(value for _, value, _ in fresh) + (current.Total if current is not None else 0)
    count = len(fresh) + (current.Inputs if current is not None else 0)
    if current is None:
        connection.execute(
            _LANE_SUM_INSERT,
            {"pack": pack_install_id, "lane": lane, "Total": total, "Inputs": count, "LastOrdinal": fresh[-1][0]},
        )
    else:
        updated = connection.execute(
            _LANE_SUM_UPDATE,
            {
                "pack": pack_install_id,
                "lane": lane,
                "last": last,
                "total": total,
                "inputs": count,
                "new_last": fresh[-1][0],
            },
        )
        if updated.rowcount != 1:
            raise RuntimeError(f"lane {lane} changed under its row lock")
    now = time.time()
    connection.execute(
        _APPLIED_INSERT,
        [
            {"PackInstallId": pack_install_id, "EnqueueOrdinal": ordinal, "SentAt": sent, "AppliedAt": now}
            for ordinal, _, sent in fresh
        ],
    )
    return len(fresh)


def lane_sum_flow(context: FlowContext) -> Flow:
    """Flow factory (``bench.laneflow:lane_sum_flow``): creates the tables, returns the Flow.

    The Flow reads the generation's whole member set first (the stream must not hold the
    database's write lock, which matters on SQLite), then folds it in one retried transaction.
    """
    engine = context.engine
    metadata.create_all(engine, checkfirst=True)

    def fold(generation: Generation) -> None:
        lane = decode_projection_key(generation.work.projection_key).source_lane
        inputs = [
            (row.enqueue_ordinal, input_value(row.receipt_key or ""), sent_at(row.payload))
            for row in generation.inputs
            if not row.is_replay
        ]
        pack = generation.work.pack_install_id
        run_transaction(engine, lambda connection: apply_inputs(connection, pack, lane, inputs), name="bench lane sum")

    return fold
