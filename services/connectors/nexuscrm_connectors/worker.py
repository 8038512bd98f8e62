"""The worker library: claim, run a Flow over the complete ordered input set, finish.

A ``Worker`` talks to any ``WorkSource``: the in-process ``Connectors`` facade or the gRPC
``ConnectorsClient``. The adapter keeps the WorkId and lease token from the claim and passes
them to every later call; a heartbeat thread extends the lease while the Flow runs. The Flow
must consume every input (the complete set is the contract); if it does not, or raises, the
attempt fails and is retried with backoff. ``run_until_drained`` stops new claims and waits
for in-flight work; it does not drain the durable queue.
"""

from __future__ import annotations

import contextvars
import dataclasses
import datetime as dt
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Protocol

from nexuscrm_connectors.models import Claim, InputPage, InputRow, WorkItemRow
from nexuscrm_runtime.logs import log_context

log = logging.getLogger(__name__)


class WorkSource(Protocol):
    """What a worker needs from Connectors (``Connectors`` and ``ConnectorsClient`` provide it)."""

    def claim(
        self,
        worker_id: str,
        *,
        pack_install_ids: Sequence[str] = (),
        work_types: Sequence[str] = (),
        max_items: int = 1,
        lease_seconds: int = 0,
    ) -> list[Claim]: ...

    def load_inputs(self, work_id: str, lease_token: str, page_size: int = 0) -> Iterator[InputPage]: ...

    def heartbeat(self, work_id: str, lease_token: str, lease_seconds: int = 0) -> dt.datetime: ...

    def complete(self, work_id: str, lease_token: str) -> WorkItemRow: ...

    def fail(self, work_id: str, lease_token: str, error: str, *, retryable: bool = True) -> WorkItemRow: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class Generation:
    """What a Flow receives: the claimed generation and an iterator over all its members."""

    work: WorkItemRow
    inputs: Iterator[InputRow]


Flow = Callable[[Generation], None]


class IncompleteConsumption(RuntimeError):
    """The Flow returned before reading every member of its generation."""


@dataclasses.dataclass(kw_only=True)
class WorkerStats:
    """Counters of one worker (read by hosts and tests)."""

    executions: int = 0
    completed: int = 0
    failed_attempts: int = 0
    current_work_id: str | None = None


class Worker:
    """Claims generations of some packs and work types and runs ``flow`` on each, one at a time."""

    def __init__(
        self,
        source: WorkSource,
        flow: Flow,
        *,
        worker_id: str,
        pack_install_ids: Sequence[str] = (),
        work_types: Sequence[str] = (),
        lease_seconds: int = 30,
        page_size: int = 0,
        poll_interval: float = 0.2,  # seconds between claims when there is no work
    ) -> None:
        self._source = source
        self._flow = flow
        self.worker_id = worker_id
        self._packs = tuple(pack_install_ids)
        self._work_types = tuple(work_types)
        self._lease_seconds = lease_seconds
        self._page_size = page_size
        self._poll_interval = poll_interval
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.stats = WorkerStats()

    def run_once(self) -> bool:
        """Claim and run at most one generation; True if one was claimed."""
        claims = self._source.claim(
            self.worker_id,
            pack_install_ids=self._packs,
            work_types=self._work_types,
            max_items=1,
            lease_seconds=self._lease_seconds,
        )
        for claim in claims:
            self._execute(claim)
        return bool(claims)

    def _execute(self, claim: Claim) -> None:
        with log_context(pack=claim.work.pack_install_id, work_id=claim.work.work_id):
            self._execute_attempt(claim)

    def _execute_attempt(self, claim: Claim) -> None:
        work_id, token = claim.work.work_id, claim.lease_token
        self.stats.current_work_id = work_id
        self.stats.executions += 1
        beating = threading.Event()
        # The heartbeat thread logs with this attempt's context (pack, WorkId) too.
        heart = threading.Thread(
            target=contextvars.copy_context().run, args=(self._heartbeat, work_id, token, beating), daemon=True
        )
        heart.start()
        try:
            inputs = _Members(self._source.load_inputs(work_id, token, self._page_size))
            self._flow(Generation(work=claim.work, inputs=iter(inputs)))
            if not inputs.exhausted():
                raise IncompleteConsumption(f"flow returned before reading every input of {work_id}")
        except Exception as error:
            beating.set()
            heart.join()
            self.stats.failed_attempts += 1
            message = f"{type(error).__name__}: {error}"
            # A Flow's message may quote its inputs: it goes to LastError (GetWork), never to the log.
            log.warning("work %s failed with %s; GetWork shows its message", work_id, type(error).__name__)
            self._settle(lambda: self._source.fail(work_id, token, message))
        else:
            beating.set()
            heart.join()
            if self._settle(lambda: self._source.complete(work_id, token)):
                self.stats.completed += 1
        finally:
            self.stats.current_work_id = None

    @staticmethod
    def _settle(call: Callable[[], WorkItemRow]) -> bool:
        """Finish an attempt; a refusal (lost lease) is logged: the attempt is someone else's now."""
        try:
            call()
        except Exception as error:
            log.warning("could not finish attempt: %s", error)
            return False
        return True

    def _heartbeat(self, work_id: str, token: str, stop: threading.Event) -> None:
        interval = max(0.05, self._lease_seconds / 3)
        while not stop.wait(interval):
            try:
                self._source.heartbeat(work_id, token, self._lease_seconds)
            except Exception as error:
                log.warning("heartbeat of %s refused: %s", work_id, error)
                return

    def run(self) -> None:
        """Claim and run work until ``run_until_drained`` (or ``stop``) is called."""
        while not self._stopping.is_set():
            try:
                claimed = self.run_once()
            except Exception as error:  # the service may be away: keep polling
                log.warning("claim failed: %s", error)
                claimed = False
            if not claimed:
                self._stopping.wait(self._poll_interval)

    def start(self) -> None:
        """Run in a background thread."""
        self._thread = threading.Thread(target=self.run, name=f"worker-{self.worker_id}", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop claiming new work; the in-flight generation, if any, runs to its end."""
        self._stopping.set()

    def run_until_drained(self, timeout: float | None = None) -> bool:
        """Stop claiming and wait for the in-flight generation; True if it finished in time."""
        self.stop()
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()


class _Members:
    """Flattens pages into inputs and remembers whether the last page was read."""

    def __init__(self, pages: Iterator[InputPage]) -> None:
        self._pages = pages
        self._done = False

    def __iter__(self) -> Iterator[InputRow]:
        for page in self._pages:
            yield from page.inputs
            if page.last:
                self._done = True

    def exhausted(self) -> bool:
        return self._done
