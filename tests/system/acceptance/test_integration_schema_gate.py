"""The Integration host's activation gate checks the schema version the schema catalog reports (decision 144).

A database at v7: the schema catalog (applying nothing) and Controlplane (minimum 6) serve it,
the host, which serves 10..15 +1, refuses in its gate's one line and exits 3.
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from nexuscrm.controlplane.v1 import controlplane_pb2 as cp_pb
from nexuscrm.controlplane.v1 import controlplane_pb2_grpc as cp_grpc
from nexuscrm_integration.main import EXIT_REFUSED
from nexuscrm_integration.release import RELEASE
from nexuscrm_tools import demo
from nexuscrm_tools.launcher import (
    CONTROLPLANE,
    INTEGRATION,
    SCHEMA_CATALOG,
    LaunchError,
    start_services,
    stop_services,
    target_env,
)
from nexuscrm_tools.run import demo_pools
from tests.support.service_starts import schema_at

INVARIANTS_NOT_CHECKED = "the activation gate reads the schema version: no input is admitted or run"

pytestmark = [pytest.mark.acceptance, pytest.mark.database]


def test_the_host_refuses_a_database_older_than_its_minimum(empty_dsn: str, tmp_path: Path) -> None:
    schema_at(empty_dsn, 7)
    env = {"NEXUSCRM_DSN": empty_dsn, "NEXUSCRM_APPLY_SCHEMA_ON_START": "0"}
    services = start_services((SCHEMA_CATALOG, CONTROLPLANE), env=env, workdir=tmp_path)
    try:
        with grpc.insecure_channel(services[1].address) as channel:
            request = cp_pb.InstallPackRequest(
                namespace="acme", pack_name=demo.PACK_NAME, pack_version=demo.PACK_VERSION
            )
            pack = cp_grpc.ControlplaneServiceStub(channel).InstallPack(request, timeout=10).pack.pack_install_id
        host = {**env, **target_env(services), "NEXUSCRM_INTEGRATION_POOLS": demo_pools(pack, 1)}
        with pytest.raises(LaunchError, match=f"exited with {EXIT_REFUSED}"):
            start_services((INTEGRATION,), env=host, workdir=tmp_path)
    finally:
        assert set(stop_services(services).values()) == {0}
    (refusal,) = [line for line in (tmp_path / "integration.log").read_text().splitlines() if " ERROR " in line]
    assert "NOT_SERVING: activation refused; missing: schema: the database is at schema 7" in refusal
    assert f"nexuscrm-integration {RELEASE.version} serves schema 10..15 +1" in refusal
    assert 'nexuscrm-schema migrate --dsn "$NEXUSCRM_DSN"' in refusal
