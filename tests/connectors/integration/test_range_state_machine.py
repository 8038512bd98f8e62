"""A randomized stateful test of the range protocol on every backend.

Interleaves ingest (with duplicates), claim, heartbeat, fail, lease expiry, complete and
replay, and checks M, O, B, D, X, P after every step. Each example runs in a new pack of the
test's database, so the whole-database checker sees every earlier example too.
"""

from __future__ import annotations

import datetime as dt
from collections import Counter

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from nexuscrm_connectors.errors import LeaseLost, ReplayRefused
from nexuscrm_connectors.facade import Connectors
from tests.support.factories import FakeClock, delivery, install_pack
from tests.support.invariants import assert_invariants, bounds_violations, check_invariants, generation_bounds
from workqueue.statuses import TERMINAL_WORK_STATUSES, WorkStatus
from workqueue.values import Claim, IngestItem, Outcome

pytestmark = pytest.mark.database

LANES = ("a", "b", "c")
LEASE = 10  # seconds
# members(G) as the design defines them, read from the tables: the Events of G's identity whose
# ordinal lies in its persisted range, in ordinal order.
MEMBERS = sa.text(
    "SELECT e.EnqueueOrdinal FROM Event e JOIN WorkItem w"
    " ON e.PackInstallId = w.PackInstallId AND e.ProjectionKey = w.ProjectionKey"
    " AND e.EnqueueOrdinal BETWEEN w.InputStartOrdinal AND w.LaneOrdinal"
    " WHERE w.WorkId = :work_id ORDER BY e.EnqueueOrdinal"
)


def test_range_protocol_state_machine(engine: sa.Engine) -> None:
    class RangeMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.clock = FakeClock()
            self.connectors = Connectors(engine, clock=self.clock)
            self.pack = install_pack(engine)
            self.sent: list[IngestItem] = []
            self.held: list[Claim] = []
            self.executed: Counter[int] = Counter()  # inputs of completed generations
            self.admitted: set[int] = set()
            self.bounds = generation_bounds(engine)

        @rule(lanes=st.lists(st.sampled_from(LANES), min_size=1, max_size=4), repeat=st.booleans())
        def ingest(self, lanes: list[str], repeat: bool) -> None:
            items = [delivery(lane=lane) for lane in lanes]
            if repeat and self.sent:  # redeliver an earlier receipt unchanged
                items.append(self.sent[0])
            for item, result in zip(items, self.connectors.ingest(self.pack, items=items), strict=True):
                if result.outcome is Outcome.ADMITTED:
                    self.sent.append(item)
                    self.admitted.add(result.enqueue_ordinal)
                else:  # D: a redelivery is covered by the generation that holds it
                    assert result.outcome is Outcome.DUPLICATE_COVERED, result

        @rule()
        def claim(self) -> None:
            self.held += self.connectors.claim(
                "w", pack_install_ids=[self.pack], max_items=2, lease=dt.timedelta(seconds=LEASE)
            )

        @rule(index=st.integers(0, 3))
        def heartbeat(self, index: int) -> None:
            if self.held:
                claim = self.held[index % len(self.held)]
                try:
                    self.connectors.heartbeat(
                        claim.work.work_id, lease_token=claim.lease_token, lease=dt.timedelta(seconds=LEASE)
                    )
                except LeaseLost:
                    self.held.remove(claim)

        @rule(index=st.integers(0, 3), retryable=st.booleans())
        def fail(self, index: int, retryable: bool) -> None:
            if self.held:
                claim = self.held.pop(index % len(self.held))
                try:
                    self.connectors.fail(
                        claim.work.work_id, lease_token=claim.lease_token, error="flow error", retryable=retryable
                    )
                except LeaseLost:
                    pass

        @rule(seconds=st.sampled_from([1, LEASE + 1, 400]))
        def time_passes(self, seconds: int) -> None:
            self.clock.advance(seconds)

        @rule(index=st.integers(0, 3))
        def complete(self, index: int) -> None:
            if self.held:
                claim = self.held.pop(index % len(self.held))
                try:
                    loaded = [
                        i.enqueue_ordinal
                        for p in self.connectors.load_inputs(claim.work.work_id, lease_token=claim.lease_token)
                        for i in p.inputs
                    ]
                    with engine.connect() as connection:
                        members = list(connection.execute(MEMBERS, {"work_id": claim.work.work_id}).scalars())
                    work = self.connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
                except LeaseLost:
                    return
                assert loaded == members  # P: exactly members(G), in ordinal order
                assert [members[0], members[-1]] == [work.input_start_ordinal, work.lane_ordinal]
                self.executed.update(o for o in loaded if o in self.admitted)

        @rule(index=st.integers(0, 20))
        def replay(self, index: int) -> None:
            work_ids = sorted(self.bounds)
            if work_ids:
                work_id = work_ids[index % len(work_ids)]
                try:
                    self.connectors.replay(work_id)
                except ReplayRefused as error:
                    status = self.connectors.get_work(work_id).work.status
                    # Refused only while not terminal, while its replay is live, or once replayed if it failed.
                    assert (
                        status not in TERMINAL_WORK_STATUSES
                        or "live replay" in str(error)
                        or (status is WorkStatus.FAILED and "replayed already" in str(error))
                    ), str(error)

        @invariant()
        def protocol_invariants(self) -> None:
            after = generation_bounds(engine)
            problems = check_invariants(engine) + bounds_violations(self.bounds, after)
            assert not problems, problems
            self.bounds = after
            # No input executed by two completed generations.
            assert all(n == 1 for n in self.executed.values()), self.executed

    run_state_machine_as_test(
        RangeMachine,
        settings=settings(
            max_examples=15,
            stateful_step_count=25,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
        ),
    )
    assert_invariants(engine)
