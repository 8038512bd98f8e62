"""One bad delivery is refused alone: every item-level field is checked per item (issue 34).

A batch holding one over-long receipt key (or one Timestamp outside the representable range)
answers that item REJECTED, naming the field and the limit, and admits the others; what is
not about one item (too many items, bytes that do not decode) still refuses the whole call.
"""

from __future__ import annotations

import grpc
import pytest
import sqlalchemy as sa

from nexuscrm.connectors.v1 import connectors_pb2 as pb
from nexuscrm.connectors.v1 import connectors_pb2_grpc as pb_grpc
from nexuscrm_connectors.facade import Connectors
from nexuscrm_schema.tables import Event, IngressReceipt
from nexuscrm_wire import convert
from tests.connectors.integration.test_queue_and_generation_reads import channel, client, server
from tests.support.factories import delivery, install_pack
from tests.support.invariants import assert_invariants
from workqueue.limits import RECEIPT_KEY_LENGTH

pytestmark = pytest.mark.database
__all__ = ["channel", "client", "server"]  # the gRPC fixtures, shared

BATCH = 60
BAD = 48  # the index of the bad delivery


def _stored_keys(engine: sa.Engine) -> tuple[set[str], set[str]]:
    with engine.connect() as connection:
        events = set(connection.execute(sa.select(Event.c.ReceiptKey)).scalars())
        receipts = set(connection.execute(sa.select(IngressReceipt.c.ReceiptKey)).scalars())
    return events, receipts


def _batch(pack: str, bad: pb.IngestItem) -> pb.IngestRequest:
    items = [convert.item_to_proto(delivery(lane=f"lane-{n % 5}")) for n in range(BATCH)]
    items[BAD].CopyFrom(bad)
    return pb.IngestRequest(pack_install_id=pack, items=items)


def _admits_all_but_the_bad_one(
    engine: sa.Engine, channel: grpc.Channel, request: pb.IngestRequest, message: str
) -> None:
    response = pb_grpc.ConnectorsServiceStub(channel).Ingest(request)

    outcomes = [result.outcome for result in response.results]
    assert len(outcomes) == BATCH
    assert outcomes[BAD] == pb.INGEST_OUTCOME_REJECTED
    assert response.results[BAD].message == message
    assert outcomes[:BAD] + outcomes[BAD + 1 :] == [pb.INGEST_OUTCOME_ADMITTED] * (BATCH - 1)
    events, receipts = _stored_keys(engine)
    good = {item.receipt_key for index, item in enumerate(request.items) if index != BAD}
    assert events == good and receipts == good  # D, P: the refused delivery wrote nothing
    assert_invariants(engine)


def test_an_over_long_receipt_key_is_refused_alone(
    engine: sa.Engine, connectors: Connectors, channel: grpc.Channel
) -> None:
    pack = install_pack(engine)
    key = "k" * 285
    bad = convert.item_to_proto(delivery(key))

    _admits_all_but_the_bad_one(
        engine,
        channel,
        _batch(pack, bad),
        f"items[{BAD}].receipt_key is 285 characters long; the limit is {RECEIPT_KEY_LENGTH}",
    )


def test_a_source_time_outside_the_timestamp_range_is_refused_alone(
    engine: sa.Engine, connectors: Connectors, channel: grpc.Channel
) -> None:
    pack = install_pack(engine)
    bad = convert.item_to_proto(delivery())
    bad.source_time.seconds = 253_402_300_800  # 10000-01-01T00:00:00Z: no datetime holds it

    _admits_all_but_the_bad_one(
        engine,
        channel,
        _batch(pack, bad),
        f"items[{BAD}].source_time.seconds is 253402300800; a timestamp must lie in 0001-01-01..9999-12-31 UTC "
        "(-62135596800..253402300799)",
    )


def test_what_is_not_about_one_item_still_refuses_the_whole_call(
    engine: sa.Engine, connectors: Connectors, channel: grpc.Channel
) -> None:
    install_pack(engine)
    too_long_pack = pb.IngestRequest(pack_install_id="p" * 300, items=[convert.item_to_proto(delivery())])

    with pytest.raises(grpc.RpcError) as refused:
        pb_grpc.ConnectorsServiceStub(channel).Ingest(too_long_pack)

    assert refused.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert "pack_install_id is 300 characters long" in (refused.value.details() or "")
    assert _stored_keys(engine) == (set(), set())
