"""A Flow version's build survives a SIGKILL of Connectors and of its worker, while ingest goes on (issue 52).

A Connectors process (on a reserved port, so a restart answers where the workers call) holds
some thousands of retained inputs that ran live; V2 is built over them with a rate bound.
A worker process claims V2's generations (``flow_versions=[V2]``, ``version_worker``), a
thread of this test runs V1's live work, and another delivers new inputs with duplicates (a
batch a second: the build claims only while no live work is due, decision 185).
Mid-build, Connectors is SIGKILLed and started again; later the worker is SIGKILLed and a
new one started. When the queue is drained: every input ran live once in V1 and once in V2 as
a build (a generation cut off by a kill may have run again, but in that same generation),
every V1 and V2 identity's ranges tile its inputs and V2 is caught up. One retained input's
generation fails once in V1's live pool and is retried. Then V2 is switched to (the next inputs
run live in V2 and never in V1), rolled back from (V1 catches up on what it missed as a build
and runs the next inputs live, V2 receives them as builds), switched to again, and V1 is
retired: every input ran live exactly once, each version's coverage tiles every input, and the
invariants hold at the end.

The issue's scenario at 10^5 retained inputs: ``make versions-demo``
(``NEXUSCRM_VERSION_DEMO_INPUTS``, default 3 000, a hundred a lane).
"""

from __future__ import annotations

import datetime as dt
import functools
import os
import subprocess
import sys
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import grpc
import pytest
import sqlalchemy as sa

from nexuscrm.connectors.v1 import connectors_pb2 as pb
from nexuscrm.connectors.v1 import connectors_pb2_grpc as pb_grpc
from nexuscrm_runtime.database import create_engine
from nexuscrm_schema.tables import Event, WorkItem
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_tools.launcher import (
    CONNECTORS,
    SCHEMA_CATALOG,
    reserved_ports,
    start_service,
    start_services,
    stop_services,
)
from tests.support.factories import install_pack, route
from tests.support.invariants import assert_invariants
from tests.support.metrics import counter
from tests.support.waiting import wait_until
from workqueue import WorkStatus
from workqueue.statuses import TERMINAL_WORK_STATUSES
from workqueue.values import ACKNOWLEDGED_OUTCOMES, Claim, IngestItem, IngestResult

T = TypeVar("T")

pytestmark = [pytest.mark.database, pytest.mark.acceptance]

V1, V2 = "crm-1.0", "crm-2.0"
RETAINED = int(os.environ.get("NEXUSCRM_VERSION_DEMO_INPUTS", "3000"))
LANES, SEED_BATCH = RETAINED // 100, 500  # 100 inputs a lane: one catch-up generation each
BUILD_RATE = max(400, RETAINED // 8)  # inputs per second the build may claim: it lasts several seconds
FAILING = RETAINED // 2  # the retained input whose live generation fails once and is retried
NEW_PER_BATCH = 8  # each live batch: 8 new inputs and one earlier receipt again (a duplicate)
INGEST_PAUSE = 1.0  # seconds between live batches: the live pool is idle at times, and only then the build claims
RETRIED = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.FAILED_PRECONDITION)
DRAIN_SECONDS = 300.0
ENV = {"NEXUSCRM_MATERIALIZE_INTERVAL_SECONDS": "0", "NEXUSCRM_CONNECTORS_METRICS_ADDRESS": "127.0.0.1:0"}


def _item(n: int) -> IngestItem:
    return IngestItem(receipt_key=f"r-{n}", route=route(f"lane-{n % LANES}"), payload=f"input {n}".encode())


