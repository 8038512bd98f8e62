"""The history checker finds each anomaly it promises to find (forged outcomes over a real database)."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa

from nexuscrm_connectors.facade import Connectors
from nexuscrm_runtime.clock import utcnow
from tests.connectors.reliability.history import History, check_history
from tests.support.factories import delivery, install_pack
from tests.support.invariants import assert_invariants
from tests.support.waiting import wait_until
from workqueue.values import Claim, IngestResult, Outcome

LEASE = 1  # seconds


def loaded(connectors: Connectors, key: tuple[str, str]) -> list[int]:
    """The ordinals of a held generation's members."""
    work_id, token = key
    return [i.enqueue_ordinal for p in connectors.load_inputs(work_id, lease_token=token) for i in p.inputs]


def test_a_clean_history_has_no_violation_and_forged_anomalies_are_each_found(engine: sa.Engine) -> None:
    connectors = Connectors(engine)
    pack = install_pack(engine)
    history = History()
    item = delivery()
    history.call("c", "ingest", ((item.receipt_key, item.payload),), lambda: connectors.ingest(pack, items=[item]))
    first = history.call("w1", "claim", "w1", lambda: connectors.claim("w1", lease=dt.timedelta(seconds=LEASE)))
    (stale,) = first.result
    key = (stale.work.work_id, stale.lease_token)
    history.call("w1", "load", key, lambda: loaded(connectors, key))
    # w1 stalls past its lease; w2 takes over and completes.
    wait_until(lambda: utcnow() > stale.work.lease_expires_at, "w1's lease to expire")
    second = history.call("w2", "claim", "w2", lambda: connectors.claim("w2", lease=dt.timedelta(seconds=LEASE)))
    (fresh,) = second.result
    key2 = (fresh.work.work_id, fresh.lease_token)
    history.call("w2", "load", key2, lambda: loaded(connectors, key2))
    history.call("w2", "complete", key2, lambda: connectors.complete(key2[0], lease_token=key2[1]))
    assert check_history(history, engine, lease_seconds=LEASE) == []

    # Forged outcomes: the stale worker's completion "accepted", a lost acknowledged receipt, and
    # an acknowledged completion of a WorkItem the database lost (a crash without durable commits).
    history.call("w1", "complete", key, lambda: stale.work)
    history.call("w3", "complete", ("lost-work", "lost-token"), lambda: stale.work)
    ghost = IngestResult(receipt_key="never-admitted", outcome=Outcome.ADMITTED)
    history.call("c", "ingest", (("never-admitted", b"x"),), lambda: [ghost])
    found = "\n".join(check_history(history, engine, lease_seconds=LEASE))
    assert "lost: receipt never-admitted" in found
    assert "false success: completion of" in found
    assert "false success: completion of lost-work" in found
    assert "expired lease: completion of" in found
    assert "superseded lease" in found

    # A lease granted while the previous one was surely still held.
    early = Claim(work=stale.work, lease_token="overlapping")
    history.call("w3", "claim", "w3", lambda: [early])
    assert "overlap:" in "\n".join(check_history(history, engine, lease_seconds=LEASE))
    assert_invariants(engine)
