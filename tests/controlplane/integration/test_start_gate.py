"""Controlplane's start-up schema gate, as a real process on each backend (decision 144).

Controlplane serves schema 6..15 with a forward window of 1 (``nexuscrm_controlplane.release``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nexuscrm_controlplane.release import RELEASE
from tests.support.service_starts import Service, health, schema_at, serving, start_until_exit

INVARIANTS_NOT_CHECKED = "the start-up schema gate only: a process accepts or refuses a schema and writes no pack row"

pytestmark = [pytest.mark.acceptance, pytest.mark.database]

CONTROLPLANE = Service(module="nexuscrm_controlplane.main", env_name="CONTROLPLANE")


def test_an_empty_database_is_refused_in_one_line_before_anything_serves(empty_dsn: str, tmp_path: Path) -> None:
    ended = start_until_exit(CONTROLPLANE, dsn=empty_dsn, workdir=tmp_path)
    assert ended.process.returncode == 3, ended.log
    assert not ended.port_file.exists()  # never bound: no health service, nothing SERVING
    (refusal,) = ended.lines("ERROR")
    assert "the database has no canonical schema (version 0)" in refusal
    assert f"nexuscrm-controlplane {RELEASE.version} serves schema 6..15 +1" in refusal
    assert 'nexuscrm-schema migrate --dsn "$NEXUSCRM_DSN"' in refusal


def test_its_minimum_serves(empty_dsn: str, tmp_path: Path) -> None:
    schema_at(empty_dsn, 6)
    with serving(CONTROLPLANE, dsn=empty_dsn, workdir=tmp_path) as (started, address):
        assert health(address) == "SERVING"
        assert "schema 6..15 +1, database at 6)" in started.log
