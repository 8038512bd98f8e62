"""The gRPC health of running services over time, recorded by a polling thread.

``HealthTimeline`` asks each (service address, health name) for its status every ``POLL``
seconds and keeps each change with its time (monotonic seconds since the recording started).
Tests wait on its ``latest`` status with deadlines and print the changes as a timeline.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support.waiting import wait_until

POLL = 0.05  # seconds between rounds of health checks
CHECK_TIMEOUT = 1.0  # seconds one check may take before it counts as UNREACHABLE


@dataclasses.dataclass(frozen=True)
class Change:
    """One probe's status from ``at`` (seconds since the recording started) on."""

    at: float
    label: str
    status: str


@dataclasses.dataclass(frozen=True)
class Probe:
    """What to ask: a service's address and a health name, shown as ``label``."""

    label: str
    address: str
    name: str


class HealthTimeline:
    """Records every status change of ``probes``; see the module docstring."""

    def __init__(self, probes: Sequence[Probe]) -> None:
        self.probes = list(probes)
        self.started = time.monotonic()
        self.changes: list[Change] = []
        self._latest: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._channels = {address: grpc.insecure_channel(address) for address in {p.address for p in self.probes}}
        self._thread = threading.Thread(target=self._run, name="health-timeline", daemon=True)

    def now(self) -> float:
        """Seconds since the recording started (the timeline's clock)."""
        return time.monotonic() - self.started

    def latest(self, label: str) -> str:
        """The last status seen for ``label`` ("" before the first)."""
        with self._lock:
            return self._latest.get(label, "")

    def all_are(self, labels: Sequence[str], status: str) -> bool:
        """Whether the last status of every one of ``labels`` is ``status``."""
        return all(self.latest(label) == status for label in labels)

    def statuses(self, label: str) -> set[str]:
        """Every status ``label`` had during the recording."""
        with self._lock:
            return {change.status for change in self.changes if change.label == label}

    def first(self, label: str, status: str, after: float) -> float | None:
        """When ``label`` first turned ``status`` at or after ``after`` (None: it did not)."""
        with self._lock:
            return next((c.at for c in self.changes if c.label == label and c.status == status and c.at >= after), None)

    def lines(self, marks: Sequence[tuple[float, str]] = ()) -> list[str]:
        """The changes and ``marks`` (time, event) in time order, one line each."""
        with self._lock:
            rows = [(c.at, f"{c.label}: {c.status}") for c in self.changes] + [(at, f"** {what}") for at, what in marks]
        return [f"{at:7.2f}s  {text}" for at, text in sorted(rows)]

    def _check(self, probe: Probe) -> str:
        stub = health_pb2_grpc.HealthStub(self._channels[probe.address])
        try:
            response = stub.Check(health_pb2.HealthCheckRequest(service=probe.name), timeout=CHECK_TIMEOUT)
        except grpc.RpcError as error:
            return "UNREACHABLE" if error.code() != grpc.StatusCode.NOT_FOUND else "SERVICE_UNKNOWN"
        return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))

    def _run(self) -> None:
        while not self._stop.is_set():
            for probe in self.probes:
                status = self._check(probe)
                with self._lock:
                    if self._latest.get(probe.label) != status:
                        self._latest[probe.label] = status
                        self.changes.append(Change(self.now(), probe.label, status))
            self._stop.wait(POLL)

    @contextmanager
    def recording(self) -> Iterator[HealthTimeline]:
        """Record while inside; the first round has been seen when the body starts."""
        self._thread.start()
        try:
            wait_until(lambda: len(self._latest) == len(self.probes), "a first round of health checks", timeout=10)
            yield self
        finally:
            self._stop.set()
            self._thread.join()
            for channel in self._channels.values():
                channel.close()
