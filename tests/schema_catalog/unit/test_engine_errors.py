"""The engine error table: every listed code, forged as PyMySQL raises it, gets its class, retry and status."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pymysql
import pytest
import sqlalchemy as sa

from nexuscrm_runtime import database
from nexuscrm_runtime.database import (
    DatabaseLimitExceeded,
    DatabaseUnavailable,
    RetryPolicy,
    TransactionConflict,
    domain_error,
    run_transaction,
)
from nexuscrm_runtime.engine_errors import ENGINE_ERRORS, ErrorClass, error_class
from nexuscrm_runtime.status import STATUS_CODES, domain_status
from workqueue.errors import ErrorKind

INVARIANTS_NOT_CHECKED = "the engine error table with forged driver errors: no projection data"


def codes(error_class: ErrorClass) -> list[int]:
    return sorted(code for code, entry in ENGINE_ERRORS.items() if entry.error_class is error_class)


def driver_error(code: int) -> sa.exc.OperationalError:
    return sa.exc.OperationalError("UPDATE ...", {}, pymysql.err.OperationalError(code, f"forged {code}"))


@pytest.fixture
def engine() -> sa.Engine:
    return database.create_engine("sqlite://")


NO_SLEEP = RetryPolicy(sleep=lambda seconds: None)


def test_the_issue_s_codes_are_in_their_classes() -> None:
    """Issue 19 item 3: the TiDB codes that were INTERNAL or not retried before."""
    assert {8028, 8005, 9004, 1205, 1213, 8002, 8022, 9007} <= set(codes(ErrorClass.CONFLICT))
    assert {9001, 9002, 9003, 9005, 8027, 2013, 2006} <= set(codes(ErrorClass.UNAVAILABLE))
    assert {8004, 8025, 8175} <= set(codes(ErrorClass.TOO_LARGE))
    assert error_class(1064) is ErrorClass.PERMANENT  # not listed: a bug
    assert error_class(None) is ErrorClass.PERMANENT


def test_each_class_has_one_status() -> None:
    statuses = {entry.error_class: entry.status for entry in ENGINE_ERRORS.values()}
    assert statuses == {
        ErrorClass.CONFLICT: ErrorKind.ABORTED,
        ErrorClass.UNAVAILABLE: ErrorKind.UNAVAILABLE,
        ErrorClass.TOO_LARGE: ErrorKind.RESOURCE_EXHAUSTED,
        ErrorClass.PERMANENT: None,
    }


@pytest.mark.parametrize("code", codes(ErrorClass.CONFLICT))
def test_a_conflict_is_retried_as_a_whole_transaction(engine: sa.Engine, code: int) -> None:
    calls = []

    def work(connection: sa.Connection) -> str:
        calls.append(1)
        if len(calls) < 3:
            raise driver_error(code)
        return "done"

    assert run_transaction(engine, work, name="test", retry=NO_SLEEP) == "done"
    assert len(calls) == 3


@pytest.mark.parametrize("code", codes(ErrorClass.CONFLICT))
def test_a_conflict_past_the_budget_is_aborted(engine: sa.Engine, code: int) -> None:
    def work(connection: sa.Connection) -> None:
        raise driver_error(code)

    with pytest.raises(TransactionConflict) as caught:
        run_transaction(engine, work, name="test", retry=RetryPolicy(budget=0.0))
    assert STATUS_CODES[caught.value.kind].name == "ABORTED"


@pytest.mark.parametrize("code", codes(ErrorClass.UNAVAILABLE))
def test_unavailable_is_not_retried_and_answers_unavailable(engine: sa.Engine, code: int) -> None:
    calls = []

    def work(connection: sa.Connection) -> None:
        calls.append(1)
        raise driver_error(code)

    with pytest.raises(DatabaseUnavailable, match="database unavailable during test; retry the request") as caught:
        run_transaction(engine, work, name="test", retry=NO_SLEEP)
    assert len(calls) == 1
    assert STATUS_CODES[caught.value.kind].name == "UNAVAILABLE"


@pytest.mark.parametrize(
    ("code", "limit"),
    [
        (8004, "txn-total-size-limit"),
        (8025, "txn-entry-size-limit"),
        (8175, "tidb_mem_quota_query"),
        (1153, "max_allowed_packet"),
        (1197, "max_binlog_cache_size"),
    ],
)
def test_too_large_is_not_retried_and_names_the_limit(engine: sa.Engine, code: int, limit: str) -> None:
    assert error_class(code) is ErrorClass.TOO_LARGE
    calls = []

    def work(connection: sa.Connection) -> None:
        calls.append(1)
        raise driver_error(code)

    with pytest.raises(DatabaseLimitExceeded) as caught:
        run_transaction(engine, work, name="admission", retry=NO_SLEEP)
    assert len(calls) == 1
    message = str(caught.value)
    assert message.startswith("admission was refused by the database")
    assert limit in message and f"error {code}" in message and "nothing was committed" in message
    assert domain_status(caught.value).code == STATUS_CODES[ErrorKind.RESOURCE_EXHAUSTED].value[0]


def test_every_too_large_code_is_tested() -> None:
    tested = {8004, 8025, 8175, 1153, 1197}
    assert set(codes(ErrorClass.TOO_LARGE)) == tested


@pytest.mark.parametrize("code", [*codes(ErrorClass.PERMANENT), 1064, 1062])
def test_a_permanent_error_propagates_unchanged(engine: sa.Engine, code: int) -> None:
    calls = []

    def work(connection: sa.Connection) -> None:
        calls.append(1)
        raise driver_error(code)

    with pytest.raises(sa.exc.OperationalError):
        run_transaction(engine, work, name="test", retry=NO_SLEEP)
    assert len(calls) == 1
    assert domain_error(driver_error(code)) is None  # the RPC layer answers INTERNAL and logs it


@pytest.mark.parametrize(
    ("code", "kind"),
    [(8028, ErrorKind.ABORTED), (9002, ErrorKind.UNAVAILABLE), (8175, ErrorKind.RESOURCE_EXHAUSTED)],
)
def test_a_driver_error_outside_run_transaction_has_the_table_s_status(code: int, kind: ErrorKind) -> None:
    refusal = domain_error(driver_error(code))
    assert refusal is not None and refusal.kind is kind


def test_the_documented_table_is_the_code_s_table() -> None:
    """docs/tidb.md cites ENGINE_ERRORS row by row: code, class and status."""
    text = (Path(__file__).resolve().parents[3] / "docs" / "tidb.md").read_text()
    rows = re.findall(r"^\| (\d+) \| [^|]+ \| ([a-z ]+) \| ([A-Z_]+) \|", text, flags=re.MULTILINE)
    documented = {int(code): (error_class, status) for code, error_class, status in rows}
    assert documented == {
        code: (entry.error_class.value, entry.status.value if entry.status else "INTERNAL")
        for code, entry in ENGINE_ERRORS.items()
    }


def sqlite_error(extended_code: int) -> sa.exc.OperationalError:
    """A sqlite3 error as the driver raises it: its (extended) result code on the exception."""
    error = sqlite3.OperationalError(f"forged sqlite {extended_code}")
    error.sqlite_errorcode = extended_code  # the driver sets it from the C result code
    return sa.exc.OperationalError("INSERT ...", {}, error)


@pytest.mark.parametrize(
    ("extended_code", "kind", "cause"),
    [
        (13, ErrorKind.RESOURCE_EXHAUSTED, "disk holding the database file is full (SQLITE_FULL)"),
        (8, ErrorKind.UNAVAILABLE, "read-only (SQLITE_READONLY"),
        (8 | (1 << 8), ErrorKind.UNAVAILABLE, "read-only (SQLITE_READONLY"),  # SQLITE_READONLY_RECOVERY
        (10 | (3 << 8), ErrorKind.UNAVAILABLE, "disk I/O error"),  # SQLITE_IOERR_WRITE
        (14, ErrorKind.UNAVAILABLE, "cannot be opened (SQLITE_CANTOPEN)"),
    ],
)
def test_a_sqlite_storage_fault_names_its_cause_and_is_not_retried(
    engine: sa.Engine, extended_code: int, kind: ErrorKind, cause: str
) -> None:
    calls = []

    def work(connection: sa.Connection) -> None:
        calls.append(1)
        raise sqlite_error(extended_code)

    with pytest.raises((DatabaseLimitExceeded, DatabaseUnavailable)) as caught:
        run_transaction(engine, work, name="admission", retry=NO_SLEEP)
    assert len(calls) == 1
    assert caught.value.kind is kind
    assert str(caught.value).startswith("admission failed: ")
    assert cause in str(caught.value) and "nothing was committed" in str(caught.value)
    outside = domain_error(sqlite_error(extended_code))  # a read outside run_transaction
    assert outside is not None and outside.kind is kind and cause in str(outside)


def test_any_other_sqlite_error_stays_a_bug() -> None:
    assert domain_error(sqlite_error(1)) is None  # SQLITE_ERROR (a bad statement): INTERNAL, logged
    assert domain_error(sqlite_error(19)) is None  # SQLITE_CONSTRAINT
