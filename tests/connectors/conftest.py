"""Fixtures shared by the integration tests: a clock that moves when told, and Connectors on it."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.facade import Connectors
from tests.support.factories import FakeClock


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def connectors(engine: sa.Engine, clock: FakeClock) -> Connectors:
    return Connectors(engine, clock=clock)
