"""Capture the SQL an engine sends: proof of which statements an operation ran (never timed).

The only place in tests/ and bench/ that listens to the engine's cursor-execute events
(``tests/architecture/test_statement_capture.py`` keeps it so): every statement-count test sees
``executemany`` the same way, so a multi-row statement turned into one statement per row fails it.

Round trips: what the server executes for each captured call, as PyMySQL (the driver of every
MySQL-protocol backend here) sends it.

- ``cursor.execute()``: one. SQLAlchemy's "insertmanyvalues" batches (an INSERT with RETURNING
  over many rows) reach the driver this way, one multi-row INSERT per batch, and count one each.
- ``cursor.executemany()`` of an ``INSERT``/``REPLACE ... VALUES (...)`` that PyMySQL's own
  ``RE_INSERT_VALUES`` matches: one, PyMySQL rewrites it into a single multi-row INSERT (it
  splits one beyond ``max_stmt_length``, 1 MB, which no captured batch reaches).
- any other ``cursor.executemany()``: one per parameter set, PyMySQL loops over ``execute()``.

On SQLite the same rule is applied to the statement with its ``?`` placeholders read as ``%s``,
so a count means the same on every backend (sqlite3 itself steps the statement once per row).
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import sqlalchemy as sa
from pymysql.cursors import RE_INSERT_VALUES
from sqlalchemy import event
from sqlalchemy.engine.interfaces import ExecuteStyle

COMMIT = "COMMIT"


@dataclasses.dataclass(frozen=True)
class Captured:
    """One DBAPI call: its statement and parameters, whether it was an executemany, what it costs."""

    statement: str
    parameters: Any  # one parameter set, or for an executemany the sequence of them
    executemany: bool  # sent through ``cursor.executemany()``
    parameter_sets: int  # 1 for ``cursor.execute()``
    round_trips: int  # statements the server executes for it (the rule in the module's docstring)

    @property
    def verb(self) -> str:
        """The statement's first word, upper case (``SELECT``, ``UPDATE``...)."""
        return self.statement.split()[0].upper()

    @property
    def one_row_parameters(self) -> Any:
        """The parameters of one execution (the first row's for an executemany): what an EXPLAIN takes."""
        return self.parameters[0] if self.executemany else self.parameters


@dataclasses.dataclass
class Capture:
    """What an engine sent inside a ``capture`` block, in order."""

    statements: list[Captured] = dataclasses.field(default_factory=list)
    commit_positions: list[int] = dataclasses.field(default_factory=list)  # len(statements) at each COMMIT

    @property
    def commits(self) -> int:
        """COMMITs sent inside the block."""
        return len(self.commit_positions)

    def round_trips(self, *, commits: bool = False) -> list[str]:
        """The verb of each statement the server executes, repeated per round trip; with ``COMMIT``s if asked.

        An executemany sent one row at a time appears once per row, so a list compared with a
        fixed one (or with the same operation's list on a larger batch) catches it.
        """
        trips: list[str] = []
        for position, captured in enumerate(self.statements):
            if commits:
                trips += [COMMIT] * self.commit_positions.count(position)
            trips += [captured.verb] * captured.round_trips
        if commits:
            trips += [COMMIT] * self.commit_positions.count(len(self.statements))
        return trips


def _round_trips(statement: str, parameters: Sequence[Any], paramstyle: str) -> int:
    """Round trips of an executemany of ``statement`` over ``parameters`` (the module's docstring)."""
    if paramstyle == "qmark":
        statement = statement.replace("?", "%s")
    elif paramstyle not in ("format", "pyformat"):
        raise ValueError(f"no round-trip rule for the {paramstyle!r} paramstyle")
    return 1 if RE_INSERT_VALUES.match(statement) else len(parameters)


@contextlib.contextmanager
def capture(engine: sa.Engine) -> Iterator[Capture]:
    """Every statement and COMMIT ``engine`` sends inside the block, from any thread, in order."""
    captured = Capture()

    def on_statement(
        conn: sa.Connection, _cursor: Any, statement: str, parameters: Any, context: Any, executemany: bool
    ) -> None:
        # SQLAlchemy passes executemany=True for an insertmanyvalues batch, which the driver gets as one execute().
        many = executemany and not (context is not None and context.execute_style is ExecuteStyle.INSERTMANYVALUES)
        sets = len(parameters) if many else 1
        trips = _round_trips(statement, parameters, conn.dialect.paramstyle) if many else 1
        captured.statements.append(Captured(statement, parameters, many, sets, trips))

    def on_commit(_conn: sa.Connection) -> None:
        captured.commit_positions.append(len(captured.statements))

    event.listen(engine, "before_cursor_execute", on_statement)
    event.listen(engine, "commit", on_commit)
    try:
        yield captured
    finally:
        event.remove(engine, "before_cursor_execute", on_statement)
        event.remove(engine, "commit", on_commit)


@contextlib.contextmanager
def after_each_statement(engine: sa.Engine, hook: Callable[[str], None]) -> Iterator[None]:
    """Call ``hook(statement)`` after each statement ``engine`` executes inside the block, on its thread.

    For tests that make something happen between two statements of an operation (a commit
    between two reads); it counts nothing: counts go through ``capture``.
    """

    def after(_conn: sa.Connection, _cursor: Any, statement: str, *_rest: Any) -> None:
        hook(statement)

    event.listen(engine, "after_cursor_execute", after)
    try:
        yield
    finally:
        event.remove(engine, "after_cursor_execute", after)
