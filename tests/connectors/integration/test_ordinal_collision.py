"""An Event already at or above the ordinal counter is a data inconsistency, never an INTERNAL error.

The counter (PackInstall.LastOrdinal) must stay at or above every retained Event of its pack.
When it does not (a restore of PackInstall older than Event, a writer that bypassed the
counter), admission and replay of that pack answer DATA_LOSS, write nothing, and keep
refusing until an operator repairs the pack (docs/runbook-cutover.md, "Ordinal counter
behind the history"); other packs are unaffected.
"""

from __future__ import annotations

import grpc
import pytest
import sqlalchemy as sa

from nexuscrm_connectors.errors import OrdinalCollision
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.queries import packs as packs_sql
from nexuscrm_runtime.status import STATUS_CODES, domain_status
from nexuscrm_schema.tables import Event, PackInstall
from tests.support.checksums import database_digest
from tests.support.factories import FakeClock, delivery, install_pack
from tests.support.invariants import assert_invariants, check_invariants
from workqueue.errors import ErrorKind
from workqueue.values import Outcome

pytestmark = pytest.mark.database


def set_counter(engine: sa.Engine, pack: str, value: int) -> None:
    with engine.begin() as connection:
        connection.execute(sa.update(PackInstall).where(PackInstall.c.PackInstallId == pack).values(LastOrdinal=value))


@pytest.mark.parametrize("behind", [1, 3], ids=["at_next_ordinal", "further_up"])
def test_an_event_above_the_counter_refuses_the_pack_with_data_loss(
    engine: sa.Engine, connectors: Connectors, behind: int
) -> None:
    pack = install_pack(engine)
    other = install_pack(engine)
    admitted = connectors.ingest(pack, items=[delivery(f"k{n}") for n in range(3)])
    assert [r.enqueue_ordinal for r in admitted] == [1, 2, 3]
    set_counter(engine, pack, 3 - behind)  # the counter is behind Events {4 - behind}..3
    before = database_digest(engine)

    for attempt in range(2):  # refused again: nothing moved, the operator has not acted
        with pytest.raises(OrdinalCollision) as caught:
            connectors.ingest(pack, items=[delivery(f"fresh-{attempt}")])
        error = caught.value
        assert error.kind is ErrorKind.DATA_LOSS
        assert STATUS_CODES[error.kind] is grpc.StatusCode.DATA_LOSS
        assert domain_status(error).code == grpc.StatusCode.DATA_LOSS.value[0]
        assert (
            f"pack {pack}" in str(error)
            and f"Event {4 - behind}" in str(error)
            and f"LastOrdinal {3 - behind}" in str(error)
        )
        assert database_digest(engine) == before

    # the neighbours are unaffected
    assert connectors.ingest(other, items=[delivery("o1")])[0].outcome is Outcome.ADMITTED
    # the operator's repair: the counter raised to the retained maximum; admission resumes after it
    set_counter(engine, pack, 3)
    assert connectors.ingest(pack, items=[delivery("after")])[0].enqueue_ordinal == 4
    assert_invariants(engine)


def test_replay_is_refused_the_same_way(engine: sa.Engine, connectors: Connectors, clock: FakeClock) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery("k1")])
    (claim,) = connectors.claim("w", pack_install_ids=[pack], max_items=1)
    connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    set_counter(engine, pack, 0)
    before = database_digest(engine)
    with pytest.raises(OrdinalCollision):
        connectors.replay(claim.work.work_id)
    assert database_digest(engine) == before
    assert check_invariants(engine) == [f"O: Event {pack}/1 outside (0, LastOrdinal 0]"]  # the planted damage
    set_counter(engine, pack, 1)  # the operator's repair
    assert_invariants(engine)


def test_a_collision_at_insert_time_is_named_too(engine: sa.Engine) -> None:
    """The belt behind the counter check: a row that appears between the check and the insert."""
    pack = install_pack(engine)
    Connectors(engine).ingest(pack, items=[delivery("k1")])
    with engine.begin() as connection:
        row = dict(connection.execute(sa.select(Event).where(Event.c.PackInstallId == pack)).mappings().one())
    with pytest.raises(OrdinalCollision) as caught, engine.begin() as connection:
        packs_sql.allocated_events_insert(connection, pack, [{**row, "ReceiptKey": "another"}])
    assert "Event 1" in str(caught.value)
    with engine.begin() as connection:  # any other integrity error stays what it is
        with pytest.raises(sa.exc.IntegrityError):
            packs_sql.allocated_events_insert(connection, pack, [{**row, "EnqueueOrdinal": 2}])  # the receipt key again
    assert_invariants(engine)
