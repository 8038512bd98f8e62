"""Pipelined ingest: several Ingest batches of one pack in flight, each answered in submission order.

A source that waits for each batch's answer before sending the next leaves the service idle
for a round trip per batch and never lets group admission (decision 085) merge its calls.
``PipelinedIngest`` keeps up to ``max_in_flight`` batches unanswered; ``submit`` blocks while
that many are (the caller's back-pressure) and returns a future of the batch's results, one
per delivery in the batch's order. Futures resolve in submission order, so a source that
acknowledges upstream as its futures resolve acknowledges in the order it sent.

Twin deliveries: a receipt key in a batch while an earlier batch holding the same key is
unanswered (an at-least-once source re-sending). Two such calls in flight could be admitted in
either order, and the twin would take the first one's outcome (``admitted``, or ``rejected``
for a different payload). So the twin's deliveries are held back until every earlier batch
holding the key has its answer: each delivery gets the outcome a sequential client would have
got. The rest of its batch goes at once. Released twins ride with the next batch submitted
within ``twin_linger`` (one admission transaction instead of a small one of their own, decision
168), as long as that call stays within ``max_call_items`` and ``max_call_bytes``; otherwise
they go in a call of their own when the linger ends.

What pipelining does not keep: deliveries of one identity sent in two batches in flight are
admitted in the order the service runs the calls, which may differ from submission order, so
their ordinals (the order a Flow reads them in) may be swapped. A source whose per-lane send
order matters keeps ``max_in_flight=1``.

Failures (the documented retry behaviour, ``docs/reliability.md``): UNAVAILABLE and
DEADLINE_EXCEEDED leave the outcome unknown and ABORTED means nothing was done, so the same
deliveries are sent again after ``IngestRetry``'s back-off (receipt keys make that idempotent:
a delivery that was admitted answers ``duplicate_covered``), up to ``IngestRetry.attempts``
calls; then the batch's future raises the last error. RESOURCE_EXHAUSTED names a limit the
request exceeds (too many deliveries, payload bytes, a database size limit): sending it again
fails the same way, so it is not retried and the future raises it, as it does any other error.
A failed batch's slot is freed; later batches still go.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from types import TracebackType
from typing import Protocol

import grpc

from workqueue.errors import DomainError, ErrorKind
from workqueue.values import IngestItem, IngestResult

log = logging.getLogger(__name__)

# Batches in flight per pack unless told otherwise: chosen by measurement (decision 163).
DEFAULT_MAX_IN_FLIGHT = 8
# How long released twins wait for a batch to ride with: chosen by measurement (decision 168).
DEFAULT_TWIN_LINGER = dt.timedelta(milliseconds=20)
# A call that carries twins beside a batch stays within Connectors' default limits per Ingest
# call (NEXUSCRM_MAX_BATCH_ITEMS, NEXUSCRM_MAX_TRANSACTION_BYTES): twins never make a call refused.
DEFAULT_MAX_CALL_ITEMS = 1000
DEFAULT_MAX_CALL_BYTES = 16 * 1024 * 1024
RETRYABLE_CODES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED})
RETRYABLE_KINDS = frozenset({ErrorKind.UNAVAILABLE, ErrorKind.DEADLINE_EXCEEDED, ErrorKind.ABORTED})


class Ingestor(Protocol):
    """What a pipeline sends through: ``ConnectorsClient``, or the in-process ``Connectors`` facade."""

    def ingest(self, pack_install_id: str, *, items: Sequence[IngestItem]) -> list[IngestResult]: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class IngestRetry:
    """How often a batch is sent after a retryable failure, and how long to wait in between.

    ``attempts``: calls per batch at most (1: never again). Before call n + 1 the pipeline waits
    ``backoff`` x n, at most ``max_backoff``.
    """

    attempts: int = 5
    backoff: dt.timedelta = dt.timedelta(milliseconds=200)
    max_backoff: dt.timedelta = dt.timedelta(seconds=5)

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {self.attempts}")
        if self.backoff < dt.timedelta(0) or self.max_backoff < self.backoff:
            raise ValueError("backoff must not be negative nor above max_backoff")

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed call ``attempt`` (1-based) before the next one."""
        return min(self.backoff * attempt, self.max_backoff).total_seconds()