class Run:
    """The services, the V2 worker process and what every Flow ran: (version, build) -> ordinal -> WorkIds."""

    def __init__(self, dsn: str, workdir: Path, port: int) -> None:
        self.dsn, self.workdir, self.port = dsn, workdir, port
        self.env = {"NEXUSCRM_DSN": dsn, **ENV}
        self.services = start_services(
            [SCHEMA_CATALOG, CONNECTORS], env=self.env, workdir=workdir, ports={CONNECTORS: port}
        )
        self.worker: subprocess.Popen[bytes] | None = None
        self.workers_started = 0
        self.live_runs: dict[int, set[str]] = defaultdict(set)
        self.failed: list[str] = []  # the WorkId whose live run failed once
        self.stop = threading.Event()
        self.errors: list[BaseException] = []

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def runs_path(self) -> Path:
        return self.workdir / "v2-runs.txt"

    def kill_connectors(self) -> None:
        """SIGKILL Connectors and start it again on the same port."""
        connectors = self.services[-1]
        connectors.process.kill()
        assert connectors.process.wait() == -9
        self.services[-1] = start_service(CONNECTORS, env=self.env, workdir=self.workdir, port=self.port)

    def start_worker(self, pack: str) -> None:
        """A new V2 worker process; a running one is SIGKILLed first."""
        if self.worker is not None:
            self.worker.kill()
            assert self.worker.wait() == -9
        self.workers_started += 1
        with (self.workdir / f"worker-{self.workers_started}.log").open("wb") as log:
            self.worker = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.system.reliability.version_worker",
                    self.address,
                    pack,
                    V2,
                    str(self.runs_path),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def v2_runs(self) -> dict[tuple[bool, int], set[str]]:
        """(build, ordinal) -> the WorkIds of V2 that ran it, from the workers' file."""
        runs: dict[tuple[bool, int], set[str]] = defaultdict(set)
        if self.runs_path.exists():
            for line in self.runs_path.read_text().splitlines():
                work_id, build, ordinal = line.split()
                runs[(build == "1", int(ordinal))].add(work_id)
        return runs

    def retrying(self, call: Callable[[ConnectorsClient], T]) -> T:
        """Call until it is answered: across a restart, an unanswered call's outcome is unknown."""

        def answered() -> tuple[T] | None:
            try:
                with grpc.insecure_channel(self.address) as channel:
                    return (call(ConnectorsClient(channel, timeout=dt.timedelta(seconds=10))),)
            except grpc.RpcError as error:
                if error.code() not in RETRIED:
                    raise
                return None

        return wait_until(answered, "Connectors to answer across its restart")[0]

    def guarded(self, body: Callable[[], None]) -> threading.Thread:
        def run() -> None:
            try:
                body()
            except BaseException as error:
                self.errors.append(error)
                self.stop.set()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        return thread

    def close(self) -> None:
        self.stop.set()
        if self.worker is not None and self.worker.poll() is None:
            self.worker.kill()
            self.worker.wait()
        stop_services(self.services)


@pytest.fixture
def run(empty_dsn: str, tmp_path: Path) -> Iterator[Run]:
    with reserved_ports([CONNECTORS]) as ports:
        started = Run(empty_dsn, tmp_path, ports[CONNECTORS])
        try:
            yield started
        finally:
            started.close()


def _work_live(run: Run, pack: str) -> None:
    """V1's live pool: claim without versions, record each member with its WorkId, complete."""
    with grpc.insecure_channel(run.address) as channel:
        client = ConnectorsClient(channel, timeout=dt.timedelta(seconds=10))
        while not run.stop.is_set():
            try:
                for claim in client.claim("live", pack_install_ids=[pack], max_items=10, lease=dt.timedelta(seconds=2)):
                    assert (claim.work.flow_version, claim.work.build_run) == (None, False)
                    ordinals = _ordinals(client, claim)
                    if FAILING in ordinals and not run.failed:
                        run.failed.append(claim.work.work_id)
                        client.fail(claim.work.work_id, lease_token=claim.lease_token, error="the CRM answered 503")
                        continue
                    for ordinal in ordinals:
                        run.live_runs[ordinal].add(claim.work.work_id)
                    client.complete(claim.work.work_id, lease_token=claim.lease_token)
            except grpc.RpcError as error:
                if error.code() not in RETRIED:
                    raise
                run.stop.wait(0.1)  # back off while Connectors restarts; ends at once on stop


def _ordinals(client: ConnectorsClient, claim: Claim) -> list[int]:
    """The ordinals of a claimed generation's members, as its Flow loads them."""
    pages = client.load_inputs(claim.work.work_id, lease_token=claim.lease_token)
    return [member.enqueue_ordinal for page in pages for member in page.inputs]


def _ingest(run: Run, pack: str, delivered: list[int], until: threading.Event) -> None:
    """Deliver batches of new inputs and one earlier receipt again until ``until``; each until acknowledged."""
    n = RETAINED + 1
    while not until.is_set() and not run.stop.is_set():
        items = [*(_item(k) for k in range(n, n + NEW_PER_BATCH)), _item(n - 7)]
        waiting = {item.receipt_key: item for item in items}
        while waiting:
            for result in run.retrying(functools.partial(_deliver, pack, list(waiting.values()))):
                if result.outcome in ACKNOWLEDGED_OUTCOMES:
                    waiting.pop(result.receipt_key)
        delivered.extend(range(n, n + NEW_PER_BATCH))
        n += NEW_PER_BATCH
        until.wait(INGEST_PAUSE)  # the workload's pace; ends at once when told to stop


def _deliver(pack: str, items: list[IngestItem], client: ConnectorsClient) -> list[IngestResult]:
    return client.ingest(pack, items=items)


