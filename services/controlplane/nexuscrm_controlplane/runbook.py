"""Operator commands of the L2 cutover runbook (docs/runbook-cutover.md), shipped with Controlplane.

``connector-projection-cutover -pack-install-id ID -timeout D [-dry-run] [-json]``
    audits a pack and writes its cutoff once (``cutover.run_cutover``).
``connector-projection-drain -pack-install-id ID -timeout D [-interval D] [-json]``
    waits, read-only, until the pack's old projection work is terminal.
``connector-admission-fence arm|disarm|list|override-add|override-remove ...``
    arms and lifts admission fences.

They run the cutover in process, on the Controlplane's own modules (the specification's "same
Controlplane lifecycle entrypoint"), so they ship with the Controlplane distribution and the
operator tools import no service (decision 154). Flags follow Go's style (``-flag value``,
``-flag=value``; ``--flag`` works too) and durations are Go durations (``30s``, ``5m``,
``1h30m``, ``500ms``; ``nexuscrm_runtime.durations``). Every command reads the database URL
from ``CONNECTOR_CUTOVER_DSN`` and never prints it.

Exit codes come from the one table of every operator command, ``nexuscrm_runtime.exit_codes``;
``COMMAND_EXIT_CODES`` says which each command returns, and its ``--help`` lists those.
``connector-projection-cutover``: 0 written, already written (the same checkpoint) or dry run
passed; 1 any other failure; 2 usage error (bad flags, unknown pack); 3 CONNECTOR_CUTOVER_DSN
missing or malformed, or the database unreachable; 4 refused gate; 5 refused audit; 6 missing
prerequisite; 7 timeout, nothing was written. The drain wait and the fence command use 0, 1,
2, 3 alike and the drain wait 7 when it ends undrained (it prints its last report).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn

import sqlalchemy as sa
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from sqlalchemy.engine import Engine

from nexuscrm_controlplane import cutover, drain, fences
from nexuscrm_controlplane.errors import CutoverTimeout, UnknownFence, UnknownPack
from nexuscrm_runtime.clock import iso_utc
from nexuscrm_runtime.config import dsn_backend
from nexuscrm_runtime.database import DatabaseUnavailable, create_engine, is_retryable
from nexuscrm_runtime.durations import format_duration, parse_duration, whole_seconds
from nexuscrm_runtime.exit_codes import REFUSAL_EXIT_CODES, ExitCode, help_epilog
from nexuscrm_schema.tables import NAMESPACE_SCOPE
from workqueue.errors import DomainError, InvalidArgument

DSN_VARIABLE = "CONNECTOR_CUTOVER_DSN"
PROGRESS_LOG_INTERVAL = 10.0  # seconds between progress lines when stderr is not a terminal

# Which codes each command returns; its --help lists exactly these.
_EVERY_COMMAND = (ExitCode.OK, ExitCode.FAILURE, ExitCode.USAGE, ExitCode.UNREACHABLE)
COMMAND_EXIT_CODES: dict[str, tuple[ExitCode, ...]] = {
    "connector-projection-cutover": (*_EVERY_COMMAND, *REFUSAL_EXIT_CODES.values(), ExitCode.TIMEOUT),
    "connector-projection-drain": (*_EVERY_COMMAND, ExitCode.TIMEOUT),
    "connector-admission-fence": _EVERY_COMMAND,
}


def outcome_exit_code(outcome: cutover.Outcome) -> ExitCode:
    """The exit code of a cutover outcome: OK unless refused, then by the refusing family."""
    for category, refusal in cutover.REFUSALS.items():
        if outcome is refusal:
            return REFUSAL_EXIT_CODES[category]
    return ExitCode.OK


class CommandError(Exception):
    """Ends a command with ``exit_code`` after printing ``message`` to stderr."""

    def __init__(self, message: str, exit_code: ExitCode) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class _Parser(argparse.ArgumentParser):
    """argparse with Go-style single-dash long flags, our usage exit code and exit-code help."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("epilog", help_epilog(COMMAND_EXIT_CODES[kwargs["prog"].split()[0]]))
        super().__init__(allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs)

    def _get_option_tuples(self, option_string: str) -> list[Any]:
        # Go's flag package matches names exactly; argparse would still expand single-dash
        # prefixes ("-pack" for "-pack-install-id") despite allow_abbrev=False.
        return []

    def flag(self, name: str, **kwargs: Any) -> None:
        self.add_argument(f"-{name}", f"--{name}", dest=name.replace("-", "_"), **kwargs)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(ExitCode.USAGE, f"{self.prog}: {message}\n")


