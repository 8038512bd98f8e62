"""``validate_request`` names the first invalid field by its full path, at any depth, and passes valid requests."""

from __future__ import annotations

import pytest

from nexuscrm.connectors.v1 import connectors_pb2 as cn
from nexuscrm_runtime.requests import MAX_NANOS, MAX_TIMESTAMP_SECONDS, item_refusals, validate_request
from nexuscrm_wire import convert
from tests.support.factories import delivery
from workqueue.errors import InvalidArgument
from workqueue.limits import REQUEST_FIELD_LIMITS


def _request(count: int = 3) -> cn.IngestRequest:
    return cn.IngestRequest(
        pack_install_id="pack", items=[convert.item_to_proto(delivery(f"r-{n}")) for n in range(count)]
    )


def test_a_valid_request_passes() -> None:
    request = _request()
    request.items[2].source_time.seconds = MAX_TIMESTAMP_SECONDS
    request.items[2].source_time.nanos = MAX_NANOS
    validate_request(request, REQUEST_FIELD_LIMITS)


def test_an_overlong_identifier_deep_in_a_repeated_field_is_named_by_its_path() -> None:
    request = _request()
    request.items[1].receipt_key = "k" * (REQUEST_FIELD_LIMITS["receipt_key"] + 1)
    refusals = item_refusals(request.items, REQUEST_FIELD_LIMITS, field="items")
    assert list(refusals) == [1]
    assert refusals[1].field == "items[1].receipt_key"
    assert str(refusals[1]) == (
        f"items[1].receipt_key is {REQUEST_FIELD_LIMITS['receipt_key'] + 1} characters long; "
        f"the limit is {REQUEST_FIELD_LIMITS['receipt_key']}"
    )


@pytest.mark.parametrize(("seconds", "nanos", "part"), [(MAX_TIMESTAMP_SECONDS + 1, 0, "seconds"), (0, -1, "nanos")])
def test_an_out_of_range_timestamp_is_named_with_its_part(seconds: int, nanos: int, part: str) -> None:
    request = _request()
    request.items[2].source_time.seconds, request.items[2].source_time.nanos = seconds, nanos
    refusals = item_refusals(request.items, REQUEST_FIELD_LIMITS, field="items")
    assert list(refusals) == [2]
    assert refusals[2].field == "items[2].source_time"
    assert str(refusals[2]).startswith(f"items[2].source_time.{part} is ")


def test_the_request_walk_leaves_item_messages_to_their_handler() -> None:
    request = _request()
    request.items[1].receipt_key = "k" * (REQUEST_FIELD_LIMITS["receipt_key"] + 1)
    request.items[2].source_time.seconds = MAX_TIMESTAMP_SECONDS + 1
    validate_request(request, REQUEST_FIELD_LIMITS)  # each item is refused alone (ITEM_MESSAGES)
    request.pack_install_id = "p" * (REQUEST_FIELD_LIMITS["pack_install_id"] + 1)
    with pytest.raises(InvalidArgument) as refusal:
        validate_request(request, REQUEST_FIELD_LIMITS)
    assert refusal.value.field == "pack_install_id"


def test_the_first_invalid_field_is_the_one_named() -> None:
    request = _request()
    request.items[0].source_time.nanos = MAX_NANOS + 1
    request.pack_install_id = "p" * (REQUEST_FIELD_LIMITS["pack_install_id"] + 1)
    with pytest.raises(InvalidArgument) as refusal:
        validate_request(request, REQUEST_FIELD_LIMITS)
    assert refusal.value.field == "pack_install_id"
