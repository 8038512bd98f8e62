"""The worker library: claim, run a Flow (``nexuscrm_sdk.flows``) over the complete ordered input set, finish.

A ``Worker`` talks to any ``WorkSource``: the in-process ``Connectors`` facade or the gRPC
``ConnectorsClient``. Each claim asks for up to ``batch_size`` generations and runs them one
after the other; the adapter keeps each WorkId and lease token from the claim and passes them
to every later call, and one heartbeat thread per claimed generation extends its lease from
the claim until its attempt ends (so generations waiting their turn in the batch keep their
leases). The Flow must consume every input (the complete set is the contract); if it does
not, or raises, the attempt fails and is retried with backoff; a Flow that raises
``PermanentFailure`` fails its generation for good at once (a dead letter), and one that raises
``RetryLater`` has it run again after the delay it names, that attempt not counted. The failure's log line names the
exception and the start of its message (``FLOW_MESSAGE_LOG_CHARS``, on one line); the whole
message goes to the WorkItem's LastError (GetWork), and the traceback (its end, within
``workqueue.limits.TRACEBACK_MAX_BYTES``: ``bounded_traceback``) goes with Fail to the
attempt's history, never to a log (decision 175), see docs/security.md.

An idle worker does not sleep while work is waiting: its claim asks the service to wait up to
``claim_wait`` for work, and the service answers as soon as it claimed some. Only a claim
that came back empty sooner than ``poll_interval`` (no wait asked, or the service's waiting
places were taken) is followed by a pause for the rest of ``poll_interval``.
``run_until_drained`` stops new claims and waits for in-flight work (a waiting claim, then
the generations it returned); it does not drain the durable queue.

A Flow sees timezone-aware UTC datetimes whichever source it runs on: the client returns
aware ones, the in-process facade the naive UTC the services store, and the worker makes the
latter aware before handing a generation to the Flow (docs/decisions/104-connectors-sdk.md).

A generation whose Flow consumed every input is completed at once with ``complete``; with
``complete_in_claim`` it is completed by the worker's next claim instead, with the batch's
others, in one call (decision 131), its heartbeat renewing its lease until that claim is
sent; a worker that stops, or whose claim failed, then completes them one by one. A failed
attempt is recorded at once with ``fail``.

Small generations come with their inputs in the claim's answer (``Claim.inputs``, decision
129): the worker then makes no ``load_inputs`` call for them; larger ones, and every
generation from a source that sends none, are streamed with ``load_inputs``.

A replay generation's Flow first receives the inputs of the generation it replays again
(``load_replayed_inputs``: transitively through a replay of a replay, oldest first, each
marked with ``InputRow.replayed_work_id``), then the replay's own members: a replay exists to
run the failed inputs again (decision 173). A Flow that keeps ``nexuscrm_sdk.applied``'s
ledger applies only those it has not applied yet.

Leases are judged on the database's clock, never this host's (decision 118): the heartbeat
renews every third of the lease it was granted (a duration: the service grants the lease
asked for, or refuses), whatever this host's clock says about the expiry. The worker only
measures how far its wall clock is from the database's, from each grant's expiry less its
lease, and reports it (``WorkerStats.clock_skew``, decision 119).
"""

from __future__ import annotations

import contextvars
import dataclasses
import datetime as dt
import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from traceback import format_exc
from typing import Protocol

from nexuscrm_sdk.flows import Flow, Generation, PermanentFailure, RetryLater
from nexuscrm_wire.timestamps import aware_utc
from workqueue.limits import TRACEBACK_MAX_BYTES
from workqueue.logcontext import log_context
from workqueue.values import Claim, ClaimAnswer, Completion, CompletionResult, InputPage, InputRow, WorkItemRow

log = logging.getLogger(__name__)

TRACEBACK_CUT = "[the traceback's start is cut to fit its bound]\n"