def _engine_from_env() -> Engine:
    dsn = os.environ.get(DSN_VARIABLE, "")
    if not dsn:
        raise CommandError(
            f"{DSN_VARIABLE} is not set: export the database URL of the deployment", ExitCode.UNREACHABLE
        )
    try:
        dsn_backend(dsn)
    except Exception:
        raise CommandError(
            f"{DSN_VARIABLE} is not a valid database URL (its value is not shown)", ExitCode.UNREACHABLE
        ) from None
    return create_engine(dsn, pool_size=2)


def _backend(engine: Engine) -> str:
    return engine.dialect.name


@contextmanager
def _command(engine_factory: Callable[[], Engine] = _engine_from_env) -> Iterator[Engine]:
    """Open the engine and turn known failures into their exit codes (never echoing the DSN)."""
    engine = engine_factory()
    try:
        yield engine
    except (CommandError, CutoverTimeout):
        raise
    except (UnknownPack, UnknownFence, InvalidArgument) as error:
        raise CommandError(str(error), ExitCode.USAGE) from None
    except DatabaseUnavailable:
        raise CommandError(
            f"the {_backend(engine)} database named by {DSN_VARIABLE} is unreachable", ExitCode.UNREACHABLE
        ) from None
    except sa.exc.DBAPIError as error:
        if is_retryable(error):  # lock waits are bounded by the command's timeout (cutover.bound_lock_waits)
            raise CutoverTimeout(
                "a database lock was not granted in time; nothing was written", field="timeout"
            ) from None
        if not isinstance(error, sa.exc.OperationalError):
            raise
        code = error.orig.args[0] if error.orig is not None and error.orig.args else "?"
        raise CommandError(
            f"cannot use the {_backend(engine)} database named by {DSN_VARIABLE} ({type(error.orig).__name__} {code})",
            ExitCode.UNREACHABLE,
        ) from None
    except DomainError as error:
        raise CommandError(str(error), ExitCode.FAILURE) from None
    finally:
        engine.dispose()


def _run(prog: str, body: Callable[[], ExitCode]) -> NoReturn:
    try:
        code = body()
    except CommandError as error:
        print(f"{prog}: {error}", file=sys.stderr)
        code = error.exit_code
    except CutoverTimeout as error:
        print(f"{prog}: {error}", file=sys.stderr)
        code = ExitCode.TIMEOUT
    raise SystemExit(code)


# --- connector-projection-cutover -----------------------------------------------------------


