"""The one-time, audited cutover of a pack incarnation from the old protocol to protocol 1.

One code path serves the ``connector-projection-cutover`` command and the Cutover and
AuditCutover RPCs. In one transaction, under the namespace lock (the namespace-wide fence
rows) and then the pack lock (its PackInstall row), in this order:

1. an existing protocol row is returned unchanged: repeated and concurrent calls all get the
   same checkpoint, and the cutoff never advances;
2. prerequisite: the pack's WorkItem-only handoff (``PackInstall.WorkItemHandoffAt``) is
   recorded; without it the cutover refuses and never retires Event backlog to fake it;
3. gates: the complete native projection schema; a non-expiring namespace ``*`` fence
   without active overrides; no nonterminal old projection work;
4. the audit of retained responsibility (``audit``);
5. the protocol row: version 1, LegacyMaxOrdinal = the pack's last allocated ordinal,
   Origin ``cutover`` and the audit report as JSON.

No historical Event or WorkItem is updated, marked, deleted or replayed, whatever the
outcome. A dry run stops before step 5.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import math
import time
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

from nexuscrm_controlplane import audit, drain, queries
from nexuscrm_controlplane.audit import Category, CutoverReport, Finding, Progress, Rule, check_deadline
from nexuscrm_controlplane.errors import CutoverRefused
from nexuscrm_controlplane.fences import FenceRow, with_overrides
from nexuscrm_controlplane.lifecycle import (
    ORIGIN_CUTOVER,
    PackInstallRow,
    ProtocolRow,
    pack_get,
    protocol_read,
    protocol_write,
    validate_pack_id,
)
from nexuscrm_runtime.causal import causal_read
from nexuscrm_runtime.clock import DATABASE_CLOCK, DatabaseClock, iso_utc
from nexuscrm_runtime.database import is_sqlite, run_transaction
from nexuscrm_runtime.sqlite_writer import SerializedWriterDialect
from nexuscrm_schema.tables import ConnectorProjectionProtocol, Event, WorkItem
from nexuscrm_schema.verification import NATIVE_PROJECTION, NEWEST_VERSION, current_version, verify_schema

DEFAULT_TIMEOUT = 300.0  # seconds, when an RPC names none
# The pieces of the canonical schema the specification names (docs/design.md, "Vocabulary and
# tables"): a schema that lacks some names them first, ahead of every later version's pieces.
SPECIFICATION_PIECES = frozenset(
    [Event.name, WorkItem.name, ConnectorProjectionProtocol.name]
    + [
        f"{column.table.name}.{column.name}"
        for column in (
            WorkItem.c.WorkId,
            WorkItem.c.InputStartOrdinal,
            WorkItem.c.LaneOrdinal,
            WorkItem.c.ReplayOfWorkId,
            ConnectorProjectionProtocol.c.LegacyMaxOrdinal,
        )
    ]
)
SCHEMA_FIX = "nexuscrm-schema migrate"  # the command that applies the newest schema


class Outcome(enum.StrEnum):
    """How a cutover call ended."""

    WRITTEN = "written"
    ALREADY_WRITTEN = "already_written"
    WOULD_WRITE = "would_write"  # a dry run that passed
    REFUSED_PREREQUISITE = "refused_prerequisite"
    REFUSED_GATE = "refused_gate"
    REFUSED_AUDIT = "refused_audit"


REFUSALS = {
    Category.PREREQUISITE: Outcome.REFUSED_PREREQUISITE,
    Category.GATE: Outcome.REFUSED_GATE,
    Category.AUDIT: Outcome.REFUSED_AUDIT,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class CutoverResult:
    """The outcome, the report behind it and, once written, the checkpoint.

    For ``already_written`` the report is the one stored with the checkpoint, so every
    caller is told the same.
    """

    outcome: Outcome
    report: CutoverReport
    protocol: ProtocolRow | None = None

    @property
    def refused(self) -> bool:
        """True for every refusal outcome."""
        return self.outcome in REFUSALS.values()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (what ``-json`` prints)."""
        protocol = None
        if self.protocol is not None:
            protocol = {
                "pack_install_id": self.protocol.pack_install_id,
                "protocol_version": self.protocol.protocol_version,
                "legacy_max_ordinal": self.protocol.legacy_max_ordinal,
                "origin": self.protocol.origin,
                "created_at": iso_utc(self.protocol.created_at),
            }
        return {"outcome": self.outcome.value, "protocol": protocol, "report": self.report.to_dict()}


