"""What the runtime admits as a request, before any handler (or authorization rule) sees it.

grpcio deserializes a request before any interceptor runs, and an exception there answers
INTERNAL ("Exception deserializing request!") with an ERROR traceback. So the runtime wraps
every method's deserializer (``guarded_deserializer``): bytes that do not parse become a
``RejectedRequest`` carrying an ``InvalidArgument`` that names the message type or, for
invalid UTF-8, the string field, and the status interceptor raises it like any domain error.
A request that parses is then checked once for what protobuf accepts but no handler can use
(``validate_request``): a Timestamp outside 0001-01-01..9999-12-31 or with nanos outside
0..999 999 999, and an identifier longer than its column (``workqueue.limits``). Item
messages (``workqueue.limits.ITEM_MESSAGES``) are left to their handler, which refuses a bad
item alone and admits the rest of its request.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

from workqueue.errors import InvalidArgument
from workqueue.limits import ITEM_MESSAGES

TIMESTAMP = "google.protobuf.Timestamp"
MIN_TIMESTAMP_SECONDS = -62_135_596_800  # 0001-01-01T00:00:00Z
MAX_TIMESTAMP_SECONDS = 253_402_300_799  # 9999-12-31T23:59:59Z
MAX_NANOS = 999_999_999


@dataclasses.dataclass(frozen=True)
class RejectedRequest:
    """Stands for a request whose bytes did not parse; the handler wrapper raises ``error``."""

    error: InvalidArgument


def _varint(data: bytes, position: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if position >= len(data) or shift > 63:
            raise ValueError("truncated varint")
        byte = data[position]
        position += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, position


def _invalid_utf8_field(descriptor: Descriptor, data: bytes, prefix: str = "") -> str | None:
    """The path of the first string field of ``data`` that is not UTF-8, if the wire format says."""
    seen: dict[int, int] = {}
    position = 0
    try:
        while position < len(data):
            key, position = _varint(data, position)
            number, wire_type = key >> 3, key & 7
            if wire_type == 0:
                _, position = _varint(data, position)
                continue
            if wire_type in (1, 5):
                position += 8 if wire_type == 1 else 4
                continue
            if wire_type != 2:
                return None  # groups: not in our protos
            length, position = _varint(data, position)
            chunk, position = data[position : position + length], position + length
            field = descriptor.fields_by_number.get(number)
            if field is None:
                continue
            index = seen.get(number, 0)
            seen[number] = index + 1
            path = f"{prefix}{field.name}" + (f"[{index}]" if field.is_repeated else "")
            if field.type == FieldDescriptor.TYPE_STRING:
                try:
                    chunk.decode("utf-8")
                except UnicodeDecodeError:
                    return path
            elif field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type is not None:
                found = _invalid_utf8_field(field.message_type, chunk, f"{path}.")
                if found:
                    return found
    except ValueError:
        return None
    return None


def undecodable(descriptor: Descriptor, data: bytes) -> InvalidArgument:
    """The refusal of ``data`` that does not parse as ``descriptor``: the field at fault, if found."""
    field = _invalid_utf8_field(descriptor, data)
    if field is not None:
        return InvalidArgument(f"request field {field} is not valid UTF-8", field=field)
    return InvalidArgument(f"request bytes are not a valid {descriptor.full_name} message")


def guarded_deserializer(descriptor: Descriptor, deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    """``deserializer`` that returns a ``RejectedRequest`` instead of raising on bad bytes."""

    def deserialize(data: bytes) -> Any:
        try:
            return deserializer(data)
        except (DecodeError, ValueError, RecursionError):
            return RejectedRequest(undecodable(descriptor, data))

    return deserialize


def _check_timestamp(stamp: Message, path: str) -> None:
    seconds, nanos = stamp.seconds, stamp.nanos  # type: ignore[attr-defined]  # a Timestamp
    if not MIN_TIMESTAMP_SECONDS <= seconds <= MAX_TIMESTAMP_SECONDS:
        raise InvalidArgument(
            f"{path}.seconds is {seconds}; a timestamp must lie in 0001-01-01..9999-12-31 UTC "
            f"({MIN_TIMESTAMP_SECONDS}..{MAX_TIMESTAMP_SECONDS})",
            field=path,
        )
    if not 0 <= nanos <= MAX_NANOS:
        raise InvalidArgument(f"{path}.nanos is {nanos}; it must lie in 0..{MAX_NANOS}", field=path)


def _check_length(value: str, path: str, limit: int) -> None:
    if len(value) > limit:
        raise InvalidArgument(f"{path} is {len(value)} characters long; the limit is {limit}", field=path)


class _Kind(enum.Enum):
    """What ``validate_request`` checks in a field: a Timestamp, a message to walk, a string, or nothing."""

    TIMESTAMP = enum.auto()
    MESSAGE = enum.auto()
    STRING = enum.auto()
    OTHER = enum.auto()


def _kind(field: FieldDescriptor) -> _Kind:
    if field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type is not None:
        if field.message_type.GetOptions().map_entry or field.message_type.full_name in ITEM_MESSAGES:
            return _Kind.OTHER  # an item message is checked by its handler, item by item
        return _Kind.TIMESTAMP if field.message_type.full_name == TIMESTAMP else _Kind.MESSAGE
    return _Kind.STRING if field.type == FieldDescriptor.TYPE_STRING else _Kind.OTHER


@functools.cache
def _plan(descriptor: Descriptor, limits: frozenset[tuple[str, int]]) -> tuple[tuple[str, _Kind, bool, int], ...]:
    """The fields of ``descriptor`` to check, as (name, kind, repeated, length limit); built once per message type.

    Reading these fields by name costs less than listing the set ones and inspecting each
    field's descriptor per message (docs/performance-log.md, "Seventeenth pass"). An unset string
    reads as "", which always passes.
    """
    lengths = dict(limits)
    return tuple(
        (field.name, kind, field.is_repeated, lengths.get(field.name, 0))
        for field in descriptor.fields
        if (kind := _kind(field)) is not _Kind.OTHER and (kind is not _Kind.STRING or field.name in lengths)
    )


def validate_request(message: Message, limits: Mapping[str, int]) -> None:
    """Raise ``InvalidArgument`` naming the first out-of-range Timestamp or over-long identifier.

    ``limits`` maps a field name, at any depth, to its maximum length in characters. Fields
    holding an item message (``ITEM_MESSAGES``) are skipped: their handler checks each item
    with ``item_refusals``.
    """
    _walk(message, frozenset(limits.items()), "")


def item_refusals(items: Iterable[Message], limits: Mapping[str, int], *, field: str) -> dict[int, InvalidArgument]:
    """The refusal of each item of the repeated ``field`` that ``validate_request`` would refuse, by index.

    The path of a refusal names the item (``items[48].receipt_key``); the other items pass.
    """
    frozen = frozenset(limits.items())
    refusals: dict[int, InvalidArgument] = {}
    for index, item in enumerate(items):
        try:
            _walk(item, frozen, f"{field}[{index}].")
        except InvalidArgument as error:
            refusals[index] = error
    return refusals


def _walk(message: Message, limits: frozenset[tuple[str, int]], prefix: str) -> None:
    for name, kind, repeated, limit in _plan(message.DESCRIPTOR, limits):
        if repeated:
            items = getattr(message, name)
        elif kind is _Kind.STRING or message.HasField(name):
            items = (getattr(message, name),)
        else:
            continue  # an unset message: a message type may hold itself
        for index, item in enumerate(items):
            path = f"{prefix}{name}[{index}]" if repeated else f"{prefix}{name}"
            if kind is _Kind.TIMESTAMP:
                _check_timestamp(item, path)
            elif kind is _Kind.MESSAGE:
                _walk(item, limits, f"{path}.")
            else:
                _check_length(item, path, limit)
