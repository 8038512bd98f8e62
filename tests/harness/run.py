"""What ``python -m tests.harness check|test|owner [pytest arguments]`` does (the package docstring).

``owner OWNER`` runs one owner's suite in a virtualenv of Core and that owner only (``make
test-owner``, decision 146): the proof that an owner's tests need no other owner.

Exit codes (the shared table): 0 passed, 1 a test or an install failed, 2 a checkout variable
names no usable checkout, 9 the checkouts' versions are outside each other's ranges; otherwise
pytest's own code. With another owner's checkout named, the pytest arguments go to every
owner's session (options such as ``-k``, ``-m``, ``-x``); the test directories are the owners'.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from tests.harness.checkouts import (
    CORE_VARIABLE,
    RUNNER_ROOT,
    Checkout,
    CheckoutError,
    Package,
    commit_of,
    load_owners,
    load_packages,
    resolve_checkouts,
)
from tests.harness.environment import activated, install, temporary_virtualenv
from tests.harness.ranges import unsatisfied

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_CHECK_FAILED = 9
PYTEST_NO_TESTS = 5
# Cross-owner tests: they run from the runner's checkout against whatever the owners provide.
RUNNER_TESTS = ("tests/system", "tests/architecture")


def header_lines(packages: Sequence[Package]) -> list[str]:
    """One aligned line per package: distribution, version, owner, checkout path, commit."""
    rows = [("distribution", "version", "owner", "checkout", "commit")]
    rows += [
        (p.name, p.version, p.checkout.owner.name, str(p.checkout.path), commit_of(p.checkout.path)) for p in packages
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return ["  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]]) for row in rows]


def sessions(checkouts: Sequence[Checkout]) -> list[tuple[Path, list[str]]]:
    """The pytest sessions of a cross-checkout run: one per checkout, with the test directories it owns."""
    grouped: dict[Path, list[str]] = {}
    for checkout in checkouts:
        grouped.setdefault(checkout.path, []).extend(checkout.owner.tests)
    grouped.setdefault(RUNNER_ROOT, []).extend(RUNNER_TESTS)
    return list(grouped.items())


def outcome(codes: Sequence[int]) -> int:
    """The run's exit code from its sessions' codes: a session without tests fails only if all do."""
    if all(code == PYTEST_NO_TESTS for code in codes):
        print("pytest collected no tests: that is a failure here, not a pass", file=sys.stderr)
        return EXIT_FAILED
    return next((code for code in codes if code not in (0, PYTEST_NO_TESTS)), 0)


def _pytest(python: str, cwd: Path, args: Sequence[str], environ: dict[str, str]) -> int:
    return subprocess.run([python, "-m", "pytest", *args], cwd=cwd, env=environ).returncode


def _cross_checkout(
    checkouts: Sequence[Checkout], packages: Sequence[Package], args: Sequence[str], environ: dict[str, str]
) -> int:
    plan = sessions(checkouts)
    missing = [f"{path}/{d}" for path, dirs in plan for d in dirs if not (path / d).is_dir()]
    if missing:
        print(f"no owner test directory {', '.join(missing)}: that checkout predates the owner layout", file=sys.stderr)
        return EXIT_USAGE
    print("\n".join(["== packages of this run", *header_lines(packages)]), flush=True)
    core = next(c for c in checkouts if c.owner.variable == CORE_VARIABLE)
    with temporary_virtualenv(tuple(checkouts)) as venv:
        print(f"== installing into the temporary virtualenv {venv}", flush=True)
        try:
            install(venv, core, tuple(packages))
        except subprocess.CalledProcessError as error:
            print(f"installing into {venv} failed: {error}", file=sys.stderr)
            return EXIT_FAILED
        codes = []
        for path, dirs in plan:
            print(f"\n== pytest in {path} ({commit_of(path)}): {' '.join(dirs)}", flush=True)
            codes.append(_pytest(str(venv / "bin" / "python"), path, [*dirs, *args], activated(venv, environ)))
    return outcome(codes)


def _owner_alone(
    name: str, checkouts: Sequence[Checkout], packages: Sequence[Package], args: Sequence[str], environ: dict[str, str]
) -> int:
    owner = next((c for c in checkouts if c.owner.name == name), None)
    if owner is None:
        names = ", ".join(c.owner.name for c in checkouts)
        print(f"unknown owner {name!r}: owners.toml names {names}", file=sys.stderr)
        return EXIT_USAGE
    core = next(c for c in checkouts if c.owner.variable == CORE_VARIABLE)
    alone = tuple(p for p in packages if p.checkout in (core, owner))
    print("\n".join([f"== {owner.owner.title} alone: packages of this run", *header_lines(alone)]), flush=True)
    with temporary_virtualenv(tuple(checkouts)) as venv:
        try:
            install(venv, core, alone)
        except subprocess.CalledProcessError as error:
            print(f"installing into {venv} failed: {error}", file=sys.stderr)
            return EXIT_FAILED
        python = str(venv / "bin" / "python")
        return outcome([_pytest(python, owner.path, [*owner.owner.tests, *args], activated(venv, environ))])


def main(argv: Sequence[str]) -> int:
    """Run ``check``, ``test`` or ``owner OWNER`` with ``argv``'s pytest arguments; return the exit code."""
    command, *args = argv or ("",)
    if command not in ("check", "test", "owner") or (command == "owner" and not args):
        print("usage: python -m tests.harness check | test | owner OWNER [pytest arguments]", file=sys.stderr)
        return EXIT_USAGE
    try:
        checkouts = resolve_checkouts(load_owners())
        packages = load_packages(checkouts)
    except CheckoutError as error:
        print(error, file=sys.stderr)
        return EXIT_USAGE
    problems = unsatisfied(packages)
    if problems:
        print("the checkouts' versions are outside each other's declared ranges:", file=sys.stderr)
        print("\n".join(f"  {problem}" for problem in problems), file=sys.stderr)
        return EXIT_CHECK_FAILED
    if command == "check":
        print("versions fit each other's declared ranges:")
        print("\n".join(f"  {c.owner.name} from {c.describe()}" for c in checkouts))
        return 0
    environ = {**os.environ, **{c.owner.variable: str(c.path) for c in checkouts}}
    if command == "owner":
        return _owner_alone(args[0], checkouts, packages, args[1:], environ)
    if not any(c.named for c in checkouts):
        return outcome([_pytest(sys.executable, RUNNER_ROOT, args, environ)])
    return _cross_checkout(checkouts, packages, args, environ)
