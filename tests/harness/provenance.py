"""Where the running interpreter's first-party packages come from: the pytest report header.

The virtualenv decides which checkout each package is imported from; this reads its answer from
the installed distributions (an editable install records its directory in direct_url.json),
never from the environment's variables.
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path
from urllib.parse import unquote, urlparse

from tests.harness.checkouts import RUNNER_ROOT, Owner, commit_of, load_owners, project_file, read_project

NOT_INSTALLED = "not installed"


def installed_from(distribution: str) -> Path | None:
    """The directory an editable install of ``distribution`` points at; None when not editable."""
    recorded = importlib.metadata.distribution(distribution).read_text("direct_url.json")
    if not recorded:
        return None
    direct = json.loads(recorded)
    if not direct.get("dir_info", {}).get("editable"):
        return None
    return Path(unquote(urlparse(direct["url"]).path)).resolve()


def owner_sources(owners: tuple[Owner, ...] | None = None) -> list[str]:
    """One line per owner: the checkout and commit its packages come from, and their versions."""
    lines = []
    for owner in owners or load_owners():
        origins: dict[str, list[str]] = {}
        for relative in owner.packages:
            project = project_file(RUNNER_ROOT / relative)
            name = str(read_project(project)["name"])
            try:
                version = importlib.metadata.version(name)
                directory = installed_from(name)
            except importlib.metadata.PackageNotFoundError:
                origins.setdefault(NOT_INSTALLED, []).append(name)
                continue
            depth = len(project.parent.relative_to(RUNNER_ROOT).parts)
            source = _describe(directory.parents[depth - 1]) if directory else "a non-editable install"
            origins.setdefault(source, []).append(f"{name} {version}")
        where = "; ".join(f"{source}: {', '.join(names)}" for source, names in origins.items())
        lines.append(f"{owner.name} ({owner.variable}) from {where}")
    return lines


def _describe(checkout: Path) -> str:
    return f"{checkout} ({commit_of(checkout)})"
