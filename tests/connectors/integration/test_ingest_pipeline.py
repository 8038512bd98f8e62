"""The SDK's pipelined ingest against the real ConnectorsService, on every backend.

Batches in flight at once, with twin deliveries across them (the same receipt again, and
once with another payload), are answered in submission order with the outcomes one
sequential client gets; a commit whose reply is lost (UNAVAILABLE after the commit) is sent
again and answered as the duplicate it is; every input is admitted once and the invariants
hold.
"""

from __future__ import annotations

import functools

import grpc
import pytest
import sqlalchemy as sa

from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.servicer import registration
from nexuscrm_runtime import faults
from nexuscrm_runtime.server import create_server
from nexuscrm_schema.tables import Event
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_sdk.pipeline import IngestRetry, PipelinedIngest
from tests.support.factories import delivery, install_pack
from tests.support.invariants import assert_invariants
from workqueue.values import IngestItem, Outcome

pytestmark = pytest.mark.database

BATCHES = 12
BATCH = 40
LANES = 7


def _batches() -> list[list[IngestItem]]:
    """Fresh deliveries over a few lanes; each batch re-sends two of the previous batch's, and one changed."""
    batches: list[list[IngestItem]] = []
    for number in range(BATCHES):
        batch = [delivery(f"r-{number}-{n}", lane=f"lane-{n % LANES}") for n in range(BATCH)]
        if batches:
            previous = batches[-1]
            batch[5:5] = [previous[0], previous[1]]
            batch.append(delivery(previous[2].receipt_key, lane=previous[2].route.source_lane, payload=b"changed"))
        batches.append(batch)
    return batches


def _sequential(batches: list[list[IngestItem]]) -> list[list[Outcome]]:
    """The outcomes one client sending the batches one after the other gets."""
    first: dict[str, bytes] = {}
    expected = []
    for batch in batches:
        outcomes = []
        for item in batch:
            if item.receipt_key not in first:
                first[item.receipt_key] = item.payload
                outcomes.append(Outcome.ADMITTED)
            else:
                same = first[item.receipt_key] == item.payload
                outcomes.append(Outcome.DUPLICATE_COVERED if same else Outcome.REJECTED)
        expected.append(outcomes)
    return expected


def test_batches_in_flight_answer_what_a_sequential_client_gets(
    engine: sa.Engine, connectors: Connectors, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NEXUSCRM_FAULTS_ENABLED", "1")
    monkeypatch.setenv("NEXUSCRM_FAULTS", "admission:after_commit=raise")  # once: a lost reply
    monkeypatch.setattr(faults, "_fired", set())
    pack = install_pack(engine)
    batches = _batches()
    resolved: list[int] = []
    server = create_server([registration(connectors)], "127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            retry = IngestRetry(attempts=3)
            with PipelinedIngest(ConnectorsClient(channel), pack, max_in_flight=4, retry=retry) as pipeline:
                futures = [pipeline.submit(batch) for batch in batches]
                for number, future in enumerate(futures):
                    future.add_done_callback(functools.partial(lambda n, _: resolved.append(n), number))
    finally:
        server.stop(grace=None)
    assert resolved == list(range(BATCHES))
    answers = [[result.outcome for result in future.result()] for future in futures]
    assert [[r.receipt_key for r in f.result()] for f in futures] == [[i.receipt_key for i in b] for b in batches]
    sequential = _sequential(batches)
    # The calls of the lost reply's transaction were sent again: their fresh deliveries answer
    # duplicate_covered; every other answer is the sequential client's.
    assert faults._fired == {"admission:after_commit"}
    changed = {
        (want, got) for n in range(BATCHES) for want, got in zip(sequential[n], answers[n], strict=True) if want != got
    }
    assert changed == {(Outcome.ADMITTED, Outcome.DUPLICATE_COVERED)}
    distinct = {item.receipt_key for batch in batches for item in batch}
    with engine.connect() as connection:
        assert connection.execute(sa.select(sa.func.count()).select_from(Event)).scalar_one() == len(distinct)
    assert_invariants(engine)
