"""SQL of the Flow version tracks (FlowVersionTrack, FlowVersionChange) and of their generations.

Every statement runs in the caller's transaction; the writes that decide a track's state run
under the pack lock (``packs.pack_lock``), as admission does.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection

from nexuscrm_connectors.queries.work_items import MEMBER_KEY
from nexuscrm_schema.tables import Event, FlowVersionChange, FlowVersionTrack, PrunedWork, WorkItem
from workqueue import WorkStatus
from workqueue.statuses import NONTERMINAL_WORK_STATUSES


@dataclasses.dataclass(frozen=True, kw_only=True)
class Track:
    """One FlowVersionTrack row."""

    pack_install_id: str
    work_type: str
    version: str
    source_version: str
    live: bool
    cover_from_ordinal: int
    cover_through_ordinal: int | None
    catch_up_through_ordinal: int
    max_inputs_per_second: int | None
    verified_against: str | None
    verified_through_ordinal: int | None
    verify_outcome: str | None
    verified_at: dt.datetime | None
    retired_at: dt.datetime | None
    created_at: dt.datetime

    @classmethod
    def new(
        cls,
        pack_install_id: str,
        work_type: str,
        version: str,
        source_version: str,
        *,
        live: bool,
        cover_from: int,
        now: dt.datetime,
    ) -> Track:
        """A track about to be inserted: receiving, never caught up, verified or retired."""
        return cls(
            pack_install_id=pack_install_id,
            work_type=work_type,
            version=version,
            source_version=source_version,
            live=live,
            cover_from_ordinal=cover_from,
            cover_through_ordinal=None,
            catch_up_through_ordinal=0,
            max_inputs_per_second=None,
            verified_against=None,
            verified_through_ordinal=None,
            verify_outcome=None,
            verified_at=None,
            retired_at=None,
            created_at=now,
        )

    @property
    def own(self) -> bool:
        """The track of the inputs' own version: its generations carry no FlowVersion and no InputKey."""
        return self.version == self.source_version

    @property
    def receiving(self) -> bool:
        return self.cover_through_ordinal is None and self.retired_at is None


def _track(row: Any) -> Track:
    return Track(
        pack_install_id=row.PackInstallId,
        work_type=row.WorkType,
        version=row.Version,
        source_version=row.SourceVersion,
        live=bool(row.Live),
        cover_from_ordinal=row.CoverFromOrdinal,
        cover_through_ordinal=row.CoverThroughOrdinal,
        catch_up_through_ordinal=row.CatchUpThroughOrdinal,
        max_inputs_per_second=row.MaxInputsPerSecond,
        verified_against=row.VerifiedAgainst,
        verified_through_ordinal=row.VerifiedThroughOrdinal,
        verify_outcome=row.VerifyOutcome,
        verified_at=row.VerifiedAt,
        retired_at=row.RetiredAt,
        created_at=row.CreatedAt,
    )


def tracks_of(connection: Connection, pack_install_id: str, work_type: str | None = None) -> list[Track]:
    """The pack's tracks (of one work type), retired ones included, by work type and creation."""
    query = sa.select(FlowVersionTrack).where(FlowVersionTrack.c.PackInstallId == pack_install_id)
    if work_type is not None:
        query = query.where(FlowVersionTrack.c.WorkType == work_type)
    rows = connection.execute(query.order_by(FlowVersionTrack.c.WorkType, FlowVersionTrack.c.CreatedAt))
    return [_track(row) for row in rows]


def packs_with_versions(connection: Connection, limit: int) -> list[str]:
    """Up to ``limit`` packs with a Flow version not retired (the primary key's prefix)."""
    query = (
        sa.select(FlowVersionTrack.c.PackInstallId)
        .where(FlowVersionTrack.c.RetiredAt.is_(None))
        .group_by(FlowVersionTrack.c.PackInstallId)
        .order_by(FlowVersionTrack.c.PackInstallId)
        .limit(limit)
    )
    return list(connection.execute(query).scalars())


def track_insert(connection: Connection, track: Track) -> None:
    """Insert a new track (never verified, never retired)."""
    connection.execute(
        sa.insert(FlowVersionTrack).values(
            PackInstallId=track.pack_install_id,
            WorkType=track.work_type,
            Version=track.version,
            SourceVersion=track.source_version,
            Live=track.live,
            CoverFromOrdinal=track.cover_from_ordinal,
            CoverThroughOrdinal=track.cover_through_ordinal,
            CatchUpThroughOrdinal=track.catch_up_through_ordinal,
            MaxInputsPerSecond=track.max_inputs_per_second,
            CreatedAt=track.created_at,
        )
    )


def track_update(connection: Connection, track: Track, **values: Any) -> None:
    """Change one track, expected unchanged since read under the pack lock (RuntimeError otherwise)."""
    changed = connection.execute(
        sa.update(FlowVersionTrack)
        .where(
            FlowVersionTrack.c.PackInstallId == track.pack_install_id,
            FlowVersionTrack.c.WorkType == track.work_type,
            FlowVersionTrack.c.Version == track.version,
            FlowVersionTrack.c.Live == track.live,
        )
        .values(**values)
    ).rowcount
    if changed != 1:
        raise RuntimeError(f"Flow version {track.version} of {track.work_type} changed under the pack lock")


