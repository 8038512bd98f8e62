"""Time as the database keeps it: one clock, the database's, shared by every replica (decision 118).

Every instant that is stored or that decides ownership or eligibility (lease expiry and
reclaim, heartbeat extension, ClaimableAt, fence and override expiry, lag) is the database's
time, read by the statement that needs it: ``DatabaseClock.now()`` is SQL, never a value of
the process that handles the call. Durations (lease length, backoff) stay configuration.
Stored times are naive UTC datetimes with microseconds.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any, overload

import sqlalchemy as sa
from sqlalchemy.engine import Connection
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.functions import FunctionElement

# A dialect flag set by ``database.create_engine`` on the first connection to a TiDB server.
TIDB_DIALECT_FLAG = "nexuscrm_tidb"
# SQLite's ``%f`` is seconds with milliseconds; three zeros make the stored six-digit form.
_SQLITE_NOW = "strftime('%Y-%m-%d %H:%M:%f000', 'now'"


class _DatabaseNow(FunctionElement[dt.datetime]):
    """The server's current UTC time plus an offset in microseconds (zero outside tests)."""

    type = sa.DateTime()
    inherit_cache = True
    name = "database_now"


@compiles(_DatabaseNow, "mysql")
@compiles(_DatabaseNow, "mariadb")
def _mysql_now(element: _DatabaseNow, compiler: SQLCompiler, **kw: Any) -> str:
    if getattr(compiler.dialect, TIDB_DIALECT_FLAG, False):
        # TiDB: the transaction's start timestamp from PD's TSO (one clock for every SQL node),
        # whose upper 46 bits are milliseconds since the epoch: arithmetic, no time zone. It is 0
        # outside an active transaction; that statement falls back to the SQL node's own clock.
        now = (
            "IF(@@tidb_current_ts = 0, UTC_TIMESTAMP(6), "
            "TIMESTAMPADD(MICROSECOND, (@@tidb_current_ts >> 18) * 1000, '1970-01-01 00:00:00.000000'))"
        )
    else:
        now = "UTC_TIMESTAMP(6)"
    return f"({now} + INTERVAL {compiler.process(element.clauses, **kw)} MICROSECOND)"


@compiles(_DatabaseNow, "sqlite")
def _sqlite_now(element: _DatabaseNow, compiler: SQLCompiler, **kw: Any) -> str:
    offset = compiler.process(element.clauses, **kw)
    return f"{_SQLITE_NOW}, ({offset} / 1000000.0) || ' seconds')"


# The bound parameter holding the clock's offset in a statement built once (``NOW_PARAMETER``).
OFFSET_PARAMETER = "clock_offset_us"
# ``DatabaseClock.now()`` for statements built once and cached: the offset is a parameter that
# ``DatabaseClock.parameters()`` supplies, so one statement serves every clock.
NOW_PARAMETER: sa.ColumnElement[dt.datetime] = _DatabaseNow(sa.bindparam(OFFSET_PARAMETER, type_=sa.BigInteger()))


def now_parameter_shifted(shift: dt.timedelta) -> sa.ColumnElement[dt.datetime]:
    """``NOW_PARAMETER`` moved by ``shift`` (a window's start, say), with the same parameter."""
    microseconds = shift // dt.timedelta(microseconds=1)
    return _DatabaseNow(sa.bindparam(OFFSET_PARAMETER, type_=sa.BigInteger()) + microseconds)


@dataclasses.dataclass
class DatabaseClock:
    """The database's clock, as SQL that the server evaluates in the statement holding it.

    ``offset`` shifts it: zero in production (``DATABASE_CLOCK``); tests move it (a
    database-side offset, so every decision is still taken by the database, with the
    database's time).
    """

    offset: dt.timedelta = dt.timedelta(0)

    def now(self) -> sa.ColumnElement[dt.datetime]:
        """The database's current UTC time, as a SQL expression (naive UTC when read)."""
        return _DatabaseNow(sa.literal(self.offset // dt.timedelta(microseconds=1), sa.BigInteger()))

    def parameters(self) -> dict[str, int]:
        """The parameter a statement holding ``NOW_PARAMETER`` needs: this clock's offset."""
        return {OFFSET_PARAMETER: self.offset // dt.timedelta(microseconds=1)}

    def read(self, connection: Connection) -> dt.datetime:
        """The database's current UTC time, read in its own statement.

        For paths with no deciding statement to carry ``now()``; the hot paths (Ingest,
        Claim, Heartbeat, Complete, Fail) read it in a statement they run anyway.
        """
        value: dt.datetime = connection.execute(sa.select(self.now())).scalar_one()
        return value


# The clock of every service: the database's own time, unshifted.
DATABASE_CLOCK = DatabaseClock()


def utcnow() -> dt.datetime:
    """The current UTC time of this process as a naive datetime: for logs and waits, never for a decision."""
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)


@overload
def iso_utc(value: dt.datetime) -> str: ...
@overload
def iso_utc(value: None) -> None: ...
@overload
def iso_utc(value: dt.datetime | None) -> str | None: ...
def iso_utc(value: dt.datetime | None) -> str | None:
    """A time as every operator surface prints it: ``2024-05-01T12:00:00.250Z`` (None stays None).

    RFC 3339 in UTC with ``Z``, always to the millisecond (truncated, never rounded up): the
    one format of the command lines, their JSON, the dashboard and the services' messages
    (docs/output-conventions.md, decision 179). Naive values are UTC (the stored form); aware
    ones are converted to UTC first.
    """
    if value is None:
        return None
    if value.tzinfo is not None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return value.isoformat(timespec="milliseconds") + "Z"
