r"""Payloads as operators read them: JSON where they parse, UTF-8 text where they decode, escaped otherwise.

Payloads are bytes, so ``--json`` carries them base64-encoded (docs/output-conventions.md),
which nobody reads. ``work members`` shows each one decoded as well (decision 178): in JSON
``payload_format`` (``json``, ``text`` or ``bytes``) and ``payload_decoded`` (the parsed JSON
value, the text, or the bytes with each byte above 0x7f escaped as ``\xNN``),
beside the lossless base64 ``payload``; in a table, the start of the decoded form on one line.
Decoding happens in the command line: the RPC and who may call it (operators of the pack's
namespace) are unchanged.
"""

from __future__ import annotations

import json
from typing import Any

PREVIEW_CHARACTERS = 60  # of a payload in a table row


def decoded(payload: bytes) -> tuple[str, Any]:
    """(format, value): ``json`` and the parsed value, ``text`` and the string, or ``bytes`` and the escaped string."""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes", payload.decode("ascii", errors="backslashreplace")
    try:
        return "json", json.loads(text, parse_constant=_not_json)
    except ValueError:
        return "text", text


def preview(payload: bytes) -> str:
    """The decoded payload on one line (JSON compact, what does not print escaped), cut to ``PREVIEW_CHARACTERS``."""
    form, value = decoded(payload)
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":")) if form == "json" else str(value)
    line = "".join(char if char.isprintable() else ascii(char)[1:-1] for char in text)
    return line if len(line) <= PREVIEW_CHARACTERS else line[: PREVIEW_CHARACTERS - 1] + "…"


def _not_json(constant: str) -> Any:
    """``NaN`` and ``Infinity`` parse in Python, yet are not JSON: such a payload is text."""
    raise ValueError(constant)
