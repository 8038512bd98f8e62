"""Group admission: concurrent Ingest calls of one pack share one admission transaction.

Admission of a pack is serialized by its PackInstall row lock, so concurrent calls of one
pack used to queue behind it, each for a transaction and a commit of its own. Here the first
caller of a pack leads: it admits its own deliveries together with those of every call that
arrived while the previous group of the pack ran (up to ``admission_group_items`` deliveries
and ``max_transaction_bytes`` payload bytes), in one transaction, and hands each caller its
own results. A caller that arrives while a group runs waits for the next one (group commit,
as databases do for their logs).

A call's results are exactly what it would have got alone, but for a receipt key that two
concurrent calls both carry: the second reads as a duplicate of the first (or is rejected
when its payload differs), as inside one batch. A failure that is not a domain error (a
delivery the database refuses) could be any member's fault: then each call runs alone, so
no call is failed by a neighbour. A domain error (unknown pack, no protocol row, database
unavailable, conflict) is the pack's or the database's, and every member receives it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from nexuscrm_connectors import metrics
from workqueue.errors import DomainError
from workqueue.values import IngestResult, Outcome

if TYPE_CHECKING:
    from nexuscrm_connectors.admission import Delivery

Admit = Callable[[Sequence["Delivery"]], dict[str, IngestResult]]


class _Call:
    """One caller's deliveries and, once its group ran, its results or error."""

    def __init__(self, deliveries: Sequence[Delivery]) -> None:
        self.deliveries = deliveries
        self.payload_bytes = sum(len(delivery.item.payload) for delivery in deliveries)
        self.results: dict[str, IngestResult] | None = None
        self.error: BaseException | None = None

    @property
    def done(self) -> bool:
        return self.results is not None or self.error is not None

    def outcome(self) -> dict[str, IngestResult]:
        if self.error is not None:
            raise self.error
        if self.results is None:
            raise RuntimeError("outcome() of a group that is not done")
        return self.results


class AdmissionGroups:
    """Merges concurrent admissions of one pack into one transaction (one instance per engine)."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._waiting: dict[str, list[_Call]] = {}  # pack -> calls not yet taken by a leader
        self._leading: set[str] = set()  # packs whose group is running

    def admit(
        self,
        pack_install_id: str,
        deliveries: Sequence[Delivery],
        run: Admit,
        *,
        group_items: int,
        group_bytes: int,
    ) -> dict[str, IngestResult]:
        """Admit ``deliveries`` (unique receipt keys) with ``run``, grouped with concurrent calls of the pack.

        ``run`` admits a list of deliveries with unique keys in one transaction and returns
        results by key. A group holds at most ``group_items`` deliveries and ``group_bytes``
        payload bytes, and always at least the leader's own.
        """
        call = _Call(deliveries)
        with self._condition:
            waiting = self._waiting.setdefault(pack_install_id, [])
            waiting.append(call)
            while not call.done and pack_install_id in self._leading:
                self._condition.wait()
            if call.done:
                return call.outcome()
            self._leading.add(pack_install_id)
            group = _take(waiting, call, group_items, group_bytes)
        try:
            _run_group(group, run)
        finally:
            with self._condition:
                self._leading.discard(pack_install_id)
                if not waiting:
                    del self._waiting[pack_install_id]
                self._condition.notify_all()
        return call.outcome()


def _take(waiting: list[_Call], leader: _Call, limit: int, limit_bytes: int) -> list[_Call]:
    """The leader and the oldest waiting calls within ``limit`` deliveries and ``limit_bytes`` (taken out)."""
    waiting.remove(leader)
    group, size, size_bytes = [leader], len(leader.deliveries), leader.payload_bytes
    while (
        waiting and size + len(waiting[0].deliveries) <= limit and size_bytes + waiting[0].payload_bytes <= limit_bytes
    ):
        size += len(waiting[0].deliveries)
        size_bytes += waiting[0].payload_bytes
        group.append(waiting.pop(0))
    return group


def _run_group(group: list[_Call], run: Admit) -> None:
    first: dict[str, Delivery] = {}
    for call in group:
        for delivery in call.deliveries:
            first.setdefault(delivery.item.receipt_key, delivery)
    try:
        admitted = run(list(first.values()))
    except DomainError as error:
        for call in group:
            call.error = error
        return
    except Exception as error:
        if len(group) == 1:
            group[0].error = error
            return
        for call in group:  # whose delivery failed it is unknown: each call alone
            _run_group([call], run)
        return
    metrics.ADMISSION_TRANSACTIONS.observe(len(first))
    metrics.ADMISSION_CALLS.inc(len(group))
    for call in group:
        call.results = {
            d.item.receipt_key: admitted[d.item.receipt_key]
            if first[d.item.receipt_key] is d
            else same_key_again(first[d.item.receipt_key], d, admitted)
            for d in call.deliveries
        }


def same_key_again(first: Delivery, again: Delivery, admitted: dict[str, IngestResult]) -> IngestResult:
    """A later delivery of a receipt key that an earlier delivery of the same transaction carried."""
    result = admitted[first.item.receipt_key]
    if again.item.payload != first.item.payload or again.item.route != first.item.route:
        return IngestResult(
            receipt_key=again.item.receipt_key,
            outcome=Outcome.REJECTED,
            message="receipt_key was delivered twice in one admission with a different payload or route",
        )
    if result.outcome is Outcome.ADMITTED:
        return IngestResult(
            receipt_key=again.item.receipt_key,
            outcome=Outcome.DUPLICATE_COVERED,
            enqueue_ordinal=result.enqueue_ordinal,
            work_id=result.work_id,
            message="duplicate of a delivery admitted in the same transaction",
        )
    return result
