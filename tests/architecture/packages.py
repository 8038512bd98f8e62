"""The repository's packages and their declared dependencies, read from their pyproject.toml files.

``python -m tests.architecture.packages`` (``make deps``) prints each package's declared
dependencies, the first-party closure a deployment of it installs, and exits 1 when a service
names another service. The architecture tests use the same reading
(docs/decisions/103-package-graph-enforced.md).
"""

from __future__ import annotations

import dataclasses
import re
import sys
import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
# The directories of the Makefile's PACKAGES, bottom to top.
PACKAGE_DIRS = (
    "protos/python",
    "libs/workqueue",
    "libs/runtime",
    "libs/schema",
    "libs/connectors_sdk",
    "services/schema_catalog",
    "services/controlplane",
    "services/connectors",
    "services/integration",
    "tools",
)
# nexuscrm-protos lists its packages in its setup.py: nexuscrm is generated from the contract when
# it is built, nexuscrm_wire is written by hand.
GENERATED_MODULES = {"protos/python": ("nexuscrm", "nexuscrm_wire")}
SERVICES = ("nexuscrm-schema-catalog", "nexuscrm-controlplane", "nexuscrm-connectors", "nexuscrm-integration")
FIRST_PARTY_PREFIX = "nexuscrm-"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def canonical_name(requirement: str) -> str:
    """The normalized distribution name of a requirement string ("SQLAlchemy>=2" -> "sqlalchemy")."""
    match = _NAME.match(requirement.strip())
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(0)).lower()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Package:
    """One distribution of the repository: where it lives, what it ships and what it declares."""

    name: str
    version: str
    directory: Path
    modules: tuple[str, ...]  # top-level import names it ships
    requires: tuple[str, ...]  # [project] dependencies, as written

    @property
    def first_party(self) -> tuple[str, ...]:
        """The declared nexuscrm-* distributions, normalized."""
        return tuple(n for n in map(canonical_name, self.requires) if n.startswith(FIRST_PARTY_PREFIX))

    @property
    def third_party(self) -> tuple[str, ...]:
        """The declared requirements of other distributions, as written."""
        return tuple(r for r in self.requires if not canonical_name(r).startswith(FIRST_PARTY_PREFIX))


def load_packages(root: Path = REPO_ROOT) -> dict[str, Package]:
    """Every package of ``PACKAGE_DIRS`` under ``root`` by its normalized distribution name."""
    packages: dict[str, Package] = {}
    for relative in PACKAGE_DIRS:
        directory = root / relative
        project = tomllib.loads((directory / "pyproject.toml").read_text())
        find = project["tool"]["setuptools"].get("packages", {}).get("find")
        name = canonical_name(project["project"]["name"])
        packages[name] = Package(
            name=name,
            version=project["project"]["version"],
            directory=directory,
            modules=tuple(i.rstrip("*") for i in find["include"]) if find else GENERATED_MODULES[relative],
            requires=tuple(project["project"].get("dependencies", ())),
        )
    return packages


def closure(packages: Mapping[str, Package], name: str) -> list[str]:
    """``name`` and every first-party package it depends on, transitively, bottom first."""
    ordered: list[str] = []

    def visit(current: str, path: tuple[str, ...]) -> None:
        if current in ordered:
            return
        if current in path:
            raise ValueError(f"dependency cycle: {' -> '.join((*path, current))}")
        if current not in packages:
            raise ValueError(f"{path[-1]} declares {current}, which is not a package of this repository")
        for dependency in packages[current].first_party:
            visit(dependency, (*path, current))
        ordered.append(current)

    visit(name, ())
    return ordered


def third_party_requirements(packages: Mapping[str, Package], names: Iterable[str]) -> list[str]:
    """The third-party requirements, as written, that the packages ``names`` declare."""
    return sorted({r for n in names for r in packages[n].third_party}, key=str.lower)


def services_named(packages: Mapping[str, Package], name: str) -> list[str]:
    """The other services that ``name``'s first-party closure contains (empty for a sound graph)."""
    return [n for n in closure(packages, name) if n in SERVICES and n != name]


def main() -> int:
    """Print each package's declared dependencies; 1 when a service depends on another service."""
    packages = load_packages()
    status = 0
    for name, package in packages.items():
        print(f"{name} ({package.directory.relative_to(REPO_ROOT)})")
        print(f"  declares:  {', '.join(package.requires) or '(nothing)'}")
        print(f"  installs:  {', '.join(closure(packages, name)[:-1]) or '(no other nexuscrm package)'}")
        if name in SERVICES and (others := services_named(packages, name)):
            print(f"  VIOLATION: depends on another service: {', '.join(others)}")
            status = 1
    print("no service depends on another service" if status == 0 else "a service depends on another service")
    return status


if __name__ == "__main__":
    sys.exit(main())
