"""Two operators' calls started together through two server processes, and what each was answered.

``race`` starts both calls behind a barrier and records, per call, its status (or OK), its
message, its response and when (on this process's monotonic clock) it was sent and answered,
so a test can count the rounds whose calls were in flight at the same time instead of
trusting that a barrier made them overlap. ``serving_operators`` starts the
two replicas (each a Connectors and a Controlplane process) on one database, or on two nodes of
a Galera cluster. The mutations themselves live in ``test_operator_races.py``; the Galera tier
runs the same tests through two nodes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import sqlalchemy as sa
from google.protobuf.message import Message

from nexuscrm.connectors.v1 import connectors_pb2_grpc
from nexuscrm.controlplane.v1 import controlplane_pb2_grpc
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.settings import Settings
from nexuscrm_runtime.database import create_engine
from nexuscrm_tools.launcher import CONNECTORS, CONTROLPLANE, SCHEMA_CATALOG, start_services, stop_services, target_env

CALL_TIMEOUT = 60.0  # seconds: well above run_transaction's conflict budget


@dataclasses.dataclass(frozen=True, kw_only=True)
class Answer:
    """One raced call's answer: its status name (``OK`` for a response), message, response and times."""

    code: str
    message: str
    response: Any
    sent: float
    answered: float


@dataclasses.dataclass(frozen=True)
class Replica:
    """The stubs of one Connectors and one Controlplane process (one "operator" of a race)."""

    connectors: connectors_pb2_grpc.ConnectorsServiceStub
    controlplane: controlplane_pb2_grpc.ControlplaneServiceStub

    @classmethod
    def on(cls, connectors: grpc.Channel, controlplane: grpc.Channel) -> Replica:
        """Stubs on the two channels."""
        return cls(
            connectors_pb2_grpc.ConnectorsServiceStub(connectors),
            controlplane_pb2_grpc.ControlplaneServiceStub(controlplane),
        )


def _answer(call: Callable[[], Any]) -> Answer:
    sent = time.monotonic()
    try:
        response = call()
    except grpc.RpcError as error:
        code: grpc.StatusCode = error.code()
        return Answer(
            code=code.name,
            message=error.details() or "",
            response=None,
            sent=sent,
            answered=time.monotonic(),
        )
    return Answer(code="OK", message="", response=response, sent=sent, answered=time.monotonic())


def race(calls: Sequence[Callable[[], Any]]) -> list[Answer]:
    """Run ``calls`` at once, each on its own thread released by one barrier; their answers in order."""
    start = threading.Barrier(len(calls))
    answers: list[Answer | None] = [None] * len(calls)

    def run(index: int) -> None:
        start.wait()
        answers[index] = _answer(calls[index])

    threads = [threading.Thread(target=run, args=(n,)) for n in range(len(calls))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(answer is not None for answer in answers)
    return [answer for answer in answers if answer is not None]


def overlapped(answers: Sequence[Answer]) -> bool:
    """Whether every call was sent before any of them was answered: they were in flight together."""
    return max(a.sent for a in answers) < min(a.answered for a in answers)


@dataclasses.dataclass(frozen=True)
class Operators:
    """The two replicas' stubs, an engine on their database (the first's DSN) and a Connectors facade for setup."""

    replicas: tuple[Replica, Replica]
    engine: sa.Engine
    connectors: Connectors
    backend: str

    def both(self, method: Callable[[Replica], Callable[..., Any]], *requests: Message) -> list[Answer]:
        """``method`` of each replica called at once: with ``requests`` one each, or one request for both."""
        sent = requests * 2 if len(requests) == 1 else requests
        return race(
            [
                functools.partial(method(replica), request, timeout=CALL_TIMEOUT)
                for replica, request in zip(self.replicas, sent, strict=True)
            ]
        )


@contextlib.contextmanager
def serving_operators(dsns: tuple[str, str], workdir: Path, backend: str) -> Iterator[Operators]:
    """A schema catalog, then replica n (a Connectors and a Controlplane process) on ``dsns[n]``; stopped after.

    The materializer and the retention pass stay idle (their interval 0): only the raced calls
    write. Every process must stop with exit code 0 and log no unhandled error (an INTERNAL answer).
    """
    quiet = {"NEXUSCRM_MATERIALIZE_INTERVAL_SECONDS": "0"}
    engine = create_engine(dsns[0])
    (catalog,) = start_services([SCHEMA_CATALOG], env={"NEXUSCRM_DSN": dsns[0]}, workdir=workdir / "catalog")
    services = [catalog]
    channels: list[grpc.Channel] = []
    try:
        for n, dsn in enumerate(dsns, start=1):
            services += start_services(
                [CONNECTORS, CONTROLPLANE],
                env={"NEXUSCRM_DSN": dsn, **target_env([catalog]), **quiet},
                workdir=workdir / f"replica-{n}",
            )
        channels = [grpc.insecure_channel(service.address) for service in services[1:]]
        replicas = (Replica.on(channels[0], channels[1]), Replica.on(channels[2], channels[3]))
        yield Operators(replicas, engine, Connectors(engine, Settings()), backend)
    finally:
        for channel in channels:
            channel.close()
        codes = stop_services(services)
        engine.dispose()
    assert set(codes.values()) == {0}, codes
    unhandled = [service.log_path.read_text() for service in services]
    assert not any("unhandled error" in log for log in unhandled), "\n".join(unhandled)


@dataclasses.dataclass
class Tally:
    """What the rounds of one mutation's race saw: rounds, rounds in flight together, answers by code."""

    rounds: int = 0
    overlapping: int = 0
    codes: Counter[str] = dataclasses.field(default_factory=Counter)

    def add(self, answers: Sequence[Answer]) -> None:
        """Count one round."""
        self.rounds += 1
        self.overlapping += overlapped(answers)
        self.codes.update(a.code for a in answers)

    def figures(self) -> dict[str, object]:
        """The tally as a figures line's fields."""
        return {"rounds": self.rounds, "overlapping": self.overlapping, "codes": dict(sorted(self.codes.items()))}
