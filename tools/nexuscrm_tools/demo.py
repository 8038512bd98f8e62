"""The demo: contact-style source events projected into a read model of the demo's own.

Each input's payload is a JSON contact update from one source lane::

    {"contact_id": "lane-0007/c-2", "fields": {"name": "...", "email": "..."}, "sent_at": 1767225600.25}

The Flow folds a generation's inputs, in ordinal order, into ``DemoContactProjection`` (one
row per contact: the latest value of every field and how many updates it absorbed) and
records each applied input in the SDK's ledger (``nexuscrm_sdk.applied``, table
``DemoContactApplied``). Both writes share one transaction and skip inputs already recorded,
so running a generation again (a retry after a lost lease) leaves the same result. A replay
generation hands the Flow the replayed generation's inputs again, which are applied if they
were not before; the replay's own Event carries no contact data and is skipped. These tables
belong to the demo, not to the canonical schema; the Flow factory creates them.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy.engine import Connection, Engine

from nexuscrm_runtime.database import run_transaction
from nexuscrm_schema.invariants import check_invariants, snapshot
from nexuscrm_sdk.flows import Flow, FlowContext, Generation
from nexuscrm_tools import demo_queries as queries
from nexuscrm_tools.demo_tables import applied, metadata
from nexuscrm_tools.tables import plural
from workqueue.values import InputRow, Route, WorkItemRow

EVENT_KIND = "contact.upsert"
ROUTE_VERSION = "1"
COMPANION_VERSION = "demo-contacts-1"
WORK_TYPE = "project-contacts"
FLOW_NAME = "demo-contacts"  # the entry point of ``contact_projection``
PACK_NAME = "demo-contacts"
PACK_VERSION = "1.0"
FIELDS = ("name", "email", "company", "stage")

COLUMNS = {"name": "Name", "email": "Email", "company": "Company", "stage": "Stage"}


def route(source_lane: str) -> Route:
    """The demo's route on ``source_lane``."""
    return Route(
        event_kind=EVENT_KIND,
        route_version=ROUTE_VERSION,
        companion_version=COMPANION_VERSION,
        work_type=WORK_TYPE,
        source_lane=source_lane,
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ContactUpdate:
    """One decoded input."""

    contact_id: str
    fields: Mapping[str, str]
    sent_at: float

    def encode(self) -> bytes:
        """The payload bytes (canonical JSON, so equal updates are equal bytes)."""
        body = {"contact_id": self.contact_id, "fields": dict(self.fields), "sent_at": self.sent_at}
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, payload: bytes) -> ContactUpdate:
        """Parse a payload; raises ``ValueError`` when it is not a contact update.

        The message says what is wrong, never what the payload holds (docs/security.md): the
        host logs its start and LastError keeps it, for operators to read.
        """
        try:
            body = json.loads(payload)
        except ValueError:  # JSONDecodeError keeps the document, UnicodeDecodeError quotes its bytes
            raise ValueError("payload is not a contact update: not JSON") from None
        fields = body.get("fields") if isinstance(body, dict) else None
        if not isinstance(fields, dict) or not isinstance(body.get("contact_id"), str):
            raise ValueError("payload is not a contact update: no contact_id string and fields object")
        unknown = len(set(fields) - set(FIELDS))
        if unknown:
            known = ", ".join(FIELDS)
            raise ValueError(f"contact update has {plural(unknown, 'unknown field')} of {len(fields)} (known: {known})")
        try:
            sent_at = float(body.get("sent_at", 0.0))
        except (TypeError, ValueError):  # float's message quotes the value
            raise ValueError("contact update's sent_at is not a number") from None
        return cls(contact_id=body["contact_id"], fields=fields, sent_at=sent_at)


@dataclasses.dataclass(kw_only=True)
class ContactState:
    """A contact's folded state: latest fields, updates absorbed, newest ordinal."""

    fields: dict[str, str | None] = dataclasses.field(default_factory=lambda: dict.fromkeys(FIELDS))
    updates: int = 0
    last_ordinal: int = 0

    def apply(self, ordinal: int, update: ContactUpdate) -> None:
        """Fold one input; inputs must come in ordinal order."""
        self.fields.update(update.fields)
        self.updates += 1
        self.last_ordinal = ordinal


def fold(
    inputs: Iterable[tuple[int, ContactUpdate]], into: dict[str, ContactState] | None = None
) -> dict[str, ContactState]:
    """Fold (ordinal, update) pairs, in ordinal order, into per-contact states (``into`` is extended)."""
    states = into if into is not None else {}
    for ordinal, update in inputs:
        states.setdefault(update.contact_id, ContactState()).apply(ordinal, update)
    return states


def create_tables(engine: Engine) -> None:
    """Create the demo's read-model tables if absent (idempotent; never alters existing ones)."""
    metadata.create_all(engine, checkfirst=True)


