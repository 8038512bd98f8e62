"""Each owner's test suite imports only that owner, Core and the shared test support (decision 146).

An owner's tests live under the directories ``owners.toml`` lists as its ``tests``. A module
there may import its owner's packages, Core's (the schema-catalog owner: the protos, the shared
libraries and the schema catalog every database test migrates with), ``tests.support``, test
modules of its own owner's directories and third-party libraries; never another owner's package
nor another owner's tests. ``tests/support`` imports only Core and third-party libraries, so
an owner's suite runs in a virtualenv holding only Core and that owner (``make test-owner``).

The operator tools (``nexuscrm_tools``) belong to Controlplane, so only Controlplane's suite
may import them. The tools import no service (decision 154), but a test of the CLI or the
runner that needs another owner's service running is a system test (tests/system). Imports are read from the source
(every ``import`` and ``from`` anywhere in a module, also inside functions), so a lazy import
counts the same as one at the top.
"""

from __future__ import annotations

import ast
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.architecture.packages import PACKAGE_DIRS, REPO_ROOT, load_packages

OWNERS = tomllib.loads((REPO_ROOT / "owners.toml").read_text())["owners"]
CORE = "schema-catalog"  # whose packages every owner's tests may import
SUPPORT = "tests.support"


def owner_modules(owner: str) -> set[str]:
    """The top-level import names of the packages ``owners.toml`` gives ``owner``."""
    packages = load_packages()
    by_directory = {package.directory.relative_to(REPO_ROOT).as_posix(): package for package in packages.values()}
    modules: set[str] = set()
    for listed in OWNERS[owner]["packages"]:
        assert listed in PACKAGE_DIRS, f"owners.toml: {owner}'s package {listed} is none of {PACKAGE_DIRS}"
        modules.update(by_directory[listed].modules)
    return modules


def test_dirs(owner: str) -> list[str]:
    """``owner``'s test directories as dotted module prefixes (``tests/connectors`` -> ``tests.connectors``)."""
    return [directory.replace("/", ".") for directory in OWNERS[owner]["tests"]]


test_dirs.__test__ = False  # type: ignore[attr-defined]  # a helper, not a test


def imported_modules(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) of every absolute import in ``path``; relative imports stay inside the package."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module


def foreign_imports(path: Path, allowed_packages: set[str], allowed_tests: list[str]) -> list[str]:
    """The imports of ``path`` outside what its suite may import, each as ``file:line imports module``."""
    first_party = {m for owner in OWNERS for m in owner_modules(owner)}
    shown = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
    found = []
    for line, module in imported_modules(path):
        top = module.split(".")[0]
        if top == "tests":
            if not any(module == p or module.startswith(f"{p}.") for p in [SUPPORT, *allowed_tests]):
                found.append(f"{shown}:{line} imports {module}")
        elif top in first_party and top not in allowed_packages:
            found.append(f"{shown}:{line} imports {module}")
    return found


@pytest.mark.parametrize("owner", sorted(OWNERS))
def test_an_owners_tests_import_only_that_owner_core_and_support(owner: str) -> None:
    allowed = owner_modules(owner) | owner_modules(CORE)
    modules = [path for directory in OWNERS[owner]["tests"] for path in sorted((REPO_ROOT / directory).rglob("*.py"))]
    # pytest collects test_*.py only: packages' __init__.py and helpers make no suite
    assert [path for path in modules if path.name.startswith("test_")], f"no test module under {OWNERS[owner]['tests']}"
    found = [problem for path in modules for problem in foreign_imports(path, allowed, test_dirs(owner))]
    assert not found, f"{owner}'s tests import another owner (move the test to tests/system):\n" + "\n".join(found)


def test_the_shared_support_imports_only_core() -> None:
    support = sorted((REPO_ROOT / "tests" / "support").rglob("*.py"))
    found = [problem for path in support for problem in foreign_imports(path, owner_modules(CORE), [])]
    assert not found, "tests/support imports beyond Core and third-party libraries:\n" + "\n".join(found)


def test_the_checker_reads_a_module_that_crosses_owners(tmp_path: Path) -> None:
    """The check can fail: a Connectors test importing Controlplane is named with its line."""
    module = tmp_path / "test_crossing.py"
    module.write_text(
        "import sqlalchemy\nfrom tests.support.factories import START\n\n"
        "def f():\n    import nexuscrm_controlplane.fences\n"
    )
    crossing = foreign_imports(module, owner_modules("connectors") | owner_modules(CORE), test_dirs("connectors"))
    assert crossing == [f"{module}:5 imports nexuscrm_controlplane.fences"]
