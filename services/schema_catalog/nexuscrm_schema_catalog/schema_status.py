"""Where a database's schema stands against this release's migrations, read without changing anything.

``nexuscrm-schema status`` prints it. In Alembic's words: ``current`` is the newest version the
database records, ``head`` the newest this release's migrations reach. The applied steps are the
database's own SchemaVersion rows (a newer release's rows included); the pending ones are what
``migrations.apply_schema`` would run, with the rows each data step would copy; an interrupted
data step is the first pending one whose DDL is already in place (its copy began, its version
is not recorded), with how far its copy got.
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
class InterruptedCopy:
    """A data step whose DDL is in place but whose version is not recorded: ``copied`` done, ``left`` to go."""

    step: migrations.Step
    unit: str
    copied: int
    left: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class SchemaStatus:
    """The database's schema against this release (see the module docstring)."""

    current: int
    head: int
    applied: tuple[AppliedStep, ...]
    pending: tuple[migrations.PlannedStep, ...]
    interrupted: InterruptedCopy | None

    @property
    def newer_than_known(self) -> bool:
        """The database records a version this release does not know: only a newer release migrates it."""
        return self.current > self.head


def read_status(engine: Engine) -> SchemaStatus:
    """The database's schema status; reads only."""
    with engine.connect() as connection:
        current = current_version(connection)
        applied = _applied(connection) if current else ()
    if current > NEWEST_VERSION:
        return SchemaStatus(current=current, head=NEWEST_VERSION, applied=applied, pending=(), interrupted=None)
    pending = migrations.plan(engine).steps
    return SchemaStatus(
        current=current,
        head=NEWEST_VERSION,
        applied=applied,
        pending=pending,
        interrupted=_interrupted(engine, pending),
    )


def _applied(connection: sa.Connection) -> tuple[AppliedStep, ...]:
    rows = connection.execute(sa.select(tables.SchemaVersion).order_by(tables.SchemaVersion.c.Version))
    return tuple(AppliedStep(version=r.Version, step=r.Step, applied_at=r.AppliedAt) for r in rows)


def _interrupted(engine: Engine, pending: tuple[migrations.PlannedStep, ...]) -> InterruptedCopy | None:
    with engine.connect() as connection:
        for planned in pending:
            copy = planned.step.copy
            if copy is not None and copy.started(connection):
                return InterruptedCopy(
                    step=planned.step, unit=copy.unit, copied=copy.copied(connection), left=copy.left(connection)
                )
    return None
