"""Every test module that works on a database ends its scenarios with the invariant checker, or says why not.

A module works on a database when one of its tests or fixtures takes a database fixture (the
list below: tests/conftest.py and the packages' conftests) or it makes its own engine
(``create_engine``). It must call ``assert_invariants`` or ``check_invariants``
(tests/support/invariants.py), or a helper of the test tree that does (``assert_end_state``),
or define ``INVARIANTS_NOT_CHECKED = "why"``: a module with no scenario (a schema, driver or
error-mapping test, a database other than the canonical one).
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
DATABASE_FIXTURES = {
    "engine",
    "dsn",
    "empty_engine",
    "empty_dsn",
    "mysql_server_dsn",
    "connectors",  # tests/connectors and tests/system/dashboard: a service on ``engine``
    "connectors_target",
    "start_proxied",
    "private_server",
    "cluster",
    "node_dsns",
}
CHECKERS = {"assert_invariants", "check_invariants"}
EXEMPTION = "INVARIANTS_NOT_CHECKED"


def _is_test_or_fixture(node: ast.FunctionDef) -> bool:
    decorators = [d.func if isinstance(d, ast.Call) else d for d in node.decorator_list]
    return node.name.startswith("test_") or any(
        isinstance(d, ast.Attribute) and d.attr == "fixture" for d in decorators
    )


def _called(node: ast.AST) -> str | None:
    if not isinstance(node, ast.Call):
        return None
    function = node.func
    return function.id if isinstance(function, ast.Name) else getattr(function, "attr", None)


def uses_a_database(tree: ast.Module) -> bool:
    """Whether a test or fixture of the module takes a database fixture, or the module makes an engine."""
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and _is_test_or_fixture(node):
            if {a.arg for a in node.args.args + node.args.kwonlyargs} & DATABASE_FIXTURES:
                return True
        if _called(node) == "create_engine":
            return True
    return False


def checking_helpers(root: Path) -> set[str]:
    """The checkers, and every function of a helper module under ``root`` that calls one (transitively)."""
    functions = [
        node
        for path in sorted(root.rglob("*.py"))
        if not path.name.startswith("test_")
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.FunctionDef)
    ]
    checkers, grown = set(CHECKERS), True
    while grown:
        found = {f.name for f in functions if any(_called(n) in checkers for n in ast.walk(f))}
        grown, checkers = not found <= checkers, checkers | found
    return checkers


def checks_invariants_or_says_why(tree: ast.Module, checkers: set[str]) -> bool:
    """Whether the module calls a checker, or defines a non-empty ``INVARIANTS_NOT_CHECKED`` reason."""
    if any(_called(node) in checkers for node in ast.walk(tree)):
        return True
    return any(
        isinstance(node, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == EXEMPTION for t in node.targets)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        and node.value.value.strip() != ""
        for node in tree.body
    )


def offenders(root: Path) -> list[str]:
    """The test modules under ``root`` that use a database and neither check the invariants nor say why."""
    checkers, found = checking_helpers(root), []
    for path in sorted(root.rglob("test_*.py")):
        tree = ast.parse(path.read_text(), str(path))
        if uses_a_database(tree) and not checks_invariants_or_says_why(tree, checkers):
            found.append(str(path.relative_to(root.parent)))
    return found


def test_every_database_test_module_checks_the_invariants_or_says_why_not() -> None:
    missing = offenders(TESTS)
    assert not missing, (
        "these test modules use a database but never call assert_invariants/check_invariants "
        f"(tests/support/invariants.py) nor define {EXEMPTION} = 'why': {missing}"
    )


def test_the_rule_sees_a_database_module_without_the_check(tmp_path: Path) -> None:
    tests = tmp_path / "tests"
    tests.mkdir()
    cases = {
        "test_unchecked.py": "def test_a(engine):\n    engine.begin()\n",
        "test_own_engine.py": "def test_a(tmp_path):\n    sa.create_engine('sqlite://')\n",
        "test_empty_reason.py": f"{EXEMPTION} = ' '\n\ndef test_a(dsn):\n    pass\n",
        "test_checked.py": "def test_a(engine):\n    assert_invariants(engine)\n",
        "test_attribute.py": "def test_a(engine):\n    invariants.check_invariants(engine)\n",
        "test_exempt.py": f"{EXEMPTION} = 'error mapping only'\n\ndef test_a(engine):\n    pass\n",
        "test_no_database.py": "def test_a(tmp_path):\n    pass\n",
        "test_helper_argument.py": "def helper(*, engine):\n    pass\n",
        "test_fixture.py": "@pytest.fixture\ndef system(empty_dsn):\n    yield empty_dsn\n",
        "scenario.py": (  # a helper that checks through another helper
            "def end_state(engine):\n    return settled(engine)\n\n"
            "def settled(engine):\n    assert_invariants(engine)\n"
        ),
        "test_through_a_helper.py": "def test_a(engine):\n    end_state(engine)\n",
    }
    for name, source in cases.items():
        (tests / name).write_text(source)
    assert offenders(tests) == [
        "tests/test_empty_reason.py",
        "tests/test_fixture.py",
        "tests/test_own_engine.py",
        "tests/test_unchecked.py",
    ]