def _refused(report: CutoverReport, findings: list[Finding]) -> CutoverResult:
    """The result of the first family of checks that refused."""
    report = dataclasses.replace(report, findings=tuple(findings))
    return CutoverResult(outcome=REFUSALS[findings[0].category], report=report)


def fence_findings(fences: list[FenceRow], clock_now: dt.datetime) -> list[Finding]:
    """Gate findings about the namespace-wide fences; empty when one qualifies.

    A qualifying fence is scoped ``*``, never expires and has no active override. Fences
    scoped to one pack do not qualify: every pack of the namespace must stay fenced.
    """
    active = [f for f in fences if f.active(clock_now)]
    if any(f.expires_at is None and not f.active_overrides(clock_now) for f in active):
        return []
    if not active:
        return [
            Finding(
                rule=Rule.FENCE_MISSING,
                category=Category.GATE,
                count=0,
                sample_ids=(),
                detail="no namespace-wide '*' admission fence is armed; pack-scoped fences do not qualify "
                "(arm one that never expires)",
            )
        ]
    findings = []
    expiring = [f for f in active if f.expires_at is not None]
    if expiring:
        findings.append(
            Finding(
                rule=Rule.FENCE_EXPIRING,
                category=Category.GATE,
                count=len(expiring),
                sample_ids=tuple(f.fence_id for f in expiring[: audit.SAMPLE_LIMIT]),
                detail="the namespace fence expires; the cutover needs one that never does",
            )
        )
    overridden = [f for f in active if f.expires_at is None and f.active_overrides(clock_now)]
    if overridden:
        packs = sorted({o.pack_install_id for f in overridden for o in f.active_overrides(clock_now)})
        findings.append(
            Finding(
                rule=Rule.FENCE_OVERRIDDEN,
                category=Category.GATE,
                count=len(overridden),
                sample_ids=tuple(f.fence_id for f in overridden[: audit.SAMPLE_LIMIT]),
                detail=f"active overrides release packs {', '.join(packs[: audit.SAMPLE_LIMIT])}; remove them",
            )
        )
    return findings


def drain_findings(status: drain.DrainStatus) -> list[Finding]:
    """The gate finding for nonterminal old projection work, if any."""
    if status.drained:
        return []
    return [
        Finding(
            rule=Rule.NONTERMINAL_WORK,
            category=Category.GATE,
            count=status.nonterminal,
            sample_ids=status.sample_work_ids,
            detail=status.summary(),
        )
    ]


def _checkpoint(
    connection: Connection,
    pack_install_id: str,
    *,
    dry_run: bool,
    deadline: float | None,
    progress: Progress | None,
    clock: DatabaseClock,
) -> CutoverResult:
    check_deadline(deadline)
    namespace = pack_get(connection, pack_install_id).namespace
    fences = with_overrides(connection, queries.fences_namespace_lock(connection, namespace))
    pack: PackInstallRow = pack_get(connection, pack_install_id, lock=True)
    existing = protocol_read(connection, pack.pack_install_id)
    if existing is not None:
        return _already_written(existing, pack)
    report = CutoverReport(pack_install_id=pack.pack_install_id, legacy_max_ordinal=pack.last_ordinal)
    if pack.work_item_handoff_at is None:
        return _refused(
            report,
            [
                Finding(
                    rule=Rule.WORK_ITEM_HANDOFF_MISSING,
                    category=Category.PREREQUISITE,
                    count=0,
                    sample_ids=(),
                    detail="the prior WorkItem-only v2 handoff is not recorded for this pack "
                    "(PackInstall.WorkItemHandoffAt); this upgrade does not retire Event backlog to create it",
                )
            ],
        )
    now = clock.read(connection)  # the database's time decides fence expiry and stamps the row
    gates = fence_findings(fences, now) + drain_findings(
        drain.drain_status_read(connection, pack.pack_install_id, clock)
    )
    if gates:
        return _refused(report, gates)
    report = audit.audit_responsibility(
        connection, pack.pack_install_id, pack.last_ordinal, deadline=deadline, progress=progress
    )
    if not report.passed:
        return _refused(report, list(report.findings))
    if dry_run:
        return CutoverResult(outcome=Outcome.WOULD_WRITE, report=report)
    check_deadline(deadline)
    row, written = protocol_write(
        connection,
        pack_install_id=pack.pack_install_id,
        legacy_max_ordinal=pack.last_ordinal,
        origin=ORIGIN_CUTOVER,
        audit_report=report.to_json(),
        now=now,
    )
    if not written:
        return _already_written(row, pack)
    return CutoverResult(outcome=Outcome.WRITTEN, report=report, protocol=row)


