"""The workqueue identity helper: deterministic, versioned, injective, validating."""

from __future__ import annotations

import dataclasses
import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workqueue import KEY_VERSION, ProjectionIdentity, decode_projection_key
from workqueue.errors import InvalidArgument
from workqueue.identity import FIELD_MAX_LENGTHS, PROJECTION_KEY_MAX_LENGTH, REFUSED_CATEGORIES, validate_text

FIELDS = tuple(FIELD_MAX_LENGTHS)
# Printable text that includes the separators "|" and ":" and digits, to attack boundaries.
ALPHABET = st.characters(categories=("L", "N", "P", "S", "Zs"), include_characters="|:0123456789")


def field_text(name: str) -> st.SearchStrategy[str]:
    return st.text(ALPHABET, min_size=1, max_size=FIELD_MAX_LENGTHS[name]).map(str.strip).filter(bool)


identities = st.builds(ProjectionIdentity, **{name: field_text(name) for name in FIELDS})


@given(identities)
def test_key_is_deterministic_versioned_and_decodable(identity: ProjectionIdentity) -> None:
    again = ProjectionIdentity(**dataclasses.asdict(identity))
    assert identity.key == again.key
    assert identity.key.startswith(KEY_VERSION + "|")
    assert len(identity.key) <= PROJECTION_KEY_MAX_LENGTH
    assert decode_projection_key(identity.key) == identity


@given(identities, identities)
def test_different_identities_never_share_a_key(a: ProjectionIdentity, b: ProjectionIdentity) -> None:
    assert (a == b) == (a.key == b.key)


@given(st.lists(field_text("event_kind"), min_size=2, max_size=2), st.integers(1, 5))
def test_field_boundaries_cannot_be_confused(parts: list[str], cut: int) -> None:
    # Moving characters from one field to its neighbour always changes the key.
    left, right = parts
    joined = left + right
    if cut >= len(joined):
        return
    base = dict.fromkeys(FIELDS, "x")
    one = ProjectionIdentity(**{**base, "event_kind": left, "route_version": right[:32]})
    moved_left, moved_right = joined[:cut].strip(), joined[cut:].strip()
    if not moved_left or not moved_right or len(moved_right) > 32:
        return
    two = ProjectionIdentity(**{**base, "event_kind": moved_left, "route_version": moved_right})
    assert (one.key == two.key) == (one == two)


@pytest.mark.parametrize("field", FIELDS)
@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "is required"),
        ("a\x00b", "control"),
        ("a\nb", "control"),
        ("a\u200bb", "control"),  # zero-width space (format character)
        (" padded", "white space"),
        ("padded ", "white space"),
    ],
)
def test_invalid_fields_are_rejected_naming_the_field(field: str, value: str, message: str) -> None:
    values = dict.fromkeys(FIELDS, "ok") | {field: value}
    with pytest.raises(InvalidArgument, match=message) as caught:
        ProjectionIdentity(**values)
    assert caught.value.field == field
    assert field in str(caught.value)


@pytest.mark.parametrize("field", FIELDS)
def test_too_long_fields_are_rejected_naming_the_field(field: str) -> None:
    values = dict.fromkeys(FIELDS, "ok") | {field: "y" * (FIELD_MAX_LENGTHS[field] + 1)}
    with pytest.raises(InvalidArgument, match=f"{field} is .* the limit is {FIELD_MAX_LENGTHS[field]}"):
        ProjectionIdentity(**values)


@pytest.mark.parametrize(
    "key",
    [
        "",
        "pk0|1:a",
        "pk1",
        "pk1|1:a|1:b|1:c|1:d|1:e|1:f|",
        "pk1|01:a|1:b|1:c|1:d|1:e|1:f",
        "pk1|2:a|1:b|1:c|1:d|1:e|1:f",
    ],
)
def test_malformed_keys_are_refused(key: str) -> None:
    with pytest.raises(InvalidArgument):
        decode_projection_key(key)


@given(st.text(st.characters(codec="utf-8"), max_size=12))
def test_validate_text_refuses_exactly_the_refused_categories_and_padding(value: str) -> None:
    valid = (
        bool(value)
        and not any(unicodedata.category(char) in REFUSED_CATEGORIES for char in value)
        and value == value.strip()
    )
    try:
        validate_text("field", value, 64)
    except InvalidArgument:
        assert not valid
    else:
        assert valid


@pytest.mark.parametrize("value", ["a\u00a0b", "a\ue000b", "a\u2028b", "x\u3000y"])
def test_text_that_is_not_printable_but_allowed_passes(value: str) -> None:
    assert validate_text("field", value, 64) == value