# Of a failed Flow's message in the log line (docs/security.md): enough to say what
# went wrong, too little to carry an input; LastError keeps the whole message.
FLOW_MESSAGE_LOG_CHARS = 200


class WorkSource(Protocol):
    """What a worker needs from Connectors.

    ``Connectors`` (in process), ``ConnectorsClient`` (over gRPC) and
    ``nexuscrm_sdk.testing.InMemoryWorkSource`` provide it, with the same signatures. The
    datetimes they return are UTC: aware from the client and the in-memory source, naive from
    the facade (the services' own convention). A Flow sees aware ones whichever the source (the
    worker converts them, with ``nexuscrm_wire.timestamps.aware_utc``).
    """

    def complete_and_claim(
        self,
        worker_id: str,
        *,
        completions: Sequence[Completion],
        pack_install_ids: Sequence[str] = (),
        work_types: Sequence[str] = (),
        max_items: int = 1,
        lease: dt.timedelta | None = None,
        wait: dt.timedelta = dt.timedelta(0),
        inline_inputs: bool = False,
        flow_versions: Sequence[str] = (),
    ) -> ClaimAnswer:
        """Complete ``completions`` (each answered on its own, in order), then lease up to ``max_items`` generations.

        ``lease``: how long each is held (None: the source's default). ``inline_inputs``: ask
        for each generation's inputs in its ``Claim`` when they fit; a source may answer without
        them (``Claim.inputs`` None: read them with ``load_inputs``). A source may answer fewer
        completions than asked (a server that predates them answers none): the worker completes
        the unanswered ones with ``complete``. ``flow_versions``: claim the generations of
        these Flow versions' tracks; empty: only those of the inputs' own version (decision 185).
        """
        ...

    def load_inputs(self, work_id: str, *, lease_token: str, page_size: int = 0) -> Iterator[InputPage]:
        """Every member of a held generation, in ordinal order, in pages."""
        ...

    def load_replayed_inputs(self, work_id: str, *, lease_token: str, page_size: int = 0) -> Iterator[InputPage]:
        """For a held replay generation, the members of the generations it replays, oldest first, in pages."""
        ...

    def heartbeat(self, work_id: str, *, lease_token: str, lease: dt.timedelta | None = None) -> dt.datetime:
        """Extend a held lease; return its new expiry."""
        ...

    def complete(self, work_id: str, *, lease_token: str) -> WorkItemRow:
        """Finish a held generation successfully."""
        ...

    def fail(
        self,
        work_id: str,
        *,
        lease_token: str,
        error: str,
        retryable: bool = True,
        retry_after: dt.timedelta | None = None,
        traceback: str | None = None,
    ) -> WorkItemRow:
        """Record a failed attempt of a held generation; ``retry_after``: run it again then, the attempt not counted.

        ``traceback``: the Flow's, at most ``workqueue.limits.TRACEBACK_MAX_BYTES`` of UTF-8, stored with the attempt.
        """
        ...


class IncompleteConsumption(RuntimeError):
    """The Flow returned before reading every member of its generation."""


@dataclasses.dataclass(kw_only=True)
class WorkerStats:
    """Counters of one worker (read by hosts and tests)."""

    executions: int = 0
    completed: int = 0
    failed_attempts: int = 0
    current_work_id: str | None = None
    # This host's wall clock minus the database's, from the last claim or heartbeat (None: none
    # yet); exact to within that call's round trip. Reported, never used to judge a lease.
    clock_skew: dt.timedelta | None = None


def host_clock() -> dt.datetime:
    """This host's wall clock (timezone-aware UTC): a worker's default ``wall_clock``."""
    return dt.datetime.now(dt.UTC)


