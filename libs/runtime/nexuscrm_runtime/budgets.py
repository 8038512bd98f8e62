"""Byte budgets that keep every row, transaction and page within TiDB's limits (decision 122).

TiDB refuses a row above ``txn-entry-size-limit`` (6 MiB by default, error 8025) and a
transaction above ``txn-total-size-limit`` (100 MiB by default, error 8004); a client refuses
a gRPC message above 4 MiB by default. The services bound what they write and send by these
budgets, in bytes as well as in rows, so the engine's limits are never what stops them
(``engine_errors`` names the limit when a server is configured below them).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")

MIB = 1024 * 1024  # bytes
# The largest payload a row may carry: TiDB's 6 MiB entry limit less 64 KiB for the rest of an
# EventPayload, Event or receipt row (keys, digest, times: a few KiB at most).
MAX_ENTRY_PAYLOAD_BYTES = 6 * MIB - 64 * 1024
# The most payload one transaction may write: a quarter of TiDB's 100 MiB transaction limit. An
# admission writes each payload once (its EventPayload row, or its stored receipt) beside index entries
# and small rows; the rest is headroom for them and for a server configured lower.
MAX_TRANSACTION_BYTES = 25 * MIB


def within_bytes(sized: Sequence[tuple[T, int]], budget: int) -> list[T]:
    """The longest prefix of ``sized`` (item, bytes) whose bytes fit in ``budget``; at least the first item.

    At least one: an item larger than the budget on its own still goes, alone, so a budget
    never blocks progress (every item already fits its own, stricter, per-item limit).
    """
    taken: list[T] = []
    total = 0
    for item, size in sized:
        total += size
        if taken and total > budget:
            break
        taken.append(item)
    return taken
