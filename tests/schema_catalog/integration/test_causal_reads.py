"""Causal reads cost nothing without replica lag (decision 187): no statement on SQLite or one MariaDB server."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from nexuscrm_runtime.causal import causal_read, is_galera
from tests.support.statements import capture

INVARIANTS_NOT_CHECKED = "runs a read of the server's clock; writes nothing"

pytestmark = [pytest.mark.database, pytest.mark.parametrize("empty_dsn", ["sqlite", "mysql"], indirect=True)]


def test_a_causal_read_on_one_server_sends_nothing_before_the_read(empty_engine: sa.Engine) -> None:
    with empty_engine.connect() as connection:
        assert is_galera(connection) is False
        with capture(empty_engine) as sent:
            causal_read(connection).execute(sa.select(sa.func.now()))
    assert sent.round_trips() == ["SELECT"]
