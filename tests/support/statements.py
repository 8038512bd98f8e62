"""Capture the SQL an engine sends: proof of which statements an operation ran (never timed)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event


@contextlib.contextmanager
def statements(engine: sa.Engine) -> Iterator[list[str]]:
    """Every statement ``engine`` sends inside the block, in order."""
    seen: list[str] = []

    def on_statement(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", on_statement)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", on_statement)