def _coverage(channel: grpc.Channel, pack: str) -> list[pb.IdentityCoverage]:
    stub, identities, token = pb_grpc.ConnectorsServiceStub(channel), [], None
    while token != "":
        page = stub.GetCoverage(
            pb.GetCoverageRequest(pack_install_id=pack, work_type="project", page_token=token or ""), timeout=30
        )
        identities.extend(page.identities)
        token = page.next_page_token
    return identities


def _open_work(engine: sa.Engine) -> int:
    with engine.connect() as connection:
        return int(
            connection.execute(
                sa.select(sa.func.count())
                .select_from(WorkItem)
                .where(WorkItem.c.Status.not_in(list(TERMINAL_WORK_STATUSES)))
            ).scalar_one()
        )


def test_a_build_survives_a_killed_connectors_and_a_killed_worker_while_ingest_goes_on(run: Run) -> None:
    engine = create_engine(run.dsn)
    pack = install_pack(engine)
    for start in range(1, RETAINED + 1, SEED_BATCH):
        batch = [_item(n) for n in range(start, start + SEED_BATCH)]
        run.retrying(functools.partial(_deliver, pack, batch))
    live = run.guarded(lambda: _work_live(run, pack))
    wait_until(lambda: _open_work(engine) == 0, "the retained inputs to run live")

    request = pb.BuildFlowVersionRequest(pack_install_id=pack, work_type="project", version=V2)
    request.max_inputs_per_second, request.started_by, request.reason = BUILD_RATE, "ops", "restart test"
    with grpc.insecure_channel(run.address) as channel:
        built = pb_grpc.ConnectorsServiceStub(channel).BuildFlowVersion(request, timeout=60)
    assert (built.catch_up_generations, built.catch_up_inputs) == (LANES, RETAINED)
    delivered: list[int] = []
    ingest_done = threading.Event()
    ingest = run.guarded(lambda: _ingest(run, pack, delivered, ingest_done))
    run.start_worker(pack)

    def built_inputs() -> int:
        return sum(1 for (build, ordinal) in run.v2_runs() if build and ordinal <= RETAINED)

    wait_until(lambda: built_inputs() >= RETAINED // 3 or run.stop.is_set(), "a third of the build", DRAIN_SECONDS)
    run.kill_connectors()
    wait_until(
        lambda: built_inputs() >= 2 * RETAINED // 3 or run.stop.is_set(), "two thirds of the build", DRAIN_SECONDS
    )
    run.start_worker(pack)
    caught_up_mid_way = built_inputs()
    after_kills = len(delivered)
    wait_until(  # ingest goes on a little after both kills
        lambda: len(delivered) >= after_kills + 2 * NEW_PER_BATCH or run.stop.is_set(), "two batches after the kills"
    )
    ingest_done.set()
    ingest.join()
    wait_until(lambda: _open_work(engine) == 0 or run.stop.is_set(), "the queue to drain", timeout=DRAIN_SECONDS)
    run.stop.set()
    live.join()
    assert not run.errors, run.errors
    assert caught_up_mid_way < RETAINED  # the worker was killed mid-build
    (failed,) = run.failed  # failed once, retried in the same generation, completed
    described = run.retrying(lambda c: c.get_work(failed))
    assert described.work.status is WorkStatus.COMPLETED
    assert [a.error for a in described.attempts] == ["the CRM answered 503"]

    with engine.connect() as connection:
        ordinals = set(
            connection.execute(sa.select(Event.c.EnqueueOrdinal).where(Event.c.PackInstallId == pack)).scalars()
        )
        statuses = set(connection.execute(sa.select(WorkItem.c.Status)).scalars())
    assert ordinals == set(range(1, RETAINED + len(delivered) + 1))  # no duplicate admitted, nothing lost
    assert statuses == {WorkStatus.COMPLETED}
    # Every input ran live once in V1 and once in V2 as a build: each in exactly one generation.
    assert {o: len(w) for o, w in run.live_runs.items()} == dict.fromkeys(ordinals, 1)
    v2 = run.v2_runs()
    assert {build for build, _ in v2} == {True}
    assert {o: len(w) for (_, o), w in v2.items()} == dict.fromkeys(ordinals, 1)

    with grpc.insecure_channel(run.address) as channel:
        identities = _coverage(channel, pack)
        (version,) = (
            v
            for v in pb_grpc.ConnectorsServiceStub(channel)
            .ListFlowVersions(pb.ListFlowVersionsRequest(pack_install_id=pack, work_type="project"), timeout=30)
            .versions
            if v.version == V2
        )
    per_version: dict[str, list[pb.IdentityCoverage]] = defaultdict(list)
    for identity in identities:
        per_version[identity.route.companion_version].append(identity)
    for name in (V1, V2):
        assert len(per_version[name]) == LANES
        assert all(i.tiled for i in per_version[name]), name
        assert {r.state for i in per_version[name] for r in i.ranges} == {pb.COVERAGE_RANGE_STATE_COMPLETED}
        assert sum(i.inputs for i in per_version[name]) == len(ordinals)
    assert version.state == pb.FLOW_VERSION_STATE_STANDBY
    assert (version.inputs_done, version.inputs_total) == (len(ordinals), len(ordinals))
    # The restarted Connectors' Prometheus endpoint reports the same progress.
    metrics = run.services[-1].side_port("metrics")
    assert counter(metrics, "nexuscrm_flow_version_inputs", version=V2, progress="done") == len(ordinals)
    assert counter(metrics, "nexuscrm_flow_version_state", version=V2, nexuscrm_flow_version_state="standby") == 1
    assert counter(metrics, "nexuscrm_flow_version_catch_up_behind", version=V2) == 0

    # Switched, V2's worker runs the next inputs live; V1 receives none of them.
    step = functools.partial(_step, run)
    step("SwitchFlowVersion", pb.SwitchFlowVersionRequest(version=V2, switched_by="ops", reason="built"), pack)
    total = len(ordinals)
    switched = set(range(total + 1, total + 11))
    run.retrying(functools.partial(_deliver, pack, [_item(n) for n in sorted(switched)]))
    wait_until(lambda: _open_work(engine) == 0, "the inputs after the switch to run")
    assert run.retrying(lambda c: c.claim("live", pack_install_ids=[pack])) == []
    assert {o: len(w) for (build, o), w in run.v2_runs().items() if not build} == dict.fromkeys(switched, 1)

    # Rolled back, V1 catches up on what it missed as a build and runs the next inputs live; V2,
    # a standby again, receives them as builds.
    rolled = step("RollbackFlowVersion", pb.RollbackFlowVersionRequest(rolled_back_by="ops", reason="differs"), pack)
    assert (rolled.live.version, rolled.catch_up_inputs) == (V1, len(switched))
    after_rollback = set(range(total + 11, total + 21))
    run.retrying(functools.partial(_deliver, pack, [_item(n) for n in sorted(after_rollback)]))
    v1_runs = _run_v1(run, pack, engine)
    assert v1_runs == {**{(True, o): 1 for o in switched}, **{(False, o): 1 for o in after_rollback}}
    assert {o for (build, o) in run.v2_runs() if build and o > total} == after_rollback

    # Switched again and V1 retired: every input ran live once, each version covers every input.
    step("SwitchFlowVersion", pb.SwitchFlowVersionRequest(version=V2, switched_by="ops", reason="fixed"), pack)
    retired = step("RetireFlowVersion", pb.RetireFlowVersionRequest(version=V1, retired_by="ops", reason="done"), pack)
    assert retired.version.state == pb.FLOW_VERSION_STATE_RETIRED
    everything = ordinals | switched | after_rollback
    live_counts = Counter({o: len(w) for o, w in run.live_runs.items()})
    live_counts.update({o: len(w) for (build, o), w in run.v2_runs().items() if not build})
    live_counts.update({o: n for (build, o), n in v1_runs.items() if not build})
    assert live_counts == dict.fromkeys(everything, 1)
    with grpc.insecure_channel(run.address) as channel:
        final = _coverage(channel, pack)
    for name in (V1, V2):
        mine = [i for i in final if i.route.companion_version == name]
        assert all(i.tiled for i in mine) and sum(i.inputs for i in mine) == len(everything), name
    assert_invariants(engine)
    engine.dispose()


def _step(run: Run, rpc: str, request: Any, pack: str) -> Any:
    """A Flow version step over the generated stub, on the test's pack and work type; its answer."""
    request.pack_install_id, request.work_type = pack, "project"
    with grpc.insecure_channel(run.address) as channel:
        return getattr(pb_grpc.ConnectorsServiceStub(channel), rpc)(request, timeout=60)


def _run_v1(run: Run, pack: str, engine: sa.Engine) -> dict[tuple[bool, int], int]:
    """Run V1's generations (a claim without versions) until nothing is open; (build, ordinal) -> runs."""
    runs: dict[tuple[bool, int], int] = defaultdict(int)
    with grpc.insecure_channel(run.address) as channel:
        client = ConnectorsClient(channel, timeout=dt.timedelta(seconds=10))

        def drained() -> bool:
            for claim in client.claim("v1", pack_install_ids=[pack], max_items=10, wait=dt.timedelta(seconds=0.2)):
                for ordinal in _ordinals(client, claim):
                    runs[(claim.work.build_run, ordinal)] += 1
                client.complete(claim.work.work_id, lease_token=claim.lease_token)
            return _open_work(engine) == 0

        wait_until(drained, "V1's catch-up and live work, and V2's builds, to run", DRAIN_SECONDS)
    return dict(runs)
