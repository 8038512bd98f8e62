"""Pack lifecycle, greenfield activation, fences as Connectors sees them, and the legacy refusal."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.errors import LegacyRefused
from nexuscrm_connectors.legacy.runtime import LegacyRuntime
from nexuscrm_connectors.queries import packs as packs_sql
from nexuscrm_controlplane import drain, fences, lifecycle
from nexuscrm_controlplane.errors import PackHasHistory, UnknownFence, UnknownPack
from nexuscrm_schema.tables import Event, IngressReceipt
from tests.controlplane.integration.history import (
    NAMESPACE,
    FakeClock,
    arm,
    cut,
    install,
    items,
    protocol_rows,
)
from tests.support.checksums import database_digest
from tests.support.invariants import assert_invariants
from tests.system.integration.old_workers import run_old_workers
from workqueue import ReceiptState
from workqueue.errors import InvalidArgument
from workqueue.values import Outcome

pytestmark = pytest.mark.database


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def test_install_creates_fresh_incarnations_with_their_own_counter(engine: sa.Engine, clock: FakeClock) -> None:
    first = lifecycle.install_pack(engine, NAMESPACE, "crm-sync", "1.0.0", clock)
    second = lifecycle.install_pack(engine, NAMESPACE, "crm-sync", "1.0.0", clock)
    assert first.pack_install_id != second.pack_install_id
    assert first.pack_install_id.startswith("pk-") and first.last_ordinal == 0
    assert first.work_item_handoff_at is None
    before = database_digest(engine)
    with pytest.raises(InvalidArgument):
        lifecycle.install_pack(engine, "*", "crm-sync", "1.0.0", clock)
    assert database_digest(engine) == before
    assert_invariants(engine)


def test_greenfield_activation_writes_cutoff_zero_once(engine: sa.Engine, clock: FakeClock) -> None:
    pack = lifecycle.install_pack(engine, NAMESPACE, "crm-sync", "1.0.0", clock).pack_install_id
    assert lifecycle.get_protocol(engine, pack) is None

    row, already = lifecycle.activate_pack(engine, pack, clock)
    clock.advance(60)
    again, already_again = lifecycle.activate_pack(engine, pack, clock)

    assert (row.protocol_version, row.legacy_max_ordinal, row.origin, already) == (1, 0, "greenfield", False)
    assert already_again and again == row == lifecycle.get_protocol(engine, pack)
    assert protocol_rows(engine, pack) == [(1, 0, "greenfield")]
    assert_invariants(engine)


def test_activation_refuses_a_pack_with_old_protocol_history(engine: sa.Engine, clock: FakeClock) -> None:
    pack = install(engine, clock)
    LegacyRuntime(engine, clock).ingest(pack, items(["k1"]))
    before = database_digest(engine)
    with pytest.raises(PackHasHistory, match="cutover"):
        lifecycle.activate_pack(engine, pack, clock)
    assert database_digest(engine) == before  # no protocol row, nothing else either
    assert_invariants(engine)


def test_unknown_packs_are_not_found(engine: sa.Engine) -> None:
    before = database_digest(engine)
    for call in (lifecycle.get_protocol, lifecycle.activate_pack, drain.drain_status):
        with pytest.raises(UnknownPack):
            call(engine, "pk-missing")
    assert database_digest(engine) == before


def test_the_legacy_runtime_refuses_a_cut_over_pack(engine: sa.Engine, clock: FakeClock) -> None:
    pack = install(engine, clock)
    legacy = LegacyRuntime(engine, clock)
    legacy.ingest(pack, items(["k1"]))
    run_old_workers(legacy, pack)
    arm(engine, clock)
    assert cut(engine, pack, clock).protocol is not None
    before = database_digest(engine)
    with pytest.raises(LegacyRefused, match="rollback to old writers after cutover is unsupported"):
        legacy.ingest(pack, items(["k2"]))
    with pytest.raises(LegacyRefused, match="rollback"):
        legacy.claim("w", pack)
    with pytest.raises(LegacyRefused, match="rollback"):
        legacy.record_work_item_handoff(pack)
    assert database_digest(engine) == before
    assert_invariants(engine)


def fenced(engine: sa.Engine, pack: str, clock: FakeClock) -> bool:
    """Whether a fence holds ``pack`` as admission reads it; the legacy writer's reads agree (decision 140)."""
    with engine.connect() as connection:
        locked = packs_sql.pack_lock(connection, pack, clock)
        guard = packs_sql.admission_guard(connection, locked)
        assert guard.fenced == packs_sql.fence_active(connection, locked, locked.now)
        assert guard.protocol == packs_sql.protocol_get(connection, pack)
        return guard.fenced


