"""``make run`` says the runner's own exit code; GNU make itself can only exit 2 for a failure (decision 113)."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.conftest import REPO_ROOT

pytestmark = pytest.mark.acceptance

TIMEOUT = 120.0  # seconds: no service starts, the database check refuses at once


def test_make_run_names_the_runners_exit_code() -> None:
    assert shutil.which("make") is not None, "GNU make is needed: the README's commands are make targets"
    make = ["make", "--no-print-directory", "-C", str(REPO_ROOT)]
    runtime = subprocess.run([*make, "-q", "runtime"], check=False)
    assert runtime.returncode == 0, "the runtime environment is not up to date: make run would install it first"
    env = {**os.environ, "NEXUSCRM_DSN": "postgresql://someone@127.0.0.1/crm"}
    done = subprocess.run(
        [*make, "run", "ARGS=--inputs 0"], env=env, capture_output=True, text=True, timeout=TIMEOUT, check=False
    )
    assert done.returncode == 2, done.stdout + done.stderr  # make's own code for any failed recipe
    assert "unsupported scheme 'postgresql'" in done.stderr
    assert "nexuscrm-run exited with 3 (docs: exit codes); make reports it as Error 3 and exits 2" in done.stderr
    assert "Error 3" in done.stderr.splitlines()[-1]  # make's own line says the same code
