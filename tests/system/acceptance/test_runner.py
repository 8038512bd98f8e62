"""``nexuscrm-run`` as a person runs it: fresh state by default, any Flow, and a wrong database said in one line.

Real processes on OS-chosen ports, small unpaced workloads; no assertion on how fast.
"""

from __future__ import annotations

import json
import os
import re
import socket
import sqlite3
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from nexuscrm_runtime.database import create_engine
from nexuscrm_tools.exits import ExitCode
from tests.conftest import REPO_ROOT, REQUIRED
from tests.support.invariants import assert_invariants
from tests.support.waiting import wait_until
from tests.system.acceptance import exiting_flow, failing_flow

pytestmark = pytest.mark.acceptance

DEADLINE = 300.0  # seconds for one small run on a loaded machine
EXAMPLE_FLOW = "examples.contact_stages:contact_stages"
FAILING_FLOW = f"{failing_flow.__name__}:boom"
EXITING_FLOW = f"{exiting_flow.__name__}:{exiting_flow.exit_at_once.__name__}"
SMALL = ["--lanes", "3", "--inputs", "30", "--rate", "0"]


def nexuscrm_run(
    *args: str, dsn: str | None = None, extra_env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``nexuscrm-run`` from the repository root (as the README does), NEXUSCRM_DSN set only when given."""
    env = {k: v for k, v in os.environ.items() if k != "NEXUSCRM_DSN"} | {"COLUMNS": "80"} | (extra_env or {})
    if dsn is not None:
        env["NEXUSCRM_DSN"] = dsn
    return run_command([sys.executable, "-m", "nexuscrm_tools.run", *args], env)


def run_command(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """Run to the end from the repository root; the caller checks the exit code."""
    return subprocess.run(command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=DEADLINE)


def packs_in(database: Path) -> int:
    with sqlite3.connect(database) as connection:
        return int(connection.execute("SELECT COUNT(*) FROM PackInstall").fetchone()[0])


def test_each_run_starts_fresh_and_keep_reuses_the_state(tmp_path: Path) -> None:
    workdir = tmp_path / "run"
    workdir.mkdir()
    (workdir / "notes.txt").write_text("not the run's")
    for _ in range(2):
        first = nexuscrm_run(*SMALL, "--workdir", str(workdir))
        assert first.returncode == ExitCode.OK, first.stdout + first.stderr
        assert packs_in(workdir / "nexuscrm.db") == 1
        assert (workdir / "connectors.log").read_text().count("serving nexuscrm") == 1
    assert f"database: {workdir / 'nexuscrm.db'} (SQLite" in first.stdout
    assert f"logs: {workdir}/*.log" in first.stdout

    kept = nexuscrm_run(*SMALL, "--workdir", str(workdir), "--keep")
    assert kept.returncode == ExitCode.OK, kept.stdout + kept.stderr
    assert packs_in(workdir / "nexuscrm.db") == 2
    assert (workdir / "notes.txt").read_text() == "not the run's"


def test_a_database_named_by_nexuscrm_dsn_is_never_emptied(tmp_path: Path) -> None:
    database = tmp_path / "mine.db"
    for expected in (1, 2):
        done = nexuscrm_run(*SMALL, "--workdir", str(tmp_path / "run"), dsn=f"sqlite:///{database}")
        assert done.returncode == ExitCode.OK, done.stdout + done.stderr
        assert packs_in(database) == expected
    assert f"the sqlite database of NEXUSCRM_DSN ({database})" in done.stdout
    assert not (tmp_path / "run" / "nexuscrm.db").exists()


def test_a_flow_by_module_and_function_with_the_simulator(tmp_path: Path) -> None:
    read_model = tmp_path / "stages.db"
    done = nexuscrm_run(
        *SMALL,
        "--workdir",
        str(tmp_path / "run"),
        "--flow",
        EXAMPLE_FLOW,
        "--setting",
        f"database=sqlite:///{read_model}",
    )
    assert done.returncode == ExitCode.OK, done.stdout + done.stderr
    assert EXAMPLE_FLOW in done.stdout
    with sqlite3.connect(read_model) as connection:
        assert connection.execute("SELECT COUNT(*) FROM ContactStageApplied").fetchone()[0] == 30
        assert connection.execute("SELECT COUNT(*) FROM ContactStage").fetchone()[0] > 0
    with sqlite3.connect(tmp_path / "run" / "nexuscrm.db") as connection:  # nothing of the Flow's in the host's
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert not {"ContactStage", "ContactStageApplied", "DemoContactApplied"} & tables


def test_a_flow_without_the_simulator_serves_until_stopped(tmp_path: Path) -> None:
    output = tmp_path / "runner.out"
    env = {k: v for k, v in os.environ.items() if k != "NEXUSCRM_DSN"} | {"COLUMNS": "80"}
    command = [sys.executable, "-m", "nexuscrm_tools.run", "--inputs", "0", "--serve", "--flow", EXAMPLE_FLOW]
    command += ["--setting", f"database=sqlite:///{tmp_path / 'stages.db'}", "--workdir", str(tmp_path / "run")]
    with output.open("w") as sink:
        process = subprocess.Popen(command, cwd=REPO_ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, text=True)
    try:
        wait_until(lambda: "press Ctrl-C to stop" in output.read_text(), "the system to serve", timeout=DEADLINE)
        exports = dict(
            line.strip().removeprefix("export ").split("=", 1)
            for line in output.read_text().splitlines()
            if line.strip().startswith("export ")
        )
        workers = run_command([sys.executable, "-m", "nexuscrm_tools.cli", "workers", "--json"], env | exports)
        assert workers.returncode == ExitCode.OK, workers.stderr
        assert f'"flow": "{EXAMPLE_FLOW}"' in workers.stdout
        assert exports["NEXUSCRM_DSN"].startswith("sqlite:////"), exports  # absolute: works from any folder
        # The dashboard's Workers panel asks the host the runner started (Controlplane was given its target).
        dashboard = re.search(r"operator dashboard: (http://\S+)", output.read_text())
        assert dashboard is not None, output.read_text()
        with urllib.request.urlopen(f"{dashboard.group(1)}api/workers", timeout=30) as response:
            hosts = json.loads(response.read())["hosts"]
        assert [(h["target"], h["state"]) for h in hosts] == [(exports["NEXUSCRM_INTEGRATION_TARGET"], "answered")]
        assert len(hosts[0]["workers"]) == 4 and {w["flow"] for w in hosts[0]["workers"]} == {EXAMPLE_FLOW}
        process.send_signal(2)  # Ctrl-C
        assert process.wait(timeout=DEADLINE) == ExitCode.OK, output.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_a_flow_that_fails_ends_the_run_at_once_naming_each_failure(tmp_path: Path) -> None:
    # DEADLINE (5 min) is half the timeout: a run that waited it out would fail (TimeoutExpired)
    done = nexuscrm_run(
        *["--lanes", "5", "--inputs", "20", "--flow", FAILING_FLOW, "--timeout", "10m", "--workdir", str(tmp_path)],
        extra_env={"NEXUSCRM_MAX_ATTEMPTS": "2", "NEXUSCRM_RETRY_BASE_SECONDS": "1"},
    )
    said = done.stdout + done.stderr
    assert done.returncode == ExitCode.CHECK_FAILED, said
    assert "stopped at once: no generation can run any more" in said
    with sqlite3.connect(tmp_path / "nexuscrm.db") as connection:
        failed = sorted(r[0] for r in connection.execute("SELECT WorkId FROM WorkItem WHERE Status = 'failed'"))
    assert failed and len(failed) <= 5
    problem = next(line for line in said.splitlines() if "failed for good:" in line)
    assert f"{len(failed)} generation" in problem and f"ValueError: {failing_flow.MESSAGE}" in problem
    assert all(work_id in problem for work_id in failed), problem
    assert "not measured: the Flow is not the demo's" in said
    host_log = (tmp_path / "integration.log").read_text()
    assert f"failed with ValueError: {failing_flow.MESSAGE} (the whole message: GetWork)" in host_log


@pytest.mark.database
def test_a_host_that_exits_ends_the_run_with_its_summary_and_exit_9(empty_dsn: str, tmp_path: Path) -> None:
    workdir = tmp_path / "run"
    done = nexuscrm_run(
        *["--lanes", "5", "--inputs", "50", "--rate", "0", "--flow", EXITING_FLOW, "--workdir", str(workdir)],
        dsn=empty_dsn,
        extra_env={"COLUMNS": "200"},  # each summary row on one line
    )
    said = done.stdout + done.stderr
    assert done.returncode == ExitCode.CHECK_FAILED, said
    assert "Traceback" not in said
    code = exiting_flow.EXIT_CODE
    assert f"stopped at once: the Integration host exited with {code}: see {workdir / 'integration.log'}\n" in said
    assert f"flow {EXITING_FLOW}\n" in done.stdout  # the summary's title
    assert re.search(r"│ invariants M O B D X P \(every input in one generation\) +│ +OK │", done.stdout), said
    assert re.search(r"│ every generation completed +│ +not reached: the run stopped first │", done.stdout), said
    assert re.search(r"│ executions +│ +not known: the host exited │", done.stdout), said
    assert f"stopped: integration exit {code}, " in said
    engine = create_engine(empty_dsn)
    try:
        assert_invariants(engine)
    finally:
        engine.dispose()


def test_a_dsn_in_a_folder_that_does_not_exist_is_refused_naming_it(tmp_path: Path) -> None:
    database = tmp_path / "no" / "such" / "x.db"
    done = nexuscrm_run("--workdir", str(tmp_path / "run"), dsn=f"sqlite:///{database}")
    assert done.returncode == ExitCode.UNREACHABLE, done.stdout + done.stderr
    assert f"the sqlite file {database}, whose folder {database.parent} does not exist" in done.stderr
    assert not (tmp_path / "no").exists() and not (tmp_path / "run").exists()


def test_bad_counts_name_their_flag() -> None:
    for flag, value, said in [
        ("--lanes", "0", "argument --lanes: must be at least 1, got 0"),
        ("--workers", "0", "argument --workers: must be at least 1, got 0"),
        ("--inputs", "-1", "argument --inputs: must be at least 0, got -1"),
        ("--duplicates", "1", "argument --duplicates: must be below 1, got 1"),
    ]:
        done = nexuscrm_run(flag, value)
        assert done.returncode == ExitCode.USAGE and said in done.stderr, done.stderr


def test_help_is_plain_text() -> None:
    done = nexuscrm_run("--help")
    assert done.returncode == ExitCode.OK
    assert "``" not in done.stdout and "130 interrupted" in done.stdout


def test_an_unknown_flow_is_a_usage_error_before_anything_starts(tmp_path: Path) -> None:
    done = nexuscrm_run("--flow", "no_such_module:factory", "--workdir", str(tmp_path / "run"))
    assert done.returncode == ExitCode.USAGE
    assert "flow 'no_such_module:factory' cannot be imported" in done.stderr
    assert not (tmp_path / "run").exists()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _dsn_cases(server: str) -> list[tuple[str, str]]:
    host = server.split("@", 1)[1].split("/", 1)[0]
    return [
        (f"{server.rstrip('/')}/nxtest_no_such_database", "database 'nxtest_no_such_database' does not exist on"),
        (f"mysql://root:not-the-password@{host}/mysql", "authentication failed for user 'root'"),
        (f"mysql://root@127.0.0.1:{_closed_port()}/nexuscrm", "nothing is listening on 127.0.0.1:"),
        (f"mysql://root@{host}", "NEXUSCRM_DSN names no database"),
        ("postgresql://root@127.0.0.1/nexuscrm", "unsupported scheme 'postgresql'"),
    ]


@pytest.mark.database
def test_a_wrong_dsn_is_said_in_one_line_and_nothing_starts(mysql_server_dsn: str, tmp_path: Path) -> None:
    if "@" not in mysql_server_dsn or ":" in mysql_server_dsn.split("@", 1)[0].removeprefix("mysql://"):
        message = "needs a server whose root has no password (as the test machines' have)"
        if REQUIRED:
            pytest.fail(f"NEXUSCRM_TIDB_REQUIRED=1: {message}")
        pytest.skip(message)
    for dsn, cause in _dsn_cases(mysql_server_dsn):
        done = nexuscrm_run("--workdir", str(tmp_path / "run"), dsn=dsn)
        said = done.stdout + done.stderr
        assert done.returncode == ExitCode.UNREACHABLE, said
        assert cause in said, said
        assert "Traceback" not in said and "not-the-password" not in said
        assert len([line for line in said.splitlines() if line.strip()]) == 1, said
        assert not list((tmp_path / "run").glob("*.log"))  # no service was started
