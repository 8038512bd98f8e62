"""The Connectors SDK: what a Flow author and a Connectors client need, without a database or a service.

A Flow author imports from here (``__all__``, decision 154); the modules say more:

- ``nexuscrm_sdk.flows``, the Flow protocol: ``Generation`` (what a Flow receives: ``work``,
  ``identity``, ``route``, and ``inputs``: every member as a ``workqueue.InputRow``, in ordinal
  order), ``Flow``, ``FlowContext`` (the pool, the host's engine, the pool's settings),
  ``FlowFactory`` and ``resolve_flow``, which finds the factory a pool names
  (``module:function`` or an entry point of the group ``nexuscrm.flows``); Flow versions
  (decision 185): ``Generation.live`` / ``build_run`` (a Flow causes side effects only when
  live) and ``Generation.flow_version``, and ``DigestingFlow``, a Flow with a digest of its read
  model that ``nexuscrm versions verify`` compares between two versions.
- ``nexuscrm_sdk.worker``: ``Worker``, which claims, loads, heartbeats and completes or fails
  over any ``WorkSource``.
- ``nexuscrm_sdk.applied``: ``AppliedInputs``, the ledger that applies each input once however
  often a generation runs (the ``sql`` extra).
- ``nexuscrm_sdk.testing``: ``InMemoryWorkSource`` and ``FakeClock``, to test a Flow in process.
- ``nexuscrm_sdk.client``: ``ConnectorsClient``, the gRPC client of every ConnectorsService RPC.
- ``nexuscrm_sdk.pipeline``: ``PipelinedIngest``, which keeps several Ingest batches of a pack in
  flight and answers them in order, retrying as ``IngestRetry`` says (decision 163).
The wire conversions the client shares with the services (protobuf messages to and from
workqueue values, protobuf Timestamps, the words of a lookup that finds nothing) are
``nexuscrm_wire``, shipped with the generated messages in nexuscrm-protos (decision 184); the
loop that waits for a drained queue is ``workqueue.draining``.

The shared values (``ProjectionIdentity``, ``WorkStatus``, ``InputRow``) come from ``workqueue``.
A Flow must read every input of its generation; raising fails the attempt, which is retried,
unless it raises ``PermanentFailure`` (failed for good at once) or ``RetryLater`` (run again
after a delay, the attempt not counted); the worker sends the exception's traceback with the
failure, stored with the attempt for operators, never logged. A replay generation hands its
Flow the replayed generation's inputs again first, each with ``InputRow.replayed_work_id`` set.
A Flow and its test::

    from nexuscrm_sdk import Flow, FlowContext, Generation, InMemoryWorkSource, Worker
    from workqueue import ProjectionIdentity, WorkStatus

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

from nexuscrm_sdk.applied import AppliedInputs
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_sdk.flows import DigestingFlow, Flow, FlowContext, FlowFactory, Generation, PermanentFailure, RetryLater
from nexuscrm_sdk.pipeline import IngestRetry, PipelinedIngest
from nexuscrm_sdk.testing import InMemoryWorkSource
from nexuscrm_sdk.worker import Worker, WorkSource

__all__ = [
    "AppliedInputs",
    "ConnectorsClient",
    "DigestingFlow",
    "Flow",
    "FlowContext",
    "FlowFactory",
    "Generation",
    "InMemoryWorkSource",
    "IngestRetry",
    "PermanentFailure",
    "PipelinedIngest",
    "RetryLater",
    "WorkSource",
    "Worker",
]
