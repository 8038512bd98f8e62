"""Our side of the "peer" section: the lane-sum projection end to end through the real services.

``nexuscrm_tools.run.start_system`` starts the schema catalog, Controlplane and
Connectors as processes, installs and activates a pack through Controlplane, then starts the
Integration host with 4 workers (claiming up to 4 generations each, completing them in the
next claim) running ``bench.laneflow:lane_sum_flow`` (a ``module:function`` Flow reference,
resolved by the host like any other). The bench process is only a gRPC client:
it ingests the walking workload with ``ConnectorsClient`` through the SDK's ``PipelinedIngest``
(each concurrent client on a channel of its own, with the SDK's default batches in flight
unless told otherwise) and reads the database afterwards to check the result (the per-lane
sums, every delivery admitted once, the invariant checker). The Connectors the clients call
publishes its Prometheus metrics, from which the run reads its admission transactions.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import sqlalchemy as sa

from bench.environment import Backend, scratch_database
from bench.laneflow import FLOW_REFERENCE, BenchLaneApplied, BenchLaneSum
from bench.lanesum import WORKERS, Outcome, busy_since, deliver, lanes_of, sum_problems, wait_until
from nexuscrm_runtime.database import create_engine
from nexuscrm_schema.invariants import check_invariants
from nexuscrm_schema.tables import Event, WorkItem
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_sdk.pipeline import DEFAULT_MAX_IN_FLIGHT, PipelinedIngest
from nexuscrm_tools import run as system
from nexuscrm_tools.launcher import CONNECTORS, INTEGRATION, ServiceProcess, stop_services
from tests.support.metrics import counter
from workqueue.statuses import NONTERMINAL_WORK_STATUSES
from workqueue.values import IngestItem
from workqueue.values import Outcome as IngestOutcome

NAMESPACE = "bench-peer"
# Generations per claim of each worker (the pool's batch_size): how a team tunes the host for
# many small generations, as the peer runs one worker process with concurrency 4; chosen by
# measurement (docs/performance-log.md, "Seventeenth pass").
CLAIM_BATCH = 4
# Each worker completes its finished generations in its next claim (decision 170): on this
# workload's cheap Flow, one Claim per batch instead of a Complete per generation was faster
# end to end in every measured pair, with more Flow executions (docs/performance-log.md,
# "Twenty-fourth pass").
COMPLETE_IN_CLAIM = True
# The host's workers call a Connectors replica of their own on MariaDB (decision 135): how a
# deployment runs Connectors past one Python process. Not on SQLite, where one process holds
# the one writer and hands it between its threads (decision 134).
WORKER_CONNECTORS = {"mysql": True, "sqlite": False}
# The Connectors processes publish their metrics on a free port (``ServiceProcess.side_port``).
METRICS_ENV = {"NEXUSCRM_CONNECTORS_METRICS_ADDRESS": "127.0.0.1:0"}
ADMISSION_TRANSACTIONS = "nexuscrm_admission_transaction_deliveries_count"


@contextlib.contextmanager
def running_system(dsn: str, workdir: Path, *, worker_connectors: bool) -> Iterator[tuple[list[ServiceProcess], str]]:
    """The four services on ``dsn``, the host serving the lane-sum Flow with 4 workers; and the pack id."""
    root = Path(__file__).resolve().parent.parent
    # The host imports the Flow by module path: make this checkout importable from any directory.
    path = os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))
    services, pack = system.start_system(
        dsn,
        workdir,
        namespace=NAMESPACE,
        workers=WORKERS,
        flow=FLOW_REFERENCE,
        batch_size=CLAIM_BATCH,
        complete_in_claim=COMPLETE_IN_CLAIM,
        extra_env={"PYTHONPATH": path, **METRICS_ENV},
        worker_connectors=worker_connectors,
    )
    try:
        yield services, pack
    finally:
        stop_services(services)


def _settled(engine: sa.Engine, pack: str, admitted: int) -> bool:
    with engine.connect() as connection:
        applied = connection.execute(
            sa.select(sa.func.count()).select_from(BenchLaneApplied).where(BenchLaneApplied.c.PackInstallId == pack)
        ).scalar_one()
        open_work = connection.execute(
            sa.select(sa.func.count())
            .select_from(WorkItem)
            .where(WorkItem.c.PackInstallId == pack, WorkItem.c.Status.in_(NONTERMINAL_WORK_STATUSES))
        ).scalar_one()
    return int(applied) >= admitted and int(open_work) == 0


def admission_transactions(connectors: ServiceProcess) -> int:
    """Admission transactions the Connectors process committed so far (its metrics endpoint)."""
    return int(counter(connectors.side_port("metrics"), ADMISSION_TRANSACTIONS))


def run(
    backend: Backend, *, inputs: int, rate: float = 0.0, clients: int = 1, in_flight: int = DEFAULT_MAX_IN_FLIGHT
) -> Outcome:
    """One run of ours on a scratch database of ``backend``: deliver over gRPC, wait until projected, check.

    ``clients`` concurrent ingest clients, each with ``in_flight`` batches in flight at most.
    """
    with (
        scratch_database(backend) as dsn,
        tempfile.TemporaryDirectory(prefix="nxbench-peer-") as workdir,
        running_system(dsn, Path(workdir), worker_connectors=WORKER_CONNECTORS[backend.name]) as (services, pack),
    ):
        integration = next(service for service in services if service.spec is INTEGRATION)
        # The first Connectors: the one the ingest clients call (the host may call a replica).
        connectors = next(service for service in services if service.spec is CONNECTORS)
        outcomes: dict[IngestOutcome, int] = {}
        with contextlib.ExitStack() as stack:
            pipelines = [
                stack.enter_context(
                    PipelinedIngest(
                        ConnectorsClient(stack.enter_context(connectors.channel())), pack, max_in_flight=in_flight
                    )
                )
                for _ in range(clients)
            ]
            transactions_before = admission_transactions(connectors)
            counting = threading.Lock()
            sent = deliver([_client(pipeline, outcomes, counting) for pipeline in pipelines], inputs, rate)
        transactions = admission_transactions(connectors) - transactions_before
        engine = create_engine(dsn)
        try:
            complete = wait_until(lambda: _settled(engine, pack, sent.admitted))
            cpu_seconds = busy_since(sent)
            executions = system.executions(integration)
            problems = [] if complete else ["not every input was projected in time"]
            problems += _admission_problems(engine, sent.distinct, sent.duplicates, outcomes)
            problems += [f"invariant {problem}" for problem in check_invariants(engine)]
            with engine.connect() as connection:
                projected = lanes_of(
                    connection.execute(
                        sa.select(BenchLaneSum.c.SourceLane, BenchLaneSum.c.Total, BenchLaneSum.c.Inputs).where(
                            BenchLaneSum.c.PackInstallId == pack
                        )
                    ).tuples()
                )
                applied = connection.execute(
                    sa.select(BenchLaneApplied.c.SentAt, BenchLaneApplied.c.AppliedAt).where(
                        BenchLaneApplied.c.PackInstallId == pack
                    )
                ).all()
        finally:
            engine.dispose()
    problems += sum_problems(sent, projected)
    if len(applied) != sent.distinct:
        problems.append(f"{len(applied)} inputs folded, {sent.distinct} distinct delivered")
    last = max((float(row.AppliedAt) for row in applied), default=sent.started)
    return Outcome(
        side=f"ours ({backend.name})",
        inputs=sent.distinct,
        deliveries=sent.deliveries,
        duplicates=sent.duplicates,
        seconds=last - sent.started,
        ingest_seconds=sent.ingested - sent.started,
        executions=executions,
        cpu_seconds=cpu_seconds,
        transactions=transactions,
        problems=tuple(problems),
        lags=tuple(float(row.AppliedAt) - float(row.SentAt) for row in applied),
    )


def _client(
    pipeline: PipelinedIngest, outcomes: dict[IngestOutcome, int], counting: threading.Lock
) -> Callable[[Sequence[IngestItem]], Callable[[], int]]:
    """One client of ``deliver``: submits a batch; its answer counts the batch's outcomes."""

    def ingest(items: Sequence[IngestItem]) -> Callable[[], int]:
        future = pipeline.submit(items)

        def answer() -> int:
            results = future.result()
            with counting:
                for result in results:
                    outcomes[result.outcome] = outcomes.get(result.outcome, 0) + 1
            return sum(result.outcome is IngestOutcome.ADMITTED for result in results)

        return answer

    return ingest


def _admission_problems(
    engine: sa.Engine, distinct: int, duplicates: int, outcomes: dict[IngestOutcome, int]
) -> list[str]:
    """Every fresh delivery admitted once, every duplicate acknowledged without new work."""
    problems = []
    if outcomes.get(IngestOutcome.ADMITTED, 0) != distinct:
        problems.append(f"{outcomes.get(IngestOutcome.ADMITTED, 0)} deliveries admitted, {distinct} distinct delivered")
    acknowledged = outcomes.get(IngestOutcome.DUPLICATE_COVERED, 0) + outcomes.get(IngestOutcome.DUPLICATE_LEGACY, 0)
    if acknowledged != duplicates:
        problems.append(f"{acknowledged} duplicates acknowledged, {duplicates} sent")
    with engine.connect() as connection:
        events = int(connection.execute(sa.select(sa.func.count()).select_from(Event)).scalar_one())
    if events != distinct:
        problems.append(f"{events} Events stored, {distinct} distinct delivered")
    return problems
