"""A status message never grows with the input it echoes (docs/decisions/109-transport-fails-closed.md)."""

from __future__ import annotations

from nexuscrm_runtime.status import FIELD_LIMIT, MESSAGE_LIMIT, bounded, domain_status
from workqueue.errors import DomainError, ErrorKind


def test_a_short_message_is_kept_whole() -> None:
    assert bounded("work w-1 not found") == "work w-1 not found"


def test_an_echoed_input_is_cut_on_a_character_boundary_and_says_so() -> None:
    text = bounded("é" * 10_000)
    assert len(text.encode()) <= MESSAGE_LIMIT
    assert text.endswith("(20000 bytes; cut)")


def test_the_rich_status_is_bounded_in_message_and_field() -> None:
    error = DomainError(f"work {'x' * 10_000} not found", kind=ErrorKind.NOT_FOUND, field="y" * 1_000)
    status = domain_status(error)
    assert len(status.message.encode()) <= MESSAGE_LIMIT
    assert status.ByteSize() < 3 * MESSAGE_LIMIT + FIELD_LIMIT
