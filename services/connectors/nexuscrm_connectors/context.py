"""What every operation of one Connectors process holds: its database, settings, clock and claim wake-ups."""

from __future__ import annotations

import dataclasses

from sqlalchemy.engine import Engine

from nexuscrm_connectors.reservations import Reservations
from nexuscrm_connectors.settings import Settings
from nexuscrm_runtime.clock import DATABASE_CLOCK, DatabaseClock


@dataclasses.dataclass(frozen=True)
class Context:
    """The process's engine, settings and database clock, and the reservations that wake waiting claims.

    Built once by ``facade.Connectors``; the operations of both wings take it first.
    """

    engine: Engine
    settings: Settings
    clock: DatabaseClock
    reservations: Reservations

    @classmethod
    def of(cls, engine: Engine, settings: Settings | None = None, clock: DatabaseClock = DATABASE_CLOCK) -> Context:
        """A context of its own for ``engine`` (tools and tests that run an operation without the facade)."""
        settings = settings or Settings()
        return cls(engine, settings, clock, Reservations(settings.max_claim_waiters))
