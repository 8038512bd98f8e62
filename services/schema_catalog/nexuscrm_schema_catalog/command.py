"""``nexuscrm-schema``: read and migrate a database's canonical schema without a schema-catalog server.

  nexuscrm-schema status  [--dsn DSN] [--json]
  nexuscrm-schema migrate [--dsn DSN] [--target N] [--dry-run]

The first step of deploying any owner (docs/decisions/145-migrating-without-a-server.md):
``migrate`` runs ``migrations.apply_schema``, the function the schema catalog runs at start
(NEXUSCRM_APPLY_SCHEMA_ON_START) and for ApplySchema. The DSN comes from --dsn, else
NEXUSCRM_DSN; it is shown only with its password hidden. Before anything else the database is
checked (``nexuscrm_runtime.database_check``, then the server's prerequisites); a database
whose schema is newer than this release knows is refused. Every refusal is one line on stderr
naming what was found, and changes nothing. ``migrate`` is idempotent and only adds schema:
it writes no existing row (decision 150). Ctrl-C stops it between steps (a second Ctrl-C at
once: the open step's transaction rolls back); run it again to go on.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from sqlalchemy.engine import URL, Engine, make_url

from nexuscrm_runtime.clock import iso_utc
from nexuscrm_runtime.database import DatabaseUnavailable, create_engine
from nexuscrm_runtime.database_check import DatabaseUnusable, check_database
from nexuscrm_runtime.exit_codes import ExitCode, help_epilog
from nexuscrm_runtime.prerequisites import PrerequisiteError, verify
from nexuscrm_schema.verification import NEWEST_VERSION
from nexuscrm_schema_catalog import migrations
from nexuscrm_schema_catalog.migrate_progress import MigrateProgress, Stopped
from nexuscrm_schema_catalog.schema_status import SchemaStatus, read_status
from workqueue.errors import InvalidArgument

PROG = "nexuscrm-schema"
DSN_ENV = "NEXUSCRM_DSN"
EXIT_CODES = (ExitCode.OK, ExitCode.USAGE, ExitCode.UNREACHABLE, ExitCode.CHECK_FAILED, ExitCode.INTERRUPTED)
RESUME_HINT = f"`{PROG} migrate` resumes it"


class Refused(Exception):
    """A refusal: ``code`` to exit with, the message one line naming what was found."""

    def __init__(self, code: ExitCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def main(argv: Sequence[str] | None = None) -> ExitCode:
    """Run the command; return its exit code (the shared table, ``nexuscrm_runtime.exit_codes``)."""
    args = build_parser().parse_args(argv)
    out = Console(highlight=False, soft_wrap=True)
    try:
        dsn, named = _dsn(args.dsn)
        read_only = args.command == "status" or args.dry_run
        engine = _open(dsn, named, must_exist=read_only)
        try:
            if args.command == "status":
                return _status(out, engine, dsn, as_json=args.json)
            return _migrate(out, engine, dsn, target=args.target, dry_run=args.dry_run)
        finally:
            engine.dispose()
    except Refused as refusal:
        print(f"{PROG}: {refusal}", file=sys.stderr)
        return refusal.code


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also the documentation site's reference)."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=__doc__,
        epilog=help_epilog(EXIT_CODES),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)
    status = commands.add_parser("status", help="the database's version (current), this release's newest (head), steps")
    migrate = commands.add_parser("migrate", help="apply the pending steps (idempotent; adds schema, writes no row)")
    for sub in (status, migrate):
        sub.add_argument("--dsn", help=f"database URL (default: ${DSN_ENV})")
    status.add_argument("--json", action="store_true", help="one JSON object instead of text")
    migrate.add_argument(
        "--target", type=_version, default=0, help=f"stop at this version (default: the newest, {NEWEST_VERSION})"
    )
    migrate.add_argument("--dry-run", action="store_true", help="list the steps that would run; change nothing")
    return parser


def _version(raw: str) -> int:
    """A --target: a version from 1 to the newest this release knows (``migrations.resolve_target``)."""
    try:
        return migrations.resolve_target(int(raw))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a version number: {raw!r}") from None
    except InvalidArgument:
        raise argparse.ArgumentTypeError(
            f"{raw} is beyond what this release knows: it migrates to versions 1 to {NEWEST_VERSION}"
        ) from None


def _dsn(option: str | None) -> tuple[str, str]:
    """The DSN and where it came from (for messages)."""
    if option:
        return option, "--dsn"
    if os.environ.get(DSN_ENV):
        return os.environ[DSN_ENV], DSN_ENV
    raise Refused(ExitCode.UNREACHABLE, f"no database named: pass --dsn or set {DSN_ENV}")


def _open(dsn: str, named: str, *, must_exist: bool) -> Engine:
    """An engine on a database that can be used; ``Refused`` (exit 3) saying why not."""
    try:
        url = make_url(dsn)
    except Exception:  # make_url raises ArgumentError and, for a bad port, ValueError
        url = None
    if must_exist and url is not None and url.get_backend_name() == "sqlite" and url.database:
        if not Path(url.database).is_file():  # checking would create it: reading creates nothing
            raise Refused(ExitCode.UNREACHABLE, f"sqlite file {url.database} does not exist (migrate creates it)")
    try:
        check_database(dsn, named=named)
    except DatabaseUnusable as error:
        raise Refused(ExitCode.UNREACHABLE, str(error)) from None
    engine = create_engine(dsn, pool_size=2)
    try:
        verify(engine)
    except PrerequisiteError as error:
        engine.dispose()
        raise Refused(ExitCode.UNREACHABLE, str(error)) from None
    return engine


def _shown(dsn: str) -> str:
    url: URL = make_url(dsn)
    return url.render_as_string(hide_password=True)


def _status(out: Console, engine: Engine, dsn: str, *, as_json: bool) -> ExitCode:
    status = read_status(engine)
    if as_json:
        out.print_json(json.dumps(_status_json(status, _shown(dsn))))
    else:
        _print_status(out, status, _shown(dsn))
    if status.newer_than_known:
        print(f"{PROG}: {migrations.SchemaNewerThanKnown(status.current)}", file=sys.stderr)
        return ExitCode.CHECK_FAILED
    return ExitCode.OK


def _status_json(status: SchemaStatus, shown: str) -> dict[str, Any]:
    return {
        "database": shown,
        "current": status.current,
        "head": status.head,
        "applied": [
            {"version": a.version, "step": a.step, "applied_at": iso_utc(a.applied_at)} for a in status.applied
        ],
        "pending": [{"version": step.version, "step": step.name} for step in status.pending],
    }


def _print_status(out: Console, status: SchemaStatus, shown: str) -> None:
    names = {step.version: step.name for step in migrations.STEPS} | {a.version: a.step for a in status.applied}
    out.print(f"database: {shown}")
    out.print(f"current:  {status.current}" + (f" ({names[status.current]})" if status.current in names else ""))
    out.print(f"head:     {status.head} ({names[status.head]})")
    out.print("applied:" + ("" if status.applied else " none (empty database)"))
    for applied in status.applied:
        out.print(f"  {applied.version:>3}  {applied.step:<28} {iso_utc(applied.applied_at)}")
    out.print("pending:" + ("" if status.pending else " none"))
    for line in _planned_lines(status.pending):
        out.print(line)


def _planned_lines(steps: Sequence[migrations.Step]) -> Iterator[str]:
    for step in steps:
        yield f"  {step.version:>3}  {step.name}"


def _migrate(out: Console, engine: Engine, dsn: str, *, target: int, dry_run: bool) -> ExitCode:
    try:
        planned = migrations.plan(engine, target)
    except migrations.SchemaNewerThanKnown as newer:
        raise Refused(ExitCode.CHECK_FAILED, str(newer)) from None
    aim = target or NEWEST_VERSION
    if not planned.steps:
        if planned.current > aim:
            out.print(f"database at version {planned.current}, past --target {aim}: nothing to do (never backwards)")
        else:
            out.print(f"already at version {planned.current}: nothing to do")
        return ExitCode.OK
    out.print(f"database: {_shown(dsn)} at version {planned.current}")
    if dry_run:
        out.print(f"dry run: {len(planned.steps)} steps would run to reach version {aim}; nothing changed")
        for line in _planned_lines(planned.steps):
            out.print(line)
        return ExitCode.OK
    stop = threading.Event()
    progress = MigrateProgress(out, stop)
    try:
        with _stopping_on_signals(stop, out):
            start, end, applied = migrations.apply_schema(engine, aim, observer=progress)
    except Stopped as stopped:
        print(f"{PROG}: interrupted: {stopped}; {RESUME_HINT}", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted at once: the open transaction rolled back; {RESUME_HINT}", file=sys.stderr)
        return ExitCode.INTERRUPTED
    except DatabaseUnavailable as error:
        print(f"{PROG}: the database went away while migrating ({error}); {RESUME_HINT}", file=sys.stderr)
        return ExitCode.UNREACHABLE
    out.print(f"schema at version {end} (was {start}; applied {', '.join(applied)})")
    return ExitCode.OK


@contextmanager
def _stopping_on_signals(stop: threading.Event, out: Console) -> Iterator[None]:
    """SIGINT/SIGTERM set ``stop``: the apply stops after its step. A second one interrupts at once."""

    def _on_signal(signum: int, _frame: object) -> None:
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        out.print(f"{signal.Signals(signum).name}: stopping after the current step (again to stop at once) ...")

    previous = {signum: signal.signal(signum, _on_signal) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


if __name__ == "__main__":
    raise SystemExit(main())
