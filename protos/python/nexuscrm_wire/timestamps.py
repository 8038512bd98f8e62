"""UTC datetimes and protobuf Timestamps, both directions.

The services store naive UTC datetimes; the SDK hands its users timezone-aware UTC ones
(docs/decisions/104-connectors-sdk.md). A naive datetime given to the SDK is read as UTC.
"""

from __future__ import annotations

import datetime as dt

from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp


def aware_utc(value: dt.datetime) -> dt.datetime:
    """``value`` as a timezone-aware UTC datetime; a naive ``value`` is taken to be UTC already."""
    if value.tzinfo is None:
        return value.replace(tzinfo=dt.UTC)
    return value.astimezone(dt.UTC)


def naive_utc(value: dt.datetime) -> dt.datetime:
    """``value`` as the naive UTC datetime the services store; a naive ``value`` is returned as is."""
    if value.tzinfo is None:
        return value
    return value.astimezone(dt.UTC).replace(tzinfo=None)


def to_timestamp(value: dt.datetime | None) -> Timestamp | None:
    """A Timestamp of ``value`` (aware, or naive UTC); None stays unset."""
    if value is None:
        return None
    stamp = Timestamp()
    stamp.FromDatetime(aware_utc(value))
    return stamp


def from_timestamp(message: Message, field: str) -> dt.datetime | None:
    """The timezone-aware UTC datetime of ``message``'s Timestamp ``field``, or None when unset."""
    if not message.HasField(field):
        return None
    stamp: Timestamp = getattr(message, field)
    return stamp.ToDatetime(tzinfo=dt.UTC)
