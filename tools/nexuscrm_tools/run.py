"""``nexuscrm-run``: the whole system on one machine, with a Flow, stopped cleanly with Ctrl-C.

Starts the four services as separate processes, installs and activates a demo pack through
Controlplane, starts the Integration host with a Flow (``--flow``: ``module:function`` or an
entry point of group ``nexuscrm.flows``; default the demo's ``demo-contacts``), drives a
source simulator (400 lanes, a walking workload with bursts and about 5% duplicate deliveries
by default), waits until every admitted input is in a finished generation, and prints a
summary with the invariant check over the database (and, for the demo Flow, that its
projection equals the inputs). The wait ends at once when no generation can run any more
(the Flow failed them for good, or the "block" order policy holds them behind a dead letter)
or the Integration host exited: the summary then names each failure with its WorkIds and the
Flow's message, and each held generation with the dead letter it is blocked behind, and a
line of its own says why the wait stopped (for the host, its exit code and log): the
summary's problems are failed checks only. Each decision to stop reads one snapshot of the
database (decision 172). ``--serve`` then keeps the services up for real clients
(``--inputs 0`` skips the simulator); each service is given the targets of the others
(Controlplane's dashboard reaches the Integration host).

Every run starts from a fresh run state: the logs and port files in ``--workdir`` and, unless
NEXUSCRM_DSN names a database, the embedded SQLite file ``WORKDIR/nexuscrm.db`` are removed
first; ``--keep`` reuses them. A database named by NEXUSCRM_DSN is never emptied.

Environment: NEXUSCRM_DSN (default: embedded SQLite in the workdir; set it to a
``mysql://user:password@host:3306/database`` URL to run against MariaDB, MySQL or TiDB, or a
``sqlite:////absolute/path.db`` in a folder that exists; a URL that cannot serve ends the run
at once, saying why); NEXUSCRM_DASHBOARD_ADDRESS (where Controlplane serves the operator
dashboard; default 127.0.0.1:0, a free port, printed at start).

Exit codes come from the one table of every operator command (``nexuscrm_tools.exits``; the
list below ``--help``): 0 every check passed; 1 a service did not stop cleanly; 2 usage error;
3 a service or the database did not start; 9 a check failed (a generation failed for good,
the projection or the invariants; also a run that stopped before every input was projected:
nothing could progress, the Integration host exited, or the timeout);
130 interrupted (SIGINT, SIGTERM or SIGHUP) before every admitted input was projected: the
summary printed so far says what was done and marks the projection "not checked". An
unknown ``--flow`` is a usage error (2); a database that cannot serve is 3. Every service
stops with the runner, whatever ends it (``nexuscrm_tools.launcher``). ``--timeout`` is a Go
duration (``10m``, ``90s``).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import grpc
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError

from nexuscrm.controlplane.v1 import controlplane_pb2 as cp_pb
from nexuscrm.controlplane.v1 import controlplane_pb2_grpc as cp_grpc
from nexuscrm.integration.v1 import integration_pb2 as in_pb
from nexuscrm.integration.v1 import integration_pb2_grpc as in_grpc
from nexuscrm_runtime.config import dsn_backend, env_str
from nexuscrm_runtime.database import create_engine
from nexuscrm_runtime.database_check import DatabaseUnusable, check_database
from nexuscrm_runtime.durations import parse_duration
from nexuscrm_runtime.polling import poll_until
from nexuscrm_schema.invariants import check_invariants, snapshot
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_sdk.flows import FlowNotFound, resolve_flow
from nexuscrm_tools import demo, demo_tables, tables
from nexuscrm_tools import demo_queries as queries
from nexuscrm_tools.commands.shared import setting
from nexuscrm_tools.exits import ExitCode, help_epilog
from nexuscrm_tools.launcher import (
    CONNECTORS,
    CONTROLPLANE,
    INTEGRATION,
    SCHEMA_CATALOG,
    LaunchError,
    ServiceProcess,
    ServiceSpec,
    health_status,
    reserved_ports,
    reserved_target_env,
    start_services,
    stop_services,
    target_env,
)
from nexuscrm_tools.run_outcome import Ending, ending, failure_problems, held_problems, states_text
from nexuscrm_tools.simulator import Simulator, SimulatorStats, WorkloadConfig
from nexuscrm_tools.tables import plural
from workqueue.statuses import NONTERMINAL_WORK_STATUSES

POLL_INTERVAL = dt.timedelta(milliseconds=250)  # between progress reads of the database
RPC_TIMEOUT = 30.0  # seconds per set-up RPC
INVARIANT_PREFIXES = ("M:", "O:", "B:", "D:", "X:", "P:", "R:")  # how check_invariants names violations
DATABASE_FILE = "nexuscrm.db"  # the run's embedded SQLite database, in the workdir
# What a run leaves in its workdir: service logs, (side) port files, the SQLite file with its
# WAL, shared-memory and writer-lock files. Only these are removed: the workdir may hold anything else.
RUN_STATE = ("*.log", "*.port", DATABASE_FILE, f"{DATABASE_FILE}-*")
PROBLEMS_SHOWN = 20  # problem lines after the summary table; the rest are counted
NOT_DEMO_LAG = "not measured: the Flow is not the demo's"
NOT_CHECKED = "[yellow]not checked: interrupted[/yellow]"
NOT_REACHED = "[red]not reached: the run stopped first[/red]"  # a Flow not the demo's: nothing else judges it
NOT_KNOWN = "not known: the host exited"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Summary:
    """The outcome of one demo run, as the summary table shows it; ``problems`` are failed checks only."""

    pack_install_id: str
    flow: str
    stats: SimulatorStats
    generations: int
    executions: int | None  # None when the host exited: no one is left to ask
    lag_p50: float
    lag_p99: float
    seconds: float
    problems: tuple[str, ...]
    ending: Ending
    stopped: str  # why the wait ended before every input was projected ("" when it did not)

    @property
    def complete(self) -> bool:
        """True when every admitted input was projected."""
        return self.ending is Ending.PROJECTED


def install_demo_pack(controlplane: grpc.Channel, namespace: str) -> str:
    """Install a new incarnation of the demo pack and activate it (greenfield); return its id."""
    stub = cp_grpc.ControlplaneServiceStub(controlplane)
    installed = stub.InstallPack(
        cp_pb.InstallPackRequest(namespace=namespace, pack_name=demo.PACK_NAME, pack_version=demo.PACK_VERSION),
        timeout=RPC_TIMEOUT,
    )
    pack_install_id: str = installed.pack.pack_install_id
    stub.ActivatePack(cp_pb.ActivatePackRequest(pack_install_id=pack_install_id), timeout=RPC_TIMEOUT)
    return pack_install_id


def demo_pools(
    pack_install_id: str,
    workers: int,
    flow: str = demo.FLOW_NAME,
    batch_size: int = 1,
    settings: Mapping[str, str] | None = None,
    complete_in_claim: bool = False,
) -> str:
    """NEXUSCRM_INTEGRATION_POOLS for ``flow`` (default: the demo Flow) on ``pack_install_id``."""
    pool = {
        "pack_install_id": pack_install_id,
        "work_type": demo.WORK_TYPE,
        "flow": flow,
        "size": workers,
        "batch_size": batch_size,
        "complete_in_claim": complete_in_claim,
        "settings": dict(settings or {}),
    }
    return json.dumps([pool])


def start_host(
    core: Sequence[ServiceProcess],
    pack_install_id: str,
    workdir: Path,
    *,
    env: dict[str, str],
    workers: int,
    flow: str = demo.FLOW_NAME,
    batch_size: int = 1,
    settings: Mapping[str, str] | None = None,
    complete_in_claim: bool = False,
    ports: Mapping[ServiceSpec, int] | None = None,
) -> ServiceProcess:
    """Start the Integration host serving ``flow`` (with its pool ``settings``) on the pack, wired to ``core``.

    ``complete_in_claim``: the pool field of that name.
    ``ports``: the host's port when ``reserved_ports`` holds one for it (the others were told it).
    """
    pools = demo_pools(pack_install_id, workers, flow, batch_size, settings, complete_in_claim)
    host_env = {**env, **target_env(core), "NEXUSCRM_INTEGRATION_POOLS": pools}
    return start_services((INTEGRATION,), env=host_env, workdir=workdir, ports=ports)[0]


def start_system(
    dsn: str,
    workdir: Path,
    *,
    namespace: str,
    workers: int,
    flow: str = demo.FLOW_NAME,
    batch_size: int = 1,
    settings: Mapping[str, str] | None = None,
    extra_env: dict[str, str] | None = None,
    worker_connectors: bool = False,
    complete_in_claim: bool = False,
) -> tuple[list[ServiceProcess], str]:
    """Start the services, install and activate a demo pack, then start the host serving it.

    Connectors starts before the Controlplane, whose dashboard asks it (NEXUSCRM_CONNECTORS_TARGET);
    the host starts last because its activation gate needs the pack's protocol receipt, on a
    port reserved before anything starts, so every service is given its target too
    (NEXUSCRM_INTEGRATION_TARGET: the dashboard's worker list asks the host).
    ``worker_connectors``: the host's workers call a Connectors replica of their own (a second
    process on the same database, started before the host), so their Claims and Completes do
    not share one interpreter with admission. The first Connectors in the list
    is the one clients ingest through. ``complete_in_claim``: the host's pool field of that
    name. Returns the running services (stop them with ``stop_services``) and
    the pack id.
    """
    with reserved_ports((INTEGRATION,)) as host_port:
        env = {"NEXUSCRM_DSN": dsn, **reserved_target_env(host_port), **(extra_env or {})}
        services = start_services((SCHEMA_CATALOG, CONNECTORS, CONTROLPLANE), env=env, workdir=workdir)
        try:
            controlplane = next(s for s in services if s.spec is CONTROLPLANE)
            with controlplane.channel() as channel:
                pack_install_id = install_demo_pack(channel, namespace)
            core = list(services)
            if worker_connectors:
                replica = start_services((CONNECTORS,), env=env, workdir=workdir / "worker-connectors")[0]
                core = [replica if service.spec is CONNECTORS else service for service in services]
                services.append(replica)
            host = start_host(
                core,
                pack_install_id,
                workdir,
                env=env,
                workers=workers,
                flow=flow,
                batch_size=batch_size,
                settings=settings,
                complete_in_claim=complete_in_claim,
                ports=host_port,
            )
            services.append(host)
        except BaseException:
            stop_services(services)
            raise
    return services, pack_install_id


def percentile(values: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile of ``values`` (0 when empty)."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


def executions(integration: ServiceProcess) -> int:
    """Flow executions so far, summed over the host's workers (ListWorkers)."""
    with integration.channel() as channel:
        listed = in_grpc.IntegrationServiceStub(channel).ListWorkers(in_pb.ListWorkersRequest(), timeout=RPC_TIMEOUT)
    return sum(worker.executions for worker in listed.workers)


