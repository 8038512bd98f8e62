"""The pack and WorkId a thread is serving, for its log records.

Bound by the services' RPC interceptor and by the SDK's worker around each generation; read
by the services' log filter (``nexuscrm_runtime.logs``). It lives here so that the SDK binds
it without depending on the services' runtime.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

_context: contextvars.ContextVar[dict[str, str]] = contextvars.ContextVar("nexuscrm_log_context")


@contextlib.contextmanager
def log_context(**fields: str) -> Iterator[None]:
    """Attach ``fields`` (``pack``, ``work_id``; empty values are ignored) to records logged inside."""
    bound = {name: value for name, value in fields.items() if value}
    if not bound:
        yield
        return
    token = _context.set({**_context.get({}), **bound})
    try:
        yield
    finally:
        _context.reset(token)


def bound_context() -> dict[str, str]:
    """The fields bound in this thread (empty when none)."""
    return _context.get({})
