"""The import-linter contracts of pyproject.toml hold on the tree and catch a planted violation.

``lint-imports`` runs in a subprocess: on the real tree with the repository's own configuration,
and on a copy of the packages in ``tmp_path`` in which a test plants imports that break one
contract each (docs/decisions/103-package-graph-enforced.md).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.architecture.packages import REPO_ROOT, load_packages

LINT_IMPORTS = str(Path(sys.executable).with_name("lint-imports"))
LAYERS = "Layers: each package imports only those below it"
SERVICES = "Services: the four services are independent"
FLOW_AUTHOR = "Flow author: the SDK, its wire conversions and workqueue need no runtime nor SQL stack"
TOOLS = "Operator tools: nexuscrm_tools imports no service package"
CONTRACTS = (LAYERS, SERVICES, FLOW_AUTHOR, TOOLS)
TIMEOUT = 120  # seconds for one lint-imports run
LINT_IMPORTS_MAIN = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def lint_imports(*args: str, cwd: Path, source: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run lint-imports without its cache; wide columns so that no contract name is wrapped.

    With ``source``, the packages are read from that folder alone: Python starts without its
    site hook (``-S``), so the editable installs' finders are not there, and finds
    import-linter through the environment's site-packages named on PYTHONPATH. (With both the
    finders and a copy on PYTHONPATH, grimp 3.20 drops some of the copy's imports at random.)
    """
    env = {**os.environ, "COLUMNS": "200"}
    command = [LINT_IMPORTS]
    if source is not None:
        env["PYTHONPATH"] = os.pathsep.join((str(source), sysconfig.get_paths()["purelib"]))
        command = [sys.executable, "-S", "-c", LINT_IMPORTS_MAIN]
    return subprocess.run(
        [*command, "--no-cache", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )


def verdicts(output: str) -> dict[str, str]:
    """Each contract's KEPT or BROKEN from lint-imports' summary."""
    found = {}
    for name in CONTRACTS:
        # A contract with ignore_imports says how many it ignored: "KEPT (1 ignored import)".
        match = re.search(rf"^{re.escape(name)} (KEPT|BROKEN)(?: \(\d+ ignored imports?\))?$", output, re.MULTILINE)
        assert match, f"lint-imports did not report the contract {name!r}:\n{output}"
        found[name] = match.group(1)
    return found


def broken_section(output: str, name: str) -> str:
    """The explanation lint-imports gives under a broken contract's heading."""
    sections = re.split(r"^(.+)\n-{3,}$", output.split("Broken contracts", 1)[-1], flags=re.MULTILINE)
    by_name = dict(zip(sections[1::2], sections[2::2], strict=True))
    assert name in by_name, f"{name!r} has no explanation in:\n{output}"
    return by_name[name]


def test_the_repository_keeps_every_contract() -> None:
    result = lint_imports(cwd=REPO_ROOT)
    output = result.stdout + result.stderr
    assert verdicts(output) == dict.fromkeys(CONTRACTS, "KEPT"), output
    assert result.returncode == 0, output


def test_layers_and_independence_hold_with_type_checking_imports_counted(tmp_path: Path) -> None:
    # The configuration leaves TYPE_CHECKING-only imports out for the Flow-author contract
    # (nexuscrm_sdk.flows names sqlalchemy types); no such import may cross a layer either.
    config = (REPO_ROOT / "pyproject.toml").read_text()
    assert config.count("exclude_type_checking_imports = true") == 1
    strict = tmp_path / "pyproject.toml"
    strict.write_text(config.replace("exclude_type_checking_imports = true", "exclude_type_checking_imports = false"))
    result = lint_imports("--config", str(strict), "--contract", "layers", "--contract", "services", cwd=REPO_ROOT)
    output = result.stdout + result.stderr
    assert f"{LAYERS} KEPT" in output and f"{SERVICES} KEPT" in output, output
    assert result.returncode == 0, output


@pytest.fixture
def tree_copy(tmp_path: Path) -> Path:
    """A copy of every package's modules under ``tmp_path/src``, and the repository's configuration."""
    source = tmp_path / "src"
    for package in load_packages().values():
        for module in package.modules:
            shutil.copytree(
                package.directory / module,
                source / module,
                ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"),
            )
    shutil.copy(REPO_ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def plant(path: Path, line: str) -> None:
    """Append an import (or any line) to a module of the copy."""
    assert path.is_file(), path
    path.write_text(path.read_text() + f"\n{line}\n")


def test_planted_violations_break_the_contract_they_violate(tree_copy: Path) -> None:
    source = tree_copy / "src"
    # A service importing another service: both the layers and the independence contract.
    plant(source / "nexuscrm_integration" / "host.py", "import nexuscrm_connectors.queue.admission  # planted")
    # A library importing one above it: the layers contract.
    plant(source / "nexuscrm_runtime" / "database.py", "import nexuscrm_schema  # planted")
    # The wire conversions importing the SDK they sit below: the layers contract.
    plant(source / "nexuscrm_wire" / "convert.py", "import nexuscrm_sdk.client  # planted")
    # The SDK, its wire conversions and workqueue importing the runtime or a SQL driver: the Flow-author contract.
    plant(source / "nexuscrm_sdk" / "client.py", "import nexuscrm_runtime.database  # planted")
    plant(source / "nexuscrm_wire" / "timestamps.py", "import sqlalchemy  # planted")
    plant(source / "workqueue" / "values.py", "import pymysql  # planted")
    # The operator tools importing a service (allowed by the layers: the tools are on top): the tools contract.
    plant(source / "nexuscrm_tools" / "cli.py", "import nexuscrm_controlplane.cutover  # planted")
    # TYPE_CHECKING-only imports stay allowed.
    plant(
        source / "workqueue" / "statuses.py",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import sqlalchemy  # planted, allowed",
    )
    result = lint_imports("--config", str(tree_copy / "pyproject.toml"), cwd=tree_copy, source=source)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert verdicts(output) == dict.fromkeys(CONTRACTS, "BROKEN"), output
    # Each contract names the planted import (the copy is read, not the installed tree).
    assert "nexuscrm_integration.host -> nexuscrm_connectors.queue.admission" in broken_section(output, SERVICES)
    layers = broken_section(output, LAYERS)
    assert "nexuscrm_integration.host -> nexuscrm_connectors.queue.admission" in layers
    assert "nexuscrm_runtime.database -> nexuscrm_schema" in layers
    assert "nexuscrm_wire.convert -> nexuscrm_sdk.client" in layers
    flow_author = broken_section(output, FLOW_AUTHOR)
    assert "nexuscrm_sdk.client -> nexuscrm_runtime.database" in flow_author
    assert "workqueue.values -> pymysql" in flow_author
    assert "nexuscrm_wire.timestamps -> sqlalchemy" in flow_author
    assert "nexuscrm_tools.cli -> nexuscrm_controlplane.cutover" in broken_section(output, TOOLS)
    assert "nexuscrm_tools.cli" not in layers
    assert "workqueue.statuses" not in output  # its import of sqlalchemy is for type checkers only


def test_the_copy_without_planted_imports_reads_like_the_repository(tree_copy: Path) -> None:
    # The planted test reads the copy, not the editable installs: the same verdicts on both.
    copied = lint_imports("--config", str(tree_copy / "pyproject.toml"), cwd=tree_copy, source=tree_copy / "src")
    real = lint_imports(cwd=REPO_ROOT)
    assert verdicts(copied.stdout) == verdicts(real.stdout), copied.stdout + real.stdout
    assert re.search(r"Analyzed \d+ files", copied.stdout), copied.stdout
