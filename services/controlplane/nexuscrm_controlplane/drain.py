"""Drain status of old-protocol projection work, and a bounded wait for it to drain.

Old projection work (WorkItems without InputStartOrdinal) must finish on the old runtime
before the cutover: every pending, blocked, retry and processing row counts, not only the
ones holding a lease, and so does every row whose status is not exactly a known one (another
casing, padding, empty: ``unknown``): only an exactly terminal status proves work finished.
The status also names what holds the drain: retries waiting for a future attempt time, work
blocked on an external dependency (no live predecessor), which a bounded drain may not
outlast, and work in an unknown status, which no drain ends. Nothing here changes a status: the operator decides.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import threading
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Connection, Engine

from nexuscrm_controlplane import queries
from nexuscrm_controlplane.audit import SAMPLE_LIMIT
from nexuscrm_controlplane.errors import CutoverTimeout
from nexuscrm_controlplane.lifecycle import pack_get
from nexuscrm_runtime.causal import causal_read
from nexuscrm_runtime.clock import DATABASE_CLOCK, DatabaseClock, iso_utc
from nexuscrm_runtime.polling import poll_until
from workqueue import WorkStatus

POLL_INTERVAL = dt.timedelta(seconds=2)  # between drain polls

RETRY_WAIT = "retry_wait"
DEPENDENCY_WAIT = "dependency_wait"
UNKNOWN_STATUS = "unknown_status"
STATUS_TEXT_LIMIT = 40  # characters of an unknown status quoted in a detail


@dataclasses.dataclass(frozen=True, kw_only=True)
class DrainHold:
    """Something that holds the drain: why, how many WorkItems, and some of their WorkIds."""

    reason: str
    count: int
    sample_work_ids: tuple[str, ...]
    detail: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class DrainStatus:
    """Nonterminal old-protocol work of one pack, per status, and what holds it."""

    pack_install_id: str
    pending: int
    blocked: int
    retry: int
    processing: int
    holds: tuple[DrainHold, ...]
    sample_work_ids: tuple[str, ...]  # some nonterminal WorkIds, whatever their status
    unknown: int = 0  # statuses that are not exactly a known one: live until an operator decides

    @property
    def nonterminal(self) -> int:
        """Old-protocol WorkItems whose status is not exactly completed or failed."""
        return self.pending + self.blocked + self.retry + self.processing + self.unknown

    @property
    def drained(self) -> bool:
        """True when no old-protocol work of the pack is nonterminal."""
        return self.nonterminal == 0

    def summary(self) -> str:
        """One line for operators, for example ``2 nonterminal (pending 1, ...); holds: retry_wait 1``."""
        counts = (
            f"pending {self.pending}, blocked {self.blocked}, retry {self.retry}, processing {self.processing}, "
            f"unknown {self.unknown}"
        )
        if self.drained:
            return f"pack {self.pack_install_id}: drained ({counts})"
        holds = "; ".join(f"{h.reason} {h.count} ({', '.join(h.sample_work_ids)})" for h in self.holds)
        return (
            f"pack {self.pack_install_id}: {self.nonterminal} old projection WorkItems not terminal ({counts}); "
            f"holds: {holds or 'none'}; samples: {', '.join(self.sample_work_ids)}"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form: what ``connector-projection-drain -json`` prints and the dashboard shows."""
        return {
            "pack_install_id": self.pack_install_id,
            "drained": self.drained,
            "summary": self.summary(),
            "pending": self.pending,
            "blocked": self.blocked,
            "retry": self.retry,
            "processing": self.processing,
            "unknown": self.unknown,
            "sample_work_ids": list(self.sample_work_ids),
            "holds": [
                {"reason": h.reason, "count": h.count, "sample_work_ids": list(h.sample_work_ids), "detail": h.detail}
                for h in self.holds
            ],
        }


