"""``nexuscrm version``: what each service is, side by side, and whether the combination fits (decision 144).

Each service answers GetBuildInfo (contract 1.2.0) with its release and the canonical schema
versions it serves. The database's version is the schema catalog's answer (it owns the
schema); without it, each service's own reading. A combination is out of range when a
service's declared range (``nexuscrm_runtime.release.fit``) does not serve that version, or
when the services speak contracts of different major versions. A service that answers
UNIMPLEMENTED is a release from before 0.2.0 (it cannot say); one that does not answer is
reported with the variable that sets its target.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from nexuscrm.buildinfo.v1.build_info_pb2 import BuildInfo
from nexuscrm_runtime.release import fit, schema_range
from nexuscrm_tools.exits import ExitCode

SCHEMA_OWNER = "schema-catalog"
BEFORE_BUILD_INFO = "before 0.2.0 (no GetBuildInfo)"


class Reply(enum.StrEnum):
    """How a service answered GetBuildInfo."""

    ANSWERED = "answered"
    BEFORE_BUILD_INFO = "before 0.2.0"  # UNIMPLEMENTED: a release older than the RPC
    UNREACHABLE = "unreachable"  # no answer: not listening, refused, or timed out


@dataclasses.dataclass(frozen=True, kw_only=True)
class Answer:
    """One service's answer: its build, or why there is none (``error``)."""

    service: str  # the launcher's name: schema-catalog, controlplane, connectors, integration
    variable: str  # the environment variable that sets its target
    address: str
    reply: Reply
    build: BuildInfo | None = None
    error: str = ""


def ask(service: str, variable: str, address: str, call: Callable[[], BuildInfo]) -> Answer:
    """Call ``call`` (one GetBuildInfo) and classify the outcome as an ``Answer``."""
    unanswered = Answer(service=service, variable=variable, address=address, reply=Reply.UNREACHABLE)
    try:
        return dataclasses.replace(unanswered, reply=Reply.ANSWERED, build=call())
    except grpc.RpcError as error:
        code = error.code()
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return dataclasses.replace(unanswered, reply=Reply.BEFORE_BUILD_INFO)
        return dataclasses.replace(unanswered, error=f"{code.name if code else 'UNKNOWN'}: {error.details()}")


def database_version(answers: Sequence[Answer]) -> int | None:
    """The database's schema version as the schema catalog reads it; None when it did not answer."""
    for answer in answers:
        if answer.build is not None and answer.service == SCHEMA_OWNER:
            return answer.build.database_schema_version
    return None


def _version_for(answer: Answer, database: int | None) -> int | None:
    if answer.build is None:
        return None
    return answer.build.database_schema_version if database is None else database


def problems(answers: Sequence[Answer]) -> list[str]:
    """Every way the combination is out of its declared ranges, one line each; empty when it fits."""
    database = database_version(answers)
    found = []
    for answer in answers:
        version = _version_for(answer, database)
        if answer.build is None or version is None:
            continue
        if not fit(answer.build.schema_support, version).serves:
            support = schema_range(answer.build.schema_support)
            found.append(
                f"{answer.service} {answer.build.package_version} serves schema {support}, the database is at {version}"
            )
    majors = {
        answer.service: answer.build.contract_version.split(".")[0] for answer in answers if answer.build is not None
    }
    if len(set(majors.values())) > 1:
        found.append(
            "contract major versions differ: " + ", ".join(f"{name} {major}" for name, major in majors.items())
        )
    return found


def exit_code(answers: Sequence[Answer]) -> ExitCode:
    """9 when the combination is out of range (a definite finding), else 3 when a service did not answer, else 0."""
    if problems(answers):
        return ExitCode.CHECK_FAILED
    if any(answer.reply is Reply.UNREACHABLE for answer in answers):
        return ExitCode.UNREACHABLE
    return ExitCode.OK


COLUMNS = ("service", "package", "version", "contract", "schema", "database", "fit")


def rows(answers: Sequence[Answer]) -> list[tuple[str, ...]]:
    """The table's rows, one per service, in ``COLUMNS`` order."""
    database = database_version(answers)
    table: list[tuple[str, ...]] = []
    for answer in answers:
        build, version = answer.build, _version_for(answer, database)
        if build is None or version is None:
            status = BEFORE_BUILD_INFO if answer.reply is Reply.BEFORE_BUILD_INFO else _unreachable(answer)
            table.append((answer.service, status, "", "", "", "", ""))
            continue
        table.append(
            (
                answer.service,
                build.package,
                build.package_version,
                build.contract_version,
                schema_range(build.schema_support),
                str(build.database_schema_version),
                str(fit(build.schema_support, version)),
            )
        )
    return table


def _unreachable(answer: Answer) -> str:
    return f"unreachable at {answer.address} (set {answer.variable}): {answer.error.split(':')[0]}"


def summary(answers: Sequence[Answer]) -> str:
    """One line over the table: the problems, else who did not answer, else that the combination fits."""
    found = problems(answers)
    if found:
        return "OUT OF RANGE: " + "; ".join(found)
    silent = [answer.service for answer in answers if answer.reply is Reply.UNREACHABLE]
    if silent:
        return f"not checked: {', '.join(silent)} did not answer"
    return "the combination is inside every declared range"


def to_json(answers: Sequence[Answer]) -> dict[str, Any]:
    """Plain values for ``--json``: each service's answer, the database's version and the problems."""
    database = database_version(answers)
    services = []
    for answer in answers:
        entry: dict[str, Any] = {
            "service": answer.service,
            "target": answer.address,
            "target_variable": answer.variable,
            "reply": str(answer.reply),
        }
        build, version = answer.build, _version_for(answer, database)
        if build is not None and version is not None:
            entry.update(
                owner=build.owner,
                package=build.package,
                package_version=build.package_version,
                contract_version=build.contract_version,
                schema_support={
                    "minimum": build.schema_support.minimum,
                    "newest": build.schema_support.newest,
                    "forward_window": build.schema_support.forward_window,
                },
                database_schema_version=build.database_schema_version,
                fit=str(fit(build.schema_support, version)),
            )
        if answer.error:
            entry["error"] = answer.error
        services.append(entry)
    return {"services": services, "database_schema_version": database, "problems": problems(answers)}
