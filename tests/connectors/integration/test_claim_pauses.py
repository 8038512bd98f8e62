"""Pausing and resuming claims per pack, identity and work type, on every backend (decision 158)."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa
from prometheus_client import REGISTRY

from nexuscrm_connectors.errors import UnknownPack
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.operating.claim_pauses import (
    AlreadyPaused,
    NotPaused,
    PauseScope,
    Scope,
    UnknownScope,
    scope_of,
)
from nexuscrm_connectors.queries import claims as claims_sql
from nexuscrm_schema.tables import ClaimPause
from tests.support.checksums import database_digest
from tests.support.factories import FakeClock, delivery, install_pack, route
from tests.support.invariants import assert_invariants
from tests.support.plans import explain_problems
from tests.support.statements import capture
from workqueue.errors import InvalidArgument
from workqueue.values import IngestItem

pytestmark = pytest.mark.database


def _pack_scope(pack: str) -> Scope:
    return scope_of(pack, PauseScope.PACK, None, "")


def _lanes(connectors: Connectors, pack: str, worker: str) -> list[str]:
    """The source lanes of everything ``worker`` can claim from ``pack`` now (completed at once)."""
    lanes = []
    for claim in connectors.claim(worker, pack_install_ids=[pack], max_items=50):
        lanes.append(claim.work.projection_key.rsplit(":", 1)[1])
        connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    return sorted(lanes)


def _now(engine: sa.Engine, clock: FakeClock) -> dt.datetime:
    with engine.connect() as connection:
        return clock.read(connection)


def test_a_paused_pack_gets_no_claims_while_admission_goes_on_and_resumes(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pauses = REGISTRY.get_sample_value("nexuscrm_claim_pauses_total", {"action": "pause", "scope": "pack"}) or 0
    pack, other = install_pack(engine), install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane="held")])
    held = connectors.claim("w", pack_install_ids=[pack])[0]  # in flight before the pause
    paused = connectors.pause_claims(_pack_scope(pack), paused_by="ops@acme", reason="bad deploy")
    assert (paused.scope, paused.paused_by, paused.reason, paused.resumed_at) == (
        PauseScope.PACK,
        "ops@acme",
        "bad deploy",
        None,
    )
    connectors.ingest(pack, items=[delivery(lane="a"), delivery(lane="b")])  # admission goes on
    connectors.ingest(other, items=[delivery(lane="a")])
    assert connectors.claim("w", pack_install_ids=[pack]) == []
    assert connectors.claim("w") != []  # every pack: the other pack's work only
    connectors.complete(held.work.work_id, lease_token=held.lease_token)  # the lease finishes normally
    assert connectors.queue_state(pack).pending == 2
    assert [p.pause_id for p in connectors.list_claim_pauses(pack)] == [paused.pause_id]

    assert REGISTRY.get_sample_value("nexuscrm_claim_pauses_total", {"action": "pause", "scope": "pack"}) == pauses + 1
    resumed = connectors.resume_claims(_pack_scope(pack), resumed_by="ops@acme")
    assert resumed.pause_id == paused.pause_id and resumed.resumed_by == "ops@acme"
    assert resumed.resumed_at is not None and resumed.resumed_at >= paused.paused_at
    assert _lanes(connectors, pack, "w") == ["a", "b"]
    assert connectors.list_claim_pauses(pack) == []
    with engine.connect() as connection:  # the pause stays recorded
        recorded = connection.execute(sa.select(ClaimPause).where(ClaimPause.c.PackInstallId == pack)).one()
    assert (recorded.PausedBy, recorded.Reason, recorded.ResumedBy) == ("ops@acme", "bad deploy", "ops@acme")
    assert_invariants(engine)


def test_an_identity_or_a_work_type_pause_holds_back_only_its_scope(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    invoice = IngestItem(receipt_key="inv-1", route=route("x", work_type="invoice"), payload=b"i")
    connectors.ingest(pack, items=[delivery(lane="a"), delivery(lane="b"), invoice])
    connectors.pause_claims(scope_of(pack, PauseScope.IDENTITY, route("a"), ""), paused_by="ops", reason="poison")
    connectors.pause_claims(scope_of(pack, PauseScope.WORK_TYPE, None, "invoice"), paused_by="ops", reason="ledger")
    assert _lanes(connectors, pack, "w") == ["b"]
    connectors.ingest(pack, items=[delivery(lane="a"), delivery(lane="b")])
    assert _lanes(connectors, pack, "w") == ["b"]  # a's generation waits, extended by admission
    connectors.resume_claims(scope_of(pack, PauseScope.IDENTITY, route("a"), ""), resumed_by="ops")
    assert _lanes(connectors, pack, "w") == ["a"]
    connectors.resume_claims(scope_of(pack, PauseScope.WORK_TYPE, None, "invoice"), resumed_by="ops")
    assert _lanes(connectors, pack, "w") == ["x"]
    assert_invariants(engine)


def test_a_pause_expires_on_the_database_clock(engine: sa.Engine, connectors: Connectors, clock: FakeClock) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane="a")])
    until = _now(engine, clock) + dt.timedelta(seconds=30)
    connectors.pause_claims(_pack_scope(pack), paused_by="ops", reason="window", expires_at=until)
    assert connectors.claim("w", pack_install_ids=[pack]) == []
    clock.advance(31)
    assert _lanes(connectors, pack, "w") == ["a"]
    assert connectors.list_claim_pauses(pack) == []
    with pytest.raises(NotPaused):
        connectors.resume_claims(_pack_scope(pack), resumed_by="ops")
    assert_invariants(engine)


def test_bad_pauses_are_refused_and_change_nothing(engine: sa.Engine, connectors: Connectors, clock: FakeClock) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane="a")])
    connectors.pause_claims(_pack_scope(pack), paused_by="ops", reason="first")
    with engine.connect() as connection:
        before = database_digest(connection)
    past = _now(engine, clock) - dt.timedelta(seconds=1)
    refusals: list[tuple[type[Exception], str, object]] = [
        (
            UnknownPack,
            "not installed",
            lambda: connectors.pause_claims(_pack_scope("pk-none"), paused_by="o", reason="r"),
        ),
        (
            UnknownScope,
            "the pack has no generation of it",
            lambda: connectors.pause_claims(
                scope_of(pack, PauseScope.IDENTITY, route("zz"), ""), paused_by="o", reason="r"
            ),
        ),
        (
            UnknownScope,
            "work type .nope. of pack .*: the pack has no generation",
            lambda: connectors.pause_claims(
                scope_of(pack, PauseScope.WORK_TYPE, None, "nope"), paused_by="o", reason="r"
            ),
        ),
        (
            InvalidArgument,
            "is not after the database's now",
            lambda: connectors.pause_claims(
                scope_of(pack, PauseScope.IDENTITY, route("a"), ""), paused_by="o", reason="r", expires_at=past
            ),
        ),
        (
            InvalidArgument,
            "reason is required",
            lambda: connectors.pause_claims(_pack_scope(pack), paused_by="o", reason=""),
        ),
        (
            AlreadyPaused,
            "already paused",
            lambda: connectors.pause_claims(_pack_scope(pack), paused_by="o", reason="again"),
        ),
        (InvalidArgument, "scope is required", lambda: scope_of(pack, None, None, "")),
        (InvalidArgument, "takes no route", lambda: scope_of(pack, PauseScope.PACK, route("a"), "")),
        (InvalidArgument, "route.event_kind", lambda: scope_of(pack, PauseScope.IDENTITY, route("a", kind=""), "")),
        (
            NotPaused,
            "is not paused",
            lambda: connectors.resume_claims(scope_of(pack, PauseScope.IDENTITY, route("a"), ""), resumed_by="o"),
        ),
    ]
    for error, message, call in refusals:
        with pytest.raises(error, match=message):
            call()  # type: ignore[operator]
    with engine.connect() as connection:
        assert database_digest(connection) == before
    assert_invariants(engine)


def test_the_candidate_read_probes_pauses_by_index(engine: sa.Engine, connectors: Connectors, clock: FakeClock) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane=f"l{n}") for n in range(40)])
    for n in range(0, 40, 2):  # a pause history: paused and resumed identities, one still paused
        scope = scope_of(pack, PauseScope.IDENTITY, route(f"l{n}"), "")
        connectors.pause_claims(scope, paused_by="ops", reason="history")
        if n:
            connectors.resume_claims(scope, resumed_by="ops")
    with engine.begin() as connection, capture(engine) as captured:
        claims_sql.work_items_claimable(connection, [pack], [], clock, 10)
    (read,) = captured.statements
    with engine.connect() as connection:
        assert explain_problems(connection, read.statement, read.parameters) == []
    assert "l0" not in [
        c.work.projection_key.rsplit(":", 1)[1] for c in connectors.claim("w", pack_install_ids=[pack], max_items=40)
    ]
    assert_invariants(engine)
