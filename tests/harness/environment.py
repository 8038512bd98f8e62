"""The external temporary virtualenv of a cross-checkout run.

It lives in a fresh temporary directory outside every checkout and holds the runner checkout's
development tools (requirements/dev.txt) and, editable, each owner's packages from that owner's
checkout, all under the runner checkout's requirements/constraints.txt. Nothing is written into a
checkout except Core's generated protos (protos/generate.py, as ``make setup`` does).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from tests.harness.checkouts import RUNNER_ROOT, Checkout, CheckoutError, Package

KEEP_VARIABLE = "NEXUSCRM_KEEP_VENV"


@contextlib.contextmanager
def temporary_virtualenv(checkouts: tuple[Checkout, ...]) -> Iterator[Path]:
    """A fresh, empty virtualenv directory outside every checkout; removed afterwards unless kept."""
    workspace = Path(tempfile.mkdtemp(prefix="nexuscrm-harness-")).resolve()
    try:
        inside = [c for c in checkouts if workspace.is_relative_to(c.path)]
        if inside:
            raise CheckoutError(
                f"the temporary directory {workspace} is inside {inside[0].describe()}: set TMPDIR elsewhere"
            )
        venv = workspace / "venv"
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        yield venv
    finally:
        if os.environ.get(KEEP_VARIABLE) == "1":
            print(f"kept the virtualenv {workspace / 'venv'} ({KEEP_VARIABLE}=1)", flush=True)
        else:
            shutil.rmtree(workspace, ignore_errors=True)


def install(venv: Path, core: Checkout, packages: tuple[Package, ...]) -> None:
    """The dev tools, Core's generated protos, then every package editable from its checkout.

    The packages' third-party requirements are installed first and the packages without their
    dependencies, so nothing first-party comes from an index: a set of packages that leaves out
    an owner (``make test-owner``) fails at import, never by installing a stranger's package.
    """
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "--quiet", "-c", str(RUNNER_ROOT / "requirements" / "constraints.txt")]
    third_party = sorted({requirement for package in packages for requirement in package.third_party})
    subprocess.run([*pip, "-r", str(RUNNER_ROOT / "requirements" / "dev.txt"), *third_party], check=True)
    subprocess.run([python, str(core.path / "protos" / "generate.py")], check=True, stdout=subprocess.DEVNULL)
    editables = [arg for package in packages for arg in ("-e", str(package.directory))]
    subprocess.run([*pip, "--no-deps", *editables], check=True)


def activated(venv: Path, environ: dict[str, str]) -> dict[str, str]:
    """``environ`` with ``venv`` first on PATH, as its activate script would leave it."""
    return {**environ, "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{environ.get('PATH', '')}"}
