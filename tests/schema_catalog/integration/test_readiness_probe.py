"""The readiness probe on each backend (decision 187): ready while the database answers, not once it cannot."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from nexuscrm_runtime.database import create_engine
from nexuscrm_runtime.readiness import database_ready

INVARIANTS_NOT_CHECKED = "reads nothing but the server's state; writes nothing"


@pytest.mark.database
@pytest.mark.parametrize("empty_dsn", ["sqlite", "mysql"], indirect=True)
def test_a_database_that_answers_is_ready(empty_dsn: str) -> None:
    engine = create_engine(empty_dsn)
    try:
        assert database_ready(engine) is True
    finally:
        engine.dispose()


def test_a_server_nothing_listens_for_is_not_ready() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    engine = create_engine(f"mysql://root@127.0.0.1:{port}/nexuscrm?connect_timeout=2")
    try:
        assert database_ready(engine) is False
    finally:
        engine.dispose()


def test_a_sqlite_file_that_cannot_be_opened_is_not_ready(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite:///{tmp_path}")  # a folder: SQLite cannot open it as a database
    try:
        assert database_ready(engine) is False
    finally:
        engine.dispose()
