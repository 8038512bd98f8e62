"""Completing held generations: Complete's one, and a claim's "complete these first" set-wise (decision 131).

One code path for both: a locked read of every named WorkItem with the database's now, the
lease checks of ``leases.check_lease`` per row (each refusal is that completion's answer,
never the others'), one compare-and-set UPDATE of the held ones, then ``leases.finish`` over
them all (selected Events, successor lookup of the unlinked, unblock): at most five
statements whatever the number of completions. A completion retried after its transaction
committed finds its generation completed and is refused as Complete refuses it (lease no
longer held: the work is completed), so a retry changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy.engine import Connection, Engine

from nexuscrm_connectors import leases
from nexuscrm_connectors.errors import ConnectorsError, LimitExceeded
from nexuscrm_connectors.queries import claims as claims_sql
from nexuscrm_runtime.clock import DatabaseClock
from nexuscrm_runtime.database import run_transaction
from workqueue import EventStatus, WorkStatus
from workqueue.errors import InvalidArgument
from workqueue.values import Completion, CompletionResult, WorkItemRow

FIELD = "completions"


def validate(completions: Sequence[Completion], limit: int) -> None:
    """Refuse a request's completions before anything runs: too many, a field missing, a WorkId named twice."""
    if len(completions) > limit:
        raise LimitExceeded(f"completions has {len(completions)} generations; the limit is {limit}", field=FIELD)
    seen: set[str] = set()
    for n, completion in enumerate(completions):
        if not completion.work_id:
            raise InvalidArgument(f"completions[{n}].work_id is required", field=f"{FIELD}.work_id")
        if not completion.lease_token:
            raise InvalidArgument(f"completions[{n}].lease_token is required", field=f"{FIELD}.lease_token")
        if completion.work_id in seen:
            raise InvalidArgument(
                f"completions names work {completion.work_id} twice (completions[{n}])", field=f"{FIELD}.work_id"
            )
        seen.add(completion.work_id)


def complete_all(
    connection: Connection, clock: DatabaseClock, completions: Sequence[Completion]
) -> list[CompletionResult]:
    """Complete every held generation of ``completions`` (validated) in the caller's transaction; one result each.

    The results are in the order of ``completions``.

    A refused completion (unknown WorkId, lease lost or expired, already completed) changes
    nothing and does not stop the others. Raises ``LeaseLost`` for them all (the transaction
    then changes nothing) only if a lease changed between the locked read and the UPDATE,
    which the lock rules out on one server.
    """
    if not completions:
        return []
    rows = claims_sql.work_items_lock(connection, [c.work_id for c in completions], clock)
    held, refused = [], {}
    for completion in completions:
        try:
            held.append(leases.check_lease(rows.get(completion.work_id), completion.work_id, completion.lease_token))
        except ConnectorsError as error:
            refused[completion.work_id] = error
    done: dict[str, WorkItemRow] = {}
    if held:
        now = held[0].Now
        if claims_sql.work_items_complete(connection, held, now) != len(held):
            raise leases.lost(", ".join(row.WorkId for row in held))
        leases.finish(connection, held, EventStatus.PROCESSED, now)
        values = {"Status": WorkStatus.COMPLETED, "ClaimableAt": None, "FinishedAt": now}
        done = {row.WorkId: leases.written(row, values) for row in held}
    return [
        CompletionResult(work_id=c.work_id, work=done.get(c.work_id), error=refused.get(c.work_id)) for c in completions
    ]


def complete(engine: Engine, clock: DatabaseClock, work_id: str, lease_token: str) -> WorkItemRow:
    """Finish one held generation (the Complete RPC); its successor becomes claimable in the same transaction."""
    leases.require_lease_fields(work_id, lease_token)
    completion = Completion(work_id=work_id, lease_token=lease_token)
    (result,) = run_transaction(engine, lambda c: complete_all(c, clock, [completion]), name="complete")
    if result.work is None:
        raise result.error or leases.lost(work_id)  # a result has its work or its error
    return result.work
