"""Page tokens of the paged reads: the keyset position after a page's last row, opaque to callers.

A token is the position's values as base64url JSON. A token that does not decode to the
position a read expects is refused (INVALID_ARGUMENT naming ``page_token``) before any query.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

from workqueue.errors import InvalidArgument

T = TypeVar("T")
MAX_ORDINAL = 2**63 - 1  # a BIGINT column


def encode_token(position: Sequence[str | int]) -> str:
    """The token of a keyset position."""
    return base64.urlsafe_b64encode(json.dumps(list(position)).encode()).decode()


def decode_token(token: str, rpc: str, parse: Callable[[list[Any]], T]) -> T | None:
    """The position ``token`` carries, built by ``parse`` from its values; None for "" (the first page).

    ``parse`` raises ``ValueError`` or ``TypeError`` for values of the wrong shape.
    """
    if not token:
        return None
    try:
        values = json.loads(base64.urlsafe_b64decode(token.encode()))
        if not isinstance(values, list):
            raise TypeError("not a list")
        return parse(values)
    except (ValueError, TypeError, binascii.Error):
        raise InvalidArgument(f"page_token is not a token from a previous {rpc} page", field="page_token") from None


def string(value: object) -> str:
    """A string value of a position."""
    if not isinstance(value, str):
        raise TypeError("not a string")
    return value


def ordinal(value: object) -> int:
    """An ordinal value of a position: an integer that fits its column."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_ORDINAL:
        raise ValueError("not an ordinal")
    return value


def first_kept(rows: Iterable[T], keep: Callable[[T], bool], size: int) -> tuple[list[T], int]:
    """The first ``size`` rows ``keep`` keeps, and how many rows were examined to find them.

    A filtered page's token continues after the last row examined, kept or not.
    """
    kept: list[T] = []
    examined = 0
    for row in rows:
        examined += 1
        if keep(row):
            kept.append(row)
            if len(kept) == size:
                break
    return kept, examined
