"""protobuf Timestamps of the naive UTC datetimes the database stores, both directions."""

from __future__ import annotations

import datetime as dt

from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp


def to_timestamp(value: dt.datetime | None) -> Timestamp | None:
    """A Timestamp of a naive UTC datetime; None stays unset."""
    if value is None:
        return None
    stamp = Timestamp()
    stamp.FromDatetime(value.replace(tzinfo=dt.UTC))
    return stamp


def from_timestamp(message: Message, field: str) -> dt.datetime | None:
    """The naive UTC datetime of ``message``'s Timestamp ``field``, or None when unset."""
    if not message.HasField(field):
        return None
    stamp: Timestamp = getattr(message, field)
    return stamp.ToDatetime()
