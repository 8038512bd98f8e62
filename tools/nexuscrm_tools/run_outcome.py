"""How a ``nexuscrm-run`` wait ends, and the problems its summary prints.

The wait for the projection ends as soon as its outcome is known: every admitted input
projected; no generation can run any more (every open one failed for good, waits behind
one that did, or is held by the "block" order policy behind a dead letter: decision 165), so
waiting longer changes nothing; the Integration host exited; the timeout;
or a stop signal. Failed generations are printed grouped by the Flow's message (the
WorkItem's ``LastError``, as ``nexuscrm work show`` would show it to the same operator, but
bounded as the host's log line bounds it: ``nexuscrm_sdk.worker.loggable``), each group with
its WorkIds.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence

from nexuscrm_sdk.worker import loggable
from workqueue.statuses import WorkStatus

WORK_IDS_SHOWN = 10  # per problem; ``nexuscrm work list`` has the rest
# Generations that still move without anyone's help: claimable, running or waiting for their retry.
RUNNABLE = (WorkStatus.PENDING, WorkStatus.PROCESSING, WorkStatus.RETRY)


class Ending(enum.StrEnum):
    """Why the wait for the projection ended; ``reason`` says it in the summary's words."""

    PROJECTED = "projected"
    STUCK = "stuck"
    HOST_EXITED = "host exited"
    TIMEOUT = "timeout"
    INTERRUPTED = "interrupted"

    @property
    def reason(self) -> str:
        """The summary's line for a run that ended this way before every input was projected."""
        return {
            Ending.PROJECTED: "every admitted input was projected",
            Ending.STUCK: "stopped at once: no generation can run any more (each open one failed for good, "
            "waits behind one that did, or is held by the order policy block)",
            Ending.HOST_EXITED: "stopped at once: the Integration host exited",
            Ending.TIMEOUT: "stopped at the timeout before every admitted input was projected",
            Ending.INTERRUPTED: "interrupted before every admitted input was projected",
        }[self]


def ending(
    *, delivered: bool, projected: bool, counts: Mapping[str, int], host_running: bool, held: int = 0
) -> Ending | None:
    """The ending the wait has reached, or None while progress is still possible.

    ``delivered``: the simulator is done; ``projected``: every admitted input is in a completed
    generation and none is open; ``counts``: the pack's generations per status; ``held``: the
    pending ones the "block" order policy holds behind a dead letter (no claim takes them).
    """
    if not delivered:
        return None if host_running else Ending.HOST_EXITED
    if projected:
        return Ending.PROJECTED
    if not host_running:
        return Ending.HOST_EXITED
    if sum(counts.get(status, 0) for status in RUNNABLE) <= held:
        return Ending.STUCK
    return None


def states_text(counts: Mapping[str, int]) -> str:
    """The generations that need attention, for the progress line ("2 failed, 1 retrying")."""
    shown = ((WorkStatus.FAILED, "failed"), (WorkStatus.RETRY, "retrying"), (WorkStatus.BLOCKED, "blocked"))
    return ", ".join(f"{counts[status]} {word}" for status, word in shown if counts.get(status, 0))


def failure_problems(failures: Sequence[tuple[str, str]]) -> list[str]:
    """One problem per distinct Flow message of the failed generations ``(WorkId, LastError)``, with their WorkIds."""
    by_message: dict[str, list[str]] = {}
    for work_id, message in failures:
        by_message.setdefault(loggable(message) or "(no message)", []).append(work_id)
    problems = []
    for message, work_ids in by_message.items():
        shown = ", ".join(work_ids[:WORK_IDS_SHOWN])
        more = f" and {len(work_ids) - WORK_IDS_SHOWN} more" if len(work_ids) > WORK_IDS_SHOWN else ""
        count = "1 generation" if len(work_ids) == 1 else f"{len(work_ids)} generations"
        problems.append(f"{count} failed for good: {message} (WorkIds {shown}{more})")
    return problems


def held_problems(held: Sequence[tuple[str, str]]) -> list[str]:
    """One problem per dead letter that holds generations under the "block" order policy ``(WorkId, behind)``."""
    by_dead_letter: dict[str, list[str]] = {}
    for work_id, behind in held:
        by_dead_letter.setdefault(behind, []).append(work_id)
    problems = []
    for behind, work_ids in by_dead_letter.items():
        shown = ", ".join(work_ids[:WORK_IDS_SHOWN])
        more = f" and {len(work_ids) - WORK_IDS_SHOWN} more" if len(work_ids) > WORK_IDS_SHOWN else ""
        count = "1 generation" if len(work_ids) == 1 else f"{len(work_ids)} generations"
        problems.append(
            f"{count} blocked behind {behind}: held by order policy block: predecessor {behind} failed for good; "
            f"replay or skip it (WorkIds {shown}{more})"
        )
    return problems
