"""The cross-checkout harness (tests/harness): checkouts, version ranges, provenance, NEXUSCRM_REPO_ROOT."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import nexuscrm_schema_catalog
from tests.harness.checkouts import (
    CORE_VARIABLE,
    RUNNER_ROOT,
    commit_of,
    core_checkout_problem,
    load_owners,
    load_packages,
    project_file,
    read_project,
    resolve_checkouts,
)
from tests.harness.run import EXIT_CHECK_FAILED, PYTEST_NO_TESTS, header_lines, outcome

DEADLINE = 120
CONNECTORS = next(owner for owner in load_owners() if owner.variable == "NEXUSCRM_CONNECTORS_ROOT")
RUNTIME_VERSION = read_project(project_file(RUNNER_ROOT / "libs/runtime"))["version"]


def harness(*args: str, connectors: Path) -> subprocess.CompletedProcess[str]:
    """``python -m tests.harness`` with Connectors from ``connectors`` and every other owner from this checkout."""
    variables = {owner.variable for owner in load_owners()}
    env = {name: value for name, value in os.environ.items() if name not in variables}
    env[CONNECTORS.variable] = str(connectors)
    command = [sys.executable, "-m", "tests.harness", *args]
    return subprocess.run(command, cwd=RUNNER_ROOT, env=env, capture_output=True, text=True, timeout=DEADLINE)


def connectors_tree(root: Path, *, version: str | None = None, runtime: str | None = None) -> Path:
    """A Connectors checkout of pyproject files only: the runner's, or at ``version`` needing ``runtime``."""
    for relative in CONNECTORS.packages:
        target = root / relative / "pyproject.toml"
        target.parent.mkdir(parents=True)
        text = project_file(RUNNER_ROOT / relative).read_text()
        if version is not None:
            project = read_project(project_file(RUNNER_ROOT / relative))
            text = text.replace(f'version = "{project["version"]}"', f'version = "{version}"', 1)
            text = text.replace("dependencies = [", f'dependencies = ["nexuscrm-runtime{runtime}", ', 1)
        target.write_text(text)
    return root


def test_checkouts_whose_versions_fit_each_others_ranges_pass_the_check(tmp_path: Path) -> None:
    tree = connectors_tree(tmp_path / "connectors")
    result = harness("check", connectors=tree)
    assert result.returncode == 0, result.stderr
    assert f"connectors from {CONNECTORS.variable}={tree}, not a git checkout" in result.stdout


def test_a_version_outside_a_declared_range_is_named_and_the_check_fails_with_9(tmp_path: Path) -> None:
    tree = connectors_tree(tmp_path / "connectors", version="0.3.0", runtime=">=0.3,<0.4")
    result = harness("check", connectors=tree)
    assert result.returncode == EXIT_CHECK_FAILED
    assert "Traceback" not in result.stderr
    core = f"{CORE_VARIABLE}={RUNNER_ROOT}, {commit_of(RUNNER_ROOT)}"
    expected = (
        f"nexuscrm-connectors 0.3.0 ({CONNECTORS.variable}={tree}, not a git checkout) "
        f"needs nexuscrm-runtime>=0.3,<0.4; Core schema catalog ({core}) provides nexuscrm-runtime {RUNTIME_VERSION}"
    )
    assert expected in result.stderr
    # The other direction too: the runner's owners need the Connectors line they declare.
    assert "provides nexuscrm-connectors-sdk 0.3.0" in result.stderr


def test_a_variable_naming_no_checkout_of_its_owner_is_a_usage_error(tmp_path: Path) -> None:
    result = harness("check", connectors=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"{CONNECTORS.variable}={tmp_path} is not a checkout of Connectors: "
        "no pyproject.toml in libs/connectors_sdk, services/connectors"
    )


