"""A Flow author's path to testing: the SDK's ``testing`` extra, outside this repository's settings.

A virtual environment outside the checkout gets the SDK with its ``testing`` extra, installed
as the SDK's README says (editable, pinned by requirements/constraints.txt); the README's own
example Flow and test are written to a folder outside the checkout and run with that
environment's pytest and no configuration file: this repository's ``filterwarnings = error``
and ``--timeout`` do not apply there.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[3]  # the checkout whose SDK the Flow author installs


pytestmark = pytest.mark.slow

SDK_README = REPO_ROOT / "libs" / "connectors_sdk" / "README.md"
INSTALL_TIMEOUT = 600.0  # seconds: resolving the extra's pytest may download it


def readme_example() -> str:
    """The Python example of the SDK README's "Testing a Flow" section."""
    section = SDK_README.read_text().split("## Testing a Flow", 1)[1]
    found = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert found is not None, "the SDK README has no Python example under Testing a Flow"
    return found.group(1)


def run(command: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "PYTHONPATH"))}
    env["PYTHONWARNINGS"] = "ignore:Editable installation"  # setuptools' notice, as the Makefile quiets it
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def test_the_testing_extra_runs_a_flows_own_tests_outside_the_repository(tmp_path: Path) -> None:
    assert not tmp_path.is_relative_to(REPO_ROOT)
    venv = tmp_path / "venv"
    made = run([sys.executable, "-m", "venv", str(venv)], tmp_path, INSTALL_TIMEOUT)
    assert made.returncode == 0, made.stderr
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--quiet", "-c", str(REPO_ROOT / "requirements" / "constraints.txt")]
    packages = ["-e", "protos/python", "-e", "libs/workqueue", "-e", "libs/connectors_sdk[testing]"]
    installed = run([*pip, *packages], REPO_ROOT, INSTALL_TIMEOUT)
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert "Editable installation" not in installed.stderr

    flows = tmp_path / "author" / "myflows"
    flows.mkdir(parents=True)
    (flows / "test_shout.py").write_text(readme_example())
    tested = run(
        [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", "/dev/null", "myflows"], flows.parent, 300
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "1 passed" in tested.stdout, tested.stdout
