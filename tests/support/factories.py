"""Factories for test rows and deliveries, and a clock tests can move."""

from __future__ import annotations

import datetime as dt
import itertools
import uuid

import sqlalchemy as sa

from nexuscrm_runtime.clock import DATABASE_CLOCK, DatabaseClock
from nexuscrm_schema.tables import AdmissionFence, ConnectorProjectionProtocol, PackInstall
from workqueue.statuses import WorkStatus
from workqueue.values import IngestItem, Route, WorkItemRow

START = dt.datetime(2026, 3, 1, 12, 0, 0)
_counter = itertools.count(1)


class FakeClock(DatabaseClock):
    """The database's clock plus an offset that the test moves with ``advance`` (decision 118).

    Every instant still comes from the database in the statement that decides with it (so it
    also moves with real time); the test moves the database's time, never a process's.
    """

    def advance(self, seconds: float) -> None:
        self.offset += dt.timedelta(seconds=seconds)


def install_pack(
    engine: sa.Engine, *, namespace: str = "acme", legacy_max_ordinal: int | None = 0, last_ordinal: int = 0
) -> str:
    """A PackInstall row; with a protocol row unless ``legacy_max_ordinal`` is None."""
    pack_id = f"pk-{uuid.uuid4().hex[:12]}"
    with engine.begin() as connection:
        connection.execute(
            sa.insert(PackInstall).values(
                PackInstallId=pack_id,
                Namespace=namespace,
                PackName="crm",
                PackVersion="1.0",
                LastOrdinal=last_ordinal,
                CreatedAt=START,
            )
        )
        if legacy_max_ordinal is not None:
            connection.execute(
                sa.insert(ConnectorProjectionProtocol).values(
                    PackInstallId=pack_id,
                    ProtocolVersion=1,
                    LegacyMaxOrdinal=legacy_max_ordinal,
                    Origin="greenfield" if legacy_max_ordinal == 0 else "cutover",
                    CreatedAt=START,
                )
            )
    return pack_id


def fence_pack(engine: sa.Engine, pack_install_id: str, *, namespace: str = "acme", reason: str = "") -> str:
    """Arm a never-expiring fence on one pack, as Controlplane's ``arm_fence`` writes it; its FenceId.

    The AdmissionFence row and the pack's ControlVersion bump (decision 107) in one transaction,
    so a Connectors test fences a pack without installing Controlplane (decision 146).
    """
    fence_id = str(uuid.uuid4())
    with engine.begin() as connection:
        now = DATABASE_CLOCK.read(connection)
        connection.execute(
            sa.insert(AdmissionFence).values(
                FenceId=fence_id, Namespace=namespace, Scope=pack_install_id, Reason=reason, CreatedAt=now
            )
        )
        _bump_control_version(connection, pack_install_id)
    return fence_id


def lift_fence(engine: sa.Engine, fence_id: str) -> None:
    """Remove a pack fence armed by ``fence_pack`` and bump its pack's ControlVersion, as ``disarm_fence`` does."""
    with engine.begin() as connection:
        fence = AdmissionFence.c.FenceId == fence_id
        scope = connection.execute(sa.select(AdmissionFence.c.Scope).where(fence)).scalar_one()
        connection.execute(sa.delete(AdmissionFence).where(fence))
        _bump_control_version(connection, scope)


def _bump_control_version(connection: sa.Connection, pack_install_id: str) -> None:
    connection.execute(
        sa.update(PackInstall)
        .where(PackInstall.c.PackInstallId == pack_install_id)
        .values(ControlVersion=sa.func.coalesce(PackInstall.c.ControlVersion, 0) + 1)
    )


def record_work_item_handoff(engine: sa.Engine, pack_install_id: str, clock: DatabaseClock = DATABASE_CLOCK) -> None:
    """Record a pack's switch to WorkItem-only execution (``PackInstall.WorkItemHandoffAt``), once.

    The row the old runtime's ``record_work_item_handoff`` writes for a pack not cut over, so a
    Controlplane test sets up that prior state without installing Connectors (decision 146).
    """
    with engine.begin() as connection:
        connection.execute(
            sa.update(PackInstall)
            .where(PackInstall.c.PackInstallId == pack_install_id, PackInstall.c.WorkItemHandoffAt.is_(None))
            .values(WorkItemHandoffAt=clock.read(connection))
        )


def route(lane: str = "lane-1", *, kind: str = "contact.upsert", work_type: str = "project") -> Route:
    """A route of the demo contact projection on ``lane``."""
    return Route(event_kind=kind, route_version="1", companion_version="crm-1.0", work_type=work_type, source_lane=lane)


def delivery(
    key: str | None = None,
    *,
    lane: str = "lane-1",
    payload: bytes | None = None,
    source_time: dt.datetime | None = None,
) -> IngestItem:
    """One delivery; unique key and payload unless given."""
    key = key or f"r-{next(_counter)}"
    return IngestItem(
        receipt_key=key,
        route=route(lane),
        payload=payload if payload is not None else f"payload of {key}".encode(),
        source_time=source_time,
    )


def processing_work(pack_install_id: str, work_id: str = "w-1", *, projection_key: str = "key") -> WorkItemRow:
    """A generation as a worker holds it (processing, first attempt), for code that takes a claimed one."""
    return WorkItemRow(
        work_id=work_id,
        pack_install_id=pack_install_id,
        projection_key=projection_key,
        work_type="project",
        input_start_ordinal=1,
        lane_ordinal=1,
        replay_of_work_id=None,
        status=WorkStatus.PROCESSING,
        attempt=0,
        max_attempts=3,
        claimable_at=None,
        lease_owner="worker",
        lease_token="token",
        lease_expires_at=None,
        last_error=None,
        created_at=START,
        finished_at=None,
    )
