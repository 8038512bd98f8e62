"""Each owner's previous release, built from its commit into a virtualenv of its own.

owners.toml records every owner's previous release (``previous = {version, commit}``). A
release is built as that commit's Makefile built it: the commit's tree extracted with
``git archive`` (nothing of the checkout is touched), a virtualenv next to it, grpcio-tools and
protobuf under the commit's requirements/constraints.txt, the commit's protos/generate.py,
then every first-party package of the commit installed editable under the same constraints.
Its service processes then run from that virtualenv (``PreviousRelease.python``), never from
the current one.

Where: ``cache_root/<commit>/{src,venv}``. The tier's session gives a temporary directory
outside the checkout (built once per commit per session); NEXUSCRM_COMPAT_CACHE names a
directory to keep builds in across runs instead (a build is reused once its stamp exists: a
commit's tree and constraints never change). A commit missing from the clone (a shallow or
partial clone) is a failure that says how to fetch it, never a skip.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar

REPO_ROOT = Path(__file__).resolve().parents[2]
CACHE_VARIABLE = "NEXUSCRM_COMPAT_CACHE"
EXTRACT = 'git -C "$1" archive "$2" | tar -x -C "$3"'  # bash: repository, commit, destination
STAMP = "built.json"  # written last: a directory without it is a build that did not finish
OUTPUT_TAIL = 40  # lines of a failed command's output quoted in the error
BUILD_TIMEOUT = 900  # seconds a test that may build a release can take (the build took 45 s to 2.5 min)


class PreviousReleaseError(RuntimeError):
    """A previous release cannot be built; the message says which, why and what to do."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Release:
    """One owner's previous release as owners.toml records it."""

    owner: str
    version: str
    commit: str


def recorded_releases(root: Path = REPO_ROOT) -> dict[str, Release]:
    """Every owner's ``previous`` of ``root``/owners.toml, by owner name."""
    owners = tomllib.loads((root / "owners.toml").read_text())["owners"]
    missing = [name for name, entry in owners.items() if "previous" not in entry]
    if missing:
        raise PreviousReleaseError(f"owners.toml records no previous release for {', '.join(missing)}")
    return {
        name: Release(owner=name, version=entry["previous"]["version"], commit=entry["previous"]["commit"])
        for name, entry in owners.items()
    }


@dataclasses.dataclass(frozen=True, kw_only=True)
class PreviousRelease:
    """A built previous release: its extracted tree and virtualenv, and what the build took."""

    commit: str
    source: Path
    venv: Path
    seconds: dict[str, float]  # per build step; empty when an earlier run's build was reused

    @property
    def python(self) -> str:
        """The interpreter of the release's virtualenv: what runs its services."""
        return str(self.venv / "bin" / "python")

    def console_module(self, script: str) -> str:
        """The module the virtualenv's console script ``script`` runs (``nexuscrm-connectors`` -> its main module)."""
        path = self.venv / "bin" / script
        if not path.is_file():
            raise PreviousReleaseError(f"the build of {self.commit} has no console script {script} in {path.parent}")
        for line in path.read_text().splitlines():
            if line.startswith("from ") and line.endswith(" import main"):
                return line.removeprefix("from ").removesuffix(" import main")
        raise PreviousReleaseError(f"{path} does not name the module it runs")


def build_release(commit: str, cache_root: Path, *, repo: Path = REPO_ROOT) -> PreviousRelease:
    """The release of ``commit`` under ``cache_root``: reused when built before, else built now."""
    target = cache_root / commit
    source, venv, stamp = target / "src", target / "venv", target / STAMP
    if stamp.is_file():
        return PreviousRelease(commit=commit, source=source, venv=venv, seconds={})
    require_commit(commit, repo)
    shutil.rmtree(target, ignore_errors=True)  # a build that stopped halfway starts again
    source.mkdir(parents=True)
    seconds: dict[str, float] = {}
    constraints = str(source / "requirements" / "constraints.txt")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "-c", constraints]
    # Each command is made when its step runs: the package list is read from the extracted tree.
    steps: list[tuple[str, Callable[[], list[str]]]] = [
        ("extract", lambda: ["bash", "-o", "pipefail", "-c", EXTRACT, "-", str(repo), commit, str(source)]),
        ("virtualenv", lambda: [sys.executable, "-m", "venv", str(venv)]),
        ("protoc", lambda: [*pip, "grpcio-tools", "protobuf"]),
        ("generate", lambda: [str(venv / "bin" / "python"), str(source / "protos" / "generate.py")]),
        ("install", lambda: [*pip, *(arg for package in first_party_packages(source) for arg in ("-e", str(package)))]),
    ]
    for name, command in steps:
        started = time.monotonic()
        run_step(commit, name, command(), cwd=source)
        seconds[name] = time.monotonic() - started
    stamp.write_text(json.dumps({"commit": commit, "seconds": seconds}, indent=2))
    return PreviousRelease(commit=commit, source=source, venv=venv, seconds=seconds)


def require_commit(commit: str, repo: Path) -> None:
    """Fail, saying how to fetch it, when ``commit`` is not in the clone at ``repo``."""
    found = subprocess.run(
        ["git", "-C", str(repo), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True, check=False
    )
    if found.returncode == 0:
        return
    shallow = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--is-shallow-repository"], capture_output=True, text=True, check=False
    ).stdout.strip()
    kind = "a shallow clone" if shallow == "true" else "this clone"
    raise PreviousReleaseError(
        f"commit {commit} (a previous release in owners.toml) is not in {kind} at {repo}: "
        f"fetch it with `git -C {repo} fetch --unshallow` or `git -C {repo} fetch origin {commit}`, "
        "then run the compatibility tier again"
    )


def first_party_packages(source: Path) -> list[Path]:
    """The directories of the tree's distributions: every pyproject.toml with a [project] but the root's."""
    found = [*source.glob("*/pyproject.toml"), *source.glob("*/*/pyproject.toml")]
    return sorted(path.parent for path in found if "project" in tomllib.loads(path.read_text()))


def run_step(commit: str, name: str, command: list[str], *, cwd: Path) -> None:
    """Run one build step; on failure raise with the step's name and the tail of its output."""
    done = subprocess.run(command, cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-OUTPUT_TAIL:])
        raise PreviousReleaseError(f"building {commit}: step {name} exited with {done.returncode}:\n{tail}")


class PreviousReleases:
    """Builds each recorded previous release once per session, by commit.

    ``built`` lists every release a session built or reused, for its summary.
    """

    built: ClassVar[list[PreviousRelease]] = []

    def __init__(self, cache_root: Path) -> None:
        self.cache_root = cache_root
        self._releases = recorded_releases()
        self._built: dict[str, PreviousRelease] = {}

    def of(self, owner: str) -> PreviousRelease:
        """``owner``'s previous release, built (or reused) now if this session has not yet."""
        commit = self._releases[owner].commit
        if commit not in self._built:
            self._built[commit] = build_release(commit, self.cache_root)
            PreviousReleases.built.append(self._built[commit])
        return self._built[commit]
