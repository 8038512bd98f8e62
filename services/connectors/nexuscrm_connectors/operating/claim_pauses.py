"""Pausing and resuming claims on one scope of a pack: the pack, one identity or one work type.

Admission goes on while a scope is paused; claims lease nothing of it (the candidate read's
condition, ``pauses_sql.candidate_not_paused``), and leases already granted finish
normally. A pause is a ClaimPause row: durable, seen by every replica, judged on the
database's clock (its optional expiry too), recorded with who paused it, when and why, and
who resumed it and when (decision 158). Pause and resume run under the PackInstall row lock
and write that row, so two operators never both pause, or both resume, one scope: on a
multi-primary engine too, where the lock holds on one node only (decision 183).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import uuid

from sqlalchemy.engine import Connection

from nexuscrm_connectors.context import Context
from nexuscrm_connectors.errors import ConnectorsError, UnknownPack
from nexuscrm_connectors.operating import generations
from nexuscrm_connectors.queries import DbRow
from nexuscrm_connectors.queries import claim_pauses as pauses_sql
from nexuscrm_connectors.queries import operator_reads as operator_reads_sql
from nexuscrm_connectors.queries import packs as packs_sql
from nexuscrm_runtime.clock import iso_utc
from nexuscrm_runtime.database import run_transaction
from nexuscrm_schema.tables import WorkItem
from workqueue.errors import ErrorKind, InvalidArgument
from workqueue.identity import FIELD_MAX_LENGTHS, decode_projection_key, validate_text
from workqueue.values import Route

OPERATOR_MAX_LENGTH = 255  # ClaimPause.PausedBy and ResumedBy
REASON_MAX_LENGTH = 1024  # characters


def check_recorded(operator_field: str, operator: str, reason: str) -> None:
    """Refuse (``InvalidArgument``) a missing or too long operator (in ``operator_field``) or reason of an act."""
    validate_text(operator_field, operator, OPERATOR_MAX_LENGTH)
    validate_text("reason", reason, REASON_MAX_LENGTH)


class PauseScope(enum.StrEnum):
    """What a pause holds: the whole pack, one identity, or one work type."""

    PACK = "pack"
    IDENTITY = "identity"
    WORK_TYPE = "work_type"


class AlreadyPaused(ConnectorsError):
    """The scope already has an active pause."""

    kind = ErrorKind.ALREADY_EXISTS


class NotPaused(ConnectorsError):
    """A resume of a scope that has no active pause."""

    kind = ErrorKind.FAILED_PRECONDITION


@dataclasses.dataclass(frozen=True, kw_only=True)
class Scope:
    """A validated scope of a pack: ``value`` is ClaimPause.ScopeValue (a ProjectionKey, a work type, or "")."""

    pack_install_id: str
    scope: PauseScope
    value: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClaimPause:
    """One pause as recorded; ``route`` is the paused identity's (None for other scopes)."""

    pause_id: str
    pack_install_id: str
    scope: PauseScope
    route: Route | None
    work_type: str
    paused_by: str
    reason: str
    paused_at: dt.datetime
    expires_at: dt.datetime | None
    resumed_at: dt.datetime | None
    resumed_by: str

    @classmethod
    def from_row(cls, row: DbRow) -> ClaimPause:
        """The pause a ClaimPause row records."""
        scope = PauseScope(row.Scope)
        route = Route.of(decode_projection_key(row.ScopeValue)) if scope is PauseScope.IDENTITY else None
        return cls(
            pause_id=row.PauseId,
            pack_install_id=row.PackInstallId,
            scope=scope,
            route=route,
            work_type=row.ScopeValue if scope is PauseScope.WORK_TYPE else "",
            paused_by=row.PausedBy,
            reason=row.Reason,
            paused_at=row.PausedAt,
            expires_at=row.ExpiresAt,
            resumed_at=row.ResumedAt,
            resumed_by=row.ResumedBy or "",
        )


def scope_of(pack_install_id: str, scope: PauseScope | None, route: Route | None, work_type: str) -> Scope:
    """The scope a request names; ``InvalidArgument`` naming the field at fault.

    A pack scope takes neither route nor work type; an identity scope takes a whole route;
    a work-type scope takes a work type alone.
    """
    if not pack_install_id:
        raise InvalidArgument("pack_install_id is required", field="pack_install_id")
    if scope is None:
        raise InvalidArgument("scope is required: pack, identity or work_type", field="scope")
    if scope is PauseScope.IDENTITY:
        if route is None or work_type:
            raise InvalidArgument("an identity scope takes route (every field) and no work_type", field="route")
        key = generations.identity_key(pack_install_id, route)
        return Scope(pack_install_id=pack_install_id, scope=scope, value=key)
    if route is not None:
        raise InvalidArgument(f"a {scope} scope takes no route", field="route")
    if scope is PauseScope.WORK_TYPE:
        validate_text("work_type", work_type, FIELD_MAX_LENGTHS["work_type"])
        return Scope(pack_install_id=pack_install_id, scope=scope, value=work_type)
    if work_type:
        raise InvalidArgument("a pack scope takes no work_type", field="work_type")
    return Scope(pack_install_id=pack_install_id, scope=scope, value=pauses_sql.PACK_SCOPE_VALUE)


