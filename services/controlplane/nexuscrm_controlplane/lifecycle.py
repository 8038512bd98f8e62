"""Pack incarnations and their immutable projection protocol rows.

``install_pack`` creates an incarnation with its own ordinal counter. ``activate_pack`` writes
protocol version 1 with LegacyMaxOrdinal 0 for a pack without history (greenfield), in its
own transaction. ``protocol_write`` is the one writer of ``_System_ConnectorProjectionProtocol``
(greenfield activation and cutover both use it): it inserts, and when another caller won the
race it returns that caller's row. Nothing updates or deletes a protocol row.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from typing import Any

from sqlalchemy.engine import Connection, Engine

from nexuscrm_controlplane import queries
from nexuscrm_controlplane.errors import PackHasHistory, UnknownPack
from nexuscrm_runtime.clock import DATABASE_CLOCK, DatabaseClock
from nexuscrm_runtime.database import run_transaction
from nexuscrm_schema.tables import NAMESPACE_LENGTH, NAMESPACE_SCOPE, PACK_ID_LENGTH
from workqueue.errors import InvalidArgument
from workqueue.identity import validate_text
from workqueue.limits import PACK_NAME_LENGTH, PACK_VERSION_LENGTH

PROTOCOL_VERSION = 1
ORIGIN_GREENFIELD = "greenfield"
ORIGIN_CUTOVER = "cutover"
PACK_ID_PREFIX = "pk-"
PROTOCOL_STATE_NONE = "none"  # GetPack's protocol state of a pack without a protocol row
FIND_LIMIT = 100  # incarnations FindPacks returns
LIST_PAGE_SIZE = 100  # ListPacks' default page
LIST_PAGE_MAX = 1000  # and its largest


@dataclasses.dataclass(frozen=True, kw_only=True)
class PackInstallRow:
    """One pack incarnation."""

    pack_install_id: str
    namespace: str
    pack_name: str
    pack_version: str
    last_ordinal: int
    work_item_handoff_at: dt.datetime | None
    created_at: dt.datetime

    @classmethod
    def from_row(cls, row: Any) -> PackInstallRow:
        """Build from a PackInstall result row."""
        return cls(
            pack_install_id=row.PackInstallId,
            namespace=row.Namespace,
            pack_name=row.PackName,
            pack_version=row.PackVersion,
            last_ordinal=int(row.LastOrdinal),
            work_item_handoff_at=row.WorkItemHandoffAt,
            created_at=row.CreatedAt,
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProtocolRow:
    """A pack's projection protocol row: written once, never changed."""

    pack_install_id: str
    protocol_version: int
    legacy_max_ordinal: int
    origin: str
    audit_report: str | None
    created_at: dt.datetime

    @classmethod
    def from_row(cls, row: Any) -> ProtocolRow:
        """Build from a _System_ConnectorProjectionProtocol result row."""
        return cls(
            pack_install_id=row.PackInstallId,
            protocol_version=int(row.ProtocolVersion),
            legacy_max_ordinal=int(row.LegacyMaxOrdinal),
            origin=row.Origin,
            audit_report=row.AuditReport,
            created_at=row.CreatedAt,
        )


def validate_namespace(namespace: str) -> str:
    """A namespace is printable text and never ``*``, which names every pack of a namespace."""
    validate_text("namespace", namespace, NAMESPACE_LENGTH)
    if namespace == NAMESPACE_SCOPE:
        raise InvalidArgument("namespace may not be '*'", field="namespace")
    return namespace


def validate_pack_id(pack_install_id: str) -> str:
    """Refuse an empty or malformed pack_install_id before touching the database."""
    return validate_text("pack_install_id", pack_install_id, PACK_ID_LENGTH)


