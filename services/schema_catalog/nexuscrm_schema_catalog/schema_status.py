"""Where a database's schema stands against this release's migrations, read without changing anything.

``nexuscrm-schema status`` prints it. In Alembic's words: ``current`` is the newest version the
database records, ``head`` the newest this release's migrations reach. The applied steps are the
database's own SchemaVersion rows (a newer release's rows included); the pending ones are what
``migrations.apply_schema`` would run.
"""

from __future__ import annotations

import dataclasses
import datetime as dt

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from nexuscrm_schema import tables
from nexuscrm_schema.verification import NEWEST_VERSION, current_version
from nexuscrm_schema_catalog import migrations


@dataclasses.dataclass(frozen=True, kw_only=True)
class AppliedStep:
    """One SchemaVersion row: the version, the step's name and when it was recorded (UTC)."""

    version: int
    step: str
    applied_at: dt.datetime


@dataclasses.dataclass(frozen=True, kw_only=True)
class SchemaStatus:
    """The database's schema against this release (see the module docstring)."""

    current: int
    head: int
    applied: tuple[AppliedStep, ...]
    pending: tuple[migrations.Step, ...]

    @property
    def newer_than_known(self) -> bool:
        """The database records a version this release does not know: only a newer release migrates it."""
        return self.current > self.head


def read_status(engine: Engine) -> SchemaStatus:
    """The database's schema status; reads only."""
    with engine.connect() as connection:
        current = current_version(connection)
        applied = _applied(connection) if current else ()
    pending = () if current > NEWEST_VERSION else migrations.plan(engine).steps
    return SchemaStatus(current=current, head=NEWEST_VERSION, applied=applied, pending=pending)


def _applied(connection: sa.Connection) -> tuple[AppliedStep, ...]:
    rows = connection.execute(sa.select(tables.SchemaVersion).order_by(tables.SchemaVersion.c.Version))
    return tuple(AppliedStep(version=r.Version, step=r.Step, applied_at=r.AppliedAt) for r in rows)
