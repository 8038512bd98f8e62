"""``nexuscrm versions``: build a new Flow version of a work type beside the live one, switch, roll back, retire.

A Flow version is a track of generations over the inputs delivered with the live version
(decision 185). ``build`` starts one from history; ``list`` shows each version's state and
progress (``--watch``: until none is building); ``switch``, ``rollback`` and ``retire`` are the
recorded steps; ``verify`` compares two versions' read models with the digests their Flows
offer (``nexuscrm_tools.flow_digests``). Progress is drawn with rich on a terminal, one line
per poll on stderr otherwise.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn

from nexuscrm.connectors.v1 import connectors_pb2 as cn_pb
from nexuscrm_runtime.database import create_engine
from nexuscrm_runtime.durations import parse_duration
from nexuscrm_sdk.flows import FlowNotFound
from nexuscrm_tools import flow_digests
from nexuscrm_tools.clients import Clients
from nexuscrm_tools.commands.shared import RPC_TIMEOUT, Outcome, UsageError, fields, leaf, setting
from nexuscrm_tools.exits import ExitCode
from nexuscrm_tools.json_view import enum_word, message_data, timestamp_text
from nexuscrm_tools.tables import listing, plural

POLL_INTERVAL = 2.0  # seconds between two reads of a version's progress while waiting


def state_word(version: cn_pb.FlowVersion) -> str:
    """``building``, ``standby``, ``live``, ``stopped`` or ``retired``."""
    return enum_word(cn_pb.FlowVersionState.DESCRIPTOR, version.state)


def rate_text(version: cn_pb.FlowVersion) -> str:
    """Inputs per second over the last minute."""
    return f"{version.inputs_per_second:.1f}/s"


def left_text(version: cn_pb.FlowVersion) -> str:
    """The time left at the current rate: ``-`` when unknown or done."""
    return str(dt.timedelta(seconds=version.seconds_left)) if version.seconds_left else "-"


def _verification(version: cn_pb.FlowVersion) -> str:
    if not version.verdict:
        return "-"
    word = enum_word(cn_pb.FlowVersionVerdict.DESCRIPTOR, version.verdict)
    return f"{word} against {version.verified_against} at {version.verified_through_ordinal}"


def _row(version: cn_pb.FlowVersion) -> tuple[object, ...]:
    covers = f"{version.cover_from_ordinal}..{version.cover_through_ordinal or ''}"
    return (
        version.work_type,
        version.version,
        state_word(version),
        version.source_version,
        f"{version.inputs_done} of {version.inputs_total}",
        f"{version.generations_done} of {version.generations_total}",
        version.generations_failed,
        rate_text(version),
        left_text(version),
        covers,
        _verification(version),
    )


COLUMNS = (
    "work type",
    "version",
    "state",
    "source",
    "inputs done",
    "generations done",
    "failed",
    "rate",
    "left",
    "covers",
    "verified",
)


def versions_table(title: str, versions: Sequence[cn_pb.FlowVersion]) -> Any:
    """The versions in a table (or ``<title>: none``)."""
    return listing(
        f"{title}{': ' + plural(len(versions), 'version') if versions else ''}", COLUMNS, list(map(_row, versions))
    )


def list_versions(clients: Clients, pack: str, work_type: str = "") -> list[cn_pb.FlowVersion]:
    """A pack's Flow versions (of one work type, or every one), as ListFlowVersions answers them."""
    request = cn_pb.ListFlowVersionsRequest(pack_install_id=pack, work_type=work_type)
    return list(clients.connectors.ListFlowVersions(request, timeout=RPC_TIMEOUT).versions)


