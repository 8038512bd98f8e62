"""The command-line reference, rendered from the commands' own argparse parsers.

Each command's page section is what its parser knows: usage, description, every option with
its help and default, and each subcommand in turn; nothing about a flag is written twice. The
same parsers give ``known_flags``, the flags a documentation page may name.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator

from nexuscrm_controlplane.runbook import cutover_parser, drain_parser, fence_parser
from nexuscrm_schema_catalog.command import build_parser as schema_parser
from nexuscrm_tools.cli import build_parser as nexuscrm_parser
from nexuscrm_tools.run import build_parser as run_parser

# Every operator command, in the order the reference shows them.
COMMANDS: dict[str, Callable[[], argparse.ArgumentParser]] = {
    "nexuscrm": nexuscrm_parser,
    "nexuscrm-run": run_parser,
    "nexuscrm-schema": schema_parser,
    "connector-projection-cutover": cutover_parser,
    "connector-projection-drain": drain_parser,
    "connector-admission-fence": fence_parser,
}


def subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """Each subcommand of ``parser``: its name, its one-line help and its parser, in definition order."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def walk(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """``parser`` and every parser below it."""
    yield parser
    for _, _, sub in subcommands(parser):
        yield from walk(sub)


def known_flags() -> frozenset[str]:
    """Every option string of every command and subcommand (``--json``, ``-pack-install-id``)."""
    return frozenset(
        option
        for build in COMMANDS.values()
        for parser in walk(build())
        for action in parser._actions
        for option in action.option_strings
    )


def _escape(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|").replace("<", "&lt;")


def _option_rows(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, (argparse._SubParsersAction, argparse._HelpAction)):
            continue
        name = ", ".join(f"`{option}`" for option in action.option_strings) or f"`{action.metavar or action.dest}`"
        help_text = (action.help or "").replace("%(default)s", str(action.default))
        if action.choices and not isinstance(action, argparse._SubParsersAction):
            help_text += f" (one of: {', '.join(str(c) for c in action.choices)})"
        required = "yes" if action.required or not action.option_strings else ""
        rows.append(f"| {name} | {required} | {_escape(help_text)} |")
    return rows


def render_parser(parser: argparse.ArgumentParser, level: int) -> list[str]:
    """A parser's section: heading, usage, description, options table, then its subcommands."""
    lines = [f"{'#' * level} `{parser.prog}`", "", "```text", parser.format_usage().strip(), "```", ""]
    if parser.description:
        lines += ["```text", parser.description.strip(), "```", ""]
    rows = _option_rows(parser)
    if rows:
        lines += ["| argument | required | what |", "|---|---|---|", *rows, ""]
    if parser.epilog:
        lines += ["```text", parser.epilog.strip(), "```", ""]
    for _, _, sub in subcommands(parser):
        lines += render_parser(sub, min(level + 1, 6))
    return lines


def render() -> str:
    """The whole command-line reference page."""
    lines = [
        "# Command line",
        "",
        "Generated at build time from each command's argument parser (`docs/hooks/commands_reference.py`):",
        "what `--help` says, for every command and subcommand. Exit codes: [Exit codes](exit-codes.md).",
        "",
    ]
    for build in COMMANDS.values():
        lines += render_parser(build(), 2)
    return "\n".join(lines) + "\n"
