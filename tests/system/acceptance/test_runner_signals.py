"""``nexuscrm-run`` stops every service with itself, whatever signal or death ends it.

Ctrl-C during start-up exits 130 saying it was interrupted; SIGHUP (the terminal closing) and
SIGKILL of the runner leave no service running (docs/decisions/109-transport-fails-closed.md).
Only generous deadlines: no assertion on how fast.
"""

from __future__ import annotations

import os
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


@pytest.fixture
def runner(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path]]:
    workdir, output = tmp_path / "run", tmp_path / "runner.out"
    env = {**os.environ, "NEXUSCRM_DSN": f"sqlite:///{tmp_path / 'nexuscrm.db'}", "COLUMNS": "200"}
    command = [sys.executable, "-m", "nexuscrm_tools.run", "--inputs", "0", "--serve", "--workdir", str(workdir)]
    with output.open("wb") as sink:
        process = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
    yield process, workdir, output
    if process.poll() is None:
        process.kill()
        process.wait()


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
    process.send_signal(signum)
    process.wait(timeout=DEADLINE)
    wait_until(lambda: not any(_running(pid) for pid in children), "every service to stop", timeout=DEADLINE)
