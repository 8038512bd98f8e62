"""Admission fences: arm, disarm, list, and per-pack overrides with their own expiry.

A fence blocks admission (materialization) for a whole namespace (scope ``*``) or one pack,
until it is disarmed or expires. An override releases one pack from one fence, until it is
removed or expires. Connectors evaluates fences inside its admission transaction
(its ``packs.admission_guard``, reading the fence rows in the same transaction); receipts keep
arriving durably while fenced.

A fence is named by its id or, as the dashboard shows it, by a unique prefix of at least
``FENCE_PREFIX_DIGITS`` hex digits (``resolve_fence_id``), wherever an id is taken.

Changes to a fence's overrides and disarming lock the fence row first, so they serialize with
the cutover, which locks the namespace-wide fences while it checks them. Every change also
bumps ``PackInstall.ControlVersion`` of the packs it covers (the whole namespace for a ``*``
fence, else the one pack): admission writes those rows too, so on a multi-primary engine an
admission that read the fences before a change committed cannot commit after it (decision
107). Arming and disarming a namespace fence write every pack row of the namespace.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy.engine import Connection, Engine

from nexuscrm_controlplane import queries
from nexuscrm_controlplane.errors import UnknownFence
from nexuscrm_controlplane.lifecycle import pack_get, validate_namespace, validate_pack_id
from nexuscrm_runtime.clock import DATABASE_CLOCK, DatabaseClock, iso_utc
from nexuscrm_runtime.database import run_transaction
from nexuscrm_schema.tables import NAMESPACE_SCOPE
from workqueue.errors import InvalidArgument

REASON_LENGTH = 255
MAX_EXPIRES_IN_SECONDS = 366 * 24 * 3600  # a year and a day: longer means "never", say so with 0
FENCE_PREFIX_DIGITS = 8  # the dashboard's short fence id: the first 8 hex digits
_FENCE_PREFIX = re.compile(r"[0-9a-f][0-9a-f-]*")


@dataclasses.dataclass(frozen=True, kw_only=True)
class FenceOverrideRow:
    """One pack released from one fence; ``expires_at`` None: until removed."""

    fence_id: str
    pack_install_id: str
    expires_at: dt.datetime | None
    created_at: dt.datetime

    def active(self, now: dt.datetime) -> bool:
        """True while the override releases its pack."""
        return self.expires_at is None or self.expires_at > now

    @classmethod
    def from_row(cls, row: Any) -> FenceOverrideRow:
        """Build from an AdmissionFenceOverride result row."""
        return cls(
            fence_id=row.FenceId,
            pack_install_id=row.PackInstallId,
            expires_at=row.ExpiresAt,
            created_at=row.CreatedAt,
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class FenceRow:
    """One fence and its overrides (expired overrides included, so operators see them)."""

    fence_id: str
    namespace: str
    scope: str
    expires_at: dt.datetime | None
    reason: str
    created_at: dt.datetime
    overrides: tuple[FenceOverrideRow, ...] = ()

    def active(self, now: dt.datetime) -> bool:
        """True while the fence holds (overrides aside)."""
        return self.expires_at is None or self.expires_at > now

    def active_overrides(self, now: dt.datetime) -> tuple[FenceOverrideRow, ...]:
        """The overrides that release a pack now."""
        return tuple(o for o in self.overrides if o.active(now))

    def to_dict(self, now: dt.datetime | None = None) -> dict[str, Any]:
        """JSON-ready form (``connector-admission-fence``, the dashboard); timestamps end in ``Z``.

        With ``now``, the fence and each override also say whether they are ``active`` then.
        """

        def activity(row: FenceRow | FenceOverrideRow) -> dict[str, bool]:
            return {} if now is None else {"active": row.active(now)}

        return {
            "fence_id": self.fence_id,
            "namespace": self.namespace,
            "scope": self.scope,
            "expires_at": iso_utc(self.expires_at),
            "reason": self.reason,
            **activity(self),
            "overrides": [
                {"pack_install_id": o.pack_install_id, "expires_at": iso_utc(o.expires_at), **activity(o)}
                for o in self.overrides
            ],
        }

    @classmethod
    def from_row(cls, row: Any, overrides: Sequence[FenceOverrideRow] = ()) -> FenceRow:
        """Build from an AdmissionFence result row."""
        return cls(
            fence_id=row.FenceId,
            namespace=row.Namespace,
            scope=row.Scope,
            expires_at=row.ExpiresAt,
            reason=row.Reason,
            created_at=row.CreatedAt,
            overrides=tuple(overrides),
        )


def _check_expires_in(field: str, expires_in_seconds: int) -> None:
    if not 0 <= expires_in_seconds <= MAX_EXPIRES_IN_SECONDS:
        raise InvalidArgument(
            f"{field} must be between 0 (never) and {MAX_EXPIRES_IN_SECONDS}, got {expires_in_seconds}", field=field
        )


def _expiry(expires_in_seconds: int, now: dt.datetime) -> dt.datetime | None:
    """When a fence or override armed at ``now`` (the database's time) expires; None: never."""
    return None if expires_in_seconds == 0 else now + dt.timedelta(seconds=expires_in_seconds)


def with_overrides(connection: Connection, rows: Sequence[Any]) -> list[FenceRow]:
    """Fence rows joined with every override of theirs."""
    overrides: dict[str, list[FenceOverrideRow]] = {}
    for override in queries.overrides_list(connection, [row.FenceId for row in rows]):
        overrides.setdefault(override.FenceId, []).append(FenceOverrideRow.from_row(override))
    return [FenceRow.from_row(row, overrides.get(row.FenceId, ())) for row in rows]


def resolve_fence_id(connection: Connection, fence_id: str) -> str:
    """The id of the fence ``fence_id`` names: that id, or the one id it is a unique prefix of.

    A prefix needs at least ``FENCE_PREFIX_DIGITS`` hex digits (case does not matter). Raises
    ``InvalidArgument`` when ``fence_id`` is empty or a prefix of several fences (give more of
    it), ``UnknownFence`` when it names none.
    """
    if not fence_id:
        raise InvalidArgument("fence_id is required", field="fence_id")
    if queries.fence_namespace(connection, fence_id) is not None:
        return fence_id
    prefix = fence_id.lower()
    digits = sum(char != "-" for char in prefix)
    if not _FENCE_PREFIX.fullmatch(prefix) or digits < FENCE_PREFIX_DIGITS:
        raise UnknownFence(
            f"fence {fence_id!r} does not exist (a short id needs at least {FENCE_PREFIX_DIGITS} hex digits)",
            field="fence_id",
        )
    matches = queries.fence_ids_with_prefix(connection, prefix, limit=2)
    if not matches:
        raise UnknownFence(f"no fence id starts with {fence_id!r}", field="fence_id")
    if len(matches) > 1:
        raise InvalidArgument(
            f"{fence_id!r} is the start of more than one fence id: give more of the id", field="fence_id"
        )
    return matches[0]


def _fence_locked(connection: Connection, fence_id: str) -> Any:
    """The fence ``fence_id`` names (``resolve_fence_id``), its row locked."""
    row = queries.fence_get(connection, resolve_fence_id(connection, fence_id), lock=True)
    if row is None:
        raise UnknownFence(f"fence {fence_id!r} was removed concurrently", field="fence_id")
    return row


def _covered(connection: Connection, namespace: str, scope: str) -> None:
    """Bump the ControlVersion of the packs a fence of ``scope`` covers (decision 107).

    A namespace fence bumps the namespace's row first, which a pack install writes too: the
    packs' bump then covers every pack installed before it, on every node.
    """
    if scope == NAMESPACE_SCOPE:
        queries.namespace_control_bump(connection, namespace)
        queries.packs_control_version_bump(connection, namespace=namespace)
    else:
        queries.packs_control_version_bump(connection, pack_install_ids=[scope])


def _fence_reread(connection: Connection, fence_id: str) -> FenceRow:
    row = queries.fence_get(connection, fence_id)
    if row is None:  # locked or written in this transaction
        raise RuntimeError(f"fence {fence_id} vanished inside the transaction that locked or wrote it")
    return with_overrides(connection, [row])[0]


def arm_fence(
    engine: Engine,
    namespace: str,
    scope: str = NAMESPACE_SCOPE,
    *,
    expires_in_seconds: int = 0,
    reason: str = "",
    clock: DatabaseClock = DATABASE_CLOCK,
) -> FenceRow:
    """Arm a fence on ``namespace``: scope ``*`` (or empty) for every pack, else one pack of it.

    ``expires_in_seconds`` 0 means the fence never expires (what the cutover requires).
    A pack scope must name an installed pack of the namespace (``UnknownPack`` otherwise).
    """
    validate_namespace(namespace)
    scope = scope or NAMESPACE_SCOPE
    if len(reason) > REASON_LENGTH:
        raise InvalidArgument(f"reason is longer than {REASON_LENGTH} characters", field="reason")
    _check_expires_in("expires_in_seconds", expires_in_seconds)

    def arm(connection: Connection) -> FenceRow:
        now = clock.read(connection)
        if scope != NAMESPACE_SCOPE:
            pack = pack_get(connection, scope)
            if pack.namespace != namespace:
                raise InvalidArgument(
                    f"pack {scope} belongs to namespace {pack.namespace!r}, not {namespace!r}", field="scope"
                )
        fence_id = str(uuid.uuid4())
        queries.fence_insert(
            connection,
            {
                "FenceId": fence_id,
                "Namespace": namespace,
                "Scope": scope,
                "ExpiresAt": _expiry(expires_in_seconds, now),
                "Reason": reason,
                "CreatedAt": now,
            },
        )
        _covered(connection, namespace, scope)
        return _fence_reread(connection, fence_id)

    return run_transaction(engine, arm, name="arm fence")


def disarm_fence(engine: Engine, fence_id: str) -> None:
    """Remove a fence and its overrides; raises ``UnknownFence``.

    Receipts stored while it held are admitted by the Connectors materializer afterwards.
    """

    def disarm(connection: Connection) -> None:
        fence = _fence_locked(connection, fence_id)
        queries.override_delete(connection, fence.FenceId)
        if queries.fence_delete(connection, fence.FenceId) != 1:
            raise UnknownFence(f"fence {fence_id!r} was removed concurrently", field="fence_id")
        _covered(connection, fence.Namespace, fence.Scope)

    run_transaction(engine, disarm, name="disarm fence")


def list_fences(engine: Engine, namespace: str) -> list[FenceRow]:
    """Every fence of a namespace with its overrides, expired ones included, oldest first."""
    validate_namespace(namespace)
    with engine.connect() as connection:
        return with_overrides(connection, queries.fences_list(connection, namespace))


def add_override(
    engine: Engine,
    fence_id: str,
    pack_install_id: str,
    *,
    expires_in_seconds: int = 0,
    clock: DatabaseClock = DATABASE_CLOCK,
) -> FenceRow:
    """Release one pack of the fence's namespace from the fence; replaces an earlier override.

    ``expires_in_seconds`` 0 means until removed. Raises ``UnknownFence``, ``UnknownPack``.
    """
    _check_expires_in("expires_in_seconds", expires_in_seconds)

    def add(connection: Connection) -> FenceRow:
        now = clock.read(connection)
        fence = _fence_locked(connection, fence_id)
        pack = pack_get(connection, pack_install_id)
        if pack.namespace != fence.Namespace:
            raise InvalidArgument(
                f"pack {pack_install_id} is not in the fence's namespace {fence.Namespace!r}",
                field="pack_install_id",
            )
        queries.override_delete(connection, fence.FenceId, pack_install_id)
        queries.override_insert(
            connection,
            {
                "FenceId": fence.FenceId,
                "PackInstallId": pack_install_id,
                "ExpiresAt": _expiry(expires_in_seconds, now),
                "CreatedAt": now,
            },
        )
        queries.packs_control_version_bump(connection, pack_install_ids=[pack.pack_install_id])
        return _fence_reread(connection, fence.FenceId)

    # Through another node, a racing release of the same pack may insert first: the next attempt replaces it.
    return run_transaction(engine, add, name="add fence override", unique_keys_conflict=True)


def remove_override(engine: Engine, fence_id: str, pack_install_id: str) -> None:
    """End a pack's release from a fence; raises ``UnknownFence`` when there is no such override."""
    validate_pack_id(pack_install_id)

    def remove(connection: Connection) -> None:
        fence = _fence_locked(connection, fence_id)
        if queries.override_delete(connection, fence.FenceId, pack_install_id) != 1:
            raise UnknownFence(f"fence {fence_id!r} has no override for {pack_install_id}", field="pack_install_id")
        queries.packs_control_version_bump(connection, pack_install_ids=[pack_install_id])

    run_transaction(engine, remove, name="remove fence override")