@pytest.fixture
def second_worktree(tmp_path: Path) -> Iterator[Path]:
    """A detached worktree of the runner's HEAD, removed afterwards."""
    if shutil.which("git") is None or commit_of(RUNNER_ROOT) == "not a git checkout":
        pytest.skip("the runner's checkout is not a git checkout")
    path = tmp_path / "worktree"
    git = ["git", "-C", str(RUNNER_ROOT), "worktree"]
    subprocess.run([*git, "add", "--quiet", "--detach", str(path), "HEAD"], check=True, timeout=DEADLINE)
    try:
        yield path
    finally:
        subprocess.run([*git, "remove", "--force", str(path)], check=True, timeout=DEADLINE)


def test_the_header_names_each_packages_checkout_and_commit(second_worktree: Path) -> None:
    (second_worktree / "services" / "connectors" / "CHANGED").write_text("a change in the tree\n")
    checkouts = resolve_checkouts(load_owners(), {CONNECTORS.variable: str(second_worktree)})
    lines = header_lines(load_packages(checkouts))
    head = subprocess.run(
        ["git", "-C", str(RUNNER_ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert lines[0].split() == ["distribution", "version", "owner", "checkout", "commit"]
    assert rows["nexuscrm-connectors"][2:] == ["connectors", str(second_worktree.resolve()), f"{head}+dirty"]
    assert rows["nexuscrm-connectors-sdk"][2:] == ["connectors", str(second_worktree.resolve()), f"{head}+dirty"]
    assert rows["nexuscrm-runtime"][2:] == ["schema-catalog", str(RUNNER_ROOT), commit_of(RUNNER_ROOT)]
    assert rows["nexuscrm-runtime"][1] == RUNTIME_VERSION
    assert len(rows) == sum(len(owner.packages) for owner in load_owners())


def test_sessions_without_tests_fail_the_run_only_when_every_session_has_none() -> None:
    assert outcome([PYTEST_NO_TESTS, 0]) == 0
    assert outcome([PYTEST_NO_TESTS, PYTEST_NO_TESTS]) == 1
    assert outcome([0, 3, 1]) == 3


TINY_DATABASE_TEST = "def test_needs_a_database(empty_dsn):\n    assert empty_dsn\n"


def tiny_pytest(tmp_path: Path, core: str | None) -> subprocess.CompletedProcess[str]:
    """A one-test pytest session on this tree's conftest, with NEXUSCRM_REPO_ROOT set to ``core``."""
    (tmp_path / "test_tiny.py").write_text(TINY_DATABASE_TEST)
    env = {name: value for name, value in os.environ.items() if name != CORE_VARIABLE}
    env |= {CORE_VARIABLE: core} if core is not None else {}
    command = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider", "-k", "sqlite"]
    command += ["--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "test_tiny.py")]
    return subprocess.run(command, cwd=RUNNER_ROOT, env=env, capture_output=True, text=True, timeout=DEADLINE)


def test_database_fixtures_fail_with_one_clear_message_without_nexuscrm_repo_root(tmp_path: Path) -> None:
    result = tiny_pytest(tmp_path, None)
    assert result.returncode == 1
    assert core_checkout_problem(None) in result.stdout
    assert "Traceback" not in result.stdout


def test_database_fixtures_fail_when_nexuscrm_repo_root_holds_no_core_checkout(tmp_path: Path) -> None:
    result = tiny_pytest(tmp_path, str(tmp_path))
    assert result.returncode == 1
    problem = f"{CORE_VARIABLE}={tmp_path} is not a Core checkout (no services/schema_catalog nor libs/schema)"
    assert problem in result.stdout


def test_database_fixtures_run_with_nexuscrm_repo_root_naming_a_core_checkout(tmp_path: Path) -> None:
    result = tiny_pytest(tmp_path, str(RUNNER_ROOT))
    assert result.returncode == 0, result.stdout
    assert "1 passed" in result.stdout


def test_the_schema_catalog_is_imported_from_the_core_checkout_named() -> None:
    problem = core_checkout_problem(os.environ.get(CORE_VARIABLE))
    if problem:
        pytest.fail(problem, pytrace=False)
    core = Path(os.environ[CORE_VARIABLE]).resolve()
    assert Path(nexuscrm_schema_catalog.__file__).resolve().is_relative_to(core)
