"""``nexuscrm-run`` stops every service with itself, whatever signal or death ends it.

Ctrl-C during start-up exits 130 saying it was interrupted; Ctrl-C during the run exits 130
with a summary that marks the projection "not checked", not failed; SIGHUP (the terminal
closing) and SIGKILL of the runner leave no service running
(docs/decisions/109-transport-fails-closed.md). Each service shows in ``ps`` by its name.
Only generous deadlines: no assertion on how fast.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.waiting import wait_until

DEADLINE = 120.0  # seconds: start-up of four services on a loaded machine, or their stop


def _children(pid: int) -> set[int]:
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with open(task / "children") as listing:
            found |= {int(child) for child in listing.read().split()}
    return found


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


def _title(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()


def _start(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
    workdir, output = tmp_path / "run", tmp_path / "runner.out"
    env = {**os.environ, "NEXUSCRM_DSN": f"sqlite:///{tmp_path / 'nexuscrm.db'}", "COLUMNS": "200"}
    command = [sys.executable, "-m", "nexuscrm_tools.run", *args, "--workdir", str(workdir)]
    with output.open("wb") as sink:
        process = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
    return process, workdir, output


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path]]:
    process, workdir, output = _start(tmp_path, "--inputs", "0", "--serve")
    yield process, workdir, output
    if process.poll() is None:
        process.kill()
        process.wait()


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_ctrl_c_during_the_run_exits_130_with_the_projection_not_checked(tmp_path: Path) -> None:
    process, _, output = _start(tmp_path, "--lanes", "3", "--inputs", "100000", "--rate", "50")
    try:
        wait_until(lambda: "operator dashboard:" in output.read_text(), "the run to start", timeout=DEADLINE)
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=DEADLINE) == 130, output.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    said = output.read_text()
    assert re.search(r"projection equals the inputs\s*│\s*not checked: interrupted", said), said
    assert "interrupted before every admitted input was projected" in said
    assert "problem" not in said, said  # nothing reads as a failed check


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_ctrl_c_during_start_up_exits_130_saying_so_and_stops_what_started(
    runner: tuple[subprocess.Popen[bytes], Path, Path],
) -> None:
    process, workdir, output = runner
    wait_until(lambda: (workdir / "schema-catalog.port").exists(), "the first service to bind", timeout=DEADLINE)
    children = _children(process.pid)
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=DEADLINE) == 130, output.read_text()
    assert "interrupted" in output.read_text()
    assert "serving; for the operator CLI" not in output.read_text()
    wait_until(lambda: not any(_running(pid) for pid in children), "the started services to stop", timeout=DEADLINE)


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc and PR_SET_PDEATHSIG")
@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGKILL])
def test_every_service_stops_with_the_runner(
    runner: tuple[subprocess.Popen[bytes], Path, Path], signum: signal.Signals
) -> None:
    process, _, output = runner
    wait_until(lambda: "press Ctrl-C to stop" in output.read_text(), "the system to serve", timeout=DEADLINE)
    children = _children(process.pid)
    assert len(children) == 4, children
    titles = {_title(pid) for pid in children}  # what ps shows: the service, and who launched it
    assert titles == {
        f"nexuscrm-{name} (launched by {process.pid})"
        for name in ("schema-catalog", "connectors", "controlplane", "integration")
    }
    process.send_signal(signum)
    process.wait(timeout=DEADLINE)
    wait_until(lambda: not any(_running(pid) for pid in children), "every service to stop", timeout=DEADLINE)
