"""``nexuscrm version`` against the four services running as processes (decision 144)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nexuscrm_tools.launcher import ALL_SERVICES, start_services, stop_services, target_env

INVARIANTS_NOT_CHECKED = "build and version reads of running services: nothing is admitted"

pytestmark = [pytest.mark.acceptance, pytest.mark.database]

PACKAGES = {
    "schema-catalog": "nexuscrm-schema-catalog",
    "connectors": "nexuscrm-connectors",
    "controlplane": "nexuscrm-controlplane",
    "integration": "nexuscrm-integration",
}


def _version(env: dict[str, str], *flags: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "nexuscrm_tools.cli", *flags, "version"]
    return subprocess.run(
        command, env={**os.environ, **env, "COLUMNS": "200"}, capture_output=True, text=True, timeout=60
    )


def test_version_shows_the_four_side_by_side_and_names_a_silent_one(empty_dsn: str, tmp_path: Path) -> None:
    services = start_services(ALL_SERVICES, env={"NEXUSCRM_DSN": empty_dsn}, workdir=tmp_path)
    try:
        env = target_env(services)
        answered = _version(env, "--json")
        assert answered.returncode == 0, answered.stderr
        data = json.loads(answered.stdout)
        assert data["database_schema_version"] == 15
        assert data["problems"] == []
        contract = importlib.metadata.version("nexuscrm-protos")
        by_service = {entry["service"]: entry for entry in data["services"]}
        assert list(by_service) == list(PACKAGES)
        for service, package in PACKAGES.items():
            entry = by_service[service]
            assert entry["reply"] == "answered"
            assert (entry["owner"], entry["package"]) == (service, package)
            assert entry["package_version"] == importlib.metadata.version(package)
            assert entry["contract_version"] == contract
            assert entry["database_schema_version"] == 15
            assert entry["fit"] == "supported"
        assert by_service["connectors"]["schema_support"] == {"minimum": 15, "newest": 15, "forward_window": 1}

        table = _version(env)
        assert table.returncode == 0, table.stderr
        assert "the combination is inside every declared range" in table.stdout
        for service, package in PACKAGES.items():
            assert f"{service}" in table.stdout and package in table.stdout

        stop_services(services[-1:])  # the Integration host
        silent = _version(env)
        assert silent.returncode == 3, silent.stdout
        assert f"unreachable at {services[-1].address} (set NEXUSCRM_INTEGRATION_TARGET)" in silent.stdout
    finally:
        codes = stop_services(services)
    assert set(codes.values()) == {0}
