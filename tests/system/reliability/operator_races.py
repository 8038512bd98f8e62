"""Two operators' calls started together through two server processes, and what each was answered.

``race`` starts both calls behind a barrier and records, per call, its status (or OK), its
message, its response and when (on this process's monotonic clock) it was sent and answered,
so a test can count the rounds whose calls were in flight at the same time instead of
trusting that a barrier made them overlap. The mutations themselves live in
``test_operator_races.py``; the Galera tier uses the same rounds through two nodes.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from nexuscrm.connectors.v1 import connectors_pb2_grpc
from nexuscrm.controlplane.v1 import controlplane_pb2_grpc

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
