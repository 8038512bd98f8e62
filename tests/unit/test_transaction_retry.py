"""The whole-transaction retry policy, with DBAPI errors as drivers raise them."""

from __future__ import annotations

import pymysql
import pytest
import sqlalchemy as sa

from nexuscrm_runtime import database
from nexuscrm_runtime.database import DatabaseUnavailable, TransactionConflict, run_transaction


@pytest.fixture
def engine() -> sa.Engine:
    return database.create_engine("sqlite://")


def driver_error(code: int, message: str) -> sa.exc.OperationalError:
    return sa.exc.OperationalError("UPDATE ...", {}, pymysql.err.OperationalError(code, message))


@pytest.mark.parametrize("code", [1213, 1205, 8002, 8022, 9007])
def test_conflicts_are_retried_as_whole_transactions(
    engine: sa.Engine, code: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(database, "RETRY_BASE_DELAY", 0.0)
    calls = []

    def work(connection: sa.Connection) -> str:
        calls.append(1)
        if len(calls) < 3:
            raise driver_error(code, "conflict")
        return "done"

    assert run_transaction(engine, work, name="test") == "done"
    assert len(calls) == 3


def test_retries_are_bounded(engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(database, "RETRY_BASE_DELAY", 0.0)

    def work(connection: sa.Connection) -> None:
        raise driver_error(1213, "Deadlock found")

    with pytest.raises(TransactionConflict, match="conflicted with concurrent transactions 8 times"):
        run_transaction(engine, work, name="test")


def test_lost_connection_is_unavailable_not_retried(engine: sa.Engine) -> None:
    calls = []

    def work(connection: sa.Connection) -> None:
        calls.append(1)
        raise driver_error(2013, "Lost connection to MySQL server during query")

    with pytest.raises(DatabaseUnavailable, match="retry the request"):
        run_transaction(engine, work, name="test")
    assert len(calls) == 1


def test_other_errors_propagate_unchanged(engine: sa.Engine) -> None:
    def work(connection: sa.Connection) -> None:
        raise driver_error(1064, "syntax error")

    with pytest.raises(sa.exc.OperationalError):
        run_transaction(engine, work, name="test")


def test_engines_hide_parameters_from_error_text() -> None:
    engine = database.create_engine("sqlite://")
    with pytest.raises(sa.exc.OperationalError) as caught, engine.begin() as connection:
        connection.execute(sa.text("INSERT INTO missing VALUES (:secret)"), {"secret": "payload-secret"})
    assert "payload-secret" not in str(caught.value)
