"""The Integration package without processes: the gate, grants, configuration and the demo Flow."""

from __future__ import annotations

import json
import math
import threading
from pathlib import Path
from typing import cast

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.service import Connectors
from nexuscrm_integration.activation import ActivationGrant, check_activation, wait_for_activation
from nexuscrm_integration.config import DEFAULT_CLAIM_WAIT, DEFAULT_POLL_INTERVAL, HostConfig, PackName, PoolConfig
from nexuscrm_integration.errors import ActivationRefused, HostConfigError, NotGranted
from nexuscrm_integration.host import WorkerHost, standalone_worker
from nexuscrm_integration.packs import PackLookupFailed, resolve_pools
from nexuscrm_sdk.flows import Flow, FlowContext, FlowNotFound, Generation, resolve_flow
from nexuscrm_sdk.worker import WorkSource
from nexuscrm_tools import demo
from nexuscrm_tools import demo_queries as queries
from nexuscrm_tools.simulator import WorkloadConfig, workload
from tests.support.factories import delivery, install_pack, processing_work, route
from tests.support.invariants import assert_invariants
from tests.support.waiting import wait_until
from workqueue.values import InputRow, Route


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


CONTEXTS: list[FlowContext] = []


def context_recording_flow(context: FlowContext) -> Flow:
    """A Flow factory that records the context it was built with (``test_pool_settings_reach_the_flow``)."""
    CONTEXTS.append(context)
    return lambda _generation: None


@pytest.mark.database
def test_pool_settings_reach_the_flow_and_must_map_strings_to_strings(engine: sa.Engine) -> None:
    grant = check_activation(FakeSchema([]), FakeProtocols({"pk-a"}), ["pk-a"])
    flow = f"{__name__}:context_recording_flow"
    pool = {"pack_install_id": "pk-a", "work_type": "t", "flow": flow, "settings": {"database": "sqlite:///x.db"}}
    config = HostConfig.from_env({"NEXUSCRM_INTEGRATION_POOLS": json.dumps([pool])})
    CONTEXTS.clear()
    WorkerHost(grant, config.pools, NoWork(), engine, host_id="h")
    assert [(c.pack_install_id, dict(c.settings)) for c in CONTEXTS] == [("pk-a", {"database": "sqlite:///x.db"})]
    for settings in ({"database": 1}, ["database"], {"": None}):
        with pytest.raises(HostConfigError, match="settings must map strings to strings"):
            PoolConfig.from_mapping({**pool, "settings": settings}, "test")
    assert PoolConfig.from_mapping({k: v for k, v in pool.items() if k != "settings"}, "test").settings == {}


class FakeFinder:
    """Incarnations by pack name; a name in ``failing`` cannot be looked up."""

    def __init__(self, packs: dict[str, list[str]], failing: frozenset[str] = frozenset()) -> None:
        self.packs = packs
        self.failing = failing
        self.asked: list[str] = []

    def find_packs(self, pack: PackName) -> list[str]:
        self.asked.append(str(pack))
        if str(pack) in self.failing:
            raise PackLookupFailed("FindPacks failed (UNAVAILABLE: connection refused)")
        return self.packs.get(str(pack), [])


def named_pool(name: str, work_type: str = "t") -> PoolConfig:
    return PoolConfig.from_mapping(
        {"pack": {"namespace": "acme", "name": name, "version": "1.0"}, "work_type": work_type, "flow": "m:f"}, "test"
    )