def test_fences_and_overrides_as_connectors_admission_sees_them(engine: sa.Engine, clock: FakeClock) -> None:
    pack = install(engine, clock)
    other = install(engine, clock)
    assert not fenced(engine, pack, clock)

    scoped = fences.arm_fence(engine, NAMESPACE, other, expires_in_seconds=60, clock=clock)
    assert not fenced(engine, pack, clock) and fenced(engine, other, clock)
    clock.advance(61)
    assert not fenced(engine, other, clock)  # expired

    namespace = fences.arm_fence(engine, NAMESPACE, "*", reason="cutover", clock=clock)
    assert fenced(engine, pack, clock) and fenced(engine, other, clock)
    fences.add_override(engine, namespace.fence_id, pack, expires_in_seconds=30, clock=clock)
    assert not fenced(engine, pack, clock) and fenced(engine, other, clock)
    clock.advance(31)
    assert fenced(engine, pack, clock)  # the override expired
    fences.add_override(engine, namespace.fence_id, pack, clock=clock)
    assert not fenced(engine, pack, clock)
    fences.remove_override(engine, namespace.fence_id, pack)
    assert fenced(engine, pack, clock)

    listed = fences.list_fences(engine, NAMESPACE)
    assert [f.fence_id for f in listed] == [scoped.fence_id, namespace.fence_id]
    assert listed[1].reason == "cutover" and listed[1].expires_at is None and listed[1].overrides == ()

    fences.disarm_fence(engine, namespace.fence_id)
    assert not fenced(engine, pack, clock)
    before = database_digest(engine)
    with pytest.raises(UnknownFence):
        fences.disarm_fence(engine, namespace.fence_id)
    with pytest.raises(UnknownFence):
        fences.remove_override(engine, scoped.fence_id, pack)
    assert database_digest(engine) == before
    assert_invariants(engine)


def test_a_fenced_legacy_writer_stores_receipts_durably_without_admitting(engine: sa.Engine, clock: FakeClock) -> None:
    pack = install(engine, clock)
    arm(engine, clock)
    results = LegacyRuntime(engine, clock).ingest(pack, items(["k1"]))
    assert [r.outcome for r in results] == [Outcome.FENCED]
    with engine.connect() as connection:
        assert connection.execute(sa.select(sa.func.count()).select_from(Event)).scalar() == 0
        assert connection.execute(sa.select(IngressReceipt.c.State)).scalar() == ReceiptState.STORED
    assert_invariants(engine)


def test_drain_status_names_what_holds_the_drain_and_changes_nothing(engine: sa.Engine, clock: FakeClock) -> None:
    pack = install(engine, clock)
    legacy = LegacyRuntime(engine, clock)
    legacy.ingest(pack, items(["r1"], "lane-r"))
    legacy.ingest(pack, items(["d1"], "lane-d"))
    first = legacy.claim("w", pack)
    legacy.fail(first.work.work_id, first.lease_token, "CRM timeout")
    second = legacy.claim("w", pack)
    legacy.wait_for_dependency(second.work.work_id, second.lease_token, "account-lookup")

    before = database_digest(engine)

    status = drain.drain_status(engine, pack, clock)

    assert database_digest(engine) == before
    assert (status.pending, status.blocked, status.retry, status.processing) == (0, 1, 1, 0)
    holds = {h.reason: h for h in status.holds}
    assert holds[drain.RETRY_WAIT].sample_work_ids == (first.work.work_id,)
    assert holds[drain.DEPENDENCY_WAIT].sample_work_ids == (second.work.work_id,)
    assert drain.drain_status(engine, pack, clock) == status
    assert_invariants(engine)
