"""No ``except`` in a test that swallows what it caught (issue 59).

A handler in a test module whose body only passes (``pass``, ``...``, ``continue``), prints, or
counts (``n += 1``, ``errors[kind] += 1``, ``errors.append(error)``, ``.add``, ``.update``)
turns a failure into a pass unless something asserts on the count exactly. So such a handler
is refused when it catches broadly (bare, ``Exception``, ``BaseException``, ``grpc.RpcError``:
any status, any bug), unless what it collects is asserted on exactly (``assert name == ...``,
``assert ... == name`` or ``assert not name``) or raised again (``raise name[0]``) somewhere in
the module. A narrow handler (a named
domain error) says that outcome is expected there, and stays allowed. Every function of a test
module counts, its helpers too: a thread loop that swallows is as blind as a test that does.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.architecture.packages import REPO_ROOT

BROAD = {"Exception", "BaseException", "RpcError"}  # RpcError: grpc's, whatever its status
COLLECTING = {"append", "add", "update", "extend"}


def _name(node: ast.expr) -> str | None:
    """The last name of ``x``, ``a.x``, ``x[k]`` or ``a.x[k]``: what a handler collects into."""
    while isinstance(node, ast.Subscript):
        node = node.value
    if isinstance(node, ast.Name):
        return node.id
    return node.attr if isinstance(node, ast.Attribute) else None


def _is_broad(handler: ast.ExceptHandler) -> bool:
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(t is None or _name(t) in BROAD for t in types)


def _collected(statement: ast.stmt) -> str | None:
    """What ``statement`` counts or collects into; ``""`` for a statement that only passes or prints.

    None for anything else (an assert, a raise, a call that acts): the handler then does something.
    """
    if isinstance(statement, ast.Pass | ast.Continue):
        return ""
    if isinstance(statement, ast.AugAssign):
        return _name(statement.target)
    if isinstance(statement, ast.Expr):
        value = statement.value
        if isinstance(value, ast.Constant) and value.value is Ellipsis:
            return ""
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "print":
            return ""
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr in COLLECTING:
            return _name(value.func.value)
    return None


def _asserted_exactly(tree: ast.Module) -> set[str]:
    """Names some ``assert`` of the module compares with ``==`` or checks with ``not``, or a ``raise`` raises."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Raise) and node.exc is not None:
            names.update(n for n in map(_name, [node.exc]) if n)
        if not isinstance(node, ast.Assert):
            continue
        for part in ast.walk(node.test):
            if isinstance(part, ast.Compare) and any(isinstance(op, ast.Eq) for op in part.ops):
                names.update(n for n in map(_name, [part.left, *part.comparators]) if n)
            elif isinstance(part, ast.UnaryOp) and isinstance(part.op, ast.Not):
                names.update(n for n in [_name(part.operand)] if n)
    return names


def swallowing_handlers(path: Path) -> list[str]:
    """``file:line`` of each broad handler in ``path`` that only passes, prints or counts unchecked."""
    tree = ast.parse(path.read_text(), filename=str(path))
    checked = _asserted_exactly(tree)
    shown = path.relative_to(REPO_ROOT) if path.is_relative_to(REPO_ROOT) else path
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.ExceptHandler) or not _is_broad(node):
            continue
        collected = [_collected(statement) for statement in node.body]
        if any(c is None for c in collected):
            continue  # it raises, asserts or acts
        if not any(collected) or not {c for c in collected if c} <= checked:
            found.append(f"{shown}:{node.lineno}")
    return found


def test_no_test_swallows_what_it_catches() -> None:
    modules = sorted((REPO_ROOT / "tests").rglob("test_*.py"))
    found = [problem for path in modules for problem in swallowing_handlers(path)]
    assert not found, (
        "these handlers hide failures (assert the exact outcome, or count and assert the count exactly):\n"
        + "\n".join(found)
    )


def test_the_check_names_each_kind_of_swallowing_handler(tmp_path: Path) -> None:
    """The check can fail: a pass, a print and an unchecked count are named; a checked count is not."""
    module = tmp_path / "test_planted.py"
    module.write_text(
        "def test_a():\n"
        "    try:\n        f()\n    except Exception:\n        pass\n"  # line 4
        "    try:\n        f()\n    except BaseException as error:\n        print(error)\n"  # line 8
        "    errors = []\n"
        "    try:\n        f()\n    except (ValueError, Exception) as error:\n        errors.append(error)\n"  # 13
        "    done = 0\n"
        "    try:\n        f()\n    except Exception:\n        done += 1\n"  # 18: compared with ==
        "    assert done == 1\n"
        "    raised = []\n"
        "    try:\n        f()\n    except Exception as error:\n        raised.append(error)\n"  # 24: raised
        "    if raised:\n        raise raised[0]\n"
        "    try:\n        f()\n    except KeyError:\n        pass\n"  # 31: narrow
    )
    assert swallowing_handlers(module) == [f"{module}:4", f"{module}:8", f"{module}:13"]
