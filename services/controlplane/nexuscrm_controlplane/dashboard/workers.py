"""The dashboard's view of the Integration hosts' workers and their clock skew, over ListWorkers.

Each host named in ``NEXUSCRM_DASHBOARD_INTEGRATION_TARGETS`` (default: the one
``NEXUSCRM_INTEGRATION_TARGET``) is asked at once, each call bounded by ``TIMEOUT``. A host's
answer never fails the page, and one host's never hides another's:

| status | the host's entry |
|---|---|
| OK | ``answered``, with its workers |
| UNAVAILABLE, DEADLINE_EXCEEDED | ``unreachable``, with the code and gRPC's words |
| anything else (e.g. PERMISSION_DENIED) | ``refused``, with the code and the host's words |

A worker's skew is its host's wall clock minus the database's, as the worker last measured
it (decision 119); it decides nothing. It is flagged when it exceeds ``SKEW_LEASE_FRACTION``
of the worker's lease (decision 128): a renewal period, beyond any measurement error.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import grpc

from nexuscrm.integration.v1 import integration_pb2 as pb
from nexuscrm.integration.v1 import integration_pb2_grpc as pb_grpc
from nexuscrm_controlplane.dashboard.connectors import TIMEOUT, UNREACHABLE
from nexuscrm_runtime.config import check_address
from nexuscrm_runtime.tls import TlsFiles, open_channel

TARGETS_VARIABLE = "NEXUSCRM_DASHBOARD_INTEGRATION_TARGETS"
SKEW_LEASE_FRACTION = 1 / 3  # of a worker's lease: its heartbeat interval


def skew_flagged(skew_seconds: float | None, lease_seconds: float) -> bool:
    """Whether a measured skew exceeds the tolerance: ``SKEW_LEASE_FRACTION`` of the lease."""
    return skew_seconds is not None and abs(skew_seconds) > lease_seconds * SKEW_LEASE_FRACTION


def integration_targets(value: str, default: str) -> tuple[str, ...]:
    """The hosts ``value`` names (comma-separated host:port), else ``default`` (NEXUSCRM_INTEGRATION_TARGET).

    ``ConfigError`` naming the variable whose address is not host:port.
    """
    targets = [part.strip() for part in value.split(",") if part.strip()]
    if not targets:
        return (check_address("NEXUSCRM_INTEGRATION_TARGET", default),)
    return tuple(dict.fromkeys(check_address(TARGETS_VARIABLE, target) for target in targets))


def _worker(worker: pb.WorkerInfo) -> dict[str, Any]:
    skew = worker.clock_skew_seconds if worker.HasField("clock_skew_seconds") else None
    return {
        "worker_id": worker.worker_id,
        "pack_install_id": worker.pack_install_id,
        "work_type": worker.work_type,
        "flow": worker.flow,
        "state": worker.state,
        "current_work_id": worker.current_work_id or None,
        "executions": worker.executions,
        "lease_seconds": worker.lease_seconds,
        "clock_skew_seconds": skew,
        "skew_flagged": skew_flagged(skew, worker.lease_seconds),
    }


def _host(target: str, answer: grpc.Future[pb.ListWorkersResponse]) -> dict[str, Any]:
    try:
        response = answer.result()
    except grpc.RpcError as error:
        code = error.code()
        state = "unreachable" if code in UNREACHABLE else "refused"
        return {"target": target, "state": state, "error": f"{code.name} ({error.details() or ''})", "workers": []}
    return {"target": target, "state": "answered", "error": None, "workers": [_worker(w) for w in response.workers]}


class IntegrationHosts:
    """The worker lists of the Integration hosts behind ``stubs`` (by target)."""

    def __init__(self, stubs: Mapping[str, pb_grpc.IntegrationServiceStub]) -> None:
        self._stubs = dict(stubs)

    def workers(self) -> dict[str, Any]:
        """Every host's entry (module table), in configuration order; the calls run concurrently."""
        answers = {
            target: stub.ListWorkers.future(pb.ListWorkersRequest(), timeout=TIMEOUT.total_seconds())
            for target, stub in self._stubs.items()
        }
        return {
            "skew_lease_fraction": SKEW_LEASE_FRACTION,
            "hosts": [_host(target, answer) for target, answer in answers.items()],
        }


@contextlib.contextmanager
def integration_hosts(targets: Sequence[str], tls: TlsFiles | None) -> Iterator[IntegrationHosts]:
    """Reads over one channel per target (mutual TLS with ``tls``), closed on exit.

    Channels connect on the first read, so the hosts may start after the Controlplane.
    """
    with contextlib.ExitStack() as channels:
        stubs = {
            target: pb_grpc.IntegrationServiceStub(channels.enter_context(open_channel(target, tls)))
            for target in targets
        }
        yield IntegrationHosts(stubs)
