"""The SDK's in-memory work source replays and retries later as Connectors does (decision 173).

So a Flow author can test recovery and ``RetryLater`` in process.
"""

from __future__ import annotations

import datetime as dt

import pytest

from nexuscrm_sdk import Generation, InMemoryWorkSource, RetryLater, Worker
from nexuscrm_sdk.testing import FakeClock
from workqueue import ProjectionIdentity, WorkStatus
from workqueue.errors import DomainError

IDENTITY = ProjectionIdentity(
    pack_install_id="pk-1",
    event_kind="contact.upsert",
    route_version="1",
    companion_version="1",
    work_type="fold",
    source_lane="a",
)


def test_a_replay_hands_the_flow_the_failed_inputs_again_then_its_own() -> None:
    source = InMemoryWorkSource(max_attempts=1)
    source.add_inputs(IDENTITY, payloads=[b"x", b"y"])
    seen: list[list[tuple[bytes, str | None, bool]]] = []
    broken = True

    def flow(generation: Generation) -> None:
        seen.append([(row.payload, row.replayed_work_id, row.is_replay) for row in generation.inputs])
        if broken:
            raise RuntimeError("bad release")

    worker = Worker(source, flow, worker_id="test")
    while worker.run_once():
        pass
    (failed,) = source.generations()
    broken = False
    replayed = source.replay(failed.work_id)
    assert (replayed.work.replay_of_work_id, replayed.replay_event_ordinal) == (failed.work_id, 3)
    with pytest.raises(DomainError, match="already has a live replay"):
        source.replay(failed.work_id)
    while worker.run_once():
        pass
    with pytest.raises(DomainError, match=f"replayed already by {replayed.work.work_id}"):
        source.replay(failed.work_id)
    assert seen[0] == [(b"x", None, False), (b"y", None, False)]
    assert seen[1][:2] == [(b"x", failed.work_id, False), (b"y", failed.work_id, False)]
    assert [(payload[:1], work_id, replay) for payload, work_id, replay in seen[1][2:]] == [(b"{", None, True)]
    assert [a.outcome for a in source.attempts] == [WorkStatus.FAILED, WorkStatus.COMPLETED]


def test_replayed_inputs_of_work_that_replays_nothing_are_refused() -> None:
    source = InMemoryWorkSource()
    source.add_inputs(IDENTITY, payloads=[b"x"])
    (claim,) = source.claim("w")
    with pytest.raises(DomainError, match="is not a replay"):
        list(source.load_replayed_inputs(claim.work.work_id, lease_token=claim.lease_token))


def test_retry_later_waits_its_delay_on_the_fake_clock_without_counting_an_attempt() -> None:
    clock = FakeClock()
    source = InMemoryWorkSource(clock=clock, max_attempts=1)
    source.add_inputs(IDENTITY, payloads=[b"x"])
    runs: list[int] = []

    def flow(generation: Generation) -> None:
        list(generation.inputs)
        runs.append(generation.work.attempt)
        if len(runs) == 1:
            raise RetryLater("dependency away", delay=dt.timedelta(minutes=5))

    worker = Worker(source, flow, worker_id="test")
    while worker.run_once():
        pass
    clock.advance(dt.timedelta(minutes=4))
    assert not worker.run_once()  # not before its delay
    clock.advance(dt.timedelta(minutes=1))
    while worker.run_once():
        pass
    assert runs == [0, 0]  # with max_attempts 1, a counted attempt would have failed it for good
    assert [a.outcome for a in source.attempts] == [WorkStatus.RETRY, WorkStatus.COMPLETED]
