"""``make test-some ARGS=...``: a chosen part of the suite with what ``make test`` sets (issue 50 item 14).

The target runs pytest with ARGS and NEXUSCRM_REPO_ROOT set to this checkout when the caller's
environment has none, so a database test needs nothing more by hand; without ARGS it refuses
(exit 2) instead of running the whole suite. ``-o setup`` skips the virtualenv's set-up and
``BIN`` names this interpreter's directory: the test checks the target, not the installation.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.architecture.test_harness import TINY_DATABASE_TEST
from tests.harness.checkouts import CORE_VARIABLE, RUNNER_ROOT

DEADLINE = 120  # seconds for one make run of one test


def make_test_some(*arguments: str) -> subprocess.CompletedProcess[str]:
    """``make test-some`` in this checkout, from an environment without NEXUSCRM_REPO_ROOT."""
    env = {name: value for name, value in os.environ.items() if name != CORE_VARIABLE}
    command = ["make", "--no-print-directory", "-o", "setup", f"BIN={Path(sys.executable).parent}", "test-some"]
    return subprocess.run(
        [*command, *arguments], cwd=RUNNER_ROOT, env=env, capture_output=True, text=True, timeout=DEADLINE
    )


def test_a_database_test_runs_through_the_target_without_setting_anything(tmp_path: Path) -> None:
    (tmp_path / "test_tiny.py").write_text(TINY_DATABASE_TEST)
    selection = f"-p tests.conftest -p no:cacheprovider -k sqlite --rootdir {tmp_path} -c {os.devnull}"
    done = make_test_some(f"ARGS={selection} {tmp_path / 'test_tiny.py'}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_without_args_the_target_refuses_instead_of_running_everything() -> None:
    done = make_test_some()
    assert done.returncode == 2, done.stdout + done.stderr
    assert "make test-some needs ARGS, the pytest arguments" in done.stderr
    assert "pytest" not in done.stdout