def install_pack(
    engine: Engine, namespace: str, pack_name: str, pack_version: str, clock: DatabaseClock = DATABASE_CLOCK
) -> PackInstallRow:
    """Create a new incarnation (``pk-`` + 32 hex digits) with LastOrdinal 0 and no protocol row.

    A reinstall of the same pack is another incarnation with its own ordinals and protocol.
    The install writes its namespace's NamespaceControl row, as arming a namespace fence does,
    so a fence armed concurrently on another node of a multi-primary engine covers the new
    pack (decision 107, amendment).
    """
    validate_namespace(namespace)
    validate_text("pack_name", pack_name, PACK_NAME_LENGTH)
    validate_text("pack_version", pack_version, PACK_VERSION_LENGTH)
    pack_install_id = PACK_ID_PREFIX + uuid.uuid4().hex
    row = {
        "PackInstallId": pack_install_id,
        "Namespace": namespace,
        "PackName": pack_name,
        "PackVersion": pack_version,
        "LastOrdinal": 0,
        "WorkItemHandoffAt": None,
        "CreatedAt": clock.now(),  # evaluated by the INSERT
    }

    def insert(connection: Connection) -> PackInstallRow:
        queries.pack_insert(connection, row)
        queries.namespace_control_bump(connection, namespace)
        return pack_get(connection, pack_install_id)

    return run_transaction(engine, insert, name="install pack")


def pack_get(connection: Connection, pack_install_id: str, *, lock: bool = False) -> PackInstallRow:
    """The pack incarnation, optionally under its row lock; raises ``UnknownPack``."""
    row = queries.pack_get(connection, validate_pack_id(pack_install_id), lock=lock)
    if row is None:
        raise UnknownPack(f"pack_install_id {pack_install_id!r} is not installed", field="pack_install_id")
    return PackInstallRow.from_row(row)


def protocol_read(connection: Connection, pack_install_id: str) -> ProtocolRow | None:
    """The pack's protocol row, or None (primary key read)."""
    row = queries.protocol_get(connection, pack_install_id)
    return None if row is None else ProtocolRow.from_row(row)


def protocol_write(
    connection: Connection,
    *,
    pack_install_id: str,
    legacy_max_ordinal: int,
    origin: str,
    audit_report: str | None,
    now: dt.datetime,
) -> tuple[ProtocolRow, bool]:
    """Insert the pack's protocol row; return (the row, True) or (the existing row, False).

    Callers hold the pack lock, so on one server a competing insert cannot commit first. On a
    multi-primary engine the lock holds on its own node only: the other node's insert, applied
    here, either aborts this transaction (a deadlock error) or makes the primary key refuse
    ours; callers run with ``unique_keys_conflict`` so ``run_transaction`` runs either again,
    and the next attempt returns the winner's row unchanged. No savepoint: a transaction that
    Galera aborted has none left to roll back to (error 1305 would hide the conflict; decision
    183). The cutoff is never advanced.

    A written row also bumps the pack's ``ControlVersion``: the cutoff is the pack's
    LastOrdinal as this transaction read it, and every admission that allocates an ordinal
    (the legacy runtime's included) writes that row, so on a multi-primary engine an
    admission that read no protocol row cannot commit beside it (decision 107).
    """
    existing = protocol_read(connection, pack_install_id)
    if existing is not None:
        return existing, False
    queries.protocol_insert(
        connection,
        {
            "PackInstallId": pack_install_id,
            "ProtocolVersion": PROTOCOL_VERSION,
            "LegacyMaxOrdinal": legacy_max_ordinal,
            "Origin": origin,
            "AuditReport": audit_report,
            "CreatedAt": now,
        },
    )
    if queries.packs_control_version_bump(connection, pack_install_ids=[pack_install_id]) != 1:
        raise RuntimeError(f"pack {pack_install_id} changed under its row lock")
    written = protocol_read(connection, pack_install_id)
    if written is None:  # inserted in this transaction
        raise RuntimeError(f"the protocol row of {pack_install_id} vanished inside the transaction that wrote it")
    return written, True