@contextlib.contextmanager
def progress_view() -> Iterator[Callable[[Sequence[cn_pb.FlowVersion]], None]]:
    """A callback drawing each version's progress: inputs done of its total, rate and time left.

    A rich progress display on a terminal; otherwise one line per version per call on stderr.
    """
    console = Console(stderr=True)
    if not console.is_terminal:

        def lines(versions: Sequence[cn_pb.FlowVersion]) -> None:
            for v in versions:
                print(
                    f"{v.work_type} {v.version} {state_word(v)}: {v.inputs_done} of {v.inputs_total} inputs, "
                    f"{rate_text(v)}, {left_text(v)} left",
                    file=sys.stderr,
                    flush=True,
                )

        yield lines
        return
    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("inputs {task.fields[state]} {task.fields[rate]}, {task.fields[left]} left"),
        console=console,
    )
    tasks: dict[tuple[str, str], TaskID] = {}

    def draw(versions: Sequence[cn_pb.FlowVersion]) -> None:
        for v in versions:
            key = (v.work_type, v.version)
            if key not in tasks:
                tasks[key] = bar.add_task(f"{v.work_type} {v.version}", total=None, state="", rate="", left="")
            bar.update(
                tasks[key],
                completed=v.inputs_done,
                total=v.inputs_total,
                state=state_word(v),
                rate=rate_text(v),
                left=left_text(v),
            )

    with bar:
        yield draw


def watch(
    read: Callable[[], list[cn_pb.FlowVersion]],
    done: Callable[[list[cn_pb.FlowVersion]], bool],
    timeout: dt.timedelta | None,
) -> tuple[list[cn_pb.FlowVersion], bool]:
    """Read and draw the versions until ``done`` says so or ``timeout`` passes; the last read, and whether done."""
    deadline = None if timeout is None else time.monotonic() + timeout.total_seconds()
    with progress_view() as draw:
        while True:
            versions = read()
            draw(versions)
            if done(versions):
                return versions, True
            if deadline is not None and time.monotonic() >= deadline:
                return versions, False
            time.sleep(POLL_INTERVAL)


def _building(versions: list[cn_pb.FlowVersion]) -> bool:
    return any(v.state == cn_pb.FLOW_VERSION_STATE_BUILDING for v in versions)