def executions_if_running(integration: ServiceProcess) -> int | None:
    """``executions``, or None once the host has exited: no one is left to ask."""
    if integration.process.poll() is not None:
        return None
    try:
        return executions(integration)
    except grpc.RpcError:
        if integration.process.poll() is None:  # a running host that fails the call is a fault to show
            raise
        return None  # it exited between the check and the call


@dataclasses.dataclass(frozen=True, kw_only=True)
class WaitState:
    """What the wait decides from, all of it read in one snapshot (``read_wait_state``)."""

    finished: int  # inputs in completed generations, those retention pruned or expired included
    counts: Mapping[str, int]  # the pack's generations per status
    held: int  # pending generations the "block" order policy holds behind a dead letter


def read_wait_state(engine: Engine, pack_install_id: str, *, held: bool) -> WaitState:
    """The pack's ``WaitState``, every read in one snapshot; ``held`` False leaves that read out (0).

    Read statement by statement at READ COMMITTED, a generation that completes (or completes
    and is pruned into tombstones) between the reads counts neither as finished nor as open,
    and the wait ended "stuck" on a database where every input was applied.
    """
    with snapshot(engine) as connection:
        return WaitState(
            finished=queries.work_item_inputs_finished(connection, pack_install_id),
            counts=queries.work_item_status_counts(connection, pack_install_id),
            held=len(queries.work_items_held(connection, pack_install_id)) if held else 0,
        )