def change_insert(
    connection: Connection,
    track: Track,
    *,
    action: str,
    actor: str,
    reason: str,
    at_ordinal: int,
    now: dt.datetime,
    forced: bool = False,
) -> None:
    """Record one step of ``track``'s version, with who, why and the pack counter at it."""
    connection.execute(
        sa.insert(FlowVersionChange).values(
            ChangeId=str(uuid.uuid4()),
            PackInstallId=track.pack_install_id,
            WorkType=track.work_type,
            Version=track.version,
            Action=action,
            Actor=actor,
            Reason=reason,
            Forced=forced,
            AtOrdinal=at_ordinal,
            ChangedAt=now,
        )
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Change:
    """One recorded step of a work type's versions."""

    version: str
    action: str
    actor: str
    reason: str
    forced: bool
    at_ordinal: int
    changed_at: dt.datetime


def changes_of(connection: Connection, pack_install_id: str, work_type: str) -> list[Change]:
    """The recorded steps of a work type's versions, oldest first."""
    rows = connection.execute(
        sa.select(FlowVersionChange)
        .where(FlowVersionChange.c.PackInstallId == pack_install_id, FlowVersionChange.c.WorkType == work_type)
        .order_by(FlowVersionChange.c.ChangedAt, FlowVersionChange.c.AtOrdinal)
    )
    return [
        Change(
            version=row.Version,
            action=row.Action,
            actor=row.Actor,
            reason=row.Reason,
            forced=bool(row.Forced),
            at_ordinal=row.AtOrdinal,
            changed_at=row.ChangedAt,
        )
        for row in rows
    ]


def input_identities(connection: Connection, pack_install_id: str, work_type: str) -> list[str]:
    """The inputs' projection keys of the work type's generations, whichever version's they are."""
    keys = sa.select(MEMBER_KEY).where(
        WorkItem.c.PackInstallId == pack_install_id,
        WorkItem.c.WorkType == work_type,
        WorkItem.c.InputStartOrdinal.is_not(None),
    )
    return sorted(set(connection.execute(keys.distinct()).scalars()))


def pruned_through(connection: Connection, pack_install_id: str, projection_keys: Sequence[str]) -> int:
    """The highest ordinal retention pruned of these identities (0: none)."""
    if not projection_keys:
        return 0
    value = connection.execute(
        sa.select(sa.func.max(PrunedWork.c.LaneOrdinal)).where(
            PrunedWork.c.PackInstallId == pack_install_id,
            PrunedWork.c.ProjectionKey.in_(sa.bindparam("keys", expanding=True)),
        ),
        {"keys": list(projection_keys)},
    ).scalar()
    return int(value or 0)


def member_ordinals(
    connection: Connection, pack_install_id: str, projection_key: str, after: int, through: int
) -> list[int]:
    """The ordinals of one identity's Events in (``after``, ``through``], in order (ix_event_source_lane)."""
    return list(
        connection.execute(
            sa.select(Event.c.EnqueueOrdinal)
            .where(
                Event.c.PackInstallId == pack_install_id,
                Event.c.ProjectionKey == projection_key,
                Event.c.EnqueueOrdinal > after,
                Event.c.EnqueueOrdinal <= through,
            )
            .order_by(Event.c.EnqueueOrdinal)
        ).scalars()
    )


def _of_track(track: Track) -> list[sa.ColumnElement[bool]]:
    version = WorkItem.c.FlowVersion.is_(None) if track.own else WorkItem.c.FlowVersion == track.version
    return [
        WorkItem.c.PackInstallId == track.pack_install_id,
        WorkItem.c.WorkType == track.work_type,
        WorkItem.c.InputStartOrdinal.is_not(None),
        version,
    ]


@dataclasses.dataclass(frozen=True, kw_only=True)
class Progress:
    """A track's generations and inputs: in all, done (completed), failed, and done in the last minute."""

    generations_total: int = 0
    generations_done: int = 0
    generations_failed: int = 0
    inputs_total: int = 0
    inputs_done: int = 0
    inputs_last_minute: int = 0
    behind: int = 0  # nonterminal or failed generations starting at or below the catch-up's counter


def progress(connection: Connection, track: Track, now: dt.datetime) -> Progress:
    """One statement: the track's generations grouped by status, with the inputs they hold."""
    members = sa.func.coalesce(WorkItem.c.AdmittedMemberCount, WorkItem.c.ClaimedMemberCount, 0)
    recent = sa.case((WorkItem.c.FinishedAt >= now - dt.timedelta(minutes=1), members), else_=0)
    early = sa.case((WorkItem.c.InputStartOrdinal <= track.catch_up_through_ordinal, 1), else_=0)
    rows = connection.execute(
        sa.select(
            WorkItem.c.Status,
            sa.func.count(),
            sa.func.sum(members),
            sa.func.sum(recent),
            sa.func.sum(early),
        )
        .where(*_of_track(track))
        .group_by(WorkItem.c.Status)
    )
    totals: dict[str, int] = {"total": 0, "done": 0, "failed": 0, "inputs": 0, "inputs_done": 0, "minute": 0}
    behind = 0
    for status, count, inputs, minute, early_count in rows:
        totals["total"] += count
        totals["inputs"] += int(inputs or 0)
        if status == WorkStatus.COMPLETED:
            totals["done"] += count
            totals["inputs_done"] += int(inputs or 0)
            totals["minute"] += int(minute or 0)
        elif status == WorkStatus.FAILED:
            totals["failed"] += count
            behind += int(early_count or 0)
        elif status in NONTERMINAL_WORK_STATUSES:
            behind += int(early_count or 0)
    return Progress(
        generations_total=totals["total"],
        generations_done=totals["done"],
        generations_failed=totals["failed"],
        inputs_total=totals["inputs"],
        inputs_done=totals["inputs_done"],
        inputs_last_minute=totals["minute"],
        behind=behind,
    )


def nonterminal_count(connection: Connection, track: Track) -> int:
    """The track's generations not terminal yet."""
    return int(
        connection.execute(
            sa.select(sa.func.count()).where(*_of_track(track), WorkItem.c.Status.in_(NONTERMINAL_WORK_STATUSES))
        ).scalar()
        or 0
    )