def is_retryable(error: BaseException) -> bool:
    """True for a failure the same deliveries may be sent again after: UNAVAILABLE, DEADLINE_EXCEEDED, ABORTED.

    Accepts the gRPC client's ``grpc.RpcError`` and the in-process facade's ``DomainError``.
    """
    if isinstance(error, grpc.RpcError):
        code: grpc.StatusCode | None = error.code()
        return code in RETRYABLE_CODES
    return isinstance(error, DomainError) and error.kind in RETRYABLE_KINDS


def ingest_with_retries(
    ingestor: Ingestor,
    pack_install_id: str,
    items: Sequence[IngestItem],
    retry: IngestRetry,
    *,
    wait: Callable[[float], object] = time.sleep,
) -> list[IngestResult]:
    """One batch through ``ingestor``, sent again after each retryable failure as ``retry`` says.

    ``wait`` sleeps the given seconds (a stop event's ``wait`` returns true to stop: the last
    error is raised then).
    """
    for attempt in range(1, retry.attempts + 1):
        try:
            return ingestor.ingest(pack_install_id, items=items)
        except Exception as error:
            if attempt == retry.attempts or not is_retryable(error) or wait(retry.delay(attempt)):
                raise
            log.warning("ingest of %d deliveries failed (%s); sending them again", len(items), error)
    raise AssertionError("unreachable")


class _Batch:
    """One submitted batch: its deliveries, the results so far, what waits for an earlier twin."""

    def __init__(self, items: Sequence[IngestItem]) -> None:
        self.items = list(items)
        self.results: list[IngestResult | None] = [None] * len(self.items)
        self.unanswered = len(self.items)
        self.error: BaseException | None = None
        self.future: Future[list[IngestResult]] = Future()
        self.open_keys: collections.Counter[str] = collections.Counter(item.receipt_key for item in self.items)
        self.held: dict[str, list[int]] = {}  # receipt key -> indexes waiting for an earlier batch's answer


_Part = tuple[_Batch, list[int]]  # deliveries of one batch in a call, by their indexes in the batch


