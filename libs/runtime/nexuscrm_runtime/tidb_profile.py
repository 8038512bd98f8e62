"""A compatibility profile that makes MariaDB (or MySQL) refuse what TiDB would refuse.

Off unless ``NEXUSCRM_TIDB_PROFILE=1`` (or asked for by ``create_engine``): the suite runs
with it so that a change that would only fail on TiDB fails here. Where TiDB differs and it
matters (docs/tidb.md, "Compatibility profile"):

- **Entry and transaction size.** TiDB refuses a row above 6 MiB (8025) and a transaction
  above 100 MiB (8004); MariaDB takes up to ``max_allowed_packet`` per statement and any
  transaction size. The profile counts the bytes every statement of a transaction sends and
  raises ``DatabaseLimitExceeded`` with the engine error table's text for 8025 or 8004 before
  sending one that would pass TiDB's limit, so nothing past them reaches the server.
- **Isolation and gap locks.** Every engine runs READ COMMITTED (``create_engine``), where
  InnoDB takes no gap locks on searches, as TiDB never does; nothing is left to set.
- **Held locks.** Each session gets the same idle-transaction timeout as on TiDB
  (``prerequisites.session_statements``, on MariaDB even without the profile).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from nexuscrm_runtime.budgets import MIB
from nexuscrm_runtime.engine_errors import ENGINE_ERRORS
from workqueue.errors import DomainError, ErrorKind

ENV = "NEXUSCRM_TIDB_PROFILE"
_SENT = "nexuscrm_tidb_profile_bytes"  # connection.info key: bytes sent by the open transaction


class ProfileLimitExceeded(DomainError):
    """The profile refused a statement that TiDB would refuse for its size; nothing of it was sent."""

    kind = ErrorKind.RESOURCE_EXHAUSTED


@dataclasses.dataclass(frozen=True, kw_only=True)
class TidbProfile:
    """TiDB's default limits (bytes), as the profile enforces them; tests may pass smaller ones."""

    entry_bytes: int = 6 * MIB  # txn-entry-size-limit
    transaction_bytes: int = 100 * MIB  # txn-total-size-limit

    def install(self, engine: Engine) -> None:
        """Enforce the limits on every transaction of ``engine``."""
        event.listen(engine, "begin", _reset)
        event.listen(engine, "before_cursor_execute", self._check)

    def _check(
        self, connection: Connection, _cursor: Any, _statement: str, parameters: Any, _context: Any, executemany: bool
    ) -> None:
        rows: Sequence[Any] = parameters if executemany else [parameters]
        largest, total = 0, 0
        for row in rows:
            values = row.values() if isinstance(row, Mapping) else row if isinstance(row, Sequence) else ()
            for value in values:
                size = len(value) if isinstance(value, bytes | bytearray | str) else 8
                largest, total = max(largest, size), total + size
        if largest > self.entry_bytes:
            raise ProfileLimitExceeded(_refusal(8025, f"a value of {largest} bytes"))
        sent = connection.info.get(_SENT, 0) + total
        if sent > self.transaction_bytes:
            raise ProfileLimitExceeded(_refusal(8004, f"{sent} bytes in one transaction"))
        connection.info[_SENT] = sent


def _reset(connection: Connection) -> None:
    connection.info[_SENT] = 0


def _refusal(code: int, what: str) -> str:
    return (
        f"the TiDB compatibility profile refused {what}: {ENGINE_ERRORS[code].meaning} (TiDB error {code}); "
        "nothing of the statement was sent"
    )
