"""The N-1 compatibility tier (docs/decisions/147-n-1-compatibility-tier.md).

Each owner's previous release (owners.toml ``previous``) is built from its commit into a
virtualenv of its own (``tests.compatibility.previous``) and run as processes against the
current others on the real MariaDB. Every scenario database is created for its test and
migrated by the current schema catalog.

The default run (CI) keeps only the bounded smoke set; tests marked ``compat_full`` are
deselected unless NEXUSCRM_COMPAT_FULL=1 (``make compat`` sets it and runs the whole tier).
Builds go to a temporary directory of the session (once per commit), or to
NEXUSCRM_COMPAT_CACHE to be reused across runs; the terminal summary says what each took.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.compatibility.previous import BUILD_TIMEOUT, CACHE_VARIABLE, REPO_ROOT, PreviousReleases

FULL = os.environ.get("NEXUSCRM_COMPAT_FULL") == "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the tier's ``compat_full`` tests unless NEXUSCRM_COMPAT_FULL=1; give builders time.

    The first test that needs a previous release builds it (minutes on a busy machine): each
    test of the tier that may build gets ``BUILD_TIMEOUT`` instead of the suite's default.
    """
    for item in items:
        if "previous_releases" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timeout(BUILD_TIMEOUT))
    if FULL:
        return
    full = [item for item in items if item.get_closest_marker("compat_full")]
    if full:
        config.hook.pytest_deselected(items=full)
        items[:] = [item for item in items if not item.get_closest_marker("compat_full")]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """How long each previous release took to build (or that an earlier run's build was reused)."""
    for release in PreviousReleases.built:
        if release.seconds:
            steps = ", ".join(f"{name} {seconds:.1f}s" for name, seconds in release.seconds.items())
            line = f"built in {sum(release.seconds.values()):.1f}s ({steps})"
        else:
            line = f"an earlier build reused from {CACHE_VARIABLE}"
        terminalreporter.write_line(f"N-1 tier: previous release {release.commit[:12]}: {line}")


@pytest.fixture(scope="session")
def previous_releases(tmp_path_factory: pytest.TempPathFactory) -> PreviousReleases:
    """The previous releases of owners.toml, built on first use (see the module docstring for where)."""
    cached = os.environ.get(CACHE_VARIABLE)
    if not cached:
        return PreviousReleases(tmp_path_factory.mktemp("previous-releases"))
    cache_root = Path(cached).resolve()
    if cache_root.is_relative_to(REPO_ROOT):  # its extracted trees would be linted and globbed as this checkout's
        raise pytest.UsageError(f"{CACHE_VARIABLE}={cached} is inside the checkout {REPO_ROOT}: name one outside it")
    return PreviousReleases(cache_root)
