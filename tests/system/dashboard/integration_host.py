"""A real Integration host in the test process, whose wall clock is off from the database's by ``skew``.

IntegrationService serves a ``HostStatus`` on an OS-chosen port from the start (so a
Controlplane can be given its target before any pack exists); ``activate`` then builds a
``WorkerHost`` whose workers claim from a real ConnectorsService over gRPC and measure their
skew with the offset clock (the seam ``tests/connectors/integration/test_worker_clock.py`` uses too).
"""

from __future__ import annotations

import datetime as dt

import grpc
import sqlalchemy as sa

from nexuscrm_integration.activation import check_activation
from nexuscrm_integration.config import PoolConfig
from nexuscrm_integration.host import HostStatus, WorkerHost
from nexuscrm_integration.servicer import registration
from nexuscrm_runtime.server import create_server
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_sdk.flows import Flow, FlowContext, Generation

DRAIN_TIMEOUT = 30.0  # seconds for the workers' in-flight generations at stop


def reading_flow(context: FlowContext) -> Flow:
    """A Flow that reads its generation's members and does nothing else."""

    def flow(generation: Generation) -> None:
        list(generation.inputs)

    return flow


class _Gate:
    """The activation gate's owners, satisfied: the gate is not what the dashboard tests check."""

    def schema_missing(self, feature: str) -> list[str]:
        return []

    def protocol_missing(self, pack_install_id: str) -> str | None:
        return None


class SkewedHost:
    """An Integration host serving at ``target``; its workers' clock is the real one plus ``skew``."""

    def __init__(self, skew: dt.timedelta) -> None:
        self.skew = skew
        self._status = HostStatus([])
        self._server = create_server([registration(self._status)], "127.0.0.1:0")
        self.target = f"127.0.0.1:{self._server.port}"
        self._host: WorkerHost | None = None
        self._channel: grpc.Channel | None = None

    def activate(self, engine: sa.Engine, connectors_target: str, leases: dict[str, int]) -> None:
        """Start one worker per pack (pack -> lease seconds) claiming from Connectors at ``connectors_target``."""
        self._channel = grpc.insecure_channel(connectors_target)
        pools = [
            PoolConfig(
                pack_install_id=pack,
                work_type="project",
                flow=f"{__name__}:reading_flow",
                lease_seconds=lease,
                claim_wait_seconds=0.5,
                poll_interval_seconds=0.05,
            )
            for pack, lease in leases.items()
        ]
        self._host = WorkerHost(
            check_activation(_Gate(), _Gate(), leases),
            pools,
            ConnectorsClient(self._channel),
            engine,
            host_id=f"skew{self.skew.total_seconds():+.0f}s",
            wall_clock=lambda: dt.datetime.now(dt.UTC) + self.skew,
        )
        self._status.checking(list(leases))
        self._status.activated(self._host)
        self._host.start()

    def stop(self) -> bool:
        """Drain the workers (True if their in-flight work finished), then stop serving."""
        drained = self._host.run_until_drained(DRAIN_TIMEOUT) if self._host is not None else True
        self._server.stop(0)
        if self._channel is not None:
            self._channel.close()
        return drained