class Worker:
    """Claims generations of some packs and work types, up to ``batch_size`` at once, and runs ``flow`` on each in turn.

    ``lease``: how long each claim is held; a heartbeat renews it every third of it.
    ``claim_wait``: how long each claim asks the service to wait for work when there is none.
    ``poll_interval``: the least time between two claims that both came back empty.
    ``wall_clock``: this host's clock (timezone-aware), read only to measure its skew.
    ``complete_in_claim``: complete finished generations in the next claim (one call for the
    batch, lower lag) instead of one ``complete`` each as they finish (more time for new
    inputs to coalesce into pending generations: fewer Flow executions).
    ``flow_versions``: the Flow versions whose generations it claims; empty: those of the
    inputs' own version, as before versions existed (decision 185).
    """

    def __init__(
        self,
        source: WorkSource,
        flow: Flow,
        *,
        worker_id: str,
        pack_install_ids: Sequence[str] = (),
        work_types: Sequence[str] = (),
        lease: dt.timedelta = dt.timedelta(seconds=30),
        page_size: int = 0,
        batch_size: int = 1,
        claim_wait: dt.timedelta = dt.timedelta(seconds=1),
        poll_interval: dt.timedelta = dt.timedelta(milliseconds=200),
        wall_clock: Callable[[], dt.datetime] = host_clock,
        complete_in_claim: bool = False,
        flow_versions: Sequence[str] = (),
    ) -> None:
        self._source = source
        self._flow = flow
        self.worker_id = worker_id
        self._packs = tuple(pack_install_ids)
        self._work_types = tuple(work_types)
        self._flow_versions = tuple(flow_versions)
        self._lease = lease
        self._page_size = page_size
        self._batch_size = batch_size
        self._claim_wait = claim_wait
        self._poll_interval = poll_interval
        self._wall_clock = wall_clock
        self._complete_in_claim = complete_in_claim
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._finished: list[_Finished] = []  # run to their end, completed by the next claim
        self.stats = WorkerStats()

    def run_once(self) -> bool:
        """Claim up to ``batch_size`` generations without waiting, run and complete them; True if any was claimed."""
        try:
            return self._claim_and_run(dt.timedelta(0))
        finally:
            self._complete_finished()

    def _claim_and_run(self, wait: dt.timedelta) -> bool:
        for done in self._finished:  # renewed every third of the lease until now: most of it is left
            done.heartbeat.stop()
        answer = self._source.complete_and_claim(
            self.worker_id,
            completions=[finished.completion for finished in self._finished],
            pack_install_ids=self._packs,
            work_types=self._work_types,
            max_items=self._batch_size,
            lease=self._lease,
            wait=wait,
            inline_inputs=True,
            flow_versions=self._flow_versions,
        )
        self._settle_finished({result.work_id: result for result in answer.completed})
        claims = answer.claims
        if claims:  # a claim that waited for work answers right after its grant: time it on arrival
            self._observe_skew(self._wall_clock(), claims[0].work.lease_expires_at)
        # Every lease is renewed from the claim on: the batch's later generations wait their turn.
        heartbeats = [self._start_heartbeat(claim) for claim in claims]
        for claim, heartbeat in zip(claims, heartbeats, strict=True):
            with log_context(pack=claim.work.pack_install_id, work_id=claim.work.work_id):
                self._execute_attempt(claim, heartbeat)
        return bool(claims)

    def _settle_finished(self, answered: dict[str, CompletionResult]) -> None:
        """Count the finished generations a claim completed, log its refusals, ``complete`` those it did not answer."""
        finished, self._finished = self._finished, []
        for done in finished:
            result = answered.get(done.completion.work_id)
            if result is None:  # a source that predates completions in a claim
                self._complete(done.completion)
            elif result.error is not None:
                log.warning("could not finish attempt of %s: %s", result.work_id, result.error)
            else:
                self.stats.completed += 1

    def _complete_finished(self) -> None:
        """Complete the finished generations no claim will carry (the worker stops, or a claim failed)."""
        finished, self._finished = self._finished, []
        for done in finished:
            done.heartbeat.stop()
            self._complete(done.completion)

    def _complete(self, completion: Completion) -> None:
        call = functools.partial(self._source.complete, completion.work_id, lease_token=completion.lease_token)
        with log_context(work_id=completion.work_id):
            if self._settle(call):
                self.stats.completed += 1

    def _start_heartbeat(self, claim: Claim) -> _Heartbeat:
        """Renew ``claim``'s lease every third of it until the returned heartbeat is stopped."""
        stop, refused = threading.Event(), threading.Event()
        with log_context(pack=claim.work.pack_install_id, work_id=claim.work.work_id):
            # The heartbeat thread logs with its attempt's context (pack, WorkId).
            heart = threading.Thread(
                target=contextvars.copy_context().run,
                args=(self._heartbeat, claim.work.work_id, claim.lease_token, stop, refused),
                daemon=True,
            )
        heart.start()

        def stop_heartbeat() -> None:
            stop.set()
            heart.join()

        return _Heartbeat(stop=stop_heartbeat, refused=refused)

    def _execute_attempt(self, claim: Claim, heartbeat: _Heartbeat) -> None:
        work_id, token = claim.work.work_id, claim.lease_token
        self.stats.current_work_id = work_id
        self.stats.executions += 1
        try:
            # The claim carried the whole membership: no LoadInputs call. Unless a renewal was
            # refused while the generation waited its turn: LoadInputs then says why (lease lost).
            if claim.inputs is not None and not heartbeat.refused.is_set():
                pages: Iterator[InputPage] = iter((claim.inputs,))
            else:
                pages = self._source.load_inputs(work_id, lease_token=token, page_size=self._page_size)
            if claim.work.replay_of_work_id is not None:
                pages = itertools.chain(self._replayed(work_id, token), pages)
            inputs = _Members(pages)
            self._flow(Generation(work=_aware_work(claim.work), inputs=iter(inputs)))
            if not inputs.exhausted():
                raise IncompleteConsumption(f"flow returned before reading every input of {work_id}")
        except Exception as error:
            heartbeat.stop()
            self.stats.failed_attempts += 1
            message = f"{type(error).__name__}: {error}"
            # A Flow's message may quote its inputs: only its start reaches the log; LastError has it all.
            log.warning("work %s failed with %s (the whole message: GetWork)", work_id, loggable(message))
            retryable = not isinstance(error, PermanentFailure)
            later = error.delay if isinstance(error, RetryLater) else None
            trace = bounded_traceback(format_exc())  # stored with the attempt, never logged
            self._settle(
                lambda: self._source.fail(
                    work_id, lease_token=token, error=message, retryable=retryable, retry_after=later, traceback=trace
                )
            )
        else:
            completion = Completion(work_id=work_id, lease_token=token)
            if self._complete_in_claim:  # by the next claim (or ``complete``): its lease is renewed until then
                self._finished.append(_Finished(completion=completion, heartbeat=heartbeat))
            else:
                heartbeat.stop()
                self._complete(completion)
        finally:
            self.stats.current_work_id = None

    def _replayed(self, work_id: str, token: str) -> Iterator[InputPage]:
        """The replayed generations' members, read when the Flow reaches them.

        Their last page is not the generation's: the Flow has consumed everything only once it
        read the generation's own members too.
        """
        for page in self._source.load_replayed_inputs(work_id, lease_token=token, page_size=self._page_size):
            yield dataclasses.replace(page, last=False)

    @staticmethod
    def _settle(call: Callable[[], WorkItemRow]) -> bool:
        """Finish an attempt; a refusal (lost lease) is logged: the attempt is someone else's now."""
        try:
            call()
        except Exception as error:
            log.warning("could not finish attempt: %s", error)
            return False
        return True

    def _heartbeat(self, work_id: str, token: str, stop: threading.Event, refused: threading.Event) -> None:
        interval = max(0.05, self._lease.total_seconds() / 3)  # from the granted duration, not a local expiry
        while not stop.wait(interval):
            try:
                sent = self._wall_clock()
                expires = self._source.heartbeat(work_id, lease_token=token, lease=self._lease)
                self._observe_skew(sent + (self._wall_clock() - sent) / 2, expires)
            except Exception as error:
                log.warning("heartbeat of %s refused: %s", work_id, error)
                refused.set()
                return

    def _observe_skew(self, local: dt.datetime, expires: dt.datetime | None) -> None:
        """Record the skew: ``local``, when this host saw a grant, less the database's grant time (expiry - lease)."""
        if expires is not None:
            self.stats.clock_skew = local - (aware_utc(expires) - self._lease)

    def run(self) -> None:
        """Claim and run work until ``run_until_drained`` (or ``stop``) is called."""
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                claimed = self._claim_and_run(self._claim_wait)
            except Exception as error:  # the service may be away: keep polling
                log.warning("claim failed: %s", error)
                self._complete_finished()  # one by one: a refusal of the whole claim must not hold them
                claimed = False
            if not claimed:
                # A claim that waited for work paced this loop already; one answered at once did not.
                self._stopping.wait(max(0.0, self._poll_interval.total_seconds() - (time.monotonic() - started)))
        self._complete_finished()

    def start(self) -> None:
        """Run in a background thread."""
        self._thread = threading.Thread(target=self.run, name=f"worker-{self.worker_id}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop claiming new work; the in-flight claim and the generations it returned run to their end."""
        self._stopping.set()

    def run_until_drained(self, timeout: float | None = None) -> bool:
        """Stop claiming and wait for the in-flight claim and its generations; True if they finished in time."""
        self.stop()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Heartbeat:
    """A claimed generation's lease renewal: ``stop`` ends it; ``refused`` is set once a renewal failed."""

    stop: Callable[[], None]
    refused: threading.Event


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Finished:
    """A generation whose Flow consumed every input, waiting for the next claim to complete it."""

    completion: Completion
    heartbeat: _Heartbeat


class _Members:
    """Flattens pages into inputs and remembers whether the last page was read."""

    def __init__(self, pages: Iterator[InputPage]) -> None:
        self._pages = pages
        self._done = False

    def __iter__(self) -> Iterator[InputRow]:
        for page in self._pages:
            for row in page.inputs:
                if row.source_time is not None and row.source_time.tzinfo is None:
                    yield dataclasses.replace(row, source_time=aware_utc(row.source_time))
                else:
                    yield row
            if page.last:
                self._done = True

    def exhausted(self) -> bool:
        return self._done


def loggable(message: str, limit: int = FLOW_MESSAGE_LOG_CHARS) -> str:
    """``message`` for a log line: one line, non-printable characters escaped, at most ``limit`` characters."""
    line = " ".join(message.split())
    line = "".join(c if c.isprintable() else f"\\x{ord(c):02x}" for c in line)
    return line if len(line) <= limit else line[: limit - 1] + "…"


def bounded_traceback(text: str, limit: int = TRACEBACK_MAX_BYTES) -> str:
    """``text`` within ``limit`` bytes of UTF-8: its end kept (where the exception is), its start cut and said so."""
    encoded = text.encode()
    if len(encoded) <= limit:
        return text
    tail = encoded[len(encoded) - (limit - len(TRACEBACK_CUT.encode())) :]
    return TRACEBACK_CUT + tail.decode(errors="ignore")  # a character cut in two is dropped


def _aware_work(work: WorkItemRow) -> WorkItemRow:
    """``work`` with every datetime timezone-aware UTC (the facade returns naive UTC ones)."""
    if work.created_at.tzinfo is not None:
        return work  # from the client or the in-memory source: aware already
    return dataclasses.replace(
        work,
        claimable_at=_aware(work.claimable_at),
        lease_expires_at=_aware(work.lease_expires_at),
        created_at=aware_utc(work.created_at),
        finished_at=_aware(work.finished_at),
    )


def _aware(value: dt.datetime | None) -> dt.datetime | None:
    return aware_utc(value) if value is not None else None