def drain_status_read(
    connection: Connection, pack_install_id: str, clock: DatabaseClock = DATABASE_CLOCK
) -> DrainStatus:
    """The drain status of a pack read on ``connection`` (the cutover reads it under its locks)."""
    now = clock.read(connection)
    counts = queries.legacy_work_counts(connection, pack_install_id)
    holds: list[DrainHold] = []
    retry_waits = queries.legacy_retry_waits(connection, pack_install_id, now, SAMPLE_LIMIT)
    if retry_waits:
        soonest = retry_waits[0].ClaimableAt
        holds.append(
            DrainHold(
                reason=RETRY_WAIT,
                count=queries.legacy_retry_wait_count(connection, pack_install_id, now),
                sample_work_ids=tuple(row.WorkId for row in retry_waits),
                detail=f"next attempt at {iso_utc(soonest)} at the earliest; old workers must keep running",
            )
        )
    dependency_count, dependency_sample = queries.legacy_dependency_waits(connection, pack_install_id, SAMPLE_LIMIT)
    if dependency_count:
        holds.append(
            DrainHold(
                reason=DEPENDENCY_WAIT,
                count=dependency_count,
                sample_work_ids=tuple(dependency_sample),
                detail="blocked on an external dependency; only its resolver can release it",
            )
        )
    unknown_count, unknown_sample = queries.legacy_work_unknown(connection, pack_install_id, SAMPLE_LIMIT)
    if unknown_count:
        statuses = sorted({_quoted(row.Status) for row in unknown_sample})
        holds.append(
            DrainHold(
                reason=UNKNOWN_STATUS,
                count=unknown_count,
                sample_work_ids=tuple(row.WorkId for row in unknown_sample),
                detail=f"statuses that are not exactly a known one ({', '.join(statuses)}) count as live; "
                "never assumed finished: a separately reviewed recovery decision must resolve them",
            )
        )
    sample = queries.legacy_work_live_sample(connection, pack_install_id, SAMPLE_LIMIT)
    return DrainStatus(
        pack_install_id=pack_install_id,
        pending=counts.get(WorkStatus.PENDING, 0),
        blocked=counts.get(WorkStatus.BLOCKED, 0),
        retry=counts.get(WorkStatus.RETRY, 0),
        processing=counts.get(WorkStatus.PROCESSING, 0),
        unknown=unknown_count,
        holds=tuple(holds),
        sample_work_ids=tuple(sample),
    )


def _quoted(status: object) -> str:
    """An unknown status for a detail: its repr (NULL, blob and padding visible), bounded."""
    text = repr(status)
    return text if len(text) <= STATUS_TEXT_LIMIT else text[: STATUS_TEXT_LIMIT - 3] + "..."


def drain_status(engine: Engine, pack_install_id: str, clock: DatabaseClock = DATABASE_CLOCK) -> DrainStatus:
    """The drain status of an installed pack; raises ``UnknownPack``. Read-only."""
    with engine.connect() as connection:
        causal_read(connection)  # "drained" must count every generation acknowledged before the read
        pack = pack_get(connection, pack_install_id)
        return drain_status_read(connection, pack.pack_install_id, clock)


def wait_drained(
    engine: Engine,
    pack_install_id: str,
    timeout: dt.timedelta,
    *,
    interval: dt.timedelta = POLL_INTERVAL,
    on_poll: Callable[[DrainStatus], None] | None = None,
    stop: threading.Event | None = None,
    clock: DatabaseClock = DATABASE_CLOCK,
) -> DrainStatus:
    """Poll until the pack's old projection work is drained; return the drained status.

    ``timeout`` bounds the wait: when it passes first, ``DrainTimeout`` (a ``CutoverTimeout``)
    is raised with the last status as its message and as ``status`` attribute. ``on_poll``
    sees every status read; ``stop`` (set by a signal handler) ends the wait early like a
    timeout. The loop is ``nexuscrm_runtime.polling.poll_until``, which ``nexuscrm drain
    wait`` runs over GetDrainStatus. Never changes any row.
    """
    polled = poll_until(
        lambda: drain_status(engine, pack_install_id, clock),
        lambda status: status.drained,
        timeout=timeout,
        interval=interval,
        on_poll=on_poll,
        stop=stop,
    )
    if not polled.done:
        raise DrainTimeout(polled.status)
    return polled.status


class DrainTimeout(CutoverTimeout):
    """The drain did not finish within its bound; ``status`` is the last one read."""

    def __init__(self, status: DrainStatus) -> None:
        super().__init__(f"drain did not finish in time: {status.summary()}", field="timeout")
        self.status = status
