"""How a generation reads in the operator's tables: its range, status and attempts.

``work``, ``dead-letters`` and ``identities`` show a generation alike, in the words of
docs/output-conventions.md.
"""

from __future__ import annotations

from nexuscrm.connectors.v1 import connectors_pb2 as cn_pb
from nexuscrm_tools.json_view import enum_word, timestamp_text
from nexuscrm_tools.tables import plural
from workqueue import WorkStatus


def range_text(work: cn_pb.WorkItem) -> str:
    """The range as the conventions name it: first ordinal to last ordinal (old protocol: no first)."""
    if not work.input_start_ordinal:
        return f"old protocol, last ordinal {work.lane_ordinal}"
    return f"{work.input_start_ordinal} to {work.lane_ordinal}"


def status_text(work: cn_pb.WorkItem) -> str:
    """A generation's status as its word (``pending``, ``failed``, ...)."""
    return enum_word(cn_pb.WorkStatus.DESCRIPTOR, work.status)


def listed_status(work: cn_pb.WorkItem) -> str:
    """The status a listing shows: a generation the order policy holds is "blocked behind" its dead letter.

    A failed one an operator skipped says so, with when, by whom and why.
    """
    if work.blocked_behind_work_id:
        return f"{status_text(work)}, blocked behind {work.blocked_behind_work_id} (order policy block)"
    if work.HasField("skip"):
        return f"{status_text(work)}, skipped {skip_text(work.skip)}"
    return status_text(work)


def skip_text(skip: cn_pb.Skip) -> str:
    """A recorded skip as operators read it: when, by whom and why."""
    return f"at {timestamp_text(skip.skipped_at)} by {skip.skipped_by}: {skip.reason}"


def attempts_text(work: cn_pb.WorkItem) -> str:
    """The attempts a generation used and has left: ``attempt`` counts the attempts that failed."""
    status = WorkStatus(status_text(work))
    if status is WorkStatus.COMPLETED:
        return f"completed on attempt {work.attempt + 1} of {work.max_attempts}"
    if status is WorkStatus.FAILED:
        return f"failed for good after {plural(work.attempt, 'attempt')} of {work.max_attempts}"
    if status is WorkStatus.PROCESSING:
        return f"attempt {work.attempt + 1} of {work.max_attempts} running"
    if work.attempt:
        return f"{work.attempt} failed; attempt {work.attempt + 1} of {work.max_attempts} next"
    return f"not attempted yet (up to {work.max_attempts})"