def settled(engine: Engine, pack_install_id: str, stats: SimulatorStats) -> bool:
    """True once the simulator is done, every admitted input is in a finished generation and none is open."""
    return projected(read_wait_state(engine, pack_install_id, held=False), stats)


def projected(state: WaitState, stats: SimulatorStats) -> bool:
    """``settled`` from one ``WaitState``: the simulator done, every admitted input finished, no generation open."""
    open_ = any(state.counts.get(status, 0) for status in NONTERMINAL_WORK_STATUSES)
    return stats.done and state.finished >= stats.admitted and not open_


def decide(
    engine: Engine, pack_install_id: str, stats: SimulatorStats, *, host_running: bool
) -> tuple[Ending | None, WaitState]:
    """The ending the wait has reached (``run_outcome.ending``, None: wait on), and the ``WaitState`` it read.

    ``stats`` is taken before the read, so once it says done its admitted count is final.
    """
    state = read_wait_state(engine, pack_install_id, held=stats.done)
    reached = ending(
        delivered=stats.done,
        projected=projected(state, stats),
        counts=state.counts,
        host_running=host_running,
        held=state.held,
    )
    return reached, state


def run_demo(
    engine: Engine,
    services: Sequence[ServiceProcess],
    pack_install_id: str,
    workload: WorkloadConfig,
    *,
    stop: threading.Event,
    timeout: dt.timedelta,
    console: Console | None = None,
    flow: str = demo.FLOW_NAME,
) -> Summary:
    """Drive the simulator, show progress, wait until the outcome is known (``run_outcome.ending``), summarize.

    The check is the invariants over the database and that no generation failed (each failure
    a problem with its WorkIds and the Flow's message); for the demo Flow also that its
    projection equals the fold of the inputs (``demo.verify_projection``), unless ``stop``
    interrupted the run before every input was projected (then it is not judged).
    """
    by_name = {s.spec.name: s for s in services}
    host = by_name[INTEGRATION.name].process
    started = time.monotonic()
    with by_name[CONNECTORS.name].channel() as channel:
        halt = threading.Event()  # the simulator's stop: set when the wait ends, by ``stop`` or an outcome
        simulator = Simulator(ConnectorsClient(channel), pack_install_id, workload, halt)
        thread = threading.Thread(target=simulator.run, name="simulator", daemon=True)
        thread.start()
        progress = Progress(
            TextColumn("{task.description:<22}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("[red]{task.fields[states]}"),
            console=console,
            disable=console is None,
        )
        with progress:
            sent = progress.add_task("inputs delivered", total=workload.inputs, states="")
            shown = progress.add_task("inputs projected", total=workload.inputs, states="")

            def observe() -> Ending | None:
                stats = simulator.stats
                reached, read = decide(engine, pack_install_id, stats, host_running=host.poll() is None)
                progress.update(sent, completed=stats.fresh_sent)
                progress.update(
                    shown,
                    completed=read.finished,
                    total=max(stats.admitted, read.finished) if stats.done else None,
                    states=states_text(read.counts),
                )
                return reached

            polled = poll_until(observe, bool, timeout=timeout, interval=POLL_INTERVAL, stop=stop)
        ended = polled.status or (Ending.INTERRUPTED if stop.is_set() else Ending.TIMEOUT)
        halt.set()  # whatever ended the wait, the simulator sends no more
        thread.join()
    stats = simulator.stats
    seconds = time.monotonic() - started
    is_demo = flow == demo.FLOW_NAME
    with snapshot(engine) as connection:  # the summary's counts agree with each other
        lags = demo_tables.applied.lags(connection, pack_install_id) if is_demo else []
        counts = queries.work_item_status_counts(connection, pack_install_id)
        failures = queries.work_item_failures(connection, pack_install_id)
        held = queries.work_items_held(connection, pack_install_id)
    generations = sum(counts.values())
    if is_demo and ended is not Ending.INTERRUPTED:
        problems = demo.verify_projection(engine, pack_install_id)
    else:
        problems = check_invariants(engine)
    problems += failure_problems(failures) + held_problems(held)
    # Why the wait ended is said on a line of its own: the problems are failed checks only.
    stopped = "" if ended is Ending.PROJECTED else ended.reason
    if ended is Ending.HOST_EXITED:
        stopped += f" with {host.poll()}: see {by_name[INTEGRATION.name].log_path}"
    return Summary(
        pack_install_id=pack_install_id,
        flow=flow,
        stats=stats,
        generations=generations,
        executions=executions_if_running(by_name[INTEGRATION.name]),
        lag_p50=percentile(lags, 0.50),
        lag_p99=percentile(lags, 0.99),
        seconds=seconds,
        problems=tuple(problems),
        ending=ended,
        stopped=stopped,
    )


def summary_table(summary: Summary, lanes: int) -> Table:
    """The summary as a rich table; an interrupted run's projection is "not checked", not failed."""
    stats = summary.stats
    is_demo = summary.flow == demo.FLOW_NAME
    interrupted = summary.ending is Ending.INTERRUPTED
    table = Table(title=f"pack {summary.pack_install_id}, flow {summary.flow}", show_header=False)
    table.add_column("measure")
    table.add_column("value", justify="right")
    ok = "[green]OK[/green]"
    invariants = [p for p in summary.problems if p[:2] in INVARIANT_PREFIXES]
    projection = [p for p in summary.problems if p[:2] not in INVARIANT_PREFIXES]
    if interrupted:
        verdict = NOT_CHECKED
    elif projection:
        verdict = f"[red]{plural(len(projection), 'problem')}[/]"
    else:  # the demo's projection is checked against every input; another Flow's only by how its run ended
        verdict = NOT_REACHED if summary.stopped and not is_demo else ok
    rows = [
        ("source lanes", f"{lanes}"),
        ("deliveries sent (fresh + duplicate)", f"{stats.fresh_sent} + {stats.duplicates_sent}"),
        ("inputs admitted", f"{stats.admitted}"),
        ("duplicates acknowledged", f"{stats.duplicates_acknowledged}"),
        ("generations", f"{summary.generations}"),
        ("executions", NOT_KNOWN if summary.executions is None else f"{summary.executions}"),
        ("inputs per execution", f"{stats.admitted / summary.executions:.2f}" if summary.executions else "-"),
        (
            "end-to-end lag p50 / p99",
            f"{summary.lag_p50 * 1000:.0f} ms / {summary.lag_p99 * 1000:.0f} ms" if is_demo else NOT_DEMO_LAG,
        ),
        ("wall time", f"{summary.seconds:.1f} s"),
        (
            "invariants M O B D X P (every input in one generation)",
            ok if not invariants else f"[red]{plural(len(invariants), 'violation')}[/]",
        ),
        ("projection equals the inputs" if is_demo else "every generation completed", verdict),
    ]
    others = {o.value: n for o, n in stats.outcomes.items() if o.value not in ("admitted", "duplicate_covered")}
    if others:
        rows.insert(4, ("other outcomes", ", ".join(f"{k} {v}" for k, v in sorted(others.items()))))
    for row in rows:
        table.add_row(*row)
    return table


def print_problems(console: Console, problems: Sequence[str]) -> None:
    """Every problem (up to ``PROBLEMS_SHOWN`` lines, then how many more), one line each, in red."""
    for problem in problems[:PROBLEMS_SHOWN]:  # a Flow's message is text, never markup
        console.print(Text(problem, style="red"), highlight=False, soft_wrap=True)
    if len(problems) > PROBLEMS_SHOWN:
        console.print(f"[red]and {len(problems) - PROBLEMS_SHOWN} more problems[/red]")


# Ctrl-C, a stop request, and the terminal closing: each stops the services and ends the run.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(BaseException):
    """A stop signal arrived during start-up (a BaseException, like KeyboardInterrupt: nothing swallows it)."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (also the documentation site's reference)."""
    defaults = WorkloadConfig()
    parser = argparse.ArgumentParser(
        prog="nexuscrm-run",
        description=(__doc__ or "").replace("``", ""),  # the docstring's literals, as plain text
        epilog=help_epilog("nexuscrm-run"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--lanes", type=_at_least(int, 1), default=defaults.lanes, help="source lanes (default %(default)s)"
    )
    parser.add_argument(
        "--inputs", type=_at_least(int, 0), default=defaults.inputs, help="fresh deliveries (default %(default)s)"
    )
    parser.add_argument(
        "--rate",
        type=_at_least(float, 0),
        default=defaults.rate,
        help="deliveries/s, 0 = unpaced (default %(default)s)",
    )
    parser.add_argument(
        "--duplicates",
        type=_share,
        default=defaults.duplicate_ratio,
        help="duplicate share, at least 0 and below 1 (default %(default)s)",
    )
    parser.add_argument(
        "--flow",
        default=demo.FLOW_NAME,
        help="the Flow the host runs: module:function (importable from the current directory) or an entry point "
        "of group nexuscrm.flows (default %(default)s)",
    )
    parser.add_argument(
        "--setting",
        action="append",
        type=setting,
        default=[],
        metavar="KEY=VALUE",
        help="a setting of the Flow's pool (FlowContext.settings); repeatable",
    )
    parser.add_argument(
        "--workers", type=_at_least(int, 1), default=4, help="Flow workers in the host (default %(default)s)"
    )
    parser.add_argument("--seed", type=int, default=defaults.seed, help="workload seed (default %(default)s)")
    parser.add_argument(
        "--timeout",
        type=parse_duration,
        default="10m",
        metavar="DURATION",
        help="bound on the wait for the projection (default %(default)s)",
    )
    parser.add_argument("--serve", action="store_true", help="keep the services up after the demo until Ctrl-C")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=Path("var/run"),
        help="logs, port files and the SQLite database (default %(default)s)",
    )
    parser.add_argument(
        "--keep", action="store_true", help="reuse the run state of the workdir instead of starting fresh"
    )
    return parser


def _at_least(kind: Callable[[str], float], minimum: float) -> Callable[[str], float]:
    """An argparse type: a number of ``kind`` not below ``minimum`` (argparse names the flag in its error)."""

    def parse(raw: str) -> float:
        try:
            value = kind(raw)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {raw!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum:g}, got {raw}")
        return value

    return parse


def _share(raw: str) -> float:
    value = _at_least(float, 0)(raw)
    if value >= 1:
        raise argparse.ArgumentTypeError(f"must be below 1, got {raw}")
    return value


def fresh_run_state(workdir: Path) -> None:
    """Remove what an earlier run left in ``workdir`` (``RUN_STATE``), and nothing else."""
    for pattern in RUN_STATE:
        for path in workdir.glob(pattern):
            path.unlink()


def run_dsn(workdir: Path) -> tuple[str, bool]:
    """The database of the run and whether it is the run's own (the workdir's SQLite file, not NEXUSCRM_DSN).

    The run's own is named by its absolute path, so the printed ``export`` works from anywhere.
    """
    named = os.environ.get("NEXUSCRM_DSN")
    return (named, False) if named else (f"sqlite:///{workdir.absolute() / DATABASE_FILE}", True)


def sqlite_file(dsn: str) -> Path | None:
    """The file of a SQLite URL (None for another backend, an in-memory database or no URL at all)."""
    try:
        url = make_url(dsn)
    except ArgumentError:  # check_database says what is wrong with it
        return None
    return Path(url.database) if url.get_backend_name() == "sqlite" and url.database not in (None, ":memory:") else None


def check_sqlite_folder(dsn: str) -> None:
    """Refuse a NEXUSCRM_DSN whose SQLite file is in a folder that does not exist (never made silently)."""
    path = sqlite_file(dsn)
    if path is not None and not path.absolute().parent.is_dir():
        raise DatabaseUnusable(
            f"NEXUSCRM_DSN names the sqlite file {path}, whose folder {path.absolute().parent} does not exist: "
            "create it first, or name a file in a folder that exists"
        )


def check_flow(reference: str) -> None:
    """Raise ``FlowNotFound`` unless the host will find ``reference``, as it imports it.

    The host's interpreter starts with the working directory on ``sys.path`` (``launcher``),
    so a ``module:function`` beside the caller is found there; the check looks there too.
    """
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    resolve_flow(reference)


def main(argv: list[str] | None = None) -> ExitCode:
    """Run the demo (and with ``--serve`` keep serving); return the exit code."""
    args = build_parser().parse_args(argv)
    try:
        workload = WorkloadConfig(
            lanes=args.lanes, inputs=args.inputs, rate=args.rate, duplicate_ratio=args.duplicates, seed=args.seed
        )
    except ValueError as error:
        build_parser().error(str(error))
    try:
        check_flow(args.flow)
    except FlowNotFound as error:
        build_parser().error(str(error))
    if not args.keep:
        fresh_run_state(args.workdir)
    console = Console()
    stop = threading.Event()
    starting = True

    def _on_signal(signum: int, _frame: object) -> None:
        first = not stop.is_set()
        stop.set()
        if starting and first:  # abort the start-up where it is; start_services stops what started
            raise Interrupted(signal.Signals(signum).name)

    for signum in STOP_SIGNALS:
        signal.signal(signum, _on_signal)
    dsn, own_database = run_dsn(args.workdir)
    dashboard = {"NEXUSCRM_DASHBOARD_ADDRESS": env_str("NEXUSCRM_DASHBOARD_ADDRESS", "127.0.0.1:0")}
    try:
        if own_database:
            args.workdir.mkdir(parents=True, exist_ok=True)
        else:
            check_sqlite_folder(dsn)
        check_database(dsn)
        console.print(f"starting the NexusCRM services on the {dsn_backend(dsn)} database ...")
        services, pack_install_id = start_system(
            dsn,
            args.workdir,
            namespace="demo",
            workers=args.workers,
            flow=args.flow,
            settings=dict(args.setting),
            extra_env=dashboard,
        )
        starting = False
    except DatabaseUnusable as error:
        print(f"nexuscrm-run: the database cannot be used: {error}", file=sys.stderr)
        return ExitCode.UNREACHABLE
    except Interrupted as signalled:
        console.print(
            f"[red]interrupted ({signalled}) during start-up:[/red] the services that had started were stopped"
        )
        return ExitCode.INTERRUPTED
    except (LaunchError, grpc.RpcError) as error:
        starting = False
        if stop.is_set():
            console.print(f"[red]interrupted during start-up:[/red] {error}")
            return ExitCode.INTERRUPTED
        console.print(f"[red]startup failed:[/red] {error}")
        return ExitCode.UNREACHABLE
    code = ExitCode.OK
    try:
        _print_services(console, services)
        if workload.inputs:
            engine = create_engine(dsn)
            try:
                summary = run_demo(
                    engine,
                    services,
                    pack_install_id,
                    workload,
                    stop=stop,
                    timeout=args.timeout,
                    console=console,
                    flow=args.flow,
                )
            finally:
                engine.dispose()
            tables.print_whole(console, summary_table(summary, workload.lanes))
            print_problems(console, summary.problems)
            interrupted = summary.ending is Ending.INTERRUPTED
            if summary.stopped:  # a log path is text, never markup
                style = "yellow" if interrupted else "red"
                console.print(Text(summary.stopped, style=style), highlight=False, soft_wrap=True)
            if interrupted:
                code = ExitCode.INTERRUPTED
            elif summary.problems or summary.stopped:
                code = ExitCode.CHECK_FAILED
        if args.serve and not stop.is_set():
            console.print(f"serving; for the operator CLI ({operator_cli()} --help), in another shell:")
            for name, value in target_env(services).items():  # one line each, to copy whole
                console.print(f"  export {name}={value}", soft_wrap=True, highlight=False)
            if own_database:  # never print a DSN the caller named: it may hold a password
                console.print(f"  export NEXUSCRM_DSN={dsn}", soft_wrap=True, highlight=False)
            console.print(f"  demo pack: {pack_install_id}")
            console.print(f"operator dashboard: {dashboard_url(services)}\npress Ctrl-C to stop")
            stop.wait()
    finally:
        codes = stop_services(services)
        stopped = ", ".join(f"{name} exit {exit_code}" for name, exit_code in codes.items())
        console.print(f"stopped: {stopped}", soft_wrap=True)
        console.print(run_state_lines(args.workdir, dsn, own_database), highlight=False, soft_wrap=True)
    if any(codes.values()):
        return code or ExitCode.FAILURE
    return code


def operator_cli() -> str:
    """How to call ``nexuscrm`` from here: beside this interpreter (``.venv/bin``), relative when under the cwd."""
    path = Path(sys.executable).parent / "nexuscrm"
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def run_state_lines(workdir: Path, dsn: str, own_database: bool) -> str:
    """Where the run's database and logs are, and how the next run treats them."""
    named = sqlite_file(dsn)  # a SQLite file's path holds no secret; a server's URL may hold a password
    database = (
        f"{workdir / DATABASE_FILE} (SQLite; the next run starts afresh, --keep reuses it)"
        if own_database
        else f"the {dsn_backend(dsn)} database of NEXUSCRM_DSN{f' ({named})' if named else ''} (never emptied by a run)"
    )
    return f"database: {database}\nlogs: {workdir}/*.log"


def dashboard_url(services: Sequence[ServiceProcess]) -> str:
    """Where Controlplane serves the operator dashboard ("not served" when it does not)."""
    port = next(s for s in services if s.spec is CONTROLPLANE).side_port("dashboard")
    return "not served" if port is None else f"http://127.0.0.1:{port}/"


def _print_services(console: Console, services: Sequence[ServiceProcess]) -> None:
    rows = [
        (s.spec.name, s.process.pid, s.address, health_status(s.address, s.spec.service_name), s.log_path)
        for s in services
    ]
    tables.print_whole(console, tables.table("NexusCRM services", ("service", "pid", "address", "health", "log"), rows))
    console.print(f"operator dashboard: {dashboard_url(services)}")


if __name__ == "__main__":
    raise SystemExit(main())
