"""Database prerequisites: TiDB sessions are set at connect, and a service refuses a server that misses one.

No TiDB runs here: TiDB's answers are forged through the ``read`` seam on top of what the
real MariaDB server reports, so the statements and the refusal run for real.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from nexuscrm_runtime.database import create_engine, normalize_dsn
from nexuscrm_runtime.prerequisites import (
    IDLE_TRANSACTION_TIMEOUT,
    PrerequisiteError,
    ServerFacts,
    is_tidb,
    problems,
    read_server,
    session_statements,
    tidb_version,
    verify,
)
from nexuscrm_runtime.server import EXIT_PREREQUISITES, refuse_unless_prerequisites

INVARIANTS_NOT_CHECKED = "server settings read at connect and refused at start: no projection data"

TIDB = "8.0.11-TiDB-v8.5.1"
GOOD_TIDB = {
    "transaction_isolation": "READ-COMMITTED",
    "tidb_txn_mode": "pessimistic",
    "tidb_constraint_check_in_place_pessimistic": "ON",
    "tidb_idle_transaction_timeout": str(IDLE_TRANSACTION_TIMEOUT),
    "tidb_enable_metadata_lock": "ON",
}


@pytest.fixture
def server_engine(mysql_server_dsn: str) -> Iterator[sa.Engine]:
    engine = create_engine(str(normalize_dsn(mysql_server_dsn).set(database=None)), pool_size=1)
    yield engine
    engine.dispose()


def test_tidb_versions_are_read_from_the_version_string() -> None:
    assert tidb_version("8.0.11-TiDB-v8.1.2") == (8, 1, 2)
    assert tidb_version("5.7.25-TiDB-v7.5.0-alpha") == (7, 5, 0)
    assert tidb_version("10.11.19-MariaDB-0+deb12u1") is None
    assert tidb_version("8.0.36") is None


def test_one_test_names_tidb_and_a_release_it_cannot_read_is_refused_not_taken_for_mysql() -> None:
    assert is_tidb(TIDB) and is_tidb("5.7.25-TiDB-v7.5.0-alpha")
    assert not is_tidb("10.11.19-MariaDB-0+deb12u1") and not is_tidb("8.0.36")
    unreadable = "8.0.11-TiDB-nightly"
    # TiDB for the session settings and the database clock alike, and refused at start for its release.
    assert is_tidb(unreadable) and tidb_version(unreadable) is None
    assert session_statements(unreadable) == session_statements(TIDB)
    assert problems(ServerFacts(version=unreadable, variables=GOOD_TIDB)) == [
        f"TiDB v8.1.0 (LTS) or newer is required, the server reports {unreadable!r}"
    ]


def test_a_tidb_session_is_set_pessimistic_with_in_place_checks_and_an_idle_timeout() -> None:
    assert session_statements(TIDB) == [
        "SET SESSION tidb_txn_mode = 'pessimistic', tidb_constraint_check_in_place_pessimistic = ON, "
        f"tidb_idle_transaction_timeout = {IDLE_TRANSACTION_TIMEOUT}"
    ]
    assert session_statements("10.11.19-MariaDB-0+deb12u1") == [
        f"SET SESSION idle_transaction_timeout = {IDLE_TRANSACTION_TIMEOUT}"
    ]
    assert session_statements("8.0.36") == []  # MySQL has no idle-transaction timeout


def test_a_well_set_tidb_has_no_problem() -> None:
    assert problems(ServerFacts(version=TIDB, variables=GOOD_TIDB)) == []


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"tidb_txn_mode": "optimistic"}, "tidb_txn_mode must be pessimistic, the server has optimistic"),
        ({"tidb_enable_metadata_lock": "OFF"}, "tidb_enable_metadata_lock must be ON, the server has OFF"),
        (
            {"tidb_constraint_check_in_place_pessimistic": "OFF"},
            "tidb_constraint_check_in_place_pessimistic must be ON, the server has OFF",
        ),
        ({"transaction_isolation": "REPEATABLE-READ"}, "transaction_isolation must be READ-COMMITTED"),
    ],
)
def test_each_wrong_setting_is_named(change: dict[str, str], named: str) -> None:
    found = problems(ServerFacts(version=TIDB, variables={**GOOD_TIDB, **change}))
    assert len(found) == 1 and found[0].startswith(named), found


def test_an_old_tidb_is_named_with_the_minimum_lts() -> None:
    # v7.5 has no tidb_idle_transaction_timeout: both the version and the variable are named.
    variables = {name: value for name, value in GOOD_TIDB.items() if name != "tidb_idle_transaction_timeout"}
    found = problems(ServerFacts(version="8.0.11-TiDB-v7.5.4", variables=variables))
    assert found == [
        "TiDB v8.1.0 (LTS) or newer is required, the server is v7.5.4",
        f"tidb_idle_transaction_timeout must be {IDLE_TRANSACTION_TIMEOUT}, the server has no such variable",
    ]


def test_the_real_server_reads_back_read_committed_and_passes(server_engine: sa.Engine) -> None:
    with server_engine.connect() as connection:
        facts = read_server(connection)
        if "MariaDB" in facts.version:  # the idle-transaction timeout set at connect
            timeout = connection.exec_driver_sql("SELECT @@SESSION.idle_transaction_timeout").scalar_one()
            assert int(timeout) == IDLE_TRANSACTION_TIMEOUT
    isolation = facts.variables.get("transaction_isolation") or facts.variables["tx_isolation"]
    assert isolation == "READ-COMMITTED"
    assert not is_tidb(facts.version)
    verify(server_engine)  # MariaDB/MySQL: nothing else required


def test_a_server_claiming_to_be_tidb_without_its_settings_is_refused(server_engine: sa.Engine) -> None:
    """The real MariaDB answers, with a TiDB version string forged in: none of TiDB's variables exist."""

    def as_tidb(connection: sa.Connection) -> ServerFacts:
        return dataclasses.replace(read_server(connection), version=TIDB)

    with pytest.raises(PrerequisiteError) as caught:
        verify(server_engine, read=as_tidb)
    message = str(caught.value)
    for name in [*GOOD_TIDB][1:]:
        assert f"{name} must be" in message
    assert "transaction_isolation" not in message  # the real session is READ COMMITTED


def test_a_service_refuses_to_start_with_one_line_naming_the_setting(
    server_engine: sa.Engine, caplog: pytest.LogCaptureFixture
) -> None:
    def optimistic(connection: sa.Connection) -> ServerFacts:
        return ServerFacts(version=TIDB, variables={**GOOD_TIDB, "tidb_txn_mode": "optimistic"})

    with caplog.at_level(logging.ERROR), pytest.raises(SystemExit) as caught:
        refuse_unless_prerequisites(server_engine, read=optimistic)
    assert caught.value.code == EXIT_PREREQUISITES
    (record,) = [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert "\n" not in record.getMessage()
    assert record.getMessage().startswith("refusing to start: the database does not meet the prerequisites")
    assert "tidb_txn_mode must be pessimistic, the server has optimistic" in record.getMessage()


def test_sqlite_needs_nothing() -> None:
    engine = create_engine("sqlite://")

    def never(connection: sa.Connection) -> ServerFacts:
        raise AssertionError("SQLite is not read")

    verify(engine, read=never)
