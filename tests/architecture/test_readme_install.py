"""The install commands of the "Deploy one owner" page install what they name (issue 50 item 1).

Each ``pip install ./...`` line of docs/how-to/deploy-one-owner.md installs by path: every package it lists must
come with every first-party package that one declares (its closure, ``packages.closure``), or
pip looks for the missing one in an index that does not serve it. Every service has a line.
Each service's line runs for real: a clean copy of the tree, a fresh virtualenv, the command
as the page writes it (third-party packages from pip's index, as a deployer gets them).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.architecture.distributions import copy_clean_tree
from tests.architecture.packages import REPO_ROOT, SERVICES, Package, closure, load_packages

PAGE = REPO_ROOT / "docs" / "how-to" / "deploy-one-owner.md"
PIP_TIMEOUT = 600  # seconds for one pip command (a cold cache downloads from the index)


def install_commands() -> list[str]:
    """Every ``pip install`` line of the page, as written."""
    return [line.strip() for line in PAGE.read_text().splitlines() if line.strip().startswith("pip install ")]


def installed_by(command: str, packages: dict[str, Package]) -> set[str]:
    """The distributions a command's paths name; each argument must be the path of a package directory."""
    by_directory = {f"./{p.directory.relative_to(REPO_ROOT).as_posix()}": name for name, p in packages.items()}
    arguments = shlex.split(command)[2:]
    unknown = [argument for argument in arguments if argument not in by_directory]
    assert not unknown, f"{command!r} names {unknown}: no index serves these packages, install by path"
    return {by_directory[argument] for argument in arguments}


def test_each_install_command_holds_every_package_its_packages_need() -> None:
    packages = load_packages()
    commands = install_commands()
    assert len(commands) >= len(SERVICES), commands
    for command in commands:
        named = installed_by(command, packages)
        needed = {dependency for name in named for dependency in closure(packages, name)}
        assert needed - named == set(), f"{command!r} lacks {sorted(needed - named)}"
        assert len(named & set(SERVICES)) <= 1, f"{command!r} installs several services"


def test_every_service_and_the_tools_have_an_install_command() -> None:
    packages = load_packages()
    covered = set().union(*(installed_by(command, packages) for command in install_commands()))
    assert {*SERVICES, "nexuscrm-tools"} <= covered, sorted({*SERVICES, "nexuscrm-tools"} - covered)


@pytest.mark.slow
@pytest.mark.parametrize("service", SERVICES)
def test_each_service_command_installs_into_a_clean_virtualenv(service: str, tmp_path: Path) -> None:
    packages = load_packages()
    (command,) = [c for c in install_commands() if service in installed_by(c, packages)]
    tree = copy_clean_tree(tmp_path / "tree")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "--quiet", "--disable-pip-version-check", *shlex.split(command)[1:]]
    done = subprocess.run(pip, cwd=tree, capture_output=True, text=True, timeout=PIP_TIMEOUT, check=False)
    assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
    assert (venv / "bin" / service).is_file()  # each service's console script is named after it
    main = f"{service.replace('-', '_')}.main"
    imported = subprocess.run(
        [python, "-I", "-c", f"import {main}"], capture_output=True, text=True, timeout=120, check=False
    )
    assert imported.returncode == 0, imported.stderr
