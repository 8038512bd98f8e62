"""Operator tables never cut an id, at 80 columns or through a pipe; ``--json`` goes before or after the subcommand."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from nexuscrm_tools import cli, tables

FENCE = "fc-0402ee9840bf4219a4584e63dfb47037"
PACK = "pk-6fc5bc72c8af4e3987abea21e348bbf2"


@pytest.mark.parametrize("term", ["xterm-256color", "dumb"])
@pytest.mark.parametrize("terminal", [False, True])
def test_a_table_wider_than_80_columns_keeps_every_id_whole(
    terminal: bool, term: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TERM", term)
    out = io.StringIO()
    console = Console(file=out, width=80, force_terminal=terminal, color_system=None)
    row = (FENCE, "demo", PACK, "2026-11-30T18:00:00+00:00", "maintenance window for the vendor")
    tables.print_whole(console, tables.table("fences", ("fence", "namespace", "scope", "expires", "reason"), [row]))
    printed = out.getvalue()
    assert FENCE in printed and PACK in printed and "maintenance window for the vendor" in printed
    assert "…" not in printed
    assert max(len(line) for line in printed.splitlines()) > 80


def test_a_narrow_table_keeps_the_console_width() -> None:
    out = io.StringIO()
    tables.print_whole(Console(file=out, width=80), tables.table("t", ("a",), [("x",)]))
    assert max(len(line) for line in out.getvalue().splitlines()) <= 80


@pytest.mark.parametrize(
    ("argv", "as_json"),
    [
        (["fences", "list", "--namespace", "n"], False),
        (["--json", "fences", "list", "--namespace", "n"], True),
        (["fences", "list", "--namespace", "n", "--json"], True),
        (["fences", "list", "--json", "--namespace", "n"], True),
        (["--json", "work", "show", "w-1"], True),
        (["work", "show", "w-1", "--json"], True),
    ],
)
def test_json_is_accepted_before_and_after_the_subcommand(argv: list[str], as_json: bool) -> None:
    assert cli.build_parser().parse_args(argv).json is as_json
