"""Every SQL statement of the demo and the runner, named noun + verb (the ledger's are the SDK's).

The ``demo_*`` statements touch only the demo's own read-model table. The ``event_*`` and ``work_item_*`` reads
look at canonical tables for the demo's verification and summary; none of them writes a
canonical table.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from nexuscrm_schema.relations import EVENT_PAYLOAD, EVENT_WITH_PAYLOAD, effective_block, held_behind
from nexuscrm_schema.tables import Event, PrunedReceipt, RetentionPolicy, WorkItem
from nexuscrm_tools.demo_tables import DemoContactProjection

IN_CHUNK = 500  # values per IN list: bounded statements on every backend


def _chunks(values: Collection[Any]) -> Iterable[list[Any]]:
    ordered = sorted(values)
    for start in range(0, len(ordered), IN_CHUNK):
        yield ordered[start : start + IN_CHUNK]


def demo_contacts_get(
    connection: Connection, pack_install_id: str, contact_ids: Collection[str] | None = None
) -> list[Any]:
    """Projection rows of the pack (only ``contact_ids`` when given)."""
    statement = sa.select(DemoContactProjection).where(DemoContactProjection.c.PackInstallId == pack_install_id)
    if contact_ids is None:
        return list(connection.execute(statement))
    rows: list[Any] = []
    for chunk in _chunks(contact_ids):
        rows += connection.execute(statement.where(DemoContactProjection.c.ContactId.in_(chunk)))
    return rows


def demo_contact_insert(
    connection: Connection, pack_install_id: str, contact_id: str, values: Mapping[str, Any]
) -> None:
    """Insert a contact's first projection row."""
    connection.execute(
        sa.insert(DemoContactProjection).values(PackInstallId=pack_install_id, ContactId=contact_id, **values)
    )


def demo_contact_update(
    connection: Connection, pack_install_id: str, contact_id: str, values: Mapping[str, Any]
) -> None:
    """Overwrite a contact's projection row; exactly one row must change."""
    result = connection.execute(
        sa.update(DemoContactProjection)
        .where(
            DemoContactProjection.c.PackInstallId == pack_install_id, DemoContactProjection.c.ContactId == contact_id
        )
        .values(**values)
    )
    if result.rowcount != 1:
        raise RuntimeError(f"projection row of contact {contact_id} vanished during its update")


def event_payloads(connection: Connection, pack_install_id: str) -> list[tuple[int, bytes]]:
    """(ordinal, payload) of every non-replay Event of the pack, in ordinal order."""
    rows = connection.execute(
        sa.select(Event.c.EnqueueOrdinal, EVENT_PAYLOAD)
        .select_from(EVENT_WITH_PAYLOAD)
        .where(Event.c.PackInstallId == pack_install_id, Event.c.IsReplay == sa.false())
        .order_by(Event.c.EnqueueOrdinal)
    )
    return [(int(row.EnqueueOrdinal), bytes(row.Payload)) for row in rows]


def pruned_ordinals(connection: Connection, pack_install_id: str) -> set[int]:
    """Ordinals of the pack's inputs that retention pruned (their receipts' tombstones)."""
    statement = sa.select(PrunedReceipt.c.EnqueueOrdinal).where(PrunedReceipt.c.PackInstallId == pack_install_id)
    return set(connection.execute(statement).scalars())


def work_item_status_counts(connection: Connection, pack_install_id: str) -> dict[str, int]:
    """Generations of the pack per status."""
    rows = connection.execute(
        sa.select(WorkItem.c.Status, sa.func.count())
        .where(WorkItem.c.PackInstallId == pack_install_id)
        .group_by(WorkItem.c.Status)
    )
    return {str(row[0]): int(row[1]) for row in rows}


def work_item_inputs_finished(connection: Connection, pack_install_id: str) -> int:
    """Inputs of the pack in completed generations (each counted as its claim froze it), any Flow.

    Inputs that retention pruned with their terminal generation count through their receipts'
    tombstones, and those whose tombstones expired with the duplicate window through the
    policy's count of them.
    """
    total = sa.select(sa.func.coalesce(sa.func.sum(WorkItem.c.ClaimedMemberCount), 0)).where(
        WorkItem.c.PackInstallId == pack_install_id, WorkItem.c.Status == "completed"
    )
    pruned = (
        sa.select(sa.func.count()).select_from(PrunedReceipt).where(PrunedReceipt.c.PackInstallId == pack_install_id)
    )
    return (
        int(connection.execute(total).scalar_one())
        + int(connection.execute(pruned).scalar_one())
        + expired_count(connection, pack_install_id)
    )


def expired_count(connection: Connection, pack_install_id: str) -> int:
    """Inputs of the pack whose tombstones the duplicate window expired (0 without a policy)."""
    statement = sa.select(RetentionPolicy.c.ExpiredReceipts).where(RetentionPolicy.c.PackInstallId == pack_install_id)
    return int(connection.execute(statement).scalar() or 0)


def work_item_failures(connection: Connection, pack_install_id: str) -> list[tuple[str, str]]:
    """(WorkId, LastError) of every generation of the pack that failed for good, oldest first."""
    rows = connection.execute(
        sa.select(WorkItem.c.WorkId, WorkItem.c.LastError)
        .where(WorkItem.c.PackInstallId == pack_install_id, WorkItem.c.Status == "failed")
        .order_by(WorkItem.c.CreatedAt, WorkItem.c.WorkId)
    )
    return [(str(row.WorkId), str(row.LastError or "")) for row in rows]


def work_items_held(connection: Connection, pack_install_id: str) -> list[tuple[str, str]]:
    """(WorkId, the dead letter's WorkId) of each pending generation of the pack that a dead letter holds under "block".

    What Connectors' claim refuses: only a replay or skip of the dead letter, or
    a policy change, releases it, so a runner waiting for it waits for nothing. One held behind
    a replay that runs first is not listed: that replay releases it. Oldest first.
    """
    behind = held_behind().label("Behind")
    held = (
        sa.select(WorkItem.c.WorkId, behind, WorkItem.c.CreatedAt)
        .where(
            WorkItem.c.PackInstallId == pack_install_id,
            WorkItem.c.Status == "pending",
            WorkItem.c.InputStartOrdinal.is_not(None),
            effective_block(WorkItem.c.PackInstallId, WorkItem.c.WorkType),
        )
        .subquery()
    )
    behind_row = WorkItem.alias("Behind")
    rows = connection.execute(
        sa.select(held.c.WorkId, held.c.Behind)
        .join(behind_row, behind_row.c.WorkId == held.c.Behind)
        .where(behind_row.c.Status == "failed")
        .order_by(held.c.CreatedAt, held.c.WorkId)
    )
    return [(str(row.WorkId), str(row.Behind)) for row in rows]
