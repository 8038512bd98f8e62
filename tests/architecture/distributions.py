"""Build the repository's distributions from a clean copy of the working tree.

A clean copy holds what ``git ls-files --cached --others --exclude-standard`` lists (committed
and new files, never ignored ones such as the generated ``protos/python/nexuscrm``, ``build/``
or ``*.egg-info``), so a build proves what a clean checkout builds, uncommitted work included.
Builds run with this environment's interpreter and ``--no-build-isolation`` (its setuptools and
grpcio-tools, pinned by requirements/constraints.txt), never from an index.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

from tests.architecture.packages import REPO_ROOT, canonical_name

BUILD_TIMEOUT = 300  # seconds for one pip command building every wheel


def copy_clean_tree(target: Path, root: Path = REPO_ROOT) -> Path:
    """Copy ``root``'s tracked and untracked, not ignored, files to ``target``; symlinks stay links."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
        timeout=60,
    ).stdout.decode()
    for relative in filter(None, listed.split("\0")):
        source = root / relative
        if not source.is_symlink() and not source.exists():  # deleted in the working tree
            continue
        destination = target / relative
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, destination, follow_symlinks=False)
    return target


def pip_wheel(sources: Iterable[Path | str], out: Path) -> subprocess.CompletedProcess[str]:
    """``pip wheel --no-deps --no-build-isolation`` of ``sources`` into ``out``; the result, unchecked."""
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(out)]
    return subprocess.run(
        [*command, *map(str, sources)], capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False
    )


def build_wheels(tree: Path, directories: Iterable[str], out: Path) -> dict[str, Path]:
    """One wheel per package directory of ``tree``, by normalized distribution name.

    Raises:
        RuntimeError: pip failed; the message holds its output.
    """
    result = pip_wheel((tree / d for d in directories), out)
    if result.returncode != 0:
        raise RuntimeError(f"pip wheel exited {result.returncode}:\n{result.stdout}\n{result.stderr}")
    return {canonical_name(wheel.name.split("-")[0]): wheel for wheel in out.glob("*.whl")}
