"""The one-time audit of retained old-protocol responsibility, and the report it produces.

Old-protocol work inferred its inputs from history, so before a pack's cutoff is written
every retained input must still have a responsible owner. Per projection identity, with its
*completed boundary* = the highest LaneOrdinal of a completed old-protocol WorkItem:

refused
  ``missing_owner``: an old-protocol WorkItem whose selected Event is gone; or an Event of
  an identity that has no completed old-protocol generation.
  ``beyond_completed_boundary``: an Event above its identity's completed boundary that has
  no direct task (no WorkItem selected it).
  ``mixed_zero_history``: an indirect input (no direct task) of an identity whose history
  mixes ordinal 0 and positive ordinals.
  ``history_above_counter``: an Event, or a WorkItem bound, above the pack's ordinal counter
  (``PackInstall.LastOrdinal``, the cutoff to be written): the counter would hand out
  ordinals that retained history already holds, so the cutoff cannot be proven.
  ``unclassifiable``: anything outside the documented old-protocol domain, which the audit
  cannot prove resolved: a negative ordinal or counter; an Event status that is not exactly
  a known one (casing, padding, empty, another type); an Event whose stored key is not a
  projection key of this pack; range work (InputStartOrdinal set) before any protocol row;
  an Event the scan did not reach.
permitted
  completed coalesced inputs left in their historical Event status, and a pending Event
  without a direct task inside its identity's completed boundary.

Whatever cannot be classified is refused, never assumed fine (docs/decisions/108-cutover-audit-fails-closed.md). Every
retained Event of the pack is scanned, whatever its ordinal or key, and the number scanned is
checked against the pack's Event count. This audits retained responsibility, not historical
exactly-once business effects. The scan is streamed: identities by keyset pages, each
identity's Events by keyset pages, so memory stays bounded by the page sizes whatever the
history's size. Nothing here writes.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy.engine import Connection

from nexuscrm_controlplane import queries
from nexuscrm_controlplane.errors import CutoverTimeout
from workqueue import EventStatus, decode_projection_key
from workqueue.errors import DomainError

SAMPLE_LIMIT = 10  # sample ids per finding
IDENTITY_PAGE = 200  # identities per keyset page
EVENT_PAGE = 1000  # Events per keyset page

Progress = Callable[[int, int], None]  # (identities audited, identities in total)


class Category(enum.StrEnum):
    """Which family of checks produced a finding; each maps to its own CLI exit code."""

    PREREQUISITE = "prerequisite"
    GATE = "gate"
    AUDIT = "audit"


class Rule(enum.StrEnum):
    """Every reason a cutover refuses."""

    WORK_ITEM_HANDOFF_MISSING = "work_item_handoff_missing"
    SCHEMA_INCOMPLETE = "schema_incomplete"
    FENCE_MISSING = "fence_missing"
    FENCE_EXPIRING = "fence_expiring"
    FENCE_OVERRIDDEN = "fence_overridden"
    NONTERMINAL_WORK = "nonterminal_work"
    MISSING_OWNER = "missing_owner"
    BEYOND_COMPLETED_BOUNDARY = "beyond_completed_boundary"
    MIXED_ZERO_HISTORY = "mixed_zero_history"
    HISTORY_ABOVE_COUNTER = "history_above_counter"
    UNCLASSIFIABLE = "unclassifiable"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Finding:
    """One refusal: its rule, family, how many rows and some of their ids."""

    rule: Rule
    category: Category
    count: int
    sample_ids: tuple[str, ...]
    detail: str

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "rule": self.rule.value,
            "category": self.category.value,
            "count": self.count,
            "sample_ids": list(self.sample_ids),
            "detail": self.detail,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Finding:
        """Inverse of ``to_dict``."""
        return cls(
            rule=Rule(data["rule"]),
            category=Category(data["category"]),
            count=int(data["count"]),
            sample_ids=tuple(data["sample_ids"]),
            detail=data["detail"],
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class CutoverReport:
    """What the cutover checked and found; ``passed`` when nothing refused.

    ``legacy_max_ordinal`` is the cutoff a cutover writes (the pack's last allocated
    ordinal). ``permitted`` counts the permitted cases the audit met, by name.
    """

    pack_install_id: str
    legacy_max_ordinal: int
    findings: tuple[Finding, ...] = ()
    identities_audited: int = 0
    events_audited: int = 0
    work_items_audited: int = 0
    permitted: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def passed(self) -> bool:
        """True when no prerequisite, gate or audit rule refused."""
        return not self.findings

    def summary(self) -> str:
        """One line per finding, for messages and logs."""
        if self.passed:
            return f"pack {self.pack_install_id}: every gate and audit rule passed"
        return "; ".join(
            f"{f.category.value} {f.rule.value}: {f.count} ({', '.join(f.sample_ids) or 'no ids'}) {f.detail}".rstrip()
            for f in self.findings
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form (stored as the protocol row's AuditReport)."""
        return {
            "pack_install_id": self.pack_install_id,
            "passed": self.passed,
            "legacy_max_ordinal": self.legacy_max_ordinal,
            "identities_audited": self.identities_audited,
            "events_audited": self.events_audited,
            "work_items_audited": self.work_items_audited,
            "permitted": dict(self.permitted),
            "findings": [f.to_dict() for f in self.findings],
        }

    def to_json(self) -> str:
        """Deterministic JSON of ``to_dict``."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> CutoverReport:
        """Inverse of ``to_json``."""
        data = json.loads(text)
        return cls(
            pack_install_id=data["pack_install_id"],
            legacy_max_ordinal=int(data["legacy_max_ordinal"]),
            findings=tuple(Finding.from_dict(f) for f in data["findings"]),
            identities_audited=int(data["identities_audited"]),
            events_audited=int(data["events_audited"]),
            work_items_audited=int(data["work_items_audited"]),
            permitted={k: int(v) for k, v in data["permitted"].items()},
        )


AUDIT_RULES = (
    Rule.HISTORY_ABOVE_COUNTER,
    Rule.UNCLASSIFIABLE,
    Rule.MISSING_OWNER,
    Rule.BEYOND_COMPLETED_BOUNDARY,
    Rule.MIXED_ZERO_HISTORY,
)
KNOWN_EVENT_STATUSES = frozenset(status.value for status in EventStatus)


@dataclasses.dataclass
class _Tally:
    count: int = 0
    samples: list[str] = dataclasses.field(default_factory=list)

    def add(self, count: int, sample_ids: list[str]) -> None:
        self.count += count
        self.samples.extend(sample_ids[: SAMPLE_LIMIT - len(self.samples)])


@dataclasses.dataclass
class _Audit:
    """Running totals of one audit: tallies per rule and counters; bounded in size."""

    tallies: dict[Rule, _Tally] = dataclasses.field(default_factory=lambda: {rule: _Tally() for rule in AUDIT_RULES})
    orphaned_work: int = 0
    ownerless_events: int = 0
    events: int = 0
    permitted: dict[str, int] = dataclasses.field(default_factory=dict)
    reasons: dict[Rule, dict[str, int]] = dataclasses.field(default_factory=dict)  # why, for the detail

    def refuse(self, rule: Rule, reason: str, count: int, sample_ids: list[str]) -> None:
        if count:
            self.tallies[rule].add(count, sample_ids)
            why = self.reasons.setdefault(rule, {})
            why[reason] = why.get(reason, 0) + count

    def permit(self, name: str) -> None:
        self.permitted[name] = self.permitted.get(name, 0) + 1


PERMITTED_INDIRECT = "indirect_input_inside_completed_boundary"
PERMITTED_PENDING = "pending_event_without_direct_task_inside_completed_boundary"
DETAILS = {
    Rule.BEYOND_COMPLETED_BOUNDARY: "inputs above their identity's retained completed boundary without a direct task",
    Rule.MIXED_ZERO_HISTORY: "indirect inputs of identities whose history mixes ordinal 0 and positive ordinals",
}


def event_sample_id(ordinal: int) -> str:
    """How an Event appears among sample ids (WorkItems appear by WorkId)."""
    return f"event:{ordinal}"


def check_deadline(deadline: float | None) -> None:
    """Raise ``CutoverTimeout`` once ``deadline`` (a ``time.monotonic`` value) has passed."""
    if deadline is not None and time.monotonic() >= deadline:
        raise CutoverTimeout("the cutover did not finish within its timeout; nothing was written", field="timeout")


def audit_responsibility(
    connection: Connection,
    pack_install_id: str,
    legacy_max_ordinal: int,
    *,
    deadline: float | None = None,
    progress: Progress | None = None,
) -> CutoverReport:
    """Audit a pack's retained old-protocol responsibility on ``connection``; write nothing.

    Callers run it under the namespace and pack locks after the drain gate, so the history it
    reads cannot change underneath. Raises ``CutoverTimeout`` between pages once ``deadline``
    passes. ``progress`` is called after each identity.
    """
    audit = _Audit()
    counter = f"LastOrdinal {legacy_max_ordinal}"
    if legacy_max_ordinal < 0:
        audit.refuse(Rule.UNCLASSIFIABLE, f"ordinal counter with a negative {counter}", 1, [])
    orphaned, orphan_sample = queries.legacy_work_orphaned(connection, pack_install_id, SAMPLE_LIMIT)
    audit.orphaned_work = orphaned
    audit.tallies[Rule.MISSING_OWNER].add(orphaned, orphan_sample)
    above, above_sample = queries.work_items_above(connection, pack_install_id, legacy_max_ordinal, SAMPLE_LIMIT)
    audit.refuse(Rule.HISTORY_ABOVE_COUNTER, f"WorkItem bounds above {counter}", above, above_sample)
    odd, odd_sample = queries.work_items_unclassifiable(connection, pack_install_id, SAMPLE_LIMIT)
    audit.refuse(Rule.UNCLASSIFIABLE, "WorkItems with a persisted lower bound or a negative ordinal", odd, odd_sample)
    total = queries.event_identity_count(connection, pack_install_id)
    done = 0
    after: str | None = None  # from the first key, whatever it is ("" included)
    while keys := queries.event_identities_page(connection, pack_install_id, after, IDENTITY_PAGE):
        for projection_key in keys:
            check_deadline(deadline)
            _audit_identity(connection, pack_install_id, projection_key, legacy_max_ordinal, audit, deadline)
            done += 1
            if progress is not None:
                progress(done, total)
        after = keys[-1]
    unreached = queries.pack_event_count(connection, pack_install_id) - audit.events
    audit.refuse(Rule.UNCLASSIFIABLE, "Events the identity scan did not reach", unreached, [])
    findings = []
    for rule, tally in audit.tallies.items():
        if tally.count:
            detail = DETAILS.get(rule) or (
                f"{audit.orphaned_work} WorkItems whose selected Event is gone; "
                f"{audit.ownerless_events} Events of identities without a completed generation"
            )
            if rule in audit.reasons:
                detail = "; ".join(f"{count} {reason}" for reason, count in audit.reasons[rule].items())
                if rule is Rule.HISTORY_ABOVE_COUNTER:
                    detail += f": {counter} would hand out ordinals that retained history holds"
            findings.append(
                Finding(
                    rule=rule,
                    category=Category.AUDIT,
                    count=tally.count,
                    sample_ids=tuple(tally.samples),
                    detail=detail,
                )
            )
    return CutoverReport(
        pack_install_id=pack_install_id,
        legacy_max_ordinal=legacy_max_ordinal,
        findings=tuple(findings),
        identities_audited=done,
        events_audited=audit.events,
        work_items_audited=queries.legacy_work_count(connection, pack_install_id),
        permitted=audit.permitted,
    )


def _own_key(pack_install_id: str, projection_key: object) -> bool:
    """True when ``projection_key`` is a well-formed projection key of this pack."""
    if not isinstance(projection_key, str):
        return False
    try:
        return decode_projection_key(projection_key).pack_install_id == pack_install_id
    except DomainError:
        return False


def _audit_identity(
    connection: Connection,
    pack_install_id: str,
    projection_key: str,
    last_ordinal: int,
    audit: _Audit,
    deadline: float | None,
) -> None:
    low, high = queries.identity_event_bounds(connection, pack_install_id, projection_key)
    boundary = queries.identity_completed_boundary(connection, pack_install_id, projection_key)
    mixed = low == 0 < high
    own_key = _own_key(pack_install_id, projection_key)
    after: int | None = None  # from the lowest ordinal: old history may hold 0, damaged history less
    while page := queries.identity_events_page(connection, pack_install_id, projection_key, after, EVENT_PAGE):
        for event in page:
            audit.events += 1
            ordinal = int(event.EnqueueOrdinal)
            direct = bool(event.HasDirectTask)
            sample = [event_sample_id(ordinal)]
            if ordinal < 0:
                audit.refuse(Rule.UNCLASSIFIABLE, "Events with a negative ordinal", 1, sample)
            elif ordinal > last_ordinal:
                audit.refuse(Rule.HISTORY_ABOVE_COUNTER, "Events above the counter", 1, sample)
            elif not (isinstance(event.Status, str) and event.Status in KNOWN_EVENT_STATUSES):
                audit.refuse(Rule.UNCLASSIFIABLE, "Events whose status is not exactly a known one", 1, sample)
            elif not own_key or event.ProjectionKey != projection_key:
                audit.refuse(Rule.UNCLASSIFIABLE, "Events whose key is not a projection key of this pack", 1, sample)
            elif boundary is None:
                audit.ownerless_events += 1
                audit.tallies[Rule.MISSING_OWNER].add(1, [event_sample_id(ordinal)])
            elif not direct and ordinal > boundary:
                audit.tallies[Rule.BEYOND_COMPLETED_BOUNDARY].add(1, [event_sample_id(ordinal)])
            elif not direct and mixed:
                audit.tallies[Rule.MIXED_ZERO_HISTORY].add(1, [event_sample_id(ordinal)])
            elif not direct:
                audit.permit(PERMITTED_INDIRECT)
                if event.Status == EventStatus.PENDING:
                    audit.permit(PERMITTED_PENDING)
        after = int(page[-1].EnqueueOrdinal)
        check_deadline(deadline)
