"""The Integration host's configuration: pools from a file and the environment, and how a pool names its pack."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from nexuscrm_integration.config import DEFAULT_CLAIM_WAIT, DEFAULT_POLL_INTERVAL, HostConfig, PoolConfig
from nexuscrm_integration.errors import HostConfigError
from nexuscrm_runtime.pack_names import PackName


def test_host_config_from_file_and_environment(tmp_path: Path) -> None:
    path = tmp_path / "host.toml"
    path.write_text(
        'activation_wait_seconds = 5\n[[pool]]\npack_install_id = "pk-a"\nwork_type = "t"\n'
        'flow = "demo-contacts"\nsize = 3\nbatch_size = 4\nclaim_wait_seconds = 2.5\npoll_interval_seconds = 0\n'
    )
    pools = json.dumps([{"pack_install_id": "pk-b", "work_type": "t", "flow": "m:f"}])
    config = HostConfig.from_env(
        {
            "NEXUSCRM_INTEGRATION_CONFIG": str(path),
            "NEXUSCRM_INTEGRATION_POOLS": pools,
            "NEXUSCRM_DRAIN_TIMEOUT_SECONDS": "7",
            "NEXUSCRM_INTEGRATION_HOST_ID": "h1",
        }
    )
    assert config.pack_install_ids == ("pk-a", "pk-b") and config.pools[0].size == 3
    claiming = [(p.batch_size, p.claim_wait_seconds, p.poll_interval_seconds) for p in config.pools]
    assert claiming == [(4, 2.5, 0), (1, DEFAULT_CLAIM_WAIT, DEFAULT_POLL_INTERVAL)]
    for field, value in (("batch_size", 0), ("claim_wait_seconds", -1), ("poll_interval_seconds", "fast")):
        with pytest.raises(HostConfigError, match=field):
            PoolConfig.from_mapping({"pack_install_id": "p", "work_type": "t", "flow": "f", field: value}, "test")
    assert (config.activation_wait_seconds, config.drain_timeout_seconds, config.host_id) == (5.0, 7.0, "h1")
    assert HostConfig.from_env({"NEXUSCRM_ACTIVATION_WAIT_SECONDS": "forever"}).activation_wait_seconds == math.inf
    with pytest.raises(HostConfigError, match="unknown pool fields"):
        HostConfig.from_env(
            {"NEXUSCRM_INTEGRATION_POOLS": '[{"pack_install_id": "p", "work_type": "t", "flow": "f", "sise": 2}]'}
        )
    with pytest.raises(HostConfigError, match="more than one pool"):
        HostConfig.from_env({"NEXUSCRM_INTEGRATION_POOLS": json.dumps([json.loads(pools)[0]] * 2)})


def test_a_pool_names_its_pack_by_id_or_by_namespace_name_and_optional_version(tmp_path: Path) -> None:
    path = tmp_path / "host.toml"
    path.write_text(
        '[[pool]]\npack = { namespace = "acme", name = "contacts", version = "1.0" }\nwork_type = "t"\nflow = "m:f"\n'
    )
    config = HostConfig.from_env({"NEXUSCRM_INTEGRATION_CONFIG": str(path)})
    (pool,) = config.pools
    assert pool.pack == PackName(namespace="acme", name="contacts", version="1.0") and pool.pack_install_id == ""
    assert pool.name == "acme/contacts@1.0/t" and config.pack_install_ids == ()  # known once resolved
    assert pool.with_pack_install_id("pk-a") == PoolConfig(pack_install_id="pk-a", work_type="t", flow="m:f")
    named: tuple[tuple[object, PackName], ...] = (
        ("acme/contacts@1.0", PackName(namespace="acme", name="contacts", version="1.0")),
        ("acme/contacts", PackName(namespace="acme", name="contacts")),  # any version (decision 178)
        ({"namespace": "acme", "name": "contacts"}, PackName(namespace="acme", name="contacts")),
    )
    for given, pack in named:
        assert PoolConfig.from_mapping({"work_type": "t", "flow": "f", "pack": given}, "test").pack == pack
    for raw, field in (
        ({"work_type": "t", "flow": "f"}, "pack_install_id"),  # neither
        ({"pack_install_id": "pk-a", "pack": {"namespace": "a", "name": "n", "version": "1"}}, "pack_install_id"),
        ({"pack": {"namespace": "acme", "version": "1"}}, "pack"),  # no name
        ({"pack": {"namespace": "acme", "name": " ", "version": "1"}}, "pack.name"),
        ({"pack": "contacts"}, "pack"),  # no namespace
        ({"pack": "acme/contacts@"}, "pack"),  # an empty version
    ):
        with pytest.raises(HostConfigError) as refused:
            PoolConfig.from_mapping({"work_type": "t", "flow": "f", **raw}, "test")
        assert refused.value.field == field, refused.value
