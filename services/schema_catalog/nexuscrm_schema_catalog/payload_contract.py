"""The payload contract of schema v10 (decision 130): the one-way flag, and the operator's payload move.

Until the flag is set, Connectors writes each admitted payload into Event.Payload as well as
EventPayload, and a status change keeps it, so a v7 Connectors (which reads Event.Payload
only) may serve the same database during a rolling update. ``ApplySchema`` sets it on an
empty database (no release older than v10 can have served it); on an upgraded one the
operator sets it after the roll (``nexuscrm schema contract-payloads``, the ContractPayloads
RPC). Once set, it is never unset, and the same command moves every payload still held in
Event.Payload into EventPayload only (``payload_move``, decision 150): payloads of Events
admitted before schema v8, which applying the schema leaves where they are, and the copies
of the dual write. A dry run counts what it would move and changes nothing, the flag
included.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from nexuscrm_runtime.clock import DATABASE_CLOCK
from nexuscrm_schema.tables import PAYLOAD_CONTRACT, PayloadContract
from nexuscrm_schema.verification import current_version
from nexuscrm_schema_catalog import payload_move
from nexuscrm_schema_catalog.payload_move import Batch, Pending
from workqueue.errors import DomainError

CONTRACT_VERSION = 10  # the schema version that holds the flag
_CONTRACT_ROW = sa.select(PayloadContract.c.SetAt, PayloadContract.c.SetBy).where(
    PayloadContract.c.Contract == PAYLOAD_CONTRACT
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ContractState:
    """When and by what the flag was set, and whether this call set it."""

    set_at: dt.datetime
    set_by: str
    newly_set: bool


def set_contract(connection: Connection, set_by: str) -> ContractState:
    """Set the flag unless it is set (idempotent: a second call changes nothing and reports the first)."""
    newly_set = False
    if connection.execute(_CONTRACT_ROW).first() is None:
        try:
            with connection.begin_nested():
                connection.execute(
                    sa.insert(PayloadContract).values(
                        Contract=PAYLOAD_CONTRACT, SetAt=DATABASE_CLOCK.now(), SetBy=set_by
                    )
                )
            newly_set = True
        except sa.exc.IntegrityError:
            pass  # a concurrent setter's row is there: report it
    found = connection.execute(_CONTRACT_ROW).one()
    return ContractState(set_at=found.SetAt, set_by=found.SetBy, newly_set=newly_set)


def contract_payloads(
    engine: Engine, set_by: str, *, start: tuple[str, int], max_batches: int
) -> tuple[ContractState, list[Batch], bool]:
    """Set the flag, then move at most ``max_batches`` batches of payloads from (pack, ordinal) ``start``.

    Returns the flag's state, the batches moved, and whether none is left after them.
    Refuses (FAILED_PRECONDITION, nothing changed) a database older than schema v10. A
    restarted pass may start anywhere: a batch only changes Events still to move.
    """
    with engine.begin() as connection:
        _require_contract_schema(connection)
        state = set_contract(connection, set_by)
    moves = payload_move.move_batches(engine, start)
    batches = list(itertools.islice(moves, max_batches))  # never starts a batch past the last
    return state, batches, len(batches) < max_batches  # a full set may have been the last: the next call says


def count_moves(engine: Engine) -> tuple[ContractState | None, Pending]:
    """A dry run: the flag's state (None while unset) and what a move would change now; changes nothing.

    Refuses a database older than schema v10 as ``contract_payloads`` does.
    """
    with engine.connect() as connection:
        _require_contract_schema(connection)
        found = connection.execute(_CONTRACT_ROW).first()
        state = None if found is None else ContractState(set_at=found.SetAt, set_by=found.SetBy, newly_set=False)
        return state, payload_move.pending(connection)


def _require_contract_schema(connection: Connection) -> None:
    version = current_version(connection)
    if version < CONTRACT_VERSION:
        raise DomainError(
            f"the payload contract needs schema v{CONTRACT_VERSION}; the database is at v{version}: "
            "apply the schema first (ApplySchema)"
        )
