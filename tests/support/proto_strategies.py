"""Hypothesis strategies for any protobuf request, built from its message descriptor.

``message_strategy`` builds messages (Timestamps included out of their valid range);
``wire_strategy`` builds the bytes a hostile client can send instead: arbitrary bytes,
truncated or overwritten encodings, strings that are not UTF-8 and over-long identifiers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass
from hypothesis import strategies as st

INT_RANGES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SINT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_FIXED64: (0, 2**64 - 1),
}
INTERESTING_INTS = [0, 1, -1, 30, 500, 1001, 2**31 - 1, -(2**31)]


def _scalar(field: FieldDescriptor, known: Sequence[str]) -> st.SearchStrategy[Any]:
    if field.type == FieldDescriptor.TYPE_STRING:
        # Known ids make calls reach deep code paths; arbitrary text attacks validation.
        return st.one_of(st.sampled_from([*known, "", "*", " x", "a" * 300]), st.text(max_size=80))
    if field.type == FieldDescriptor.TYPE_BYTES:
        return st.one_of(st.binary(max_size=64), st.just(b"x" * 2_000_000))
    if field.type == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if field.type == FieldDescriptor.TYPE_ENUM:
        numbers = [v.number for v in field.enum_type.values]
        return st.sampled_from([*numbers, max(numbers) + 7])
    if field.type in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.floats(allow_nan=False, width=32)
    low, high = INT_RANGES[field.type]
    return st.one_of(st.sampled_from([i for i in INTERESTING_INTS if low <= i <= high]), st.integers(low, high))


def message_strategy(descriptor: Descriptor, known: Sequence[str] = (), depth: int = 0) -> st.SearchStrategy[Message]:
    """Messages of ``descriptor`` with every field independently set or left unset."""
    cls = GetMessageClass(descriptor)
    fields: dict[str, st.SearchStrategy[Any]] = {}
    for field in descriptor.fields:
        if field.type == FieldDescriptor.TYPE_MESSAGE:
            if depth >= 3:
                continue
            if field.message_type.full_name == "google.protobuf.Timestamp":
                stamp = GetMessageClass(field.message_type)
                # Mostly valid instants, sometimes out of range (year 0 or 10 000, nanos < 0 or >= 1e9).
                value = st.builds(
                    stamp,
                    seconds=st.one_of(
                        st.integers(0, 2**33), st.sampled_from([-62_135_596_801, 253_402_300_800, -(2**63), 2**63 - 1])
                    ),
                    nanos=st.one_of(st.integers(0, 999_999_999), st.sampled_from([-1, 1_000_000_000, -(2**31)])),
                )
            else:
                value = message_strategy(field.message_type, known, depth + 1)
        else:
            value = _scalar(field, known)
        fields[field.name] = st.lists(value, max_size=3) if field.is_repeated else value
    optional = {name: st.one_of(st.none(), strategy) for name, strategy in fields.items()}
    return st.fixed_dictionaries(optional).map(lambda values: _build(cls, values))


def _build(cls: Any, values: dict[str, Any]) -> Message:
    message: Message = cls()
    for name, value in values.items():
        if value is None:
            continue
        field = getattr(message, name)
        if isinstance(value, list):
            if value and isinstance(value[0], Message):
                for item in value:
                    field.add().CopyFrom(item)
            else:
                field.extend(value)
        elif isinstance(value, Message):
            field.CopyFrom(value)
        else:
            setattr(message, name, value)
    return message


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte, value = value & 0x7F, value >> 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _length_delimited(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _overwrite(data: bytes, position: int, patch: bytes) -> bytes:
    if not data:
        return patch
    position %= len(data)
    return data[:position] + patch + data[position + len(patch) :]


def wire_strategy(descriptor: Descriptor, known: Sequence[str] = ()) -> st.SearchStrategy[bytes]:
    """Request bytes for ``descriptor``'s RPC that no well-behaved client sends.

    Arbitrary bytes; a valid encoding truncated or with bytes overwritten; a valid encoding
    followed by a string field that is not UTF-8, or by an identifier of 10 000 characters (the
    last occurrence of a scalar field wins when parsing).
    """
    encoded = message_strategy(descriptor, known).map(lambda m: m.SerializeToString())
    strings = [f.number for f in descriptor.fields if f.type == FieldDescriptor.TYPE_STRING]
    hostile = [
        st.binary(max_size=96),
        st.tuples(encoded, st.integers(0, 2**16)).map(lambda pair: pair[0][: pair[1] % (len(pair[0]) + 1)]),
        st.builds(_overwrite, encoded, st.integers(0, 2**16), st.binary(min_size=1, max_size=4)),
    ]
    if strings:
        bad_utf8 = st.sampled_from([b"\xc3\x28", b"\xff", b"\xed\xa0\x80", b"a\x80b"])
        hostile.append(
            st.builds(lambda m, n, b: m + _length_delimited(n, b), encoded, st.sampled_from(strings), bad_utf8)
        )
        hostile.append(
            st.builds(lambda m, n: m + _length_delimited(n, b"x" * 10_000), encoded, st.sampled_from(strings))
        )
    return st.one_of(hostile)
