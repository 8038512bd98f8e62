"""The SDK's pipelined ingest against a fake service: order, twins, the in-flight bound, retries.

The fake admits per receipt key as Connectors does (new: admitted; the same payload again:
duplicate_covered; another payload: rejected), can hold a call until the test releases it, so
that later batches are answered first, and can fail a call with a status code, before or after
admitting its deliveries (a lost reply).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import functools
import threading
from collections.abc import Sequence

import grpc
import pytest

from nexuscrm_sdk.pipeline import IngestRetry, PipelinedIngest, ingest_with_retries, is_retryable
from tests.support.factories import delivery
from workqueue.errors import DomainError, ErrorKind
from workqueue.values import IngestItem, IngestResult, Outcome

NO_BACKOFF = IngestRetry(attempts=3, backoff=dt.timedelta(0), max_backoff=dt.timedelta(0))


class Status(grpc.RpcError):
    """A call that failed with ``code``, as the gRPC client raises it."""

    def __init__(self, code: grpc.StatusCode) -> None:
        super().__init__(code.name)
        self._code = code

    def code(self) -> grpc.StatusCode:
        return self._code


@dataclasses.dataclass
class FakeConnectors:
    """Admission per receipt key; ``hold``: keys whose call waits for ``release``; ``fail``: scripted errors.

    ``fail[key]`` lists (code, committed), one consumed per call carrying ``key``: the call
    raises ``code``, after admitting its deliveries when ``committed``.
    """

    hold: set[str] = dataclasses.field(default_factory=set)
    fail: dict[str, list[tuple[grpc.StatusCode, bool]]] = dataclasses.field(default_factory=dict)
    stored: dict[str, bytes] = dataclasses.field(default_factory=dict)
    calls: list[list[str]] = dataclasses.field(default_factory=list)
    running: int = 0
    most_running: int = 0
    release: threading.Event = dataclasses.field(default_factory=threading.Event)
    changed: threading.Condition = dataclasses.field(default_factory=threading.Condition)

    def ingest(self, pack_install_id: str, *, items: Sequence[IngestItem]) -> list[IngestResult]:
        keys = [item.receipt_key for item in items]
        with self.changed:
            self.calls.append(keys)
            self.running += 1
            self.most_running = max(self.most_running, self.running)
            self.changed.notify_all()
        try:
            if self.hold.intersection(keys):
                self.release.wait()
            with self.changed:
                scripted = next((self.fail[key].pop(0) for key in keys if self.fail.get(key)), None)
                if scripted is not None and not scripted[1]:
                    raise Status(scripted[0])
                results = [self._admit(item) for item in items]
                if scripted is not None:
                    raise Status(scripted[0])
                return results
        finally:
            with self.changed:
                self.running -= 1
                self.changed.notify_all()

    def _admit(self, item: IngestItem) -> IngestResult:
        if item.receipt_key not in self.stored:
            self.stored[item.receipt_key] = item.payload
            outcome = Outcome.ADMITTED
        else:
            outcome = Outcome.DUPLICATE_COVERED if self.stored[item.receipt_key] == item.payload else Outcome.REJECTED
        return IngestResult(receipt_key=item.receipt_key, outcome=outcome)

    def wait_running(self, count: int) -> None:
        with self.changed:
            self.changed.wait_for(lambda: self.running >= count)


def outcomes(results: list[IngestResult]) -> list[tuple[str, Outcome]]:
    return [(result.receipt_key, result.outcome) for result in results]


def test_later_batches_answered_first_resolve_in_submission_order() -> None:
    fake = FakeConnectors(hold={"a1"})
    resolved: list[int] = []
    with PipelinedIngest(fake, "pk", max_in_flight=3) as pipeline:
        futures = [pipeline.submit([delivery(f"{name}1"), delivery(f"{name}2")]) for name in ("a", "b", "c")]
        for number, future in enumerate(futures):
            future.add_done_callback(functools.partial(lambda n, _: resolved.append(n), number))
        with fake.changed:  # b and c answered, a still held
            fake.changed.wait_for(lambda: len(fake.calls) == 3 and fake.running == 1)
        assert resolved == [] and not futures[2].done()  # b and c wait for a: answers go out in order
        fake.release.set()
    assert resolved == [0, 1, 2]
    assert [outcomes(f.result()) for f in futures] == [
        [(f"{name}1", Outcome.ADMITTED), (f"{name}2", Outcome.ADMITTED)] for name in ("a", "b", "c")
    ]


def test_a_twin_waits_for_its_first_delivery_while_the_rest_of_its_batch_goes() -> None:
    fake = FakeConnectors(hold={"k"})
    same, other = delivery("k", payload=b"same"), delivery("x")
    with PipelinedIngest(fake, "pk", max_in_flight=4) as pipeline:
        first = pipeline.submit([same, delivery("a")])
        second = pipeline.submit([delivery("b"), delivery("k", payload=b"same"), delivery("c")])
        third = pipeline.submit([delivery("k", payload=b"different"), other])
        fake.wait_running(1)
        with fake.changed:
            fake.changed.wait_for(lambda: len(fake.calls) == 3)  # b and c, and x go before k is answered
        assert fake.calls[1:] == [["b", "c"], ["x"]] and not first.done()
        fake.release.set()
    assert outcomes(first.result()) == [("k", Outcome.ADMITTED), ("a", Outcome.ADMITTED)]
    # In its batch's order, each with the outcome a sequential client gets: the twins after the first.
    assert outcomes(second.result()) == [
        ("b", Outcome.ADMITTED),
        ("k", Outcome.DUPLICATE_COVERED),
        ("c", Outcome.ADMITTED),
    ]
    assert outcomes(third.result()) == [("k", Outcome.REJECTED), ("x", Outcome.ADMITTED)]
    assert fake.calls[3:] == [["k"], ["k"]]  # one twin after the other, in submission order


def test_twins_inside_one_batch_go_in_one_call() -> None:
    fake = FakeConnectors()
    with PipelinedIngest(fake, "pk") as pipeline:
        answered = pipeline.submit([delivery("k", payload=b"p"), delivery("k", payload=b"p")]).result()
    assert fake.calls == [["k", "k"]]
    assert outcomes(answered) == [("k", Outcome.ADMITTED), ("k", Outcome.DUPLICATE_COVERED)]


def test_submit_blocks_while_max_in_flight_batches_are_unanswered() -> None:
    fake = FakeConnectors(hold={"a", "b", "c"})
    pipeline = PipelinedIngest(fake, "pk", max_in_flight=2)
    pipeline.submit([delivery("a")])
    pipeline.submit([delivery("b")])
    fake.wait_running(2)
    third: list[object] = []
    submitter = threading.Thread(target=lambda: third.append(pipeline.submit([delivery("c")])))
    submitter.start()
    fake.release.set()  # the first two are answered, which frees the third's slot
    submitter.join()
    pipeline.close()
    assert len(third) == 1 and fake.most_running <= 2
    assert sorted(fake.calls) == [["a"], ["b"], ["c"]]
    with pytest.raises(RuntimeError, match="closed"):
        pipeline.submit([delivery("d")])


def test_an_empty_batch_is_answered_in_its_place() -> None:
    fake = FakeConnectors(hold={"a"})
    with PipelinedIngest(fake, "pk") as pipeline:
        held = pipeline.submit([delivery("a")])
        empty = pipeline.submit([])
        assert not empty.done()
        fake.release.set()
        assert empty.result() == [] and held.done()


@pytest.mark.parametrize("code", [grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED])
def test_an_unknown_outcome_is_sent_again_and_answers_what_the_first_call_did(code: grpc.StatusCode) -> None:
    fake = FakeConnectors(fail={"a": [(code, True)], "b": [(code, False)]})
    waits: list[float] = []
    retry = IngestRetry(attempts=2, backoff=dt.timedelta(milliseconds=50))
    with PipelinedIngest(fake, "pk", retry=retry, wait=waits.append) as pipeline:
        committed = pipeline.submit([delivery("a")])
        lost = pipeline.submit([delivery("b")])
    assert outcomes(committed.result()) == [("a", Outcome.DUPLICATE_COVERED)]  # its first call had admitted it
    assert outcomes(lost.result()) == [("b", Outcome.ADMITTED)]
    assert waits == [0.05, 0.05]
    assert sorted(fake.calls) == [["a"], ["a"], ["b"], ["b"]]


def test_aborted_is_retried_until_the_attempts_run_out_then_the_batch_raises() -> None:
    fake = FakeConnectors(fail={"a": [(grpc.StatusCode.ABORTED, False)] * 3})
    with PipelinedIngest(fake, "pk", retry=NO_BACKOFF, wait=lambda _: None) as pipeline:
        failed = pipeline.submit([delivery("a")])
        after = pipeline.submit([delivery("b")])
    with pytest.raises(grpc.RpcError) as raised:
        failed.result()
    assert raised.value.code() is grpc.StatusCode.ABORTED
    assert fake.calls.count(["a"]) == 3
    assert outcomes(after.result()) == [("b", Outcome.ADMITTED)]  # later batches still go


def test_resource_exhausted_is_a_limit_and_is_not_sent_again() -> None:
    fake = FakeConnectors(fail={"a": [(grpc.StatusCode.RESOURCE_EXHAUSTED, False)]})
    with PipelinedIngest(fake, "pk", retry=NO_BACKOFF, wait=lambda _: None) as pipeline:
        refused = pipeline.submit([delivery("a"), delivery("b")])
    with pytest.raises(grpc.RpcError):
        refused.result()
    assert fake.calls == [["a", "b"]] and fake.stored == {}


def test_a_twin_of_a_failed_batch_is_sent_once_the_failure_is_known() -> None:
    fake = FakeConnectors(hold={"k"}, fail={"k": [(grpc.StatusCode.INVALID_ARGUMENT, False)]})
    with PipelinedIngest(fake, "pk", retry=NO_BACKOFF) as pipeline:
        failed = pipeline.submit([delivery("k", payload=b"p")])
        twin = pipeline.submit([delivery("k", payload=b"p")])
        fake.wait_running(1)
        fake.release.set()
    assert failed.exception() is not None
    assert outcomes(twin.result()) == [("k", Outcome.ADMITTED)]  # nothing of the first call was written


def test_retryable_failures_of_either_transport() -> None:
    assert is_retryable(Status(grpc.StatusCode.UNAVAILABLE))
    assert not is_retryable(Status(grpc.StatusCode.RESOURCE_EXHAUSTED))
    assert not is_retryable(Status(grpc.StatusCode.INVALID_ARGUMENT))
    assert is_retryable(DomainError("conflict", kind=ErrorKind.ABORTED))
    assert not is_retryable(DomainError("too many", kind=ErrorKind.RESOURCE_EXHAUSTED))
    assert not is_retryable(ValueError("not a call"))


def test_a_stop_during_the_back_off_raises_the_last_error() -> None:
    fake = FakeConnectors(fail={"a": [(grpc.StatusCode.UNAVAILABLE, False)]})
    with pytest.raises(grpc.RpcError):
        ingest_with_retries(fake, "pk", [delivery("a")], NO_BACKOFF, wait=lambda _: True)
    assert fake.calls == [["a"]]


def test_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="max_in_flight"):
        PipelinedIngest(FakeConnectors(), "pk", max_in_flight=0)
    with pytest.raises(ValueError, match="twin_linger"):
        PipelinedIngest(FakeConnectors(), "pk", twin_linger=dt.timedelta(seconds=-1))
    with pytest.raises(ValueError, match="max_call_items"):
        PipelinedIngest(FakeConnectors(), "pk", max_call_items=0)
    with pytest.raises(ValueError, match="attempts"):
        IngestRetry(attempts=0)
    with pytest.raises(ValueError, match="backoff"):
        IngestRetry(backoff=dt.timedelta(seconds=-1))
    assert IngestRetry(backoff=dt.timedelta(seconds=2), max_backoff=dt.timedelta(seconds=3)).delay(4) == 3.0


def test_released_twins_ride_with_the_next_batch_within_the_linger() -> None:
    fake = FakeConnectors(hold={"k"})
    with PipelinedIngest(fake, "pk", twin_linger=dt.timedelta(seconds=30)) as pipeline:
        first = pipeline.submit([delivery("k", payload=b"p")])
        twin = pipeline.submit([delivery("k", payload=b"p"), delivery("a")])
        fake.wait_running(1)
        fake.release.set()
        first.result()
        assert not twin.done()  # its twin waits for a batch to ride with, not alone
        third = pipeline.submit([delivery("b"), delivery("c")])
        assert outcomes(third.result()) == [("b", Outcome.ADMITTED), ("c", Outcome.ADMITTED)]
    assert fake.calls == [["k"], ["a"], ["k", "b", "c"]]  # one call: the twin first, then the new batch
    assert outcomes(twin.result()) == [("k", Outcome.DUPLICATE_COVERED), ("a", Outcome.ADMITTED)]


def test_twins_that_would_make_a_call_too_large_go_alone_when_the_linger_ends() -> None:
    fake = FakeConnectors(hold={"k"})
    with PipelinedIngest(fake, "pk", twin_linger=dt.timedelta(milliseconds=50), max_call_items=2) as pipeline:
        first = pipeline.submit([delivery("k", payload=b"p")])
        twin = pipeline.submit([delivery("k", payload=b"p")])
        fake.wait_running(1)
        fake.release.set()
        first.result()
        full = pipeline.submit([delivery("b"), delivery("c")])  # two deliveries: no room for the twin
        assert outcomes(twin.result()) == [("k", Outcome.DUPLICATE_COVERED)]
        full.result()
    assert ["k"] in fake.calls and ["b", "c"] in fake.calls and len(fake.calls) == 3


def test_flush_sends_released_twins_without_waiting_for_the_linger() -> None:
    fake = FakeConnectors(hold={"k"})
    pipeline = PipelinedIngest(fake, "pk", twin_linger=dt.timedelta(hours=1))
    first = pipeline.submit([delivery("k", payload=b"p")])
    twin = pipeline.submit([delivery("k", payload=b"p")])
    fake.wait_running(1)
    fake.release.set()
    first.result()
    pipeline.close()  # would wait an hour if the twin waited for its linger
    assert outcomes(twin.result()) == [("k", Outcome.DUPLICATE_COVERED)]
    assert fake.calls == [["k"], ["k"]]


def test_a_failed_call_fails_every_batch_whose_deliveries_it_carried() -> None:
    fake = FakeConnectors(hold={"k"}, fail={"b": [(grpc.StatusCode.INVALID_ARGUMENT, False)]})
    with PipelinedIngest(fake, "pk", retry=NO_BACKOFF, twin_linger=dt.timedelta(seconds=30)) as pipeline:
        first = pipeline.submit([delivery("k", payload=b"p")])
        twin = pipeline.submit([delivery("k", payload=b"p")])
        fake.wait_running(1)
        fake.release.set()
        first.result()
        failed = pipeline.submit([delivery("b")])
    assert fake.calls == [["k"], ["k", "b"]] and fake.stored.keys() == {"k"}
    assert failed.exception() is not None and twin.exception() is failed.exception()