@contextmanager
def _audit_progress(enabled: bool) -> Iterator[Callable[[int, int], None]]:
    """A progress callback: a live bar on a terminal, else a line every few seconds on stderr."""
    console = Console(stderr=True)
    if enabled and console.is_terminal:
        with Progress(
            TextColumn("auditing identities"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        ) as bar:
            task = bar.add_task("audit", total=None)
            yield lambda done, total: bar.update(task, completed=done, total=total)
        return
    last = time.monotonic()

    def log_line(done: int, total: int) -> None:
        nonlocal last
        if enabled and time.monotonic() - last >= PROGRESS_LOG_INTERVAL:
            last = time.monotonic()
            print(f"audited {done} of {total} identities", file=sys.stderr, flush=True)

    yield log_line


def _describe(result: cutover.CutoverResult) -> str:
    report = result.report
    lines = []
    if result.protocol is not None:
        p = result.protocol
        verb = "written" if result.outcome is cutover.Outcome.WRITTEN else "already written"
        lines.append(
            f"pack {p.pack_install_id}: checkpoint {verb}: protocol {p.protocol_version}, "
            f"LegacyMaxOrdinal {p.legacy_max_ordinal}, origin {p.origin}, at {iso_utc(p.created_at)}"
        )
    elif result.outcome is cutover.Outcome.WOULD_WRITE:
        lines.append(
            f"pack {report.pack_install_id}: dry run passed; a cutover would write "
            f"LegacyMaxOrdinal {report.legacy_max_ordinal}"
        )
    else:
        lines.append(f"pack {report.pack_install_id}: cutover REFUSED ({result.outcome.value}); nothing was written")
        for f in report.findings:
            samples = ", ".join(f.sample_ids) or "-"
            lines.append(f"  {f.category.value} {f.rule.value}: count {f.count}; samples {samples}; {f.detail}")
    if report.identities_audited or report.events_audited:
        permitted = ", ".join(f"{k} {v}" for k, v in sorted(report.permitted.items())) or "none"
        lines.append(
            f"audited {report.identities_audited} identities, {report.events_audited} Events, "
            f"{report.work_items_audited} old WorkItems; permitted cases: {permitted}"
        )
    return "\n".join(lines)


def cutover_parser() -> argparse.ArgumentParser:
    """The flags of ``connector-projection-cutover`` (also the documentation site's reference)."""
    parser = _Parser(
        prog="connector-projection-cutover",
        description="Audit a pack incarnation's old-protocol history and write its cutoff once.",
    )
    parser.flag("pack-install-id", required=True, metavar="ID", help="the pack incarnation to cut over")
    parser.flag("timeout", type=parse_duration, default="5m", metavar="DURATION", help="bound on the whole run")
    parser.flag("dry-run", action="store_true", help="run every gate and the audit; write nothing")
    parser.flag("json", action="store_true", help="print the result as one JSON document on stdout")
    return parser


def cutover_main(argv: Sequence[str] | None = None) -> NoReturn:
    """``connector-projection-cutover``: see the module docstring for flags and exit codes."""
    prog = "connector-projection-cutover"
    args = cutover_parser().parse_args(argv)

    def body() -> ExitCode:
        deadline = time.monotonic() + args.timeout.total_seconds()
        engine = _engine_from_env()
        cutover.bound_lock_waits(engine, deadline)
        try:
            with _command(lambda: engine), _audit_progress(not args.json) as progress:
                result = cutover.run_cutover(
                    engine, args.pack_install_id, deadline=deadline, dry_run=args.dry_run, progress=progress
                )
        except CutoverTimeout as error:
            message = (
                f"pack {args.pack_install_id}: timed out after {format_duration(args.timeout)}; nothing was written"
            )
            if args.json:
                print(json.dumps({"outcome": "timeout", "message": message, "detail": str(error)}))
            raise CommandError(message, ExitCode.TIMEOUT) from None
        code = outcome_exit_code(result.outcome)
        if args.json:
            print(json.dumps({**result.to_dict(), "exit_code": code}, sort_keys=True))
        else:
            print(_describe(result), file=sys.stdout if code == ExitCode.OK else sys.stderr)
        return code

    _run(prog, body)


# --- connector-projection-drain -------------------------------------------------------------


def drain_parser() -> argparse.ArgumentParser:
    """The flags of ``connector-projection-drain``."""
    parser = _Parser(
        prog="connector-projection-drain",
        description="Wait until a pack's old-protocol projection work is terminal; never changes a status.",
    )
    parser.flag("pack-install-id", required=True, metavar="ID", help="the pack incarnation to watch")
    parser.flag("timeout", type=parse_duration, default="10m", metavar="DURATION", help="bound on the wait")
    parser.flag("interval", type=parse_duration, default="2s", metavar="DURATION", help="time between polls")
    parser.flag("json", action="store_true", help="print the final status as JSON on stdout")
    return parser


def drain_main(argv: Sequence[str] | None = None) -> NoReturn:
    """``connector-projection-drain``: wait (read-only) for old projection work to become terminal."""
    prog = "connector-projection-drain"
    args = drain_parser().parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def body() -> ExitCode:
        last_line = ""

        def show(status: drain.DrainStatus) -> None:
            nonlocal last_line
            if not args.json and status.summary() != last_line:
                last_line = status.summary()
                print(last_line, file=sys.stderr, flush=True)

        with _command() as engine:
            try:
                status = drain.wait_drained(
                    engine, args.pack_install_id, args.timeout, interval=args.interval, on_poll=show, stop=stop
                )
                code = ExitCode.OK
            except drain.DrainTimeout as timeout:
                status, code = timeout.status, ExitCode.TIMEOUT
        if args.json:
            print(json.dumps({**status.to_dict(), "exit_code": code}, sort_keys=True))
        elif code == ExitCode.OK:
            print(status.summary())
        else:
            print(f"{prog}: not drained within {format_duration(args.timeout)}: {status.summary()}", file=sys.stderr)
            for hold in status.holds:
                print(
                    f"  {hold.reason}: {hold.count} ({', '.join(hold.sample_work_ids)}) {hold.detail}", file=sys.stderr
                )
        return code

    _run(prog, body)


# --- connector-admission-fence --------------------------------------------------------------


def fence_parser() -> argparse.ArgumentParser:
    """The subcommands and flags of ``connector-admission-fence``."""
    parser = _Parser(
        prog="connector-admission-fence",
        description="Arm, list and lift admission fences and their per-pack overrides.",
    )
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def sub(name: str, help_text: str) -> _Parser:
        return commands.add_parser(name, help=help_text)

    arm = sub("arm", "arm a fence on a namespace ('*') or one pack")
    arm.flag("namespace", required=True)
    arm.flag("scope", default=NAMESPACE_SCOPE, help=f"'{NAMESPACE_SCOPE}' (default) or a pack_install_id")
    arm.flag("expires-in", type=parse_duration, default=None, metavar="DURATION", help="default: never expires")
    arm.flag("reason", default="")
    disarm = sub("disarm", "remove a fence and its overrides")
    disarm.flag("fence-id", required=True)
    listing = sub("list", "list a namespace's fences with their overrides")
    listing.flag("namespace", required=True)
    add = sub("override-add", "release one pack from one fence")
    add.flag("fence-id", required=True)
    add.flag("pack-install-id", required=True)
    add.flag("expires-in", type=parse_duration, default=None, metavar="DURATION", help="default: until removed")
    remove = sub("override-remove", "end a pack's release from a fence")
    remove.flag("fence-id", required=True)
    remove.flag("pack-install-id", required=True)
    return parser


def fence_main(argv: Sequence[str] | None = None) -> NoReturn:
    """``connector-admission-fence``: arm, disarm and list fences, add and remove overrides.

    Every subcommand prints JSON on stdout (the fence, the fences, or ``{}``).
    """
    prog = "connector-admission-fence"
    args = fence_parser().parse_args(argv)

    def body() -> ExitCode:
        with _command() as engine:
            output: Any = {}
            if args.command == "arm":
                output = fences.arm_fence(
                    engine,
                    args.namespace,
                    args.scope,
                    expires_in_seconds=whole_seconds(args.expires_in),
                    reason=args.reason,
                ).to_dict()
            elif args.command == "disarm":
                fences.disarm_fence(engine, args.fence_id)
            elif args.command == "list":
                output = [f.to_dict() for f in fences.list_fences(engine, args.namespace)]
            elif args.command == "override-add":
                output = fences.add_override(
                    engine, args.fence_id, args.pack_install_id, expires_in_seconds=whole_seconds(args.expires_in)
                ).to_dict()
            else:
                fences.remove_override(engine, args.fence_id, args.pack_install_id)
        print(json.dumps(output, sort_keys=True))
        return ExitCode.OK

    _run(prog, body)