def _already_written(row: ProtocolRow, pack: PackInstallRow) -> CutoverResult:
    if row.audit_report:
        report = CutoverReport.from_json(row.audit_report)
    else:  # greenfield activation: nothing was audited
        report = CutoverReport(pack_install_id=pack.pack_install_id, legacy_max_ordinal=row.legacy_max_ordinal)
    return CutoverResult(outcome=Outcome.ALREADY_WRITTEN, report=report, protocol=row)


def schema_finding(missing: list[str], version: int) -> Finding:
    """The gate finding of a schema at ``version`` that lacks ``missing`` (names from ``verify_schema``).

    Its sample names the specification's pieces first, then the others in the checker's order;
    its detail says the versions found and needed and the command that applies the schema.
    """
    ordered = sorted(missing, key=lambda piece: piece not in SPECIFICATION_PIECES)  # stable: checker's order
    return Finding(
        rule=Rule.SCHEMA_INCOMPLETE,
        category=Category.GATE,
        count=len(missing),
        sample_ids=tuple(ordered[: audit.SAMPLE_LIMIT]),
        detail=f"the database's schema is at version {version}, the cutover needs version {NEWEST_VERSION}: "
        f"run `{SCHEMA_FIX}` (or the schema catalog's ApplySchema), then the cutover again",
    )


def run_cutover(
    engine: Engine,
    pack_install_id: str,
    *,
    deadline: float,
    dry_run: bool = False,
    progress: Progress | None = None,
    clock: DatabaseClock = DATABASE_CLOCK,
) -> CutoverResult:
    """Audit a pack and, unless ``dry_run``, write its cutoff once; see the module docstring.

    Refusals are results (``refused``), not exceptions, so callers can report them. Raises
    ``UnknownPack``, ``CutoverTimeout`` once ``deadline`` (a ``time.monotonic`` value) has
    passed (the transaction rolls back: nothing is written), and the database errors of
    ``run_transaction``.
    """
    validate_pack_id(pack_install_id)
    missing = verify_schema(engine, NATIVE_PROJECTION)
    if missing:
        with engine.connect() as connection:
            pack = pack_get(connection, pack_install_id)
            version = current_version(connection)
        report = CutoverReport(pack_install_id=pack.pack_install_id, legacy_max_ordinal=pack.last_ordinal)
        return _refused(report, [schema_finding(missing, version)])
    return run_transaction(
        engine,
        lambda connection: _checkpoint(
            causal_read(connection),  # the audit sees every write acknowledged through any node
            pack_install_id,
            dry_run=dry_run,
            deadline=deadline,
            progress=progress,
            clock=clock,
        ),
        name="cutover",
        unique_keys_conflict=True,  # another node's checkpoint committed first: the next attempt returns it
        max_seconds=None,  # bounded by its own deadline (CutoverTimeout), which the operator chose
    )


def require_written(result: CutoverResult) -> CutoverResult:
    """Return a written (or already written) result; raise ``CutoverRefused`` naming every finding."""
    if result.refused:
        raise CutoverRefused(f"cutover refused ({result.outcome.value}): {result.report.summary()}")
    return result


def bound_lock_waits(engine: Engine, deadline: float) -> None:
    """Make every lock wait of ``engine``'s new connections end by ``deadline`` (``time.monotonic``).

    For a one-shot command: MySQL/TiDB sessions get ``innodb_lock_wait_timeout`` and SQLite
    connections ``busy_timeout`` set to the time left, as does a SQLite engine's wait for the
    writer before ``BEGIN IMMEDIATE`` (decision 171); a transaction that would begin after the
    deadline raises ``CutoverTimeout`` instead of being retried. Call it before the engine's
    first connection.
    """

    def remaining() -> float:
        return max(0.001, deadline - time.monotonic())

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        if is_sqlite(engine):
            cursor.execute(f"PRAGMA busy_timeout={math.ceil(remaining() * 1000)}")
        else:
            cursor.execute(f"SET SESSION innodb_lock_wait_timeout={math.ceil(remaining())}")
        cursor.close()

    # Inserted first, so it runs before SQLite's BEGIN IMMEDIATE waits for the file lock.
    @event.listens_for(engine, "begin", insert=True)
    def _on_begin(_connection: Connection) -> None:
        check_deadline(deadline)
        if isinstance(engine.dialect, SerializedWriterDialect):
            engine.dialect.writer_timeout = remaining()