class PipelinedIngest:
    """Up to ``max_in_flight`` Ingest batches of one pack in flight; results in submission order.

    Use it as a context manager (leaving it waits for every submitted batch) or call
    ``close``. ``retry`` says how retryable failures are sent again (``IngestRetry``); ``wait``
    sleeps between the attempts (as in ``ingest_with_retries``). ``twin_linger`` is how long
    released twins wait for a batch to ride with (0: they go at once, in one call of their own);
    lower ``max_call_items`` and ``max_call_bytes`` with the service's limits. Future callbacks run on the
    pipeline's threads, one at a time in submission order: keep them short.
    Thread-safe: several threads may submit, each batch taking its place when ``submit`` returns.
    """

    def __init__(
        self,
        ingestor: Ingestor,
        pack_install_id: str,
        *,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        retry: IngestRetry = IngestRetry(),
        wait: Callable[[float], object] = time.sleep,
        twin_linger: dt.timedelta = DEFAULT_TWIN_LINGER,
        max_call_items: int = DEFAULT_MAX_CALL_ITEMS,
        max_call_bytes: int = DEFAULT_MAX_CALL_BYTES,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, got {max_in_flight}")
        if twin_linger < dt.timedelta(0) or max_call_items < 1 or max_call_bytes < 1:
            raise ValueError("twin_linger must not be negative, max_call_items and max_call_bytes must be positive")
        self._ingestor = ingestor
        self._pack = pack_install_id
        self._retry = retry
        self._wait = wait
        self._linger = twin_linger.total_seconds()
        self._max_items = max_call_items
        self._max_bytes = max_call_bytes
        self._slots = threading.BoundedSemaphore(max_in_flight)
        self._lock = threading.Lock()  # the batches and holders below
        self._answering = threading.RLock()  # futures resolve one at a time, in submission order
        self._batches: collections.deque[_Batch] = collections.deque()  # unresolved, in submission order
        self._holders: dict[str, collections.deque[_Batch]] = {}  # receipt key -> unanswered batches holding it
        self._released: list[_Part] = []  # twins whose earlier holders are answered, not yet sent
        self._calls = ThreadPoolExecutor(max_workers=max_in_flight, thread_name_prefix="nexuscrm-ingest")
        self._closed = False

    def __enter__(self) -> PipelinedIngest:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()

    def submit(self, items: Sequence[IngestItem]) -> Future[list[IngestResult]]:
        """Send a batch once fewer than ``max_in_flight`` are unanswered (blocks until then).

        The future holds one result per delivery, in order, or raises the batch's error.
        """
        if self._closed:
            raise RuntimeError("submit on a closed PipelinedIngest")
        self._slots.acquire()
        batch = _Batch(items)
        ready: list[int] = []
        with self._lock:
            self._batches.append(batch)
            for index, item in enumerate(batch.items):
                holders = self._holders.setdefault(item.receipt_key, collections.deque())
                if not holders or holders[-1] is not batch:
                    holders.append(batch)
                if holders[0] is batch:
                    ready.append(index)
                else:
                    batch.held.setdefault(item.receipt_key, []).append(index)
            parts = [*self._take_released(_size(batch, ready)), (batch, ready)] if ready else []
        if parts:
            self._calls.submit(self._call, parts)
        elif not batch.items:
            self._resolve_answered()
        return batch.future

    def flush(self) -> None:
        """Wait until every batch submitted so far is answered (its future resolved).

        Twins released so far go at once: no batch is coming for them to ride with.
        """
        self._send_released()
        with self._lock:
            pending = [batch.future for batch in self._batches]
        for future in pending:
            future.exception()

    def close(self) -> None:
        """Wait for every submitted batch, then stop the calling threads; ``submit`` is refused afterwards."""
        self._closed = True
        self.flush()
        self._calls.shutdown(wait=True)

    def _take_released(self, size: tuple[int, int]) -> list[_Part]:
        """The released twins that fit in one call beside deliveries of ``size``; under ``_lock``."""
        items, payload_bytes = size
        taken: list[_Part] = []
        while self._released:
            more_items, more_bytes = _size(*self._released[0])
            if items + more_items > self._max_items or payload_bytes + more_bytes > self._max_bytes:
                break
            items, payload_bytes = items + more_items, payload_bytes + more_bytes
            taken.append(self._released.pop(0))
        return taken

    def _send_released(self) -> None:
        """Send the released twins no batch took (the linger ended, or a flush), in calls of their own."""
        while True:
            with self._lock:
                if not self._released:
                    return
                parts = [self._released.pop(0)]
                parts += self._take_released(_size(*parts[0]))
            self._calls.submit(self._call, parts)

    def _call(self, parts: list[_Part]) -> None:
        items = [batch.items[index] for batch, indexes in parts for index in indexes]
        try:
            results = ingest_with_retries(self._ingestor, self._pack, items, self._retry, wait=self._wait)
            if len(results) != len(items):
                raise RuntimeError(f"Ingest answered {len(results)} results for {len(items)} deliveries")
        except Exception as error:
            for batch, indexes in parts:
                self._answer(batch, indexes, error)
        else:
            offset = 0
            for batch, indexes in parts:
                self._answer(batch, indexes, results[offset : offset + len(indexes)])
                offset += len(indexes)

    def _answer(self, batch: _Batch, indexes: list[int], answer: list[IngestResult] | Exception) -> None:
        released: dict[_Batch, list[int]] = {}
        with self._lock:
            if isinstance(answer, Exception):
                batch.error = batch.error or answer
            else:
                for index, result in zip(indexes, answer, strict=True):
                    batch.results[index] = result
            batch.unanswered -= len(indexes)
            for index in indexes:
                key = batch.items[index].receipt_key
                batch.open_keys[key] -= 1
                if batch.open_keys[key]:
                    continue
                holders = self._holders[key]
                holders.popleft()  # this batch: only the first holder of a key sends it
                if holders:
                    released.setdefault(holders[0], []).extend(holders[0].held.pop(key))
                else:
                    del self._holders[key]
            lingering = bool(self._released)
            self._released += [(waiting, sorted(held)) for waiting, held in released.items()]
        if released and not lingering:
            # Before the answered futures free their slots: a submit they unblock takes the twins.
            if self._linger:
                timer = threading.Timer(self._linger, self._send_released)
                timer.daemon = True
                timer.start()
            else:
                self._send_released()
        self._resolve_answered()

    def _resolve_answered(self) -> None:
        """Resolve the futures of the answered batches at the head of the submission order."""
        with self._answering:
            while True:
                with self._lock:
                    if not self._batches or self._batches[0].unanswered:
                        return
                    batch = self._batches.popleft()
                self._slots.release()  # before the future's callbacks, which may submit
                if batch.error is not None:
                    batch.future.set_exception(batch.error)
                else:
                    batch.future.set_result([result for result in batch.results if result is not None])


def _size(batch: _Batch, indexes: list[int]) -> tuple[int, int]:
    """Deliveries and payload bytes of ``indexes`` of ``batch``."""
    return len(indexes), sum(len(batch.items[index].payload) for index in indexes)
