"""Tests and benchmarks capture statements through ``tests/support/statements.py`` alone.

Listeners of their own on the engine's statement events each counted differently, and the
most reused one dropped every ``executemany`` (issue 59): a multi-row statement turned into one
statement per row went unseen. The helper records each DBAPI call with its executemany flag and
round trips; any other module naming a statement-execution event fails here, file and line.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("tests", "bench")
EXECUTION_EVENTS = frozenset(
    {
        "before_cursor_execute",
        "after_cursor_execute",
        "before_execute",
        "after_execute",
        "do_execute",
        "do_executemany",
        "do_execute_no_params",
    }
)
ALLOWED = {
    "tests/support/statements.py": "the one capture helper",
    "tests/architecture/test_statement_capture.py": "names the events it looks for",
    "bench/admission.py": "StatementClock times statements and COMMITs (section 1's ceiling), it counts none",
}


def event_names(root: Path) -> list[str]:
    """``path:line`` of each string naming a statement-execution event in ``root``'s tests/ and bench/, but ALLOWED.

    Any such string, not only a call's argument: a name kept in a constant, or passed to
    ``listens_for``, subscribes all the same.
    """
    found = []
    for folder in SCANNED:
        for path in sorted((root / folder).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            if relative in ALLOWED:
                continue
            found += [
                f"{relative}:{node.lineno}"
                for node in ast.walk(ast.parse(path.read_text(), str(path)))
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in EXECUTION_EVENTS
            ]
    return found


def test_only_the_capture_helper_listens_to_statement_execution() -> None:
    assert [path for path in ALLOWED if not (ROOT / path).is_file()] == []  # no exemption outlives its file
    found = event_names(ROOT)
    assert found == [], f"capture statements with tests.support.statements.capture, not a listener of its own: {found}"


def test_a_planted_listener_is_named_by_file_and_line(tmp_path: Path) -> None:
    planted = {
        "tests/connectors/test_planted.py": 'import x\n\nevent.listen(engine, "before_cursor_execute", f)\n',
        "bench/planted.py": 'import x\n\n\n@sa.event.listens_for(engine, "after_cursor_execute")\ndef f(): ...\n',
        "tests/support/statements.py": 'event.listen(engine, "before_cursor_execute", f)\n',  # the helper may
        "tests/support/mentions.py": '"""Docs may say ``before_cursor_execute``."""\n',
    }
    for relative, source in planted.items():
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_text(source)
    assert event_names(tmp_path) == ["tests/connectors/test_planted.py:3", "bench/planted.py:4"]
