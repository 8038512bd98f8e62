"""No ``assert`` in shipped code: ``python -O`` removes it (ruff S101 says the same while linting)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ["services", "libs", "tools"]


def test_services_libs_and_tools_use_explicit_errors_not_assert() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for folder in SHIPPED
        for path in sorted((ROOT / folder).rglob("*.py"))
        if "build" not in path.parts
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.Assert)
    ]
    assert not found, f"assert vanishes under python -O; raise an explicit error instead: {found}"
