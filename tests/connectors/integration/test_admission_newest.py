"""Admission remembers each identity's newest generation only while no one else created one.

``admission.NewestMemory`` lets a process skip the newest-generation seeks of identities
it admitted to, as long as the pack's LastOrdinal is the one its last committed admission
left. Each test builds the situation in which a stale memory would pick the wrong generation:
the wrong pick would leave a claimable generation beside a processing one (invariant X) or a
second unclaimed generation of one identity.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.queries import work_items as work_items_sql
from nexuscrm_runtime.database import create_engine
from tests.support.factories import delivery, install_pack
from tests.support.invariants import assert_invariants
from workqueue import WorkStatus
from workqueue.values import Claim, Outcome

pytestmark = pytest.mark.database


@pytest.fixture
def other_engine(dsn: str) -> Iterator[sa.Engine]:
    """A second engine on the same database: another Connectors process, as far as admission can tell."""
    engine = create_engine(dsn)
    yield engine
    engine.dispose()


def _admit(connectors: Connectors, pack: str, key: str) -> str:
    """Admit one delivery on lane-1 and return the WorkId of the generation that holds it."""
    [result] = connectors.ingest(pack, items=[delivery(key)])
    assert result.outcome is Outcome.ADMITTED and result.work_id is not None
    return result.work_id


def _claim(connectors: Connectors, pack: str) -> Claim:
    [claim] = connectors.claim("w", pack_install_ids=[pack])
    return claim


def _status(connectors: Connectors, work_id: str) -> WorkStatus:
    return connectors.get_work(work_id).work.status


def test_a_generation_created_by_another_process_is_found(engine: sa.Engine, other_engine: sa.Engine) -> None:
    here, there = Connectors(engine), Connectors(other_engine)
    pack = install_pack(engine)
    first = _admit(here, pack, "a1")  # remembered here as lane-1's newest
    claim = _claim(here, pack)
    here.complete(claim.work.work_id, lease_token=claim.lease_token)
    second = _admit(there, pack, "b1")  # a successor this process never saw
    running = _claim(there, pack)
    assert running.work.work_id == second != first

    third = _admit(here, pack, "a2")

    assert third not in (first, second)
    assert _status(here, third) is WorkStatus.BLOCKED  # behind the processing successor, not beside it
    there.complete(running.work.work_id, lease_token=running.lease_token)
    assert_invariants(engine)


def test_a_replay_is_the_newest_generation_of_the_next_batch(engine: sa.Engine) -> None:
    connectors = Connectors(engine)
    pack = install_pack(engine)
    _admit(connectors, pack, "a1")
    claim = _claim(connectors, pack)
    connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    replayed = connectors.replay(claim.work.work_id).work

    assert _admit(connectors, pack, "a2") == replayed.work_id  # the unclaimed replay absorbs the input
    assert_invariants(engine)


def test_a_rolled_back_admission_is_not_remembered(
    engine: sa.Engine, other_engine: sa.Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    here, there = Connectors(engine), Connectors(other_engine)
    pack = install_pack(engine)
    _admit(here, pack, "a1")
    running = _claim(here, pack)  # the next input needs a successor

    insert = work_items_sql.work_items_insert

    def insert_then_fail(connection: sa.Connection, rows: Sequence[dict[str, Any]]) -> None:
        insert(connection, rows)
        raise RuntimeError("the admission transaction fails after creating its successor")

    with monkeypatch.context() as patch:
        patch.setattr(work_items_sql, "work_items_insert", insert_then_fail)
        with pytest.raises(RuntimeError, match="fails after creating"):
            here.ingest(pack, items=[delivery("a2")])
    successor = _admit(there, pack, "b1")  # LastOrdinal now equals what the rolled-back batch would have left

    assert _admit(here, pack, "a3") == successor  # extended, not a second successor beside it
    assert _status(here, successor) is WorkStatus.BLOCKED
    here.complete(running.work.work_id, lease_token=running.lease_token)
    assert_invariants(engine)