def apply_generation(connection: Connection, work: WorkItemRow, inputs: Iterable[InputRow]) -> int:
    """Fold a generation's inputs into the projection in ``connection``'s transaction; return how many were new.

    Inputs already in the ledger are skipped, so applying a generation twice changes nothing
    the second time. Raises ``ValueError`` naming the input's ordinal for a payload that is not
    a contact update (the attempt fails and is retried, then fails for good: never skipped
    silently).
    """
    pack_install_id = work.pack_install_id
    new_inputs = applied.fresh(connection, pack_install_id, (row for row in inputs if not row.is_replay))
    fresh = [(row.enqueue_ordinal, _decoded(row)) for row in new_inputs]
    if not fresh:
        return 0
    existing = queries.demo_contacts_get(connection, pack_install_id, {update.contact_id for _, update in fresh})
    states = {
        row.ContactId: ContactState(
            fields={field: getattr(row, column) for field, column in COLUMNS.items()},
            updates=row.Updates,
            last_ordinal=row.LastOrdinal,
        )
        for row in existing
    }
    touched = fold(fresh, states)
    for contact_id in {update.contact_id for _, update in fresh}:
        state = touched[contact_id]
        values: dict[str, Any] = {column: state.fields[field] for field, column in COLUMNS.items()}
        values.update(Updates=state.updates, LastOrdinal=state.last_ordinal)
        if contact_id in {row.ContactId for row in existing}:
            queries.demo_contact_update(connection, pack_install_id, contact_id, values)
        else:
            queries.demo_contact_insert(connection, pack_install_id, contact_id, values)
    applied.record(connection, work, new_inputs)
    return len(fresh)


def _decoded(row: InputRow) -> ContactUpdate:
    """``row``'s update; a ``ValueError`` names the input by its ordinal, never by what it holds."""
    try:
        return ContactUpdate.decode(row.payload)
    except ValueError as error:
        raise ValueError(f"input {row.enqueue_ordinal}: {error}") from None


def contact_projection(context: FlowContext) -> Flow:
    """Flow factory of the demo (entry point ``demo-contacts``): creates the tables, returns the Flow.

    The Flow reads the generation's whole member set first (the stream must not hold the
    database's write lock), then applies it in one retried transaction.
    """
    engine = context.engine
    create_tables(engine)

    def project(generation: Generation) -> None:
        inputs = list(generation.inputs)
        run_transaction(
            engine,
            functools.partial(apply_generation, work=generation.work, inputs=inputs),
            name="demo contact projection",
        )

    return project


def verify_projection(engine: Engine, pack_install_id: str) -> list[str]:
    """Every way the database disagrees with the demo's promises for one pack; empty when it holds.

    Checks the protocol invariants M, O, B, D, X, P and R over the whole database, that every
    admitted input was applied exactly once, and that the projection equals the fold of all
    admitted inputs in ordinal order. Where retention pruned inputs (their tombstones count as
    admitted; inputs whose tombstones expired, up to the policy's count of them), a contact's
    retained inputs are the newest of its lane: the projection must then hold what they set
    and end at the newest of them.
    """
    problems = check_invariants(engine)
    with snapshot(engine) as connection:
        events = queries.event_payloads(connection, pack_install_id)
        done = applied.applied(connection, pack_install_id)
        pruned = queries.pruned_ordinals(connection, pack_install_id)
        expired = queries.expired_count(connection, pack_install_id)
        projected = {row.ContactId: row for row in queries.demo_contacts_get(connection, pack_install_id)}
    admitted = {ordinal for ordinal, _ in events} | pruned
    problems += [f"input {o} was admitted but never projected" for o in sorted(admitted - done)[:20]]
    unrecorded = sorted(done - admitted)  # expired inputs leave no record but the policy's count
    if len(unrecorded) > expired:
        problems += [
            f"input {o} was projected but never admitted ({expired} expired with the duplicate window)"
            for o in unrecorded[:20]
        ]
    expected = fold((ordinal, ContactUpdate.decode(payload)) for ordinal, payload in events)
    for contact_id in sorted(set(expected) | set(projected)):
        problem = _contact_problem(
            contact_id, expected.get(contact_id), projected.get(contact_id), pruned=bool(pruned) or expired > 0
        )
        if problem:
            problems.append(problem)
    return problems


def _contact_problem(contact_id: str, expected: ContactState | None, row: Any, *, pruned: bool) -> str | None:
    if expected is None:
        return None if pruned else f"contact {contact_id} is projected but no input names it"
    if row is None:
        return f"contact {contact_id} has inputs but no projection"
    actual = {field: getattr(row, column) for field, column in COLUMNS.items()}
    if pruned:  # the retained suffix of the contact's inputs: what it set, and its newest ordinal
        actual = {field: value for field, value in actual.items() if expected.fields[field] is not None}
        wanted = {field: value for field, value in expected.fields.items() if value is not None}
        if actual != wanted or row.LastOrdinal != expected.last_ordinal or row.Updates < expected.updates:
            return (
                f"contact {contact_id}: projected {actual}, {row.Updates} updates, last {row.LastOrdinal}; "
                f"its retained inputs give {wanted}, {expected.updates} updates, last {expected.last_ordinal}"
            )
        return None
    if actual != expected.fields or row.Updates != expected.updates or row.LastOrdinal != expected.last_ordinal:
        return (
            f"contact {contact_id}: projected {actual}, {row.Updates} updates, last {row.LastOrdinal}; "
            f"inputs give {expected.fields}, {expected.updates} updates, last {expected.last_ordinal}"
        )
    return None
