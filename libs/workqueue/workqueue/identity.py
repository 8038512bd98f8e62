"""The projection identity and its key: the ONE encoding every owner uses.

A generation's identity is (pack incarnation, canonical Event kind, route version, companion
pack/Flow version, work type, source lane). ``ProjectionKey`` encodes it as
``pk1`` followed by ``|<length>:<value>`` for each field in that order. Lengths count
characters, so a field may contain ``|`` or ``:`` and still cannot be confused with a field
boundary: the encoding is injective and ``decode_projection_key`` inverts it.
"""

from __future__ import annotations

import dataclasses
import functools
import unicodedata
from typing import NewType

from workqueue.errors import InvalidArgument

KEY_VERSION = "pk1"

ProjectionKey = NewType("ProjectionKey", str)

# Maximum lengths in characters. Their sum keeps the key within PROJECTION_KEY_MAX_LENGTH,
# which keeps the (PackInstallId, ProjectionKey, ordinal) indexes under MySQL's 3072 bytes.
FIELD_MAX_LENGTHS: dict[str, int] = {
    "pack_install_id": 64,
    "event_kind": 64,
    "route_version": 32,
    "companion_version": 64,
    "work_type": 64,
    "source_lane": 128,
}
PROJECTION_KEY_MAX_LENGTH = 512
# Unicode categories no identifier may hold: control, format, surrogate, unassigned.
REFUSED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Cn"})


def validate_text(field: str, value: object, max_length: int) -> str:
    """Return ``value`` if it is valid text, else raise ``InvalidArgument`` naming ``field``.

    Valid text is a non-empty string of printable characters within ``max_length``.

    Control (Cc), format (Cf), surrogate (Cs) and unassigned (Cn) characters are refused, and
    so is leading or trailing white space: MySQL collations pad trailing spaces, so ``"a "``
    and ``"a"`` would compare equal in the database.
    """
    if not isinstance(value, str):
        raise InvalidArgument(f"{field} must be a string", field=field)
    if not value:
        raise InvalidArgument(f"{field} is required", field=field)
    if len(value) > max_length:
        raise InvalidArgument(f"{field} is {len(value)} characters long; the limit is {max_length}", field=field)
    # ``isprintable`` (in C) is False for every refused category, and for some allowed ones
    # (private use, separators other than " "): only a string it refuses is read per character.
    if not value.isprintable():
        for position, char in enumerate(value):
            if unicodedata.category(char) in REFUSED_CATEGORIES:
                raise InvalidArgument(
                    f"{field} contains a control or unassigned character (U+{ord(char):04X}) at position {position}",
                    field=field,
                )
    if value != value.strip():
        raise InvalidArgument(f"{field} has leading or trailing white space", field=field)
    return value


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProjectionIdentity:
    """One projection identity; every field is validated at construction."""

    pack_install_id: str
    event_kind: str
    route_version: str
    companion_version: str
    work_type: str
    source_lane: str

    def __post_init__(self) -> None:
        for name, limit in FIELD_MAX_LENGTHS.items():
            validate_text(name, getattr(self, name), limit)

    @property
    def key(self) -> ProjectionKey:
        """The versioned, deterministic, injective key stored on Event and WorkItem."""
        parts = (f"|{len(value)}:{value}" for value in dataclasses.astuple(self))
        return ProjectionKey(KEY_VERSION + "".join(parts))


def decode_projection_key(key: str) -> ProjectionIdentity:
    """Invert ``ProjectionIdentity.key``; raise ``InvalidArgument`` for anything else."""
    if not key.startswith(KEY_VERSION):
        raise InvalidArgument(f"projection key does not start with {KEY_VERSION!r}", field="projection_key")
    values: list[str] = []
    position = len(KEY_VERSION)
    for _ in FIELD_MAX_LENGTHS:
        if key[position : position + 1] != "|":
            raise InvalidArgument("projection key is malformed", field="projection_key")
        colon = key.find(":", position + 1)
        length_text = key[position + 1 : colon]
        if colon < 0 or not (length_text.isascii() and length_text.isdigit()):
            raise InvalidArgument("projection key is malformed", field="projection_key")
        start = colon + 1
        values.append(key[start : start + int(length_text)])
        position = start + int(length_text)
    if position != len(key):
        raise InvalidArgument("projection key has trailing characters", field="projection_key")
    identity = ProjectionIdentity(**dict(zip(FIELD_MAX_LENGTHS, values, strict=True)))
    if identity.key != key:  # a short final field would otherwise decode
        raise InvalidArgument("projection key is malformed", field="projection_key")
    return identity


@functools.lru_cache(maxsize=4096)
def with_companion_version(key: str, version: str) -> str:
    """The key of ``key``'s identity with ``version`` as its companion version: a Flow version's generations' key."""
    return dataclasses.replace(decode_projection_key(key), companion_version=version).key