def test_a_pool_names_its_pack_by_id_or_by_namespace_name_and_version(tmp_path: Path) -> None:
    path = tmp_path / "host.toml"
    path.write_text(
        '[[pool]]\npack = { namespace = "acme", name = "contacts", version = "1.0" }\nwork_type = "t"\nflow = "m:f"\n'
    )
    config = HostConfig.from_env({"NEXUSCRM_INTEGRATION_CONFIG": str(path)})
    (pool,) = config.pools
    assert pool.pack == PackName(namespace="acme", name="contacts", version="1.0") and pool.pack_install_id == ""
    assert pool.name == "acme/contacts 1.0/t" and config.pack_install_ids == ()  # known once resolved
    assert pool.with_pack_install_id("pk-a") == PoolConfig(pack_install_id="pk-a", work_type="t", flow="m:f")
    for raw, field in (
        ({"work_type": "t", "flow": "f"}, "pack_install_id"),  # neither
        ({"pack_install_id": "pk-a", "pack": {"namespace": "a", "name": "n", "version": "1"}}, "pack_install_id"),
        ({"pack": {"namespace": "acme", "name": "contacts"}}, "pack"),  # no version
        ({"pack": {"namespace": "acme", "name": " ", "version": "1"}}, "pack.name"),
        ({"pack": "acme/contacts"}, "pack"),
    ):
        with pytest.raises(HostConfigError) as refused:
            PoolConfig.from_mapping({"work_type": "t", "flow": "f", **raw}, "test")
        assert refused.value.field == field, refused.value


def test_pack_names_resolve_to_exactly_one_incarnation_or_name_the_pack_that_did_not() -> None:
    finder = FakeFinder(
        {"acme/contacts 1.0": ["pk-c"], "acme/deals 1.0": ["pk-new", "pk-old"]}, failing=frozenset({"acme/down 1.0"})
    )
    by_id = PoolConfig(pack_install_id="pk-a", work_type="t", flow="m:f")
    pools = [by_id, named_pool("contacts"), named_pool("contacts", "u"), named_pool("deals"), named_pool("gone")]
    resolution = resolve_pools([*pools, named_pool("down")], finder)
    assert [p.name for p in resolution.pools] == ["pk-a/t", "pk-c/t", "pk-c/u"]
    assert resolution.pack_install_ids == ("pk-a", "pk-c")
    assert resolution.missing == (
        "pack: acme/deals 1.0 has 2 incarnations (pk-new, pk-old); "
        "name one by pack_install_id in pool acme/deals 1.0/t",
        "pack: acme/gone 1.0 is not installed (pool acme/gone 1.0/t)",
        "pack: acme/down 1.0 could not be resolved: FindPacks failed (UNAVAILABLE: connection refused)",
    )
    assert finder.asked.count("acme/contacts 1.0") == 1  # asked once per name

    with pytest.raises(ActivationRefused) as refused:  # the gate lists them with everything else missing
        check_activation(
            FakeSchema(["X"]),
            FakeProtocols({"pk-a", "pk-c"}),
            resolution.pack_install_ids,
            unresolved=resolution.missing,
        )
    assert refused.value.missing == (*resolution.missing, "schema: X")
    grant = check_activation(
        FakeSchema([]), FakeProtocols({"pk-c"}), resolve_pools([named_pool("contacts")], finder).pack_install_ids
    )
    assert grant.covers("pk-c")


SEEN: dict[str, list[tuple[Route, str]]] = {}  # by pack: what ``recording_flow``'s Flows were given


def recording_flow(context: FlowContext) -> Flow:
    """A Flow factory (``module:function``) whose Flow records each generation's route and identity's pack."""

    def flow(generation: Generation) -> None:
        SEEN.setdefault(context.pack_install_id, []).append((generation.route, generation.identity.pack_install_id))
        for _ in generation.inputs:
            pass

    return flow


@pytest.mark.database
def test_the_host_hands_each_flow_its_generations_decoded_identity(engine: sa.Engine) -> None:
    pack = install_pack(engine)
    connectors = Connectors(engine)
    connectors.ingest(pack, items=[delivery(lane="north"), delivery(lane="south"), delivery(lane="north")])
    grant = check_activation(FakeSchema([]), FakeProtocols({pack}), [pack])
    pool = PoolConfig(pack_install_id=pack, work_type="project", flow=f"{__name__}:recording_flow", size=1)
    host = WorkerHost(grant, [pool], connectors, engine, host_id="h")
    host.start()
    try:
        wait_until(lambda: len(SEEN.get(pack, [])) == 2, "both lanes projected")
    finally:
        assert host.run_until_drained(30)
    assert sorted(SEEN[pack], key=lambda seen: seen[0].source_lane) == [(route("north"), pack), (route("south"), pack)]
    assert connectors.queue_state(pack).drained
    assert_invariants(engine)
