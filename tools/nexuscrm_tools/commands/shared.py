"""What every command group shares: the ``Outcome`` a handler answers, the leaf parser, and flags parsed once.

A leaf is one subcommand: it runs its handler, takes ``--json`` after the subcommand too, and
its ``--help`` shows the handler's docstring and the exit codes. Records read as ``fields``,
rows as ``nexuscrm_tools.tables.listing`` titled with ``title_count``; paging, the identity
flags and instants are parsed here for every group.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
from collections.abc import Callable, Sequence
from typing import Any

from rich.table import Table

from nexuscrm.connectors.v1 import connectors_pb2 as cn_pb
from nexuscrm_tools import identities, tables
from nexuscrm_tools.clients import Clients
from nexuscrm_tools.exits import ExitCode, help_epilog
from nexuscrm_tools.tables import plural
from nexuscrm_wire import convert
from workqueue.values import Route

RPC_TIMEOUT = 30.0  # seconds per call
IDENTITY_FLAGS = tuple(identities.FLAG_FIELDS)
WORK_TYPE_OR_IDENTITY = "those naming one identity, or --work-type alone: one work type"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outcome:
    """What a subcommand answers: data for ``--json``, a table or line for people, an exit code."""

    data: Any
    view: Table | str
    code: ExitCode = ExitCode.OK


Handler = Callable[[Clients, argparse.Namespace], Outcome]


class UsageError(Exception):
    """Flags that parse but do not go together: exit 2 (usage error) with the message."""


def help_of(text: str | None) -> str:
    """A docstring as --help shows it: without the reStructuredText backticks."""
    return (text or "").replace("``", "")


def leaf(group: Any, name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
    """Add the subcommand ``name`` that runs ``handler`` to ``group`` (an ``add_subparsers()``)."""
    sub: argparse.ArgumentParser = group.add_parser(
        name,
        help=help_text,
        description=help_of(handler.__doc__),
        epilog=help_epilog("nexuscrm"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub.set_defaults(handler=handler, command_parser=sub)  # a UsageError prints this one's usage
    # Also after the subcommand; SUPPRESS keeps an absent flag here from undoing one given before it.
    sub.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON instead of tables")
    return sub


def fields(title: str, data: dict[str, Any]) -> Table:
    """One record as a two-column table of field and value; lists and objects as JSON."""
    return tables.table(
        title,
        ("field", "value"),
        [(key, json.dumps(value) if isinstance(value, list | dict) else value) for key, value in data.items()],
    )


def next_page(token: str) -> str:
    """How a listing's title says where the next page starts; nothing on the last page."""
    return f"; next page: --page-token {token}" if token else ""


def title_count(rows: Sequence[object], token: str, noun: str = "") -> str:
    """A listing title's count (``": 3"``, ``": 1 incarnation"``) and next page; nothing when empty (it says none)."""
    if not rows:
        return ""
    return f": {plural(len(rows), noun) if noun else len(rows)}{next_page(token)}"


def paged(parser: argparse.ArgumentParser, *, dest: str = "page_size") -> None:
    """``--limit`` (alias ``--page-size``) and ``--page-token``: the paging flags of every listing."""
    parser.add_argument(
        "--limit",
        "--page-size",
        dest=dest,
        type=int,
        default=0,
        metavar="N",
        help="rows per page (default: the service's)",
    )
    parser.add_argument("--page-token", default="", metavar="TOKEN", help="from the previous page's output")


def identity_of(args: argparse.Namespace) -> Route | None:
    """The identity the identity flags name (``cli._named_identity`` filled in a partial one); None without them."""
    wanted = identities.given(args)
    return Route(**wanted) if wanted else None


def narrow_to_identity(args: argparse.Namespace, wanted: cn_pb.DeadLetterFilter | cn_pb.GetCoverageRequest) -> None:
    """Narrow ``wanted`` to the identity the flags name (all five) or to a work type (``--work-type`` alone)."""
    only_work_type = args.work_type is not None and all(
        getattr(args, flag.removeprefix("--").replace("-", "_")) is None
        for flag in IDENTITY_FLAGS
        if flag != "--work-type"
    )
    if only_work_type:
        wanted.work_type = args.work_type
    elif (route := identity_of(args)) is not None:
        wanted.route.CopyFrom(convert.route_to_proto(route))


# Private in name only: argparse names a --until, --after or --source-time it cannot read by it
# ("invalid _instant value"), as it always has.
def _instant(text: str) -> dt.datetime:
    """An ISO 8601 instant (``2026-12-03T05:00:00Z``); one without a zone is UTC."""
    value = dt.datetime.fromisoformat(text)
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


def setting(raw: str) -> tuple[str, str]:
    """A Flow's pool setting given as ``KEY=VALUE`` (an argparse type: its error names the flag)."""
    key, equals, value = raw.partition("=")
    if not equals or not key:
        raise argparse.ArgumentTypeError(f"a setting is KEY=VALUE, got {raw!r}")
    return key, value