def _known(connection: Connection, scope: Scope) -> None:
    """Refuse (NOT_FOUND) an identity or work type of which the pack has no generation."""
    if scope.scope is PauseScope.PACK:
        return
    column = WorkItem.c.ProjectionKey if scope.scope is PauseScope.IDENTITY else WorkItem.c.WorkType
    if not pauses_sql.work_item_exists(connection, scope.pack_install_id, column, scope.value):
        raise UnknownScope(f"{_described(scope)}: the pack has no generation of it", field=scope.scope)


class UnknownScope(ConnectorsError):
    """A pause of an identity or work type of which the pack has no generation."""

    kind = ErrorKind.NOT_FOUND


def _described(scope: Scope) -> str:
    """The scope as a refusal names it: ``pack P``, ``identity Route(...) of pack P``, ``work type 'x' of pack P``."""
    if scope.scope is PauseScope.IDENTITY:
        return f"identity {Route.of(decode_projection_key(scope.value))!r} of pack {scope.pack_install_id}"
    if scope.scope is PauseScope.WORK_TYPE:
        return f"work type {scope.value!r} of pack {scope.pack_install_id}"
    return f"pack {scope.pack_install_id}"


def pause(
    context: Context,
    scope: Scope,
    *,
    paused_by: str,
    reason: str,
    expires_at: dt.datetime | None,
) -> ClaimPause:
    """Pause claims of ``scope`` until resumed, or until ``expires_at`` (naive UTC) on the database's clock.

    Refuses an expiry not after the database's now, a missing ``paused_by`` or ``reason``
    (``InvalidArgument``), an uninstalled pack (``UnknownPack``), an identity or work type
    the pack has no generation of (``UnknownScope``) and a scope already paused
    (``AlreadyPaused``); nothing is written then.
    """
    engine, clock = context.engine, context.clock
    check_recorded("paused_by", paused_by, reason)

    def run(connection: Connection) -> ClaimPause:
        pack = packs_sql.pack_lock(connection, scope.pack_install_id, clock)
        if expires_at is not None and expires_at <= pack.now:
            raise InvalidArgument(
                f"expires_at {iso_utc(expires_at)} is not after the database's now ({iso_utc(pack.now)})",
                field="expires_at",
            )
        _known(connection, scope)
        active = pauses_sql.claim_pause_active(connection, scope.pack_install_id, scope.scope, scope.value, pack.now)
        if active is not None:
            raise AlreadyPaused(
                f"{_described(scope)} is already paused (pause {active.PauseId} by {active.PausedBy}: {active.Reason})",
                field="scope",
            )
        packs_sql.pack_control_version_bump(connection, scope.pack_install_id)
        pause_id = str(uuid.uuid4())
        row = {
            "PauseId": pause_id,
            "PackInstallId": scope.pack_install_id,
            "Scope": scope.scope.value,
            "ScopeValue": scope.value,
            "PausedBy": paused_by,
            "Reason": reason,
            "PausedAt": pack.now,
            "ExpiresAt": expires_at,
            "ResumedAt": None,
            "ResumedBy": None,
        }
        pauses_sql.claim_pause_insert(connection, row)
        return ClaimPause(
            pause_id=pause_id,
            pack_install_id=scope.pack_install_id,
            scope=scope.scope,
            route=Route.of(decode_projection_key(scope.value)) if scope.scope is PauseScope.IDENTITY else None,
            work_type=scope.value if scope.scope is PauseScope.WORK_TYPE else "",
            paused_by=paused_by,
            reason=reason,
            paused_at=pack.now,
            expires_at=expires_at,
            resumed_at=None,
            resumed_by="",
        )

    return run_transaction(engine, run, name="pause claims")


def resume(context: Context, scope: Scope, *, resumed_by: str) -> ClaimPause:
    """End the active pause of ``scope``; claims of it resume with the next candidate read.

    Refuses a missing ``resumed_by`` (``InvalidArgument``), an uninstalled pack
    (``UnknownPack``) and a scope without an active pause (``NotPaused``).
    """
    engine, clock = context.engine, context.clock
    validate_text("resumed_by", resumed_by, OPERATOR_MAX_LENGTH)

    def run(connection: Connection) -> ClaimPause:
        pack = packs_sql.pack_lock(connection, scope.pack_install_id, clock)
        active = pauses_sql.claim_pause_active(connection, scope.pack_install_id, scope.scope, scope.value, pack.now)
        if active is None:
            raise NotPaused(f"{_described(scope)} is not paused", field="scope")
        packs_sql.pack_control_version_bump(connection, scope.pack_install_id)
        if pauses_sql.claim_pause_resume(connection, active.PauseId, resumed_by, pack.now) != 1:
            raise RuntimeError(f"pause {active.PauseId} changed under the pack's row lock")
        return dataclasses.replace(ClaimPause.from_row(active), resumed_at=pack.now, resumed_by=resumed_by)

    return run_transaction(engine, run, name="resume claims")


def list_pauses(context: Context, pack_install_id: str) -> list[ClaimPause]:
    """The pack's active pauses at the database's now; raises ``UnknownPack``."""
    engine, clock = context.engine, context.clock
    if not pack_install_id:
        raise InvalidArgument("pack_install_id is required", field="pack_install_id")
    with engine.connect() as connection:
        if operator_reads_sql.pack_namespace(connection, pack_install_id) is None:
            raise UnknownPack(f"pack_install_id {pack_install_id!r} is not installed", field="pack_install_id")
        now = clock.read(connection)
        rows = pauses_sql.claim_pauses_of_pack(connection, pack_install_id, now)
    return [ClaimPause.from_row(row) for row in rows]
