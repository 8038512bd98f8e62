"""One version line per owner, single-sourced, and first-party dependencies as compatible ranges.

owners.toml names each owner's package directories; each package's version lives only in its
pyproject.toml. An owner's packages agree on one version; nexuscrm-protos carries the wire
contract's version, the newest of protos/CHANGELOG.md. Every dependency on another nexuscrm
package is a range of that package's compatibility line (0.x: ``>=0.2,<0.3``; from 1.0:
``>=1.2,<2``), never a bare name nor a path (docs/decisions/143-owners-versions-and-ranges.md).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tests.architecture.packages import PACKAGE_DIRS, REPO_ROOT, Package, canonical_name, load_packages

PROTOS = "nexuscrm-protos"
CONTRACT_CHANGELOG = REPO_ROOT / "protos" / "CHANGELOG.md"
RELEASE_HEADING = re.compile(r"^## (\d+\.\d+\.\d+)\b", re.MULTILINE)


def owners() -> dict[str, list[str]]:
    """Each owner's package directories, as owners.toml (and PACKAGE_DIRS) name them."""
    document = tomllib.loads((REPO_ROOT / "owners.toml").read_text())
    return {name: list(entry["packages"]) for name, entry in document["owners"].items()}


def by_directory() -> dict[str, Package]:
    return {p.directory.relative_to(REPO_ROOT).as_posix(): p for p in load_packages().values()}


def compatible_range(version: str) -> SpecifierSet:
    """The range a dependent declares on ``version``'s compatibility line."""
    released = Version(version)
    if released.major == 0:
        return SpecifierSet(f">=0.{released.minor},<0.{released.minor + 1}")
    return SpecifierSet(f">={released.major}.{released.minor},<{released.major + 1}")


def test_owners_cover_every_package_exactly_once() -> None:
    listed = [d for directories in owners().values() for d in directories]
    repeated = sorted({d for d in listed if listed.count(d) > 1})
    assert not repeated, f"owned twice: {repeated}"
    assert sorted(listed) == sorted(PACKAGE_DIRS), sorted(set(listed) ^ set(PACKAGE_DIRS))


@pytest.mark.parametrize("owner", sorted(owners()))
def test_an_owners_packages_share_one_version(owner: str) -> None:
    packages = by_directory()
    versions = {d: packages[d].version for d in owners()[owner] if packages[d].name != PROTOS}
    print(f"{owner}: {versions}")
    assert len(set(versions.values())) == 1, f"{owner} releases its packages on one version line: {versions}"


def test_protos_version_is_the_contracts_newest_release() -> None:
    (protos,) = [p for p in load_packages().values() if p.name == PROTOS]
    releases = RELEASE_HEADING.findall(CONTRACT_CHANGELOG.read_text())
    assert releases, f"{CONTRACT_CHANGELOG} names no release"
    assert protos.version == releases[0], (protos.version, releases)
    assert releases == sorted(releases, key=Version, reverse=True), releases


def test_versions_live_only_in_pyproject() -> None:
    for directory, package in by_directory().items():
        project = tomllib.loads((REPO_ROOT / directory / "pyproject.toml").read_text())["project"]
        assert "version" not in project.get("dynamic", []), directory
        assert str(Version(package.version)) == package.version, (directory, package.version)


@pytest.mark.parametrize("directory", PACKAGE_DIRS)
def test_first_party_dependencies_declare_compatible_ranges(directory: str) -> None:
    packages = load_packages()
    for written in by_directory()[directory].requires:
        requirement = Requirement(written)
        name = canonical_name(requirement.name)
        if name not in packages:
            continue
        assert requirement.url is None, f"{directory} names {name} by a path or URL: {written!r}"
        expected = compatible_range(packages[name].version)
        assert requirement.specifier == expected, f"{directory}: {written!r}, expected {name}{expected}"
        assert packages[name].version in requirement.specifier


def test_every_package_publishes_the_same_licence_and_urls() -> None:
    urls = {}
    for directory in PACKAGE_DIRS:
        project = tomllib.loads((REPO_ROOT / directory / "pyproject.toml").read_text())["project"]
        assert project["readme"] == "README.md" and (REPO_ROOT / directory / "README.md").is_file(), directory
        assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"], directory
        licence = Path(REPO_ROOT / directory / "LICENSE")
        assert licence.read_bytes() == (REPO_ROOT / "LICENSE").read_bytes(), directory
        urls[directory] = project["urls"]
    assert len({tuple(u.items()) for u in urls.values()}) == 1, urls
    (base,) = {u["Homepage"] for u in urls.values()}
    assert all(url.startswith(base) for url in urls["tools"].values()), urls["tools"]