def versions_build(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Start a build of a new Flow version of a work type beside the live one, from each identity's history.

    Pools for the version (a host pool with ``flow_version``) run its generations in a build:
    the Flow writes its read model, no side effect. A version that exists, a second build of
    the work type, or history that retention pruned (unless ``--from-retained``; the refusal
    names the ordinal a build could start from) is refused, nothing changed. ``--wait`` shows
    its progress until it caught up (exit 7 when ``--timeout`` passes first).
    """
    request = cn_pb.BuildFlowVersionRequest(
        pack_install_id=args.pack,
        work_type=args.work_type,
        version=args.version,
        from_retained=args.from_retained,
        max_inputs_per_second=args.max_rate,
        started_by=args.by,
        reason=args.reason,
    )
    response = clients.connectors.BuildFlowVersion(request, timeout=RPC_TIMEOUT)
    data = message_data(response)
    caught_up = (
        f"{plural(response.catch_up_generations, 'generation')} over {plural(response.catch_up_inputs, 'input')}"
    )
    view = f"version {args.version} of work type {args.work_type} of {args.pack}: building; catch-up {caught_up}"
    if not args.wait:
        return Outcome(data=data, view=view)

    def read() -> list[cn_pb.FlowVersion]:
        return [v for v in list_versions(clients, args.pack, args.work_type) if v.version == args.version]

    versions, done = watch(read, lambda found: not _building(found), args.timeout)
    data["version"] = message_data(versions[0]) if versions else data["version"]
    if not done:
        return Outcome(data=data, view=f"{view}; still building when the timeout passed", code=ExitCode.TIMEOUT)
    return Outcome(data=data, view=versions_table(f"{view}; caught up", versions))


def versions_list(clients: Clients, args: argparse.Namespace) -> Outcome:
    """A pack's Flow versions per work type: state, inputs done of the pack's counter, rate, time left, verification.

    ``--watch`` redraws their progress until no version is building (exit 7 when ``--timeout``
    passes first).
    """

    def read() -> list[cn_pb.FlowVersion]:
        return list_versions(clients, args.pack, args.work_type or "")

    if args.watch:
        versions, done = watch(read, lambda found: not _building(found), args.timeout)
    else:
        versions, done = read(), True
    data = {"versions": [message_data(v) for v in versions]}
    view = versions_table(f"Flow versions of {args.pack}", versions)
    return Outcome(data=data, view=view, code=ExitCode.OK if done else ExitCode.TIMEOUT)


def _step(title: str, live: cn_pb.FlowVersion, previous: cn_pb.FlowVersion, data: dict[str, Any]) -> Outcome:
    """A switch's or a rollback's answer: which version is live now, which was."""
    return Outcome(data=data, view=versions_table(title, [v for v in (live, previous) if v.version]))


def versions_switch(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Make a version the live one of its work type, in one recorded step (who, when, why).

    Its generations run live from then on and the version that was live stops receiving
    inputs. Refused while the version is behind or its verification found a difference, unless
    ``--force`` (recorded as forced, with the reason).
    """
    request = cn_pb.SwitchFlowVersionRequest(
        pack_install_id=args.pack,
        work_type=args.work_type,
        version=args.version,
        switched_by=args.by,
        reason=args.reason,
        force=args.force,
    )
    response = clients.connectors.SwitchFlowVersion(request, timeout=RPC_TIMEOUT)
    title = f"version {args.version} of work type {args.work_type} of {args.pack} is live"
    return _step(title, response.live, response.previous, message_data(response))


def versions_rollback(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Make the version that was live before the last switch live again; it first catches up on what it missed.

    Refused once that version is retired.
    """
    request = cn_pb.RollbackFlowVersionRequest(
        pack_install_id=args.pack, work_type=args.work_type, rolled_back_by=args.by, reason=args.reason
    )
    response = clients.connectors.RollbackFlowVersion(request, timeout=RPC_TIMEOUT)
    catch_up = f"{plural(response.catch_up_generations, 'generation')} over {plural(response.catch_up_inputs, 'input')}"
    live = f"version {response.live.version} of work type {args.work_type} of {args.pack}"
    title = f"{live} is live again; catch-up {catch_up}"
    return _step(title, response.live, response.previous, message_data(response))


def versions_retire(clients: Clients, args: argparse.Namespace) -> Outcome:
    """End a version that is not live: it receives nothing more; its history is kept."""
    request = cn_pb.RetireFlowVersionRequest(
        pack_install_id=args.pack,
        work_type=args.work_type,
        version=args.version,
        retired_by=args.by,
        reason=args.reason,
    )
    version = clients.connectors.RetireFlowVersion(request, timeout=RPC_TIMEOUT).version
    retired = timestamp_text(version.retired_at) if version.HasField("retired_at") else "-"
    title = f"version {args.version} of work type {args.work_type} of {args.pack} retired"
    return Outcome(
        data=message_data(version), view=fields(title, {"state": state_word(version), "retired at": retired})
    )


def _receives_through(version: cn_pb.FlowVersion, through: int) -> bool:
    """Whether ``version`` has (or will have, as admission goes on) generations for every input up to ``through``."""
    return version.state != cn_pb.FLOW_VERSION_STATE_BUILDING or version.catch_up_through_ordinal >= through


def versions_verify(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Compare a version's read model with another's, identity by identity, at one ordinal; record the verdict.

    Waits (showing both versions' progress) until both completed every generation at or below
    the ordinal (``--through``; default: the pack's counter now), then asks each version's Flow
    (``--flow`` / ``--against-flow`` with its pool's settings, on the host database ``--dsn`` or
    NEXUSCRM_DSN, as its host pool would build it) for each identity's digest. Prints the
    identities whose digests differ, with both; records equal, different, or coverage only
    (a Flow without a digest: only coverage was compared). Exit 9 on a difference, or when a
    generation at or below the ordinal failed for good (replay or skip it first); exit 7 when
    ``--timeout`` passes before both versions got there.
    """
    dsn = args.dsn or os.environ.get("NEXUSCRM_DSN", "")
    if not dsn:
        raise UsageError("verify builds the versions' Flows on the host database: give --dsn or set NEXUSCRM_DSN")
    pair = (args.version, args.against)
    known = {v.version: v for v in list_versions(clients, args.pack, args.work_type)}
    missing = [name for name in pair if name not in known]
    if missing:
        raise UsageError(
            f"work type {args.work_type} of {args.pack} has no version {missing[0]}; it has {sorted(known)}"
        )
    through = args.through if args.through is not None else known[args.version].high_water_ordinal
    for name in pair:
        stopped = known[name].cover_through_ordinal
        if stopped and stopped < through:
            raise UsageError(
                f"version {name} stopped receiving inputs at ordinal {stopped}: verify --through {stopped}"
            )
    source = known[args.version].source_version
    routes = flow_digests.input_routes(clients.connectors, args.pack, args.work_type, source)
    pending = {(route, name) for route in routes for name in pair}
    failed: dict[str, tuple[str, ...]] = {}

    def read() -> list[cn_pb.FlowVersion]:
        versions = [v for v in list_versions(clients, args.pack, args.work_type) if v.version in pair]
        ready = {v.version for v in versions if _receives_through(v, through)}
        # Every generation of a version completed: no identity of it needs a look of its own.
        done = {v.version for v in versions if v.version in ready and v.generations_done == v.generations_total}
        pending.difference_update({(route, name) for route, name in pending if name in done})
        for route, name in sorted(pending, key=str):
            if name in ready:
                reached = flow_digests.reach(clients.connectors, args.pack, route, name, through)
                failed.update({name: failed.get(name, ()) + reached.failed} if reached.failed else {})
                if not reached.waiting and not reached.failed:
                    pending.discard((route, name))
        return versions

    _, done = watch(read, lambda _: not pending or bool(failed), args.timeout)
    title = f"version {args.version} against {args.against} of work type {args.work_type} of {args.pack}"
    if failed:
        named = "; ".join(f"version {name}: {', '.join(works)}" for name, works in sorted(failed.items()))
        message = f"{title}: generations at or below ordinal {through} failed for good ({named}); replay or skip them"
        return Outcome(data={"failed": failed, "through_ordinal": through}, view=message, code=ExitCode.CHECK_FAILED)
    if not done:
        message = f"{title}: not both at ordinal {through} when the timeout passed"
        return Outcome(data={"through_ordinal": through}, view=message, code=ExitCode.TIMEOUT)
    flows = (
        flow_digests.VersionFlow(version=args.version, reference=args.flow, settings=dict(args.setting)),
        flow_digests.VersionFlow(
            version=args.against, reference=args.against_flow, settings=dict(args.against_setting)
        ),
    )
    engine = create_engine(dsn)
    try:
        mine, theirs = (
            flow.digest(pack_install_id=args.pack, work_type=args.work_type, engine=engine) for flow in flows
        )
        differing = []
        if mine is not None and theirs is not None:
            for route in routes:
                key = route.identity(args.pack).key
                ours, others = mine(key, through), theirs(key, through)
                if ours != others:
                    differing.append((route, key, ours, others))
    except FlowNotFound as error:
        raise UsageError(str(error)) from None
    finally:
        engine.dispose()
    if mine is None or theirs is None:
        verdict = cn_pb.FLOW_VERSION_VERDICT_COVERAGE_ONLY
    else:
        verdict = cn_pb.FLOW_VERSION_VERDICT_DIFFERENT if differing else cn_pb.FLOW_VERSION_VERDICT_EQUAL
    request = cn_pb.RecordFlowVersionVerificationRequest(
        pack_install_id=args.pack,
        work_type=args.work_type,
        version=args.version,
        against_version=args.against,
        through_ordinal=through,
        verdict=verdict,
        differing_projection_keys=[key for _, key, _, _ in differing],
        verified_by=args.by,
    )
    recorded = clients.connectors.RecordFlowVersionVerification(request, timeout=RPC_TIMEOUT).version
    word = enum_word(cn_pb.FlowVersionVerdict.DESCRIPTOR, verdict)
    data = {
        "verdict": word,
        "through_ordinal": through,
        "identities": len(routes),
        "differing": [
            {"projection_key": key, "digest": ours, "against_digest": others} for _, key, ours, others in differing
        ],
        "version": message_data(recorded),
    }
    compared = f"at ordinal {through} over {plural(len(routes), 'identity', 'identities')}"
    if verdict == cn_pb.FLOW_VERSION_VERDICT_COVERAGE_ONLY:
        without = [flow.version for flow, digest in zip(flows, (mine, theirs), strict=True) if digest is None]
        view: Any = f"{title}: coverage only {compared}: the Flow of version {', '.join(without)} has no digest"
    elif differing:
        rows = [(r.event_kind, r.route_version, r.source_lane, ours, others) for r, _, ours, others in differing]
        columns = ("event kind", "route version", "lane", f"digest of {args.version}", f"digest of {args.against}")
        view = listing(f"{title}: {plural(len(rows), 'identity', 'identities')} differ {compared}", columns, rows)
    else:
        view = f"{title}: equal {compared}"
    return Outcome(data=data, view=view, code=ExitCode.CHECK_FAILED if differing else ExitCode.OK)


def add_verify(versions: Any) -> None:
    """``versions verify``."""
    sub = leaf(versions, "verify", versions_verify, "compare two versions' read models at one ordinal")
    pack_and_work_type(sub)
    sub.add_argument("--version", required=True, help="the version verified (the new one)")
    sub.add_argument("--against", required=True, metavar="VERSION", help="the version it is compared with")
    sub.add_argument("--flow", required=True, help="the version's Flow, as its host pool names it")
    sub.add_argument("--against-flow", required=True, metavar="FLOW", help="the other version's Flow")
    for flag, whose in (("--setting", "the version's"), ("--against-setting", "the other version's")):
        sub.add_argument(
            flag,
            action="append",
            type=setting,
            default=[],
            metavar="KEY=VALUE",
            help=f"{whose} pool setting; repeatable",
        )
    sub.add_argument("--dsn", help="the host database the Flows get (default: NEXUSCRM_DSN)")
    sub.add_argument(
        "--through", type=int, metavar="N", help="the ordinal compared at (default: the pack's counter now)"
    )
    who_and_why(sub, reason=False)
    waiting_timeout(sub, "the wait for both versions")


def who_and_why(parser: argparse.ArgumentParser, *, reason: bool = True) -> None:
    """``--by`` and (unless told) ``--reason``: who and why, as recorded."""
    parser.add_argument("--by", required=True, help="who, as recorded")
    if reason:
        parser.add_argument("--reason", required=True, help="why, as recorded")


def pack_and_work_type(parser: argparse.ArgumentParser, *, required: bool = True) -> None:
    """PACK and ``--work-type``."""
    parser.add_argument("pack")
    parser.add_argument("--work-type", required=required, help="the work type of the pack")


def waiting(parser: argparse.ArgumentParser, flag: str, text: str) -> None:
    """``flag`` (wait and show progress) and ``--timeout``."""
    parser.add_argument(flag, action="store_true", help=text)
    waiting_timeout(parser, flag)


def waiting_timeout(parser: argparse.ArgumentParser, what: str) -> None:
    """``--timeout``: a bound on ``what``."""
    parser.add_argument(
        "--timeout",
        type=parse_duration,
        metavar="DURATION",
        help=f"bound on {what} (default: none; exit 7 when it passes)",
    )


def add_commands(commands: Any) -> None:
    """``versions build|list|switch|rollback|retire|verify``."""
    group = commands.add_parser("versions", help="Flow versions: build beside the live one, verify, switch")
    versions = group.add_subparsers(dest="action", required=True)
    sub = leaf(versions, "build", versions_build, "start building a new Flow version from history")
    pack_and_work_type(sub)
    sub.add_argument("--version", required=True, help="the new version (a companion version, 1..64 characters)")
    sub.add_argument("--from-retained", action="store_true", help="build from what retention kept of each identity")
    sub.add_argument(
        "--max-rate", type=int, default=0, metavar="N", help="inputs per second at most (default: unbounded)"
    )
    who_and_why(sub)
    waiting(sub, "--wait", "show its progress until it caught up")
    sub = leaf(versions, "list", versions_list, "each version's state and progress")
    pack_and_work_type(sub, required=False)
    waiting(sub, "--watch", "redraw the progress until no version is building")
    sub = leaf(versions, "switch", versions_switch, "make a version live")
    pack_and_work_type(sub)
    sub.add_argument("--version", required=True, help="the version to make live")
    sub.add_argument("--force", action="store_true", help="although it is behind or its verification differed")
    who_and_why(sub)
    sub = leaf(versions, "rollback", versions_rollback, "make the version live before the last switch live again")
    pack_and_work_type(sub)
    who_and_why(sub)
    sub = leaf(versions, "retire", versions_retire, "end a version that is not live, keeping its history")
    pack_and_work_type(sub)
    sub.add_argument("--version", required=True, help="the version to retire")
    who_and_why(sub)
    add_verify(versions)
