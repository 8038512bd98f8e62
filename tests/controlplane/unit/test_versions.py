"""``nexuscrm version``'s comparison of the services' builds (``nexuscrm_tools.versions``, decision 144)."""

from __future__ import annotations

import grpc
import pytest

from nexuscrm.buildinfo.v1.build_info_pb2 import BuildInfo, SchemaSupport
from nexuscrm_tools import versions
from nexuscrm_tools.exits import ExitCode
from nexuscrm_tools.versions import Answer, Reply


def _build(owner: str, minimum: int, newest: int, window: int, database: int, contract: str = "1.2.0") -> BuildInfo:
    return BuildInfo(
        owner=owner,
        package=f"nexuscrm-{owner}",
        package_version="0.2.0",
        contract_version=contract,
        schema_support=SchemaSupport(minimum=minimum, newest=newest, forward_window=window),
        database_schema_version=database,
    )


def _answered(service: str, build: BuildInfo) -> Answer:
    return Answer(
        service=service, variable=f"NEXUSCRM_{service.upper()}_TARGET", address="h:1", reply=Reply.ANSWERED, build=build
    )


def _system(database: int, connectors_contract: str = "1.2.0") -> list[Answer]:
    return [
        _answered("schema-catalog", _build("schema-catalog", 0, 10, 0, database)),
        _answered("connectors", _build("connectors", 10, 10, 1, database, connectors_contract)),
        _answered("controlplane", _build("controlplane", 6, 10, 1, database)),
    ]


class _Refused(grpc.RpcError):
    def __init__(self, code: grpc.StatusCode) -> None:
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "failed to connect to all addresses"


def _failing(code: grpc.StatusCode) -> BuildInfo:
    raise _Refused(code)


def test_a_combination_inside_every_range_passes() -> None:
    answers = _system(10)
    assert versions.problems(answers) == []
    assert versions.exit_code(answers) is ExitCode.OK
    assert [row[-1] for row in versions.rows(answers)] == ["supported"] * 3
    assert versions.summary(answers) == "the combination is inside every declared range"


def test_a_database_inside_a_forward_window_passes_as_ahead() -> None:
    answers = _system(11)[1:]  # a catalog at 10 could not be serving it: without it, each reads its own
    assert versions.problems(answers) == []
    assert [row[-1] for row in versions.rows(answers)] == ["ahead", "ahead"]


def test_a_service_whose_range_excludes_the_database_version_is_flagged() -> None:
    answers = [*_system(10)[:2], _answered("integration", _build("integration", 11, 12, 0, 0))]
    assert versions.problems(answers) == ["integration 0.2.0 serves schema 11..12 +0, the database is at 10"]
    assert versions.exit_code(answers) is ExitCode.CHECK_FAILED
    assert versions.rows(answers)[-1][-1] == "too old"  # judged against the catalog's reading, not its own 0
    assert versions.summary(answers).startswith("OUT OF RANGE: integration 0.2.0 serves schema 11..12 +0")


def test_contract_major_versions_that_differ_are_flagged() -> None:
    answers = _system(10, connectors_contract="2.0.0")
    (problem,) = versions.problems(answers)
    assert problem.startswith("contract major versions differ:")
    assert "connectors 2" in problem and "schema-catalog 1" in problem
    assert versions.exit_code(answers) is ExitCode.CHECK_FAILED


def test_unimplemented_is_a_release_before_build_info_not_a_failure() -> None:
    old = versions.ask(
        "integration", "NEXUSCRM_INTEGRATION_TARGET", "h:4", lambda: _failing(grpc.StatusCode.UNIMPLEMENTED)
    )
    assert old.reply is Reply.BEFORE_BUILD_INFO
    answers = [*_system(10), old]
    assert versions.rows(answers)[-1][:2] == ("integration", "before 0.2.0 (no GetBuildInfo)")
    assert versions.exit_code(answers) is ExitCode.OK
    assert versions.to_json(answers)["services"][-1] == {
        "service": "integration",
        "target": "h:4",
        "target_variable": "NEXUSCRM_INTEGRATION_TARGET",
        "reply": "before 0.2.0",
    }


def test_a_service_that_does_not_answer_is_named_with_its_target_variable() -> None:
    silent = versions.ask(
        "controlplane", "NEXUSCRM_CONTROLPLANE_TARGET", "h:3", lambda: _failing(grpc.StatusCode.UNAVAILABLE)
    )
    answers = [*_system(10)[:2], silent]
    assert versions.exit_code(answers) is ExitCode.UNREACHABLE
    assert versions.rows(answers)[-1][1] == "unreachable at h:3 (set NEXUSCRM_CONTROLPLANE_TARGET): UNAVAILABLE"
    assert versions.summary(answers) == "not checked: controlplane did not answer"


@pytest.mark.parametrize("database", [10, 13])
def test_json_holds_plain_values_with_integers_as_numbers(database: int) -> None:
    data = versions.to_json(_system(database))
    assert data["database_schema_version"] == database
    catalog = data["services"][0]
    assert catalog["schema_support"] == {"minimum": 0, "newest": 10, "forward_window": 0}
    assert catalog["database_schema_version"] == database
    assert catalog["fit"] == ("supported" if database == 10 else "too new")
    assert len(data["problems"]) == (0 if database == 10 else 3)
