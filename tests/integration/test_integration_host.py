"""The Integration package without processes: the gate, grants, configuration and the demo Flow."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import cast

import pytest
import sqlalchemy as sa

from nexuscrm_integration.activation import ActivationGrant, check_activation, wait_for_activation
from nexuscrm_integration.config import DEFAULT_CLAIM_WAIT, DEFAULT_POLL_INTERVAL, HostConfig, PoolConfig
from nexuscrm_integration.errors import ActivationRefused, FlowNotFound, HostConfigError, NotGranted
from nexuscrm_integration.flows import resolve_flow
from nexuscrm_integration.host import WorkerHost, standalone_worker
from nexuscrm_sdk.flows import Flow, FlowContext
from nexuscrm_sdk.worker import WorkSource
from nexuscrm_tools import demo
from nexuscrm_tools import demo_queries as queries
from nexuscrm_tools.simulator import WorkloadConfig, workload
from tests.support.factories import install_pack, processing_work
from tests.support.invariants import assert_invariants
from workqueue.values import InputRow


class FakeSchema:
    def __init__(self, missing: list[str]) -> None:
        self.missing = missing

    def schema_missing(self, feature: str) -> list[str]:
        assert feature == "native_projection"
        return self.missing


class FakeProtocols:
    def __init__(self, active: set[str]) -> None:
        self.active = active

    def protocol_missing(self, pack_install_id: str) -> str | None:
        return None if pack_install_id in self.active else f"pack {pack_install_id} has no protocol receipt"


class _NoWork:
    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"{name} called before the gate passed")


def NoWork() -> WorkSource:
    """A WorkSource that must never be asked for anything."""
    return cast(WorkSource, _NoWork())


def test_gate_refusal_names_every_missing_piece_and_grants_only_what_it_checked() -> None:
    with pytest.raises(ActivationRefused) as refused:
        check_activation(FakeSchema(["WorkItem.ReplayOfWorkId"]), FakeProtocols({"pk-a"}), ["pk-a", "pk-b"])
    assert refused.value.missing == ("schema: WorkItem.ReplayOfWorkId", "protocol: pack pk-b has no protocol receipt")

    grant = check_activation(FakeSchema([]), FakeProtocols({"pk-a"}), ["pk-a"])
    assert grant.covers("pk-a") and not grant.covers("pk-b")
    with pytest.raises(TypeError, match="issued only by"):
        ActivationGrant(frozenset({"pk-b"}), grant.checked_at, object())
    with pytest.raises(NotGranted):
        standalone_worker(grant, NoWork(), lambda _g: None, worker_id="w", pack_install_id="pk-b", work_type="t")
    worker = standalone_worker(grant, NoWork(), lambda _g: None, worker_id="w", pack_install_id="pk-a", work_type="t")
    assert worker.worker_id == "w"  # built, and it claims nothing until started


def test_waiting_gate_rechecks_until_it_passes_and_stops_when_asked() -> None:
    protocols = FakeProtocols(set())
    refusals: list[ActivationRefused] = []

    def gate() -> ActivationGrant:
        if refusals:
            protocols.active.add("pk-a")  # activated while the host waits
        return check_activation(FakeSchema([]), protocols, ["pk-a"])

    grant = wait_for_activation(gate, wait_seconds=math.inf, stop=threading.Event(), on_refused=refusals.append)
    assert grant.covers("pk-a") and len(refusals) == 1
    stopped = threading.Event()
    stopped.set()
    with pytest.raises(ActivationRefused):
        wait_for_activation(
            lambda: check_activation(FakeSchema(["X"]), protocols, []), wait_seconds=math.inf, stop=stopped
        )


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


def test_flows_resolve_by_entry_point_or_module_function() -> None:
    assert resolve_flow(demo.FLOW_NAME) is demo.contact_projection
    assert resolve_flow("nexuscrm_tools.demo:contact_projection") is demo.contact_projection
    with pytest.raises(FlowNotFound):
        resolve_flow("no-such-flow")
    with pytest.raises(FlowNotFound):
        resolve_flow("nexuscrm_tools.demo:no_such_factory")


@pytest.mark.database
def test_demo_flow_is_idempotent_per_generation_and_equals_the_fold(engine: sa.Engine) -> None:
    pack = install_pack(engine)
    demo.create_tables(engine)
    config = WorkloadConfig(lanes=3, inputs=40, rate=0, seed=3)
    fresh = [d.item for batch in workload(config) for d in batch if not d.duplicate]
    rows = [
        InputRow(
            enqueue_ordinal=i, receipt_key=item.receipt_key, payload=item.payload, source_time=None, is_replay=False
        )
        for i, item in enumerate(fresh, start=1)
    ]
    replay = InputRow(
        enqueue_ordinal=99, receipt_key=None, payload=b'{"replay_of": "w"}', source_time=None, is_replay=True
    )

    def apply(batch: list[InputRow]) -> int:
        with engine.begin() as connection:
            return demo.apply_generation(connection, processing_work(pack), batch)

    def snapshot() -> list[tuple[object, ...]]:
        with engine.connect() as connection:
            return sorted(tuple(r) for r in queries.demo_contacts_get(connection, pack))

    assert apply(rows[:25]) == 25
    first = snapshot()
    assert apply(rows[:25]) == 0 and snapshot() == first  # the same generation again changes nothing
    assert apply([*rows[20:], replay]) == 15
    expected = demo.fold((row.enqueue_ordinal, demo.ContactUpdate.decode(row.payload)) for row in rows)
    assert {r[1]: (r[6], r[7]) for r in snapshot()} == {c: (s.updates, s.last_ordinal) for c, s in expected.items()}
    with pytest.raises(ValueError, match="not a contact update"):
        apply([InputRow(enqueue_ordinal=100, receipt_key="x", payload=b"{}", source_time=None, is_replay=False)])
    assert_invariants(engine)


@pytest.mark.database
def test_worker_host_needs_a_grant_for_every_pool(engine: sa.Engine) -> None:
    grant = check_activation(FakeSchema([]), FakeProtocols({"pk-a"}), ["pk-a"])
    config = HostConfig.from_env(
        {
            "NEXUSCRM_INTEGRATION_POOLS": json.dumps(
                [{"pack_install_id": "pk-b", "work_type": "t", "flow": demo.FLOW_NAME}]
            )
        }
    )
    with pytest.raises(NotGranted):
        WorkerHost(grant, config.pools, NoWork(), engine, host_id="h")
    context = FlowContext(pack_install_id="pk-a", work_type="t", engine=engine)
    assert callable(demo.contact_projection(context))
    assert_invariants(engine)


SEEN: list[FlowContext] = []


def recording_flow(context: FlowContext) -> Flow:
    """A Flow factory that records the context it was built with (``test_pool_settings_reach_the_flow``)."""
    SEEN.append(context)
    return lambda _generation: None


@pytest.mark.database
def test_pool_settings_reach_the_flow_and_must_map_strings_to_strings(engine: sa.Engine) -> None:
    grant = check_activation(FakeSchema([]), FakeProtocols({"pk-a"}), ["pk-a"])
    flow = f"{__name__}:recording_flow"
    pool = {"pack_install_id": "pk-a", "work_type": "t", "flow": flow, "settings": {"database": "sqlite:///x.db"}}
    config = HostConfig.from_env({"NEXUSCRM_INTEGRATION_POOLS": json.dumps([pool])})
    SEEN.clear()
    WorkerHost(grant, config.pools, NoWork(), engine, host_id="h")
    assert [(c.pack_install_id, dict(c.settings)) for c in SEEN] == [("pk-a", {"database": "sqlite:///x.db"})]
    for settings in ({"database": 1}, ["database"], {"": None}):
        with pytest.raises(HostConfigError, match="settings must map strings to strings"):
            PoolConfig.from_mapping({**pool, "settings": settings}, "test")
    assert PoolConfig.from_mapping({k: v for k, v in pool.items() if k != "settings"}, "test").settings == {}
    assert_invariants(engine)
