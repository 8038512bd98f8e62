"""The Connectors SDK: what a Flow author and a Connectors client need, without a database or a service.

Where things are:

- ``nexuscrm_sdk.flows``: ``FlowContext`` (the pool, the host's engine, the pool's settings) and
  ``FlowFactory``, the callable a pool names (``module:function`` or an entry point of the group
  ``nexuscrm.flows``) that returns the ``Flow``.
- ``nexuscrm_sdk.worker``: ``Generation``, what a Flow receives (``work``, ``identity``,
  ``route``, and ``inputs``: every member as a ``workqueue.InputRow``, in ordinal order), and
  ``Worker``, which claims, loads, heartbeats and completes or fails over any ``WorkSource``.
- ``nexuscrm_sdk.applied``: ``AppliedInputs``, the ledger that applies each input once however
  often a generation runs (the ``sql`` extra).
- ``nexuscrm_sdk.testing``: ``InMemoryWorkSource`` and ``FakeClock``, to test a Flow in process.
- ``nexuscrm_sdk.client``: ``ConnectorsClient``, the gRPC client of every ConnectorsService RPC.
- ``nexuscrm_sdk.convert``, ``nexuscrm_sdk.timestamps``, ``nexuscrm_sdk.draining``: protobuf
  conversions, UTC datetimes, waiting for a drained queue (used by the modules above).

The shared values (``ProjectionIdentity``, ``WorkStatus``, ``InputRow``) come from ``workqueue``.
A Flow must read every input of its generation; raising fails the attempt, which is retried.
A Flow and its test::

    totals: dict[str, int] = {}

    def count_inputs(context: FlowContext) -> Flow:
        def project(generation: Generation) -> None:
            lane = generation.identity.source_lane
            totals[lane] = totals.get(lane, 0) + sum(1 for _ in generation.inputs)
        return project

    def test_count_inputs() -> None:
        source = InMemoryWorkSource()
        source.add_inputs(ProjectionIdentity(pack_install_id="pk-1", event_kind="contact.upsert",
            route_version="1", companion_version="1", work_type="count", source_lane="a"), payloads=[b"x", b"y"])
        worker = Worker(source, count_inputs(context), worker_id="test")  # context: a FlowContext
        while worker.run_once():
            pass
        assert totals == {"a": 2} and [a.outcome for a in source.attempts] == [WorkStatus.COMPLETED]

The SDK's README says how to run such tests outside this repository. ``examples/contact_stages.py``
is a complete Flow with a read model of its own, tested in ``tests/connectors/unit/test_example_flow.py``;
``docs/design.md`` describes the protocol behind it.
"""
