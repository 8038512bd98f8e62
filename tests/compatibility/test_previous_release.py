"""Building a previous release: what owners.toml records, what the build holds, and a clone without the commit."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.compatibility.previous import (
    REPO_ROOT,
    PreviousReleaseError,
    PreviousReleases,
    build_release,
    recorded_releases,
)

OWNERS = ("schema-catalog", "controlplane", "connectors", "integration")
RELEASE_ENV = {**os.environ, "PYTHONPATH": ""}  # as the scenarios start a release's services


def test_every_owner_records_a_previous_release_that_is_a_commit_of_this_clone() -> None:
    releases = recorded_releases()
    assert sorted(releases) == sorted(OWNERS)
    for release in releases.values():
        assert release.version.count(".") == 2 and len(release.commit) == 40, release
        found = subprocess.run(["git", "-C", str(REPO_ROOT), "cat-file", "-t", release.commit], capture_output=True)
        assert found.stdout.strip() == b"commit", release


def test_a_commit_missing_from_a_shallow_clone_fails_saying_how_to_fetch_it(tmp_path: Path) -> None:
    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "--quiet", "--depth", "1", REPO_ROOT.as_uri(), str(shallow)], check=True)
    commit = recorded_releases()["connectors"].commit
    with pytest.raises(PreviousReleaseError) as refused:
        build_release(commit, tmp_path / "builds", repo=shallow)
    message = str(refused.value)
    assert f"commit {commit}" in message and "is not in a shallow clone" in message
    assert f"git -C {shallow} fetch --unshallow" in message and f"fetch origin {commit}" in message
    assert not (tmp_path / "builds").exists()  # nothing was built


def test_each_owners_build_runs_its_own_service_at_the_recorded_version(previous_releases: PreviousReleases) -> None:
    for owner, recorded in recorded_releases().items():
        release = previous_releases.of(owner)
        assert release.commit == recorded.commit
        script = f"nexuscrm-{owner}"
        module = release.console_module(script)
        assert module == f"nexuscrm_{owner.replace('-', '_')}.main"
        probe = f"import importlib.metadata as m, {module} as s; print(s.__file__); print(m.version({script!r}))"
        path, version = subprocess.run(
            [release.python, "-c", probe], capture_output=True, text=True, check=True, env=RELEASE_ENV
        ).stdout.split()
        assert Path(path).is_relative_to(release.source), path  # the release's tree, never this checkout
        assert version == recorded.version
