"""``nexuscrm health``: the gRPC health (grpc.health.v1) of each deployed service (decision 177).

Each service is asked for the status of its own full name (``nexuscrm.connectors.v1.ConnectorsService``),
which it reports SERVING once its start-up gates passed (the Integration host: once its
activation gate passed). Which services are deployed: ``clients.deployed``. The check passes
when every one answers SERVING; one that answers otherwise, or not at all, exits 3 (the shared
table's "a service is unreachable or did not start"), named with the variable that sets its target.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

from nexuscrm_tools.exits import ExitCode


class Health(enum.StrEnum):
    """What a service answered; plain words, as JSON and the table print them."""

    SERVING = "serving"
    NOT_SERVING = "not_serving"  # it answers, but its gates have not passed (or it is stopping)
    SERVICE_UNKNOWN = "service_unknown"  # it answers, but serves another service there
    UNREACHABLE = "unreachable"  # no answer: not listening, refused, or timed out


_STATUS_HEALTH = {
    health_pb2.HealthCheckResponse.SERVING: Health.SERVING,
    health_pb2.HealthCheckResponse.SERVICE_UNKNOWN: Health.SERVICE_UNKNOWN,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Answer:
    """One service's health, or why there is none (``error``)."""

    service: str  # the launcher's name: schema-catalog, controlplane, connectors, integration
    variable: str  # the environment variable that sets its target
    address: str
    health: Health
    error: str = ""


def ask(service: str, variable: str, address: str, call: Callable[[], int]) -> Answer:
    """Call ``call`` (one health Check, answering its status) and classify the outcome as an ``Answer``."""
    answer = Answer(service=service, variable=variable, address=address, health=Health.UNREACHABLE)
    try:
        return dataclasses.replace(answer, health=_STATUS_HEALTH.get(call(), Health.NOT_SERVING))
    except grpc.RpcError as error:
        code = error.code()
        if code == grpc.StatusCode.NOT_FOUND:  # the health service knows no such name
            return dataclasses.replace(answer, health=Health.SERVICE_UNKNOWN)
        return dataclasses.replace(answer, error=f"{code.name if code else 'UNKNOWN'}: {error.details()}")


def exit_code(answers: Sequence[Answer]) -> ExitCode:
    """0 when every service answers SERVING, else 3."""
    return ExitCode.OK if all(a.health is Health.SERVING for a in answers) else ExitCode.UNREACHABLE


COLUMNS = ("service", "target", "health")


def rows(answers: Sequence[Answer]) -> list[tuple[str, ...]]:
    """The table's rows, one per service, in ``COLUMNS`` order."""
    return [(a.service, a.address, _shown(a)) for a in answers]


def _shown(answer: Answer) -> str:
    if answer.health is Health.UNREACHABLE:
        return f"unreachable (set {answer.variable}): {answer.error.split(':')[0]}"
    return answer.health.replace("_", " ")


def summary(answers: Sequence[Answer]) -> str:
    """One line over the table: every service serving, or which ones are not."""
    failing = [a.service for a in answers if a.health is not Health.SERVING]
    return f"not serving: {', '.join(failing)}" if failing else "every service is serving"


def to_json(answers: Sequence[Answer]) -> dict[str, Any]:
    """Plain values for ``--json``: each service's target and health, and whether all serve."""
    services = []
    for answer in answers:
        entry = {
            "service": answer.service,
            "target": answer.address,
            "target_variable": answer.variable,
            "health": str(answer.health),
        }
        if answer.error:
            entry["error"] = answer.error
        services.append(entry)
    return {"services": services, "serving": exit_code(answers) is ExitCode.OK}