def activate_pack(
    engine: Engine, pack_install_id: str, clock: DatabaseClock = DATABASE_CLOCK
) -> tuple[ProtocolRow, bool]:
    """Greenfield activation: protocol 1 with LegacyMaxOrdinal 0, in its own transaction.

    Returns (row, already_active). An existing row (greenfield or cutover) is returned
    unchanged with ``already_active`` True. A pack with any Event, WorkItem or allocated
    ordinal has old-protocol history and is refused with ``PackHasHistory``: it needs the
    audited cutover instead. Raises ``UnknownPack``.
    """

    def activate(connection: Connection) -> tuple[ProtocolRow, bool]:
        pack = pack_get(connection, pack_install_id, lock=True)
        existing = protocol_read(connection, pack.pack_install_id)
        if existing is not None:
            return existing, True
        if pack.last_ordinal > 0 or queries.pack_history_exists(connection, pack.pack_install_id):
            raise PackHasHistory(
                f"pack {pack.pack_install_id} has old-protocol history (last ordinal {pack.last_ordinal}); "
                "greenfield activation would hide it: drain it and run connector-projection-cutover instead",
                field="pack_install_id",
            )
        row, written = protocol_write(
            connection,
            pack_install_id=pack.pack_install_id,
            legacy_max_ordinal=0,
            origin=ORIGIN_GREENFIELD,
            audit_report=None,
            now=clock.read(connection),
        )
        return row, not written

    return run_transaction(engine, activate, name="activate pack", unique_keys_conflict=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PackDescription:
    """A pack incarnation and its protocol row (None: not activated or not cut over yet)."""

    pack: PackInstallRow
    protocol: ProtocolRow | None

    @property
    def protocol_state(self) -> str:
        """``none``, ``greenfield`` or ``cutover``."""
        return self.protocol.origin if self.protocol is not None else PROTOCOL_STATE_NONE


def get_pack(engine: Engine, pack_install_id: str) -> PackDescription:
    """One incarnation with its ordinal counter and protocol row; raises ``UnknownPack``. Read-only."""
    with engine.connect() as connection:
        pack = pack_get(connection, pack_install_id)
        return PackDescription(pack=pack, protocol=protocol_read(connection, pack.pack_install_id))


def find_packs(engine: Engine, namespace: str, pack_name: str, pack_version: str) -> list[PackInstallRow]:
    """The incarnations of a pack by namespace, name and version, newest first (at most ``FIND_LIMIT``).

    Empty when none matches: a reinstall makes another incarnation of the same name and
    version, so callers that need one decide what several mean (the Integration host refuses).
    """
    validate_namespace(namespace)
    validate_text("pack_name", pack_name, PACK_NAME_LENGTH)
    validate_text("pack_version", pack_version, PACK_VERSION_LENGTH)
    with engine.connect() as connection:
        rows = queries.packs_by_name(connection, namespace, pack_name, pack_version, FIND_LIMIT)
    found = sorted((PackInstallRow.from_row(row) for row in rows), key=lambda p: p.pack_install_id)
    return sorted(found, key=lambda p: p.created_at, reverse=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PackPage:
    """One page of ``list_packs``: incarnations with their protocol state, and where the next starts."""

    packs: tuple[tuple[PackInstallRow, str], ...]  # (incarnation, protocol state)
    next_page_token: str  # the last pack id of this page; empty on the last page


def list_packs(engine: Engine, namespace: str = "", page_size: int = 0, page_token: str = "") -> PackPage:
    """One page of pack incarnations by pack id, of ``namespace`` (empty: every namespace). Read-only.

    ``page_size`` 0 means ``LIST_PAGE_SIZE``; more than ``LIST_PAGE_MAX`` is refused. The page
    token is the last pack id of the previous page.
    """
    if namespace:
        validate_namespace(namespace)
    if not 0 <= page_size <= LIST_PAGE_MAX:
        raise InvalidArgument(f"page_size must be 0..{LIST_PAGE_MAX}", field="page_size")
    if len(page_token) > PACK_ID_LENGTH:
        raise InvalidArgument("page_token is not one this service gave", field="page_token")
    size = page_size or LIST_PAGE_SIZE
    with engine.connect() as connection:
        rows = queries.packs_page(connection, namespace, page_token, size)
    packs = tuple((PackInstallRow.from_row(row), row.Origin or PROTOCOL_STATE_NONE) for row in rows)
    return PackPage(packs=packs, next_page_token=packs[-1][0].pack_install_id if len(packs) == size else "")


def get_protocol(engine: Engine, pack_install_id: str) -> ProtocolRow | None:
    """The pack's protocol row, or None when not written yet; raises ``UnknownPack``."""
    with engine.connect() as connection:
        pack = pack_get(connection, pack_install_id)
        return protocol_read(connection, pack.pack_install_id)
