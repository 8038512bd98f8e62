"""Owners, their checkouts and the packages each checkout provides.

owners.toml of the runner's checkout is the truth for who owns which package directories and
tests and by which variable an owner is taken from another checkout. Versions and first-party
requirements are read from the pyproject.toml files of the checkout that provides the package.
Only the standard library and ``packaging`` are used: this runs before anything is installed.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

RUNNER_ROOT = Path(__file__).resolve().parents[2]
FIRST_PARTY_PREFIX = "nexuscrm-"
# The specification's name for the candidate Core (schema-catalog owner) checkout.
CORE_VARIABLE = "NEXUSCRM_REPO_ROOT"
CORE_CHECKOUT_PARTS = ("services/schema_catalog", "libs/schema")


class CheckoutError(Exception):
    """A checkout variable names something the harness cannot use; the message says what."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Owner:
    """One owner of owners.toml: its package directories and test directories, relative."""

    name: str
    title: str
    variable: str
    packages: tuple[str, ...]
    tests: tuple[str, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Checkout:
    """Where one owner is taken from: the path its variable names (or the runner's checkout)."""

    owner: Owner
    path: Path

    @property
    def named(self) -> bool:
        """True when the variable names another checkout than the runner's."""
        return self.path != RUNNER_ROOT

    def describe(self) -> str:
        """``VARIABLE=path, commit``: how every report names a checkout."""
        return f"{self.owner.variable}={self.path}, {commit_of(self.path)}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Package:
    """One distribution as a checkout provides it."""

    name: str  # normalized distribution name
    version: str
    directory: Path
    first_party: tuple[str, ...]  # requirements on nexuscrm-* distributions, as written
    third_party: tuple[str, ...]  # every other requirement, as written
    checkout: Checkout


def load_owners(root: Path = RUNNER_ROOT) -> tuple[Owner, ...]:
    """The owners of ``root``/owners.toml, in its order (Core first)."""
    document = tomllib.loads((root / "owners.toml").read_text())
    return tuple(
        Owner(
            name=name,
            title=entry["title"],
            variable=entry["checkout"],
            packages=tuple(entry["packages"]),
            tests=tuple(entry["tests"]),
        )
        for name, entry in document["owners"].items()
    )


def resolve_checkouts(owners: tuple[Owner, ...], environ: Mapping[str, str] = os.environ) -> tuple[Checkout, ...]:
    """Each owner's checkout: its variable's path, else the runner's checkout.

    Raises CheckoutError when a named path is not a directory holding the owner's packages.
    """
    checkouts = []
    for owner in owners:
        value = environ.get(owner.variable, "")
        path = Path(value).resolve() if value else RUNNER_ROOT
        missing = [p for p in owner.packages if not project_file(path / p).is_file()]
        if missing:
            raise CheckoutError(
                f"{owner.variable}={value or path} is not a checkout of {owner.title}: "
                f"no pyproject.toml in {', '.join(missing)}"
            )
        checkouts.append(Checkout(owner=owner, path=path))
    return tuple(checkouts)


def project_file(directory: Path) -> Path:
    """The pyproject.toml of an owners.toml package directory (each names the one it holds)."""
    return directory / "pyproject.toml"


def load_packages(checkouts: tuple[Checkout, ...]) -> tuple[Package, ...]:
    """Every package of every owner, read from that owner's checkout."""
    packages = []
    for checkout in checkouts:
        for relative in checkout.owner.packages:
            path = project_file(checkout.path / relative)
            project = read_project(path)
            if "version" not in project:
                raise CheckoutError(f"{path} declares no static version")
            requirements = [r.strip() for r in project.get("dependencies", ())]
            ours = [canonicalize_name(Requirement(r).name).startswith(FIRST_PARTY_PREFIX) for r in requirements]
            packages.append(
                Package(
                    name=canonicalize_name(project["name"]),
                    version=project["version"],
                    directory=path.parent,
                    first_party=tuple(r for r, first in zip(requirements, ours, strict=True) if first),
                    third_party=tuple(r for r, first in zip(requirements, ours, strict=True) if not first),
                    checkout=checkout,
                )
            )
    return tuple(packages)


def read_project(path: Path) -> dict[str, Any]:
    """The ``[project]`` table of the pyproject.toml at ``path``."""
    project: dict[str, Any] = tomllib.loads(path.read_text())["project"]
    return project


@functools.cache
def commit_of(path: Path) -> str:
    """The short commit of the checkout at ``path``, ``+dirty`` when its tree has changes."""
    try:
        head = _git(path, "rev-parse", "--short", "HEAD")
        changes = _git(path, "status", "--porcelain")
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"
    return head + ("+dirty" if changes else "")


def _git(path: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, check=True).stdout.strip()


def core_checkout_problem(value: str | None) -> str | None:
    """Why ``value`` of NEXUSCRM_REPO_ROOT cannot name the Core checkout, or None when it does."""
    advice = f"set it to the Core checkout whose canonical schema the tests apply (this checkout: {RUNNER_ROOT})"
    if not value:
        return f"{CORE_VARIABLE} is not set: {advice}; `make test` and the runner set it"
    missing = [part for part in CORE_CHECKOUT_PARTS if not (Path(value) / part).is_dir()]
    if missing:
        return f"{CORE_VARIABLE}={value} is not a Core checkout (no {' nor '.join(missing)}): {advice}"
    return None
