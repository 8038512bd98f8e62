"""The worker host: pools of Connectors workers running Flows, behind the activation gate.

Every worker built here needs an ``ActivationGrant`` covering its pack, and only the gate
(``activation.check_activation``) issues one, so nothing in this package can claim work for a
pack whose schema or protocol receipt the gate has not seen. Workers are the Connectors worker
library (claim, heartbeat, LoadInputs of the complete member set, complete/fail) over any
``WorkSource``, normally ``nexuscrm_sdk.client.ConnectorsClient``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Sequence

from sqlalchemy.engine import Engine

from nexuscrm_integration.activation import ActivationGrant
from nexuscrm_integration.config import DEFAULT_CLAIM_WAIT, DEFAULT_POLL_INTERVAL, PoolConfig
from nexuscrm_integration.errors import ActivationRefused, NotGranted
from nexuscrm_sdk.flows import Flow, FlowContext, resolve_flow
from nexuscrm_sdk.worker import Worker, WorkSource, host_clock

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True, kw_only=True)
class WorkerInfo:
    """One worker as ListWorkers reports it; ``state`` is "idle", "working" or "stopped".

    ``clock_skew_seconds``: this host's wall clock minus the database's, as the worker last
    measured it (None before its first grant); reported only, leases never depend on it.
    ``lease_seconds``: the lease the worker claims with, against which a reader judges the skew.
    """

    worker_id: str
    pack_install_id: str
    work_type: str
    flow: str
    state: str
    current_work_id: str | None
    executions: int
    clock_skew_seconds: float | None
    lease_seconds: float


def standalone_worker(
    grant: ActivationGrant,
    source: WorkSource,
    flow: Flow,
    *,
    worker_id: str,
    pack_install_id: str,
    work_type: str,
    lease: dt.timedelta = dt.timedelta(seconds=30),
    page_size: int = 0,
    batch_size: int = 1,
    claim_wait: dt.timedelta = dt.timedelta(seconds=DEFAULT_CLAIM_WAIT),
    poll_interval: dt.timedelta = dt.timedelta(seconds=DEFAULT_POLL_INTERVAL),
    wall_clock: Callable[[], dt.datetime] = host_clock,
    complete_in_claim: bool = False,
    flow_version: str = "",
) -> Worker:
    """One worker of one pack and work type, for library consumers that host it themselves.

    Raises ``NotGranted`` unless ``grant`` (from the activation gate) covers the pack. The
    worker claims nothing until its owner calls ``start`` or ``run_once``. ``wall_clock``:
    this host's clock, read only to measure its skew, and ``complete_in_claim`` as ``Worker``'s.
    ``flow_version``: claim that Flow version's generations only; empty: the inputs' own version's.
    """
    if not isinstance(grant, ActivationGrant) or not grant.covers(pack_install_id):
        raise NotGranted(
            f"pack {pack_install_id} has not passed the activation gate; run check_activation first",
            field="pack_install_id",
        )
    return Worker(
        source,
        flow,
        worker_id=worker_id,
        pack_install_ids=[pack_install_id],
        work_types=[work_type],
        lease=lease,
        page_size=page_size,
        batch_size=batch_size,
        claim_wait=claim_wait,
        poll_interval=poll_interval,
        wall_clock=wall_clock,
        complete_in_claim=complete_in_claim,
        flow_versions=[flow_version] if flow_version else [],
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Member:
    pool: PoolConfig
    worker: Worker


class WorkerHost:
    """Every configured pool's workers; built only with a grant covering every pool's pack.

    Construction resolves each pool's Flow factory once (``nexuscrm_sdk.flows.resolve_flow``) and builds
    its workers, which measure their skew with ``wall_clock`` (this host's clock); ``start``
    starts them; ``run_until_drained`` stops every claim first, then waits for the in-flight
    generations (it does not drain the durable queue).
    """

    def __init__(
        self,
        grant: ActivationGrant,
        pools: Sequence[PoolConfig],
        source: WorkSource,
        engine: Engine,
        *,
        host_id: str,
        wall_clock: Callable[[], dt.datetime] = host_clock,
    ) -> None:
        self._members: list[_Member] = []
        self._stopped = False
        ungranted = sorted({pool.pack_install_id for pool in pools if not grant.covers(pool.pack_install_id)})
        if ungranted:  # before any Flow factory runs: nothing happens for a pack the gate has not seen
            raise NotGranted(f"packs {ungranted} have not passed the activation gate", field="pack_install_id")
        for pool in pools:
            factory = resolve_flow(pool.flow)
            context = FlowContext(
                pack_install_id=pool.pack_install_id,
                work_type=pool.work_type,
                engine=engine,
                settings=pool.settings,
                flow_version=pool.flow_version,
            )
            flow = factory(context)
            for index in range(pool.size):
                worker = standalone_worker(
                    grant,
                    source,
                    flow,
                    worker_id=f"{host_id}/{pool.served}/{index + 1}",
                    pack_install_id=pool.pack_install_id,
                    work_type=pool.work_type,
                    lease=dt.timedelta(seconds=pool.lease_seconds),
                    page_size=pool.page_size,
                    batch_size=pool.batch_size,
                    claim_wait=dt.timedelta(seconds=pool.claim_wait_seconds),
                    poll_interval=dt.timedelta(seconds=pool.poll_interval_seconds),
                    wall_clock=wall_clock,
                    complete_in_claim=pool.complete_in_claim,
                    flow_version=pool.flow_version,
                )
                self._members.append(_Member(pool=pool, worker=worker))

    def start(self) -> None:
        """Start every worker in its own thread."""
        for member in self._members:
            member.worker.start()
        log.info("started %d workers in %d pools", len(self._members), len({m.pool.name for m in self._members}))

    def run_until_drained(self, timeout: float) -> bool:
        """Stop all claims, then wait up to ``timeout`` seconds for in-flight work; True if all finished.

        Work still running afterwards keeps its lease until expiry, when another worker
        claims it again (a failed attempt): nothing is lost, only delayed.
        """
        for member in self._members:  # stop every claim first, so no worker claims while others drain
            member.worker.stop()
        deadline = time.monotonic() + timeout
        # Join every worker (no short-circuit): each gets the time left before the deadline.
        finished = [member.worker.run_until_drained(max(0.0, deadline - time.monotonic())) for member in self._members]
        drained = all(finished)
        self._stopped = True
        return drained

    def workers(self) -> list[WorkerInfo]:
        """A snapshot of every worker."""
        infos = []
        for member in self._members:
            current = member.worker.stats.current_work_id
            skew = member.worker.stats.clock_skew
            state = "working" if current else ("stopped" if self._stopped else "idle")
            infos.append(
                WorkerInfo(
                    worker_id=member.worker.worker_id,
                    pack_install_id=member.pool.pack_install_id,
                    work_type=member.pool.work_type,
                    flow=member.pool.flow,
                    state=state,
                    current_work_id=current,
                    executions=member.worker.stats.executions,
                    clock_skew_seconds=None if skew is None else skew.total_seconds(),
                    lease_seconds=float(member.pool.lease_seconds),
                )
            )
        return infos


@dataclasses.dataclass(frozen=True, kw_only=True)
class Activation:
    """The gate's latest answer as GetActivation reports it."""

    active: bool
    missing: tuple[str, ...]
    pack_install_ids: tuple[str, ...]


class HostStatus:
    """What the host process reports over RPC while it waits for the gate and while it serves.

    Thread-safe: the gate loop and the host write it, RPC handler threads read it.
    """

    def __init__(self, pack_install_ids: Sequence[str]) -> None:
        self._lock = threading.Lock()
        self._packs = tuple(pack_install_ids)
        self._missing: tuple[str, ...] = ("the activation gate has not been checked yet",)
        self._host: WorkerHost | None = None
        self._schema_version = 0

    def schema_read(self, version: int) -> None:
        """Record the database's schema version, as the schema catalog answered the gate's last check."""
        with self._lock:
            self._schema_version = version

    def schema_version(self) -> int:
        """The database's schema version at the gate's last check; 0 before the first."""
        with self._lock:
            return self._schema_version

    def checking(self, pack_install_ids: Sequence[str]) -> None:
        """Record the packs the gate checks (pools that name a pack add theirs once resolved)."""
        with self._lock:
            self._packs = tuple(pack_install_ids)

    def refused(self, error: ActivationRefused) -> None:
        """Record a refusal of the gate."""
        with self._lock:
            self._missing = error.missing

    def activated(self, host: WorkerHost) -> None:
        """Record that the gate passed and ``host`` serves."""
        with self._lock:
            self._missing = ()
            self._host = host

    def activation(self) -> Activation:
        """The latest gate answer."""
        with self._lock:
            return Activation(active=self._host is not None, missing=self._missing, pack_install_ids=self._packs)

    def workers(self) -> list[WorkerInfo]:
        """Every worker of the host; empty before activation."""
        with self._lock:
            host = self._host
        return host.workers() if host is not None else []
