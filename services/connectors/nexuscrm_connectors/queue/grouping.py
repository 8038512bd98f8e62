"""Group commit: concurrent calls for one key share one transaction (decision 085).

The first caller of a key leads: it runs its own items together with those of every call that
arrived while the previous group of the key ran (within an item and a weight limit), in one
run, and hands each caller its own results; a later caller waits for the next group. A domain
error is every member's; any other failure could be any member's fault, so each call then
runs alone. It knows nothing of what the items are: its owner says how to key, weigh, run and
answer them (``admission.Admission``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

from workqueue.errors import DomainError

Item = TypeVar("Item")
Result = TypeVar("Result")


class _Call(Generic[Item, Result]):
    """One caller's items and, once its group ran, its results or error."""

    def __init__(self, items: Sequence[Item], weight: int) -> None:
        self.items = items
        self.weight = weight
        self.results: list[Result] | None = None
        self.error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self.results is not None or self.error is not None

    def outcome(self) -> list[Result]:
        if self.error is not None:
            raise self.error
        if self.results is None:
            raise RuntimeError("outcome() of a group that is not done")
        return self.results


class GroupCommit(Generic[Item, Result]):
    """Merges concurrent calls of one key into one run; thread-safe.

    ``run(items)`` runs one group's items (in arrival order) in one transaction and returns one
    result per item, in order; ``weigh(item)`` is what ``max_weight`` bounds (payload bytes);
    ``committed(calls)`` hears how many calls each run that succeeded served (metrics).
    """

    def __init__(
        self,
        run: Callable[[str, Sequence[Item]], list[Result]],
        weigh: Callable[[Item], int],
        *,
        committed: Callable[[int], object] = lambda calls: None,
    ) -> None:
        self._run = run
        self._weigh = weigh
        self._committed = committed
        self._condition = threading.Condition()
        self._waiting: dict[str, list[_Call[Item, Result]]] = {}  # key -> calls not yet taken by a leader
        self._leading: set[str] = set()  # keys whose group is running

    def submit(self, key: str, items: Sequence[Item], *, max_items: int, max_weight: int) -> list[Result]:
        """Run ``items`` grouped with concurrent calls of ``key``; their results, in order.

        A group holds at most ``max_items`` items and ``max_weight``, and always at least the
        leader's own.
        """
        call: _Call[Item, Result] = _Call(items, sum(self._weigh(item) for item in items))
        with self._condition:
            waiting = self._waiting.setdefault(key, [])
            waiting.append(call)
            while not call.done and key in self._leading:
                self._condition.wait()
            if call.done:
                return call.outcome()
            self._leading.add(key)
            group = _take(waiting, call, max_items, max_weight)
        try:
            self._run_group(key, group)
        finally:
            with self._condition:
                self._leading.discard(key)
                if not waiting:
                    del self._waiting[key]
                self._condition.notify_all()
        return call.outcome()

    def waiting(self, key: str) -> int:
        """How many calls of ``key`` wait for the next group."""
        with self._condition:
            return len(self._waiting.get(key, []))

    def _run_group(self, key: str, group: list[_Call[Item, Result]]) -> None:
        try:
            results = self._run(key, [item for call in group for item in call.items])
        except DomainError as error:
            for call in group:
                call.error = error
            return
        except Exception as error:
            if len(group) == 1:
                group[0].error = error
                return
            for call in group:  # whose item failed it is unknown: each call alone
                self._run_group(key, [call])
            return
        self._committed(len(group))
        start = 0
        for call in group:
            call.results = results[start : start + len(call.items)]
            start += len(call.items)


def _take(
    waiting: list[_Call[Item, Result]], leader: _Call[Item, Result], limit: int, limit_weight: int
) -> list[_Call[Item, Result]]:
    """The leader and the oldest waiting calls within ``limit`` items and ``limit_weight`` (taken out)."""
    waiting.remove(leader)
    group, size, weight = [leader], len(leader.items), leader.weight
    while waiting and size + len(waiting[0].items) <= limit and weight + waiting[0].weight <= limit_weight:
        size += len(waiting[0].items)
        weight += waiting[0].weight
        group.append(waiting.pop(0))
    return group
