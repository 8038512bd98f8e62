"""The Integration host over Connectors without processes: grants, Flows and the demo Flow.

The gate and the configuration alone are the Integration Service's own suite
(tests/integration_service/unit).
"""

from __future__ import annotations

import json
from typing import cast

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.facade import Connectors
from nexuscrm_integration.activation import check_activation
from nexuscrm_integration.config import HostConfig, PoolConfig
from nexuscrm_integration.errors import HostConfigError, NotGranted
from nexuscrm_integration.host import WorkerHost, standalone_worker
from nexuscrm_sdk.flows import Flow, FlowContext, FlowNotFound, Generation, resolve_flow
from nexuscrm_sdk.worker import WorkSource
from nexuscrm_tools import demo
from nexuscrm_tools import demo_queries as queries
from nexuscrm_tools.simulator import WorkloadConfig, workload
from tests.integration_service.fakes import FakeProtocols, FakeSchema
from tests.support.factories import delivery, install_pack, processing_work, route
from tests.support.invariants import assert_invariants
from tests.support.waiting import wait_until
from workqueue.values import InputRow, Route


class _NoWork:
    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"{name} called before the gate passed")


def NoWork() -> WorkSource:
    """A WorkSource that must never be asked for anything."""
    return cast(WorkSource, _NoWork())


def test_a_standalone_worker_needs_a_grant_for_its_pack() -> None:
    grant = check_activation(FakeSchema([]), FakeProtocols({"pk-a"}), ["pk-a"])
    with pytest.raises(NotGranted):
        standalone_worker(grant, NoWork(), lambda _g: None, worker_id="w", pack_install_id="pk-b", work_type="t")
    worker = standalone_worker(grant, NoWork(), lambda _g: None, worker_id="w", pack_install_id="pk-a", work_type="t")
    assert worker.worker_id == "w"  # built, and it claims nothing until started


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
