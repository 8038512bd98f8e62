"""The ``--json`` form of an RPC answer, by the output conventions (docs/output-conventions.md).

``google.protobuf.json_format`` prints enum names (``WORK_STATUS_COMPLETED``), 64-bit integers
as strings and the proto's field names. Operators and scripts get instead: enum values as the
plain lower-case word the tables print (``completed``), every integer as a JSON number, times
as RFC 3339 UTC with a ``Z`` to the millisecond (``timestamp_text``, the one format of every
surface), durations as seconds (the field named ``..._seconds``) and one
name per concept: a generation's range is ``first_ordinal``..``last_ordinal`` (the proto's
``input_start_ordinal`` and ``lane_ordinal``) and a pack's ordinal counter is
``ordinal_counter`` (the proto's ``PackInstall.last_ordinal``). Fields without presence are
always printed; unset optional fields and unset messages are left out.
"""

from __future__ import annotations

import base64
import re
from typing import Any

from google.protobuf.descriptor import EnumDescriptor, FieldDescriptor
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import Message
from google.protobuf.timestamp_pb2 import Timestamp

from nexuscrm_runtime.clock import iso_utc

# The proto's name of a concept -> the one name tables, JSON, the dashboard and the docs use.
RENAMED: dict[str, str] = {
    "nexuscrm.connectors.v1.WorkItem.input_start_ordinal": "first_ordinal",
    "nexuscrm.connectors.v1.WorkItem.lane_ordinal": "last_ordinal",
    "nexuscrm.controlplane.v1.PackInstall.last_ordinal": "ordinal_counter",
}


def enum_word(enum: EnumDescriptor, number: int) -> str:
    """An enum value as its plain word: ``WORK_STATUS_COMPLETED`` of WorkStatus is ``completed``."""
    value = enum.values_by_number.get(number)
    if value is None:
        return str(number)
    prefix = re.sub(r"(?<!^)(?=[A-Z])", "_", enum.name).upper() + "_"
    return value.name.removeprefix(prefix).lower()


def timestamp_text(stamp: Timestamp) -> str:
    """``stamp`` as tables, JSON and the dashboard print a time: ``2026-05-01T12:00:00.250Z``.

    ``Timestamp.ToJsonString`` would print 0, 3, 6 or 9 fraction digits as the value has them.
    """
    return iso_utc(stamp.ToDatetime())


def message_data(message: Message) -> dict[str, Any]:
    """``message`` as a JSON-ready dict by the conventions above."""
    data: dict[str, Any] = {}
    for field in message.DESCRIPTOR.fields:
        repeated = field.is_repeated
        if not repeated and field.has_presence and not message.HasField(field.name):
            continue
        name = RENAMED.get(field.full_name, field.name)
        if field.message_type is not None and field.message_type.full_name == Duration.DESCRIPTOR.full_name:
            name += "_seconds"
        value = getattr(message, field.name)
        data[name] = [_value(field, v) for v in value] if repeated else _value(field, value)
    return data


def _value(field: Any, value: Any) -> Any:
    """One value of ``field`` (a FieldDescriptor of either protobuf implementation)."""
    if field.type == FieldDescriptor.TYPE_ENUM:
        return enum_word(field.enum_type, value)
    if field.type == FieldDescriptor.TYPE_BYTES:
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, Timestamp):
        return timestamp_text(value)
    if isinstance(value, Duration):
        return value.ToTimedelta().total_seconds()
    if isinstance(value, Message):
        return message_data(value)
    return value
