"""``nexuscrm-schema status|migrate`` on every backend: the service's migrations without a server.

The main cases run the installed console script as a subprocess (as a deployment would); the
refusals and Ctrl-C call its ``main`` in process. Migrating a history writes none of its rows
(decision 150): there is no data step to interrupt, show or resume.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from nexuscrm_runtime.database import create_engine
from nexuscrm_runtime.exit_codes import DESCRIPTIONS, ExitCode
from nexuscrm_schema import tables
from nexuscrm_schema.verification import NEWEST_VERSION
from nexuscrm_schema_catalog import command, migrations
from tests.support.checksums import Checksums, database_digest
from tests.support.factories import START

INVARIANTS_NOT_CHECKED = "schema migrations only: database_digest proves they change no row"

pytestmark = pytest.mark.database

COMMAND = Path(sys.executable).parent / "nexuscrm-schema"
EVENTS = 6  # seeded at v7, one pack
NEWER = NEWEST_VERSION + 2


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(COMMAND), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "NEXUSCRM_DSN"} | (env or {}),
        check=False,
    )


def _status(dsn: str) -> dict[str, object]:
    done = _run("status", "--dsn", dsn, "--json")
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


def _seed_v7(dsn: str) -> None:
    """A database at v7 holding ``EVENTS`` Events of one pack, their payloads in Event only."""
    engine = create_engine(dsn)
    try:
        assert migrations.apply_schema(engine, 7)[1] == 7
        with engine.begin() as connection:
            connection.execute(
                sa.insert(tables.PackInstall).values(
                    PackInstallId="pk", Namespace="acme", PackName="crm", PackVersion="1.0", CreatedAt=START
                )
            )
            v7_event = sa.Table(tables.Event.name, sa.MetaData(), autoload_with=connection)
            rows = [
                {
                    "PackInstallId": "pk",
                    "EnqueueOrdinal": ordinal,
                    "ProjectionKey": "pk1|key",
                    "ReceiptKey": f"r-{ordinal}",
                    "PayloadHash": "h" * 64,
                    "Payload": bytes([ordinal]) * 100,
                    "Status": "processed",
                    "CreatedAt": START,
                }
                for ordinal in range(1, EVENTS + 1)
            ]
            connection.execute(sa.insert(v7_event), rows)
    finally:
        engine.dispose()


def _snapshot(dsn: str) -> Checksums:
    """Every table, by name, and every row of it."""
    engine = create_engine(dsn)
    try:
        return database_digest(engine)
    finally:
        engine.dispose()


def _versions(dsn: str) -> list[int]:
    engine = create_engine(dsn)
    try:
        with engine.connect() as connection:
            return list(connection.execute(sa.select(tables.SchemaVersion.c.Version).order_by("Version")).scalars())
    finally:
        engine.dispose()


def _events(dsn: str) -> list[tuple[int, bytes, int | None]]:
    """Every Event's ordinal, Event.Payload and PayloadBytes (NULL before v8's column, as after it)."""
    engine = create_engine(dsn)
    try:
        with engine.connect() as connection:
            event = sa.Table(tables.Event.name, sa.MetaData(), autoload_with=connection)
            sizes = event.c.PayloadBytes if "PayloadBytes" in event.c else sa.null()
            rows = connection.execute(
                sa.select(event.c.EnqueueOrdinal, event.c.Payload, sizes).order_by("EnqueueOrdinal")
            )
            return [(r[0], bytes(r[1]), r[2]) for r in rows]
    finally:
        engine.dispose()


def _payload_rows(dsn: str) -> int:
    engine = create_engine(dsn)
    try:
        with engine.connect() as connection:
            return int(connection.execute(sa.select(sa.func.count()).select_from(tables.EventPayload)).scalar_one())
    finally:
        engine.dispose()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# --- the main cases, as a subprocess --------------------------------------------------------------


def test_migrate_takes_an_empty_database_to_the_newest_version(empty_dsn: str) -> None:
    done = _run("migrate", env={"NEXUSCRM_DSN": empty_dsn})

    assert done.returncode == 0, done.stderr
    assert f"schema at version {NEWEST_VERSION} (was 0; applied v1_pre_upgrade_schema," in done.stdout
    status = _status(empty_dsn)
    assert (status["current"], status["head"], status["pending"]) == (NEWEST_VERSION, NEWEST_VERSION, [])
    assert [a["version"] for a in status["applied"]] == list(range(1, NEWEST_VERSION + 1))  # type: ignore[attr-defined]


def test_a_dry_run_lists_the_steps_and_changes_nothing(empty_dsn: str) -> None:
    _seed_v7(empty_dsn)
    before = _snapshot(empty_dsn)

    done = _run("migrate", "--dsn", empty_dsn, "--dry-run")

    assert done.returncode == 0, done.stderr
    assert "at version 7" in done.stdout
    after_v7 = migrations.STEPS[7:]
    assert f"dry run: {len(after_v7)} steps would run to reach version {NEWEST_VERSION}; nothing changed" in done.stdout
    assert [line.split() for line in done.stdout.splitlines()[-len(after_v7) :]] == [
        [str(step.version), step.name] for step in after_v7
    ]
    assert "cop" not in done.stdout  # no step copies data (decision 150)
    assert _snapshot(empty_dsn) == before  # the same tables, SchemaVersion rows and every other row


def test_target_7_then_the_newest_then_again_is_idempotent(empty_dsn: str) -> None:
    first = _run("migrate", "--dsn", empty_dsn, "--target", "7")
    assert first.returncode == 0, first.stderr
    assert _versions(empty_dsn) == list(range(1, 8))

    second = _run("migrate", "--dsn", empty_dsn)
    assert second.returncode == 0, second.stderr
    applied = ", ".join(step.name for step in migrations.STEPS[7:])
    assert f"schema at version {NEWEST_VERSION} (was 7; applied {applied})" in second.stdout
    rows = _snapshot(empty_dsn)

    third = _run("migrate", "--dsn", empty_dsn)
    assert third.returncode == 0, third.stderr
    assert third.stdout.strip() == f"already at version {NEWEST_VERSION}: nothing to do"
    assert _snapshot(empty_dsn) == rows


def test_a_database_newer_than_this_release_is_refused_and_left_alone(empty_dsn: str) -> None:
    engine = create_engine(empty_dsn)
    migrations.apply_schema(engine)
    with engine.begin() as connection:  # what a release two versions ahead would have recorded
        connection.execute(
            sa.insert(tables.SchemaVersion).values(Version=NEWER, Step="v12_from_the_future", AppliedAt=START)
        )
    engine.dispose()
    before = _snapshot(empty_dsn)

    for args in (["migrate"], ["migrate", "--dry-run"], ["status"]):
        done = _run(*args, "--dsn", empty_dsn)
        assert done.returncode == ExitCode.CHECK_FAILED, (args, done.stderr)
        assert done.stderr.splitlines()[-1] == (
            f"nexuscrm-schema: database at version {NEWER}, this release knows up to {NEWEST_VERSION}: "
            "use the newer nexuscrm-schema"
        )
    assert _snapshot(empty_dsn) == before


def test_an_unreachable_server_is_refused_with_exit_3_and_no_password_shown() -> None:
    dsn = f"mysql://root:s3cret@127.0.0.1:{_closed_port()}/nexuscrm"

    done = _run("migrate", env={"NEXUSCRM_DSN": dsn})

    assert done.returncode == ExitCode.UNREACHABLE
    assert done.stderr.strip().startswith("nexuscrm-schema: nothing is listening on 127.0.0.1:")
    assert "s3cret" not in done.stdout + done.stderr


def test_migrating_a_v7_history_writes_none_of_its_rows(empty_dsn: str) -> None:
    _seed_v7(empty_dsn)
    before = _events(empty_dsn)

    done = _run("migrate", "--dsn", empty_dsn)

    assert done.returncode == 0, done.stderr
    assert [line for line in done.stdout.splitlines() if line.startswith("applying ")] == [
        f"applying {step.name} ..." for step in migrations.STEPS[7:]
    ]
    assert _events(empty_dsn) == before  # every payload where it was, PayloadBytes NULL
    assert [size for _, _, size in before] == [None] * EVENTS and _payload_rows(empty_dsn) == 0
    status = _run("status", "--dsn", empty_dsn)
    assert status.returncode == 0, status.stderr
    assert "pending: none" in status.stdout and "interrupted" not in status.stdout


# --- refusals, Ctrl-C and help, in process -------------------------------------------------------


def test_ctrl_c_during_a_step_stops_after_it_and_migrate_resumes(
    empty_dsn: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _seed_v7(empty_dsn)
    before = _events(empty_dsn)
    v8 = migrations.STEPS[7]

    def apply_then_ctrl_c(connection: sa.Connection) -> None:
        v8.apply(connection)
        os.kill(os.getpid(), signal.SIGINT)  # the operator presses Ctrl-C while the step runs

    steps = list(migrations.STEPS)
    steps[7] = dataclasses.replace(v8, apply=apply_then_ctrl_c)
    monkeypatch.setattr(migrations, "STEPS", tuple(steps))
    assert command.main(["migrate", "--dsn", empty_dsn]) == ExitCode.INTERRUPTED
    stopped = capsys.readouterr()
    assert "SIGINT: stopping after the current step" in stopped.out
    assert (
        "nexuscrm-schema: interrupted: stopped after v8_event_payload: the schema is at version 8; "
        "`nexuscrm-schema migrate` resumes it"
    ) in stopped.err
    assert _versions(empty_dsn)[-1] == 8
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the command's handler is gone

    monkeypatch.undo()
    assert command.main(["migrate", "--dsn", empty_dsn]) == ExitCode.OK
    assert _versions(empty_dsn)[-1] == NEWEST_VERSION
    assert _events(empty_dsn) == before and _payload_rows(empty_dsn) == 0


def test_a_target_below_the_current_version_does_nothing_and_says_so(
    dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = _snapshot(dsn)
    assert command.main(["migrate", "--dsn", dsn, "--target", "7"]) == ExitCode.OK
    assert capsys.readouterr().out.strip() == (
        f"database at version {NEWEST_VERSION}, past --target 7: nothing to do (never backwards)"
    )
    assert _snapshot(dsn) == before


@pytest.mark.parametrize("target", [str(NEWEST_VERSION + 1), "-1", "seven"])
def test_a_target_outside_the_known_versions_is_a_usage_error(target: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as refused:
        command.main(["migrate", "--dsn", "sqlite:///unused.db", "--target", target])
    assert refused.value.code == ExitCode.USAGE
    assert "argument --target" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("dsn", "said"),
    [
        ("not a url", "--dsn is not a database URL"),
        ("postgresql://u@h/db", "--dsn has the unsupported scheme 'postgresql'"),
        ("mysql://root@127.0.0.1:3306", "--dsn names no database"),
    ],
)
def test_a_malformed_dsn_is_refused_in_one_line(dsn: str, said: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert command.main(["migrate", "--dsn", dsn]) == ExitCode.UNREACHABLE
    refused = capsys.readouterr().err.strip()
    assert refused.startswith(f"nexuscrm-schema: {said}") and "\n" not in refused


def test_a_missing_database_and_no_dsn_are_refused(
    mysql_server_dsn: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = str(sa.engine.make_url(mysql_server_dsn).set(database="nxtest_never_created"))
    assert command.main(["status", "--dsn", missing]) == ExitCode.UNREACHABLE
    assert "database 'nxtest_never_created' does not exist on 127.0.0.1:" in capsys.readouterr().err

    absent = tmp_path / "absent.db"
    assert command.main(["status", "--dsn", f"sqlite:///{absent}"]) == ExitCode.UNREACHABLE
    assert f"sqlite file {absent} does not exist (migrate creates it)" in capsys.readouterr().err
    assert not absent.exists()

    monkeypatch.delenv("NEXUSCRM_DSN", raising=False)
    assert command.main(["migrate"]) == ExitCode.UNREACHABLE
    assert "no database named: pass --dsn or set NEXUSCRM_DSN" in capsys.readouterr().err


def test_the_help_lists_the_commands_exit_codes_from_the_shared_table(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        command.main(["--help"])
    shown = " ".join(capsys.readouterr().out.split())
    for code in command.EXIT_CODES:
        assert f"{code.value} {' '.join(DESCRIPTIONS[code].split())}" in shown
