"""The canonical schema, at the newest version, as SQLAlchemy Core tables.

Names are canonical (see docs/design.md) and PascalCase. Every string column compares
byte-for-byte (``utf8mb4_bin`` on MySQL/TiDB; SQLite's default BINARY), so keys that differ
only in case or accents never collide. Every index says which query it serves.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import mysql
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.compiler import DDLCompiler

from workqueue.identity import FIELD_MAX_LENGTHS, PROJECTION_KEY_MAX_LENGTH

# The identifier lengths come from workqueue.limits, which the RPC runtime enforces on requests.
from workqueue.limits import (
    FENCE_ID_LENGTH,
    LEASE_TOKEN_LENGTH,
    PACK_NAME_LENGTH,
    PACK_VERSION_LENGTH,
    WORKER_ID_LENGTH,
)
from workqueue.limits import NAMESPACE_LENGTH as NAMESPACE_LENGTH
from workqueue.limits import PACK_ID_LENGTH as PACK_ID_LENGTH
from workqueue.limits import RECEIPT_KEY_LENGTH as RECEIPT_KEY_LENGTH
from workqueue.limits import WORK_ID_LENGTH as WORK_ID_LENGTH

metadata = sa.MetaData()

MYSQL_TABLE_OPTIONS: dict[str, Any] = {
    "mysql_charset": "utf8mb4",
    "mysql_collate": "utf8mb4_bin",
    "mysql_engine": "InnoDB",
}

STATUS_LENGTH = 16

# Every primary key is TiDB's clustered index: rows are stored in key order, so a table read by
# its key prefix (a pack's Events by ordinal) is one range and keyset orders ending in the key
# need no sort, and WorkItem's random WorkIds spread its writes. TiDB's comment
# syntax: MariaDB and MySQL ignore it (InnoDB clusters by the primary key anyway).
TIDB_CLUSTERED = "/*T![clustered_index] CLUSTERED */"


@compiles(sa.PrimaryKeyConstraint, "mysql")
@compiles(sa.PrimaryKeyConstraint, "mariadb")
def _clustered_primary_key(constraint: sa.PrimaryKeyConstraint, compiler: DDLCompiler, **kw: Any) -> str:
    text = compiler.visit_primary_key_constraint(constraint, **kw)
    return f"{text} {TIDB_CLUSTERED}" if text else text


def Timestamp() -> sa.types.TypeEngine[Any]:
    """Naive UTC timestamp with microseconds on every backend."""
    return sa.DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")


def Payload() -> sa.types.TypeEngine[bytes]:
    """Opaque payload bytes, up to 16 MiB on MySQL."""
    return sa.LargeBinary().with_variant(mysql.MEDIUMBLOB(), "mysql", "mariadb")


PackInstall = sa.Table(
    "PackInstall",
    metadata,
    sa.Column("PackInstallId", sa.String(PACK_ID_LENGTH), primary_key=True),
    sa.Column("Namespace", sa.String(NAMESPACE_LENGTH), nullable=False),
    sa.Column("PackName", sa.String(PACK_NAME_LENGTH), nullable=False),
    sa.Column("PackVersion", sa.String(PACK_VERSION_LENGTH), nullable=False),
    # The per-pack ordinal counter: the last ordinal allocated. Admission and replay lock this
    # row, so ordinals are allocated in commit order and never reused (never AUTO_INCREMENT).
    sa.Column("LastOrdinal", sa.BigInteger, nullable=False, server_default="0"),
    # When the pack's execution became driven by WorkItems alone (the prior v2 handoff).
    sa.Column("WorkItemHandoffAt", Timestamp(), nullable=True),
    sa.Column("CreatedAt", Timestamp(), nullable=False),
    # Added by schema v4. Counts the Controlplane changes an admission decides from: arming or
    # disarming a fence that covers the pack, adding or removing its override, writing its
    # protocol row. Each bumps it, so the change writes the row every admission that allocates
    # ordinals writes (LastOrdinal): on a multi-primary engine the two conflict at commit
    # instead of an admission committing on a stale fence or protocol read (decision 107).
    # NULL until the first change (rows of schema v3).
    sa.Column("ControlVersion", sa.BigInteger, nullable=True),
    # Lists the packs of a namespace (fences, drain, dashboards).
    sa.Index("ix_packinstall_namespace", "Namespace"),
    **MYSQL_TABLE_OPTIONS,
)

# Added by schema v6: one row per namespace that has had a pack installed or a namespace
# fence armed or disarmed. Each of those writes (inserts or bumps) the row, so on a
# multi-primary engine installing a pack and arming a namespace fence conflict at commit: the
# fence's retry then sees, and bumps, the new pack (decision 107, amendment).
NamespaceControl = sa.Table(
    "NamespaceControl",
    metadata,
    sa.Column("Namespace", sa.String(NAMESPACE_LENGTH), primary_key=True),
    sa.Column("ControlVersion", sa.BigInteger, nullable=False),
    **MYSQL_TABLE_OPTIONS,
)

NAMESPACE_SCOPE = "*"  # AdmissionFence.Scope of a fence on a whole namespace

AdmissionFence = sa.Table(
    "AdmissionFence",
    metadata,
    sa.Column("FenceId", sa.String(FENCE_ID_LENGTH), primary_key=True),
    sa.Column("Namespace", sa.String(NAMESPACE_LENGTH), nullable=False),
    # NAMESPACE_SCOPE ("*") for the whole namespace, else one PackInstallId.
    sa.Column("Scope", sa.String(PACK_ID_LENGTH), nullable=False),
    sa.Column("ExpiresAt", Timestamp(), nullable=True),  # NULL: never expires
    sa.Column("Reason", sa.String(255), nullable=False, server_default=""),
    sa.Column("CreatedAt", Timestamp(), nullable=False),
    # The admission fence check: fences of (namespace, '*') and (namespace, pack).
    sa.Index("ix_admissionfence_scope", "Namespace", "Scope"),
    **MYSQL_TABLE_OPTIONS,
)

AdmissionFenceOverride = sa.Table(
    "AdmissionFenceOverride",
    metadata,
    sa.Column("FenceId", sa.String(FENCE_ID_LENGTH), primary_key=True),
    sa.Column("PackInstallId", sa.String(PACK_ID_LENGTH), primary_key=True),
    sa.Column("ExpiresAt", Timestamp(), nullable=True),  # NULL: until removed
    sa.Column("CreatedAt", Timestamp(), nullable=False),
    # The admission fence check: active overrides of one pack.
    sa.Index("ix_admissionfenceoverride_pack", "PackInstallId"),
    **MYSQL_TABLE_OPTIONS,
)

IngressReceipt = sa.Table(
    "IngressReceipt",
    metadata,
    sa.Column("PackInstallId", sa.String(PACK_ID_LENGTH), primary_key=True),
    sa.Column("ReceiptKey", sa.String(RECEIPT_KEY_LENGTH), primary_key=True),
    sa.Column("ProjectionKey", sa.String(PROJECTION_KEY_MAX_LENGTH), nullable=False),
    sa.Column("PayloadHash", sa.String(64), nullable=False),  # sha256 hex
    sa.Column("Payload", Payload(), nullable=False),
    sa.Column("SourceTime", Timestamp(), nullable=True),
    sa.Column("State", sa.String(STATUS_LENGTH), nullable=False),
    sa.Column("ReceivedAt", Timestamp(), nullable=False),
    sa.Column("ConfirmedAt", Timestamp(), nullable=True),
    # The materializer scan and operator lists: receipts of a pack in one state, oldest first.
    sa.Index("ix_ingressreceipt_state", "State", "PackInstallId", "ReceivedAt"),
    **MYSQL_TABLE_OPTIONS,
)

Event = sa.Table(
    "Event",
    metadata,
    sa.Column("PackInstallId", sa.String(PACK_ID_LENGTH), primary_key=True),
    # Positive and unique per pack; legacy history may hold ordinal 0 (at most one per pack).
    sa.Column("EnqueueOrdinal", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("ProjectionKey", sa.String(PROJECTION_KEY_MAX_LENGTH), nullable=False),
    # NULL for replay Events, which no delivery produced.
    sa.Column("ReceiptKey", sa.String(RECEIPT_KEY_LENGTH), nullable=True),
    sa.Column("PayloadHash", sa.String(64), nullable=False),
    # Empty for an Event whose payload is in EventPayload (PayloadBytes set): from schema v8 a
    # status change writes a small row, never the payload. Kept NOT NULL, and
    # holding the payload of Events admitted before v8 was copied (PayloadBytes NULL): a
    # release older than v8 still reads and writes it while the schema moves.
    sa.Column("Payload", Payload(), nullable=False),
    sa.Column("SourceTime", Timestamp(), nullable=True),  # recorded, never used for membership
    sa.Column("Status", sa.String(STATUS_LENGTH), nullable=False),
    sa.Column("IsReplay", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("CreatedAt", Timestamp(), nullable=False),
    # Added by schema v8. The length of the payload in EventPayload, so byte budgets (LoadInputs
    # pages) size members without reading a payload. NULL: the payload is still in Event.Payload
    # (admitted by a release older than v8 after the v8 copy passed it).
    sa.Column("PayloadBytes", sa.BigInteger, nullable=True),
    # Duplicate detection: the Event of a receipt.
    sa.Index("uq_event_receipt", "PackInstallId", "ReceiptKey", unique=True),
    # The source-lane index: payload range reads and audit scans per identity.
    sa.Index("ix_event_source_lane", "PackInstallId", "ProjectionKey", "EnqueueOrdinal"),
    **MYSQL_TABLE_OPTIONS,
)

# Added by schema v8 (decision 126): the payload of an Event, written once by the admission
# (or replay) that inserts the Event, never updated, deleted with its Event. Keyed (clustered)
# like Event, so a page of members is one range of each table.
EventPayload = sa.Table(
    "EventPayload",
    metadata,
    sa.Column("PackInstallId", sa.String(PACK_ID_LENGTH), primary_key=True),
    sa.Column("EnqueueOrdinal", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("Payload", Payload(), nullable=False),
    **MYSQL_TABLE_OPTIONS,
)

WorkItem = sa.Table(
    "WorkItem",
    metadata,
    sa.Column("WorkId", sa.String(WORK_ID_LENGTH), primary_key=True),
    sa.Column("PackInstallId", sa.String(PACK_ID_LENGTH), nullable=False),
    sa.Column("ProjectionKey", sa.String(PROJECTION_KEY_MAX_LENGTH), nullable=False),
    sa.Column("WorkType", sa.String(FIELD_MAX_LENGTHS["work_type"]), nullable=False),
    # Added by schema v2. NULL marks old-protocol work whose coverage was inferred.
    sa.Column("InputStartOrdinal", sa.BigInteger, nullable=True),
    # Inclusive upper bound and the selected Event's ordinal.
    sa.Column("LaneOrdinal", sa.BigInteger, nullable=False),
    sa.Column("ReplayOfWorkId", sa.String(WORK_ID_LENGTH), nullable=True),
    sa.Column("Status", sa.String(STATUS_LENGTH), nullable=False),
    sa.Column("Attempt", sa.Integer, nullable=False, server_default="0"),
    sa.Column("MaxAttempts", sa.Integer, nullable=False),
    # When the row becomes claimable: creation or unblock (pending), NextAttemptAt (retry) or
    # lease expiry (processing). NULL while blocked or terminal.
    sa.Column("ClaimableAt", Timestamp(), nullable=True),
    sa.Column("LeaseOwner", sa.String(WORKER_ID_LENGTH), nullable=True),
    sa.Column("LeaseToken", sa.String(LEASE_TOKEN_LENGTH), nullable=True),
    sa.Column("LeaseExpiresAt", Timestamp(), nullable=True),
    sa.Column("LastError", sa.Text, nullable=True),
    sa.Column("CreatedAt", Timestamp(), nullable=False),
    sa.Column("FinishedAt", Timestamp(), nullable=True),
    # Added by schema v3. The generation admitted (or replayed) behind this one while it was not
    # terminal, written by that admission: the predecessor row is what the blocking decision and
    # the completion both write, so on a multi-primary engine they conflict instead of leaving
    # the successor blocked forever (decision 106); completion unblocks it by primary key.
    sa.Column("SuccessorWorkId", sa.String(WORK_ID_LENGTH), nullable=True),
    # Added by schema v5. The number of Events of the identity in [InputStartOrdinal,
    # LaneOrdinal] when the generation was first claimed (its range is frozen from then on),
    # written by the claim's lease UPDATE; LoadInputs answers DATA_LOSS when fewer remain.
    # NULL until claimed, and for rows claimed before v5.
    sa.Column("ClaimedMemberCount", sa.BigInteger, nullable=True),
    # Added by schema v11. The number of members the admissions that created and extended the
    # generation gave it, and the pack ordinal that number counts through (the last ordinal of
    # the admission that wrote it): written by the admission's (or replay's) own INSERT and
    # extension UPDATE, so a member lost before the first claim is seen. The
    # count is trusted only while LaneOrdinal <= AdmittedThroughOrdinal (``member_counts``): a
    # release that knows only v10 extends the range without touching either column. NULL for
    # rows from before v11.
    sa.Column("AdmittedMemberCount", sa.BigInteger, nullable=True),
    sa.Column("AdmittedThroughOrdinal", sa.BigInteger, nullable=True),
    # Added by schema v14 (decision 174). A replay of a dead letter under the "block" policy:
    # the held generation it runs before. Such a replay is claimable at once; the held
    # generation stays held until it completes (or is skipped); admission never extends it
    # nor links a successor behind it, and it is nobody's predecessor. NULL for every other.
    sa.Column("RunsBeforeWorkId", sa.String(WORK_ID_LENGTH), nullable=True),
    # Added by schema v14 (decision 175). When the current (or last) attempt's lease was
    # taken, written by the claim's lease UPDATE: an attempt's start in its history.
    sa.Column("ClaimedAt", Timestamp(), nullable=True),
    # Added by schema v15 (decision 185). A generation of a Flow version's track
    # (FlowVersionTrack): the companion version it runs, and the projection key of its members,
    # the inputs as they were delivered (its own ProjectionKey names the version). NULL for a
    # generation of the inputs' own key. BuildRun true: it runs in a build, where the Flow writes
    # its read model only, no side effects (the inputs ran live in another version).
    sa.Column("FlowVersion", sa.String(FIELD_MAX_LENGTHS["companion_version"]), nullable=True),
    sa.Column("InputKey", sa.String(PROJECTION_KEY_MAX_LENGTH), nullable=True),
    sa.Column("BuildRun", sa.Boolean, nullable=True),  # NULL: live
    # The projection-order index: newest generation of an identity, coverage probes,
    # successor lookup on completion.
    sa.Index("ix_workitem_projection_order", "PackInstallId", "ProjectionKey", "LaneOrdinal"),
    # Claim candidates and drain counts: claimable rows of a pack by status, oldest first.
    sa.Index("ix_workitem_claim", "PackInstallId", "Status", "ClaimableAt"),
    # Replay conflict fence: the replays of one WorkId. On SQLite partial since schema v13: with
    # the NULLs of every generation that is not a replay in it, SQLite's ANALYZE rates a seek as
    # reading the whole table and walks the primary key instead.
    sa.Index("ix_workitem_replay_of", "ReplayOfWorkId", sqlite_where=sa.column("ReplayOfWorkId").is_not(None)),
    # Added by schema v7. Retention candidates: a pack's terminal generations of one status,
    # oldest finished first.
    sa.Index("ix_workitem_retention", "PackInstallId", "Status", "FinishedAt"),
    # Added by schema v14. The replays that run before a held generation (decision 174);
    # partial on SQLite for the reason of ix_workitem_replay_of.
    sa.Index("ix_workitem_runs_before", "RunsBeforeWorkId", sqlite_where=sa.column("RunsBeforeWorkId").is_not(None)),
    **MYSQL_TABLE_OPTIONS,
)

ConnectorProjectionProtocol = sa.Table(
    "_System_ConnectorProjectionProtocol",
    metadata,
    sa.Column("PackInstallId", sa.String(PACK_ID_LENGTH), primary_key=True),
    sa.Column("ProtocolVersion", sa.Integer, nullable=False),
    # Last input admitted under the old protocol; 0 for a greenfield pack. Written once.
    sa.Column("LegacyMaxOrdinal", sa.BigInteger, nullable=False),
    sa.Column("Origin", sa.String(16), nullable=False),  # "greenfield" or "cutover"
    sa.Column("AuditReport", sa.Text, nullable=True),  # JSON of the cutover audit
    sa.Column("CreatedAt", Timestamp(), nullable=False),
    **MYSQL_TABLE_OPTIONS,
)

# Added by schema v7 (decision 123): one row per pack that has had a retention policy. Written
# by Connectors only: the operator's policy, and by every pruning transaction the pack's
# retention horizon, so a policy change and a pruning decision conflict on this row.
RetentionPolicy = sa.Table(
    "RetentionPolicy",
    metadata,
    sa.Column("PackInstallId", sa.String(PACK_ID_LENGTH), primary_key=True),
    # Generations of each identity to keep, newest first (the newest is kept whatever this
    # says); NULL: no count limit. Retention is off when both limits are NULL.
    sa.Column("KeepGenerations", sa.Integer, nullable=True),
    # Terminal generations finished less than this long ago are kept (seconds); NULL: no age limit.
    sa.Column("KeepSeconds", sa.BigInteger, nullable=True),
    # The retention horizon: the highest LaneOrdinal of a generation pruned so far; 0 before
    # the first. Like LegacyMaxOrdinal it only records a boundary: it never moves back, and
    # the ordinal counter (PackInstall.LastOrdinal) is never touched by pruning.
    sa.Column("HorizonOrdinal", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("PrunedGenerations", sa.BigInteger, nullable=False, server_default="0"),
    sa.Column("LastPrunedAt", Timestamp(), nullable=True),
    sa.Column("UpdatedAt", Timestamp(), nullable=False),
    # Added by schema v9 (decision 127): the duplicate window in seconds (NULL: tombstones are
    # kept forever). With it every delivery must carry SourceTime, and tombstones whose
    # SourceTime is older than the database clock minus the window expire.
    sa.Column("DuplicateWindowSeconds", sa.BigInteger, nullable=True),
    # The newest SourceTime of an expired tombstone (NULL before the first); never moves back.
    # A delivery of an unknown key at or below it is answered expired, never admitted.
    sa.Column("HorizonSourceTime", Timestamp(), nullable=True),
    # Tombstones expired so far (their inputs leave no other record).
    sa.Column("ExpiredReceipts", sa.BigInteger, nullable=False, server_default="0"),
    **MYSQL_TABLE_OPTIONS,
)

# Added by schema v7: the compact record of a pruned generation, so that replay and GetWork
# of its WorkId answer "pruned at ..." instead of "unknown".
PrunedWork = sa.Table(
    "PrunedWork",
    metadata,
    sa.Column("WorkId", sa.String(WORK_ID_LENGTH), primary_key=True),
    sa.Column("PackInstallId", sa.String(PACK_ID_LENGTH), nullable=False),
    sa.Column("ProjectionKey", sa.String(PROJECTION_KEY_MAX_LENGTH), nullable=False),
    sa.Column("InputStartOrdinal", sa.BigInteger, nullable=False),
    sa.Column("LaneOrdinal", sa.BigInteger, nullable=False),
    sa.Column("Status", sa.String(STATUS_LENGTH), nullable=False),
    sa.Column("FinishedAt", Timestamp(), nullable=True),
    # The lease that finished it, kept for audits (which completion counted).
    sa.Column("LeaseToken", sa.String(LEASE_TOKEN_LENGTH), nullable=True),
    sa.Column("LeaseExpiresAt", Timestamp(), nullable=True),
    sa.Column("PrunedAt", Timestamp(), nullable=False),
    # Added by schema v9: the newest SourceTime of the members pruned with the record (NULL when
    # one has none); the record expires with the duplicate window once that is old enough.
    sa.Column("SourceTime", Timestamp(), nullable=True),
    sa.Index("ix_prunedwork_source_time", "PackInstallId", "SourceTime"),
    # Added by schema v12: one identity's pruned ranges, for its coverage proof (decision 161).
    sa.Index("ix_prunedwork_identity", "PackInstallId", "ProjectionKey", "LaneOrdinal"),
    **MYSQL_TABLE_OPTIONS,
)

# Added by schema v7: the tombstone of a pruned input's receipt (no payload), so that a
# duplicate delivery of it is acknowledged as pruned: never admitted again, never
# coverage_missing. Written in the transaction that deletes the receipt.
PrunedReceipt = sa.Table(
    "PrunedReceipt",
    metadata,
    sa.Column("PackInstallId", sa.String(PACK_ID_LENGTH), primary_key=True),
    sa.Column("ReceiptKey", sa.String(RECEIPT_KEY_LENGTH), primary_key=True),
    sa.Column("EnqueueOrdinal", sa.BigInteger, nullable=False),
    sa.Column("PayloadHash", sa.String(64), nullable=False),
    sa.Column("WorkId", sa.String(WORK_ID_LENGTH), nullable=False),  # the PrunedWork it was a member of
    sa.Column("PrunedAt", Timestamp(), nullable=False),
    # Added by schema v9: the input's SourceTime, copied from its Event; tombstones expire by it,
    # oldest first, along this index.
    sa.Column("SourceTime", Timestamp(), nullable=True),
    sa.Index("ix_prunedreceipt_source_time", "PackInstallId", "SourceTime"),
    **MYSQL_TABLE_OPTIONS,
)

# Added by schema v10 (decision 130): the payload contract, a one-way flag. Its one row
# (Contract = PAYLOAD_CONTRACT) says that no release older than v8 serves the database, so
# Connectors stores an admitted payload only in EventPayload and a status change empties an
# old copy in Event.Payload; without it Connectors keeps a copy there for those releases.
# Set by ApplySchema on an empty database, otherwise by the operator after the roll.
PAYLOAD_CONTRACT = "event_payload_elsewhere"
PayloadContract = sa.Table(
    "_System_PayloadContract",
    metadata,
    sa.Column("Contract", sa.String(64), primary_key=True),
    sa.Column("SetAt", Timestamp(), nullable=False),  # the database clock
    sa.Column("SetBy", sa.String(255), nullable=False),  # what set it: ApplySchema, or the operator RPC's caller
    **MYSQL_TABLE_OPTIONS,
)

# Added by schema v12 (decision 158): an operator's pause of claims on one scope of a pack:
# the whole pack, one identity (ScopeValue: its ProjectionKey) or one work type (ScopeValue:
# the WorkType). Admission goes on; claims lease nothing of a scope with an active pause
# (ResumedAt NULL and ExpiresAt NULL or after the database clock). A resume writes ResumedAt
# and ResumedBy; rows are never deleted, so every pause stays recorded.
ClaimPause = sa.Table(
    "ClaimPause",
    metadata,
    sa.Column("PauseId", sa.String(WORK_ID_LENGTH), primary_key=True),
    sa.Column("PackInstallId", sa.String(PACK_ID_LENGTH), nullable=False),
    sa.Column("Scope", sa.String(16), nullable=False),  # "pack", "identity" or "work_type"
    sa.Column("ScopeValue", sa.String(PROJECTION_KEY_MAX_LENGTH), nullable=False),  # "" for the pack
    sa.Column("PausedBy", sa.String(255), nullable=False),
    sa.Column("Reason", sa.Text, nullable=False),
    sa.Column("PausedAt", Timestamp(), nullable=False),  # the database clock
    sa.Column("ExpiresAt", Timestamp(), nullable=True),  # NULL: until resumed
    sa.Column("ResumedAt", Timestamp(), nullable=True),
    sa.Column("ResumedBy", sa.String(255), nullable=True),
    # The claim's pause probes (served packs, and each candidate's identity and work type) and
    # the active pause of a scope that pause and resume look up.
    sa.Index("ix_claimpause_scope", "PackInstallId", "Scope", "ScopeValue"),
    # The claim's check, with the served packs, whether a pack has any pause not resumed.
    sa.Index("ix_claimpause_active", "PackInstallId", "ResumedAt"),
    **MYSQL_TABLE_OPTIONS,
)

# Added by schema v12 (decision 160): a pack's order policy, what a generation that failed for
# good means for its identity's successors. "block": the claim holds back the next generation
# of its identity until it is replayed or skipped; "continue": they run, and the failed range
# stays listed for replay. No row: the default, "continue".
OrderPolicy = sa.Table(
    "OrderPolicy",
    metadata,
    sa.Column("PackInstallId", sa.String(PACK_ID_LENGTH), primary_key=True),
    sa.Column("Policy", sa.String(16), nullable=False),
    sa.Column("SetBy", sa.String(255), nullable=False),
    sa.Column("Reason", sa.Text, nullable=False),
    sa.Column("SetAt", Timestamp(), nullable=False),  # the database clock
    **MYSQL_TABLE_OPTIONS,
)

# Added by schema v13 (decision 165): the order policy of one work type of a pack, which
# overrides the pack's (OrderPolicy) for that type's generations. A generation's effective
# policy is its work type's row, else its pack's, else "continue". Keyed (clustered) by the
# pair the claim probes per candidate row. Rows are rewritten in place, never deleted.
WorkTypeOrderPolicy = sa.Table(
    "WorkTypeOrderPolicy",
    metadata,
    sa.Column("PackInstallId", sa.String(PACK_ID_LENGTH), primary_key=True),
    sa.Column("WorkType", sa.String(FIELD_MAX_LENGTHS["work_type"]), primary_key=True),
    sa.Column("Policy", sa.String(16), nullable=False),
    sa.Column("SetBy", sa.String(255), nullable=False),
    sa.Column("Reason", sa.Text, nullable=False),
    sa.Column("SetAt", Timestamp(), nullable=False),  # the database clock
    **MYSQL_TABLE_OPTIONS,
)

# Added by schema v12 (decision 160): an operator's explicit skip of a generation that failed
# for good: it stays failed (no status is rewritten), leaves the dead-letter queue and no
# longer holds its identity's successors under the "block" policy. Never deleted.
SkippedWork = sa.Table(
    "SkippedWork",
    metadata,
    sa.Column("WorkId", sa.String(WORK_ID_LENGTH), primary_key=True),
    sa.Column("PackInstallId", sa.String(PACK_ID_LENGTH), nullable=False),
    sa.Column("SkippedBy", sa.String(255), nullable=False),
    sa.Column("Reason", sa.Text, nullable=False),
    sa.Column("SkippedAt", Timestamp(), nullable=False),  # the database clock
    **MYSQL_TABLE_OPTIONS,
)

# Added by schema v14 (decision 175): an operator's retry policy of one work type of a pack:
# attempts before a generation fails for good and the exponential backoff between them. A
# work type without a row has Connectors' settings (NEXUSCRM_MAX_ATTEMPTS, ...).
WorkTypeRetryPolicy = sa.Table(
    "WorkTypeRetryPolicy",
    metadata,
    sa.Column("PackInstallId", sa.String(PACK_ID_LENGTH), primary_key=True),
    sa.Column("WorkType", sa.String(FIELD_MAX_LENGTHS["work_type"]), primary_key=True),
    sa.Column("MaxAttempts", sa.Integer, nullable=False),
    sa.Column("RetryBaseSeconds", sa.Integer, nullable=False),
    sa.Column("RetryMaxSeconds", sa.Integer, nullable=False),
    sa.Column("SetBy", sa.String(255), nullable=False),
    sa.Column("Reason", sa.Text, nullable=False),
    sa.Column("SetAt", Timestamp(), nullable=False),  # the database clock
    **MYSQL_TABLE_OPTIONS,
)

# Added by schema v14 (decision 175): one attempt of a generation that did not complete it
# (failed, retried later, or lost its lease), written with the attempt's end; the attempt
# that completes a generation is the WorkItem row itself. Error and Traceback are the
# Flow's, bounded, shown to operators only (never logged). Pruned with its generation.
WorkAttempt = sa.Table(
    "WorkAttempt",
    metadata,
    sa.Column("WorkId", sa.String(WORK_ID_LENGTH), primary_key=True),
    sa.Column("Attempt", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("PackInstallId", sa.String(PACK_ID_LENGTH), nullable=False),
    sa.Column("WorkerId", sa.String(WORKER_ID_LENGTH), nullable=False),
    sa.Column("StartedAt", Timestamp(), nullable=True),  # NULL: claimed by a release before v14
    sa.Column("FinishedAt", Timestamp(), nullable=False),
    sa.Column("Outcome", sa.String(16), nullable=False),  # failed, retry, retry_later, expired
    sa.Column("Error", sa.Text, nullable=False),
    sa.Column("Traceback", sa.Text, nullable=True),
    **MYSQL_TABLE_OPTIONS,
)

# Added by schema v15 (decision 185): one Flow version of one work type of a pack, a track of
# generations over the inputs delivered with SourceVersion. The inputs' own version is a track
# too, once any other exists. A track receives every input admitted while CoverThroughOrdinal is
# NULL and covers each identity's inputs from CoverFromOrdinal; CatchUpThroughOrdinal is the
# pack counter its last catch-up covered from history. Live: the track whose Flow acts (at most
# one per work type). RetiredAt: ended, history kept.
FlowVersionTrack = sa.Table(
    "FlowVersionTrack",
    metadata,
    sa.Column("PackInstallId", sa.String(PACK_ID_LENGTH), primary_key=True),
    sa.Column("WorkType", sa.String(FIELD_MAX_LENGTHS["work_type"]), primary_key=True),
    sa.Column("Version", sa.String(FIELD_MAX_LENGTHS["companion_version"]), primary_key=True),
    sa.Column("SourceVersion", sa.String(FIELD_MAX_LENGTHS["companion_version"]), nullable=False),
    sa.Column("Live", sa.Boolean, nullable=False),
    sa.Column("CoverFromOrdinal", sa.BigInteger, nullable=False),
    sa.Column("CoverThroughOrdinal", sa.BigInteger, nullable=True),
    sa.Column("CatchUpThroughOrdinal", sa.BigInteger, nullable=False),
    sa.Column("MaxInputsPerSecond", sa.Integer, nullable=True),  # NULL: unbounded
    sa.Column("VerifiedAgainst", sa.String(FIELD_MAX_LENGTHS["companion_version"]), nullable=True),
    sa.Column("VerifiedThroughOrdinal", sa.BigInteger, nullable=True),
    sa.Column("VerifyOutcome", sa.String(16), nullable=True),  # equal, coverage_only, different
    sa.Column("VerifiedAt", Timestamp(), nullable=True),
    sa.Column("RetiredAt", Timestamp(), nullable=True),
    sa.Column("CreatedAt", Timestamp(), nullable=False),  # the database clock
    **MYSQL_TABLE_OPTIONS,
)

# Added by schema v15 (decision 185): every recorded step of a work type's versions (build,
# verify, switch, rollback, retire), with who, why and the pack counter at the step.
FlowVersionChange = sa.Table(
    "FlowVersionChange",
    metadata,
    sa.Column("ChangeId", sa.String(WORK_ID_LENGTH), primary_key=True),
    sa.Column("PackInstallId", sa.String(PACK_ID_LENGTH), nullable=False),
    sa.Column("WorkType", sa.String(FIELD_MAX_LENGTHS["work_type"]), nullable=False),
    sa.Column("Version", sa.String(FIELD_MAX_LENGTHS["companion_version"]), nullable=False),
    sa.Column("Action", sa.String(16), nullable=False),
    sa.Column("Actor", sa.String(255), nullable=False),
    sa.Column("Reason", sa.Text, nullable=False),
    sa.Column("Forced", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("AtOrdinal", sa.BigInteger, nullable=False),
    sa.Column("ChangedAt", Timestamp(), nullable=False),  # the database clock
    # A work type's history in order.
    sa.Index("ix_flowversionchange_work_type", "PackInstallId", "WorkType", "ChangedAt"),
    **MYSQL_TABLE_OPTIONS,
)

SchemaVersion = sa.Table(
    "_System_SchemaVersion",
    metadata,
    sa.Column("Version", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("Step", sa.String(64), nullable=False),
    sa.Column("AppliedAt", Timestamp(), nullable=False),
    **MYSQL_TABLE_OPTIONS,
)
