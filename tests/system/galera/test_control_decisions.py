"""Protocol decisions against their conflicting writers on two Galera nodes, interleaved on purpose.

Each test holds two transactions at their commit, on different nodes, after both have read
and written everything (``Gate``: the ``<name>:before_commit`` point of ``run_transaction``).
Then the first commits, and then the second. Galera certifies only write-write conflicts:
if the two write no common row, both commit, and the second has decided on a read that the
first made stale (write skew; docs/design.md, "Multi-primary engines"). Decision 107 makes each
decision write a row its conflicting writer writes, so the second aborts (deadlock 1213),
``run_transaction`` retries it, and the retry decides on the committed state.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.errors import LegacyRefused
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.legacy.runtime import LegacyRuntime
from nexuscrm_controlplane import fences, lifecycle
from nexuscrm_runtime import database, faults
from nexuscrm_runtime.database import create_engine
from tests.support.factories import delivery, install_pack
from tests.support.invariants import assert_invariants
from workqueue.values import Outcome

HOLD_SECONDS = 20.0  # seconds a held transaction waits for its release at most


class Gate:
    """Holds the first attempt of named transactions at ``before_commit`` until released."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self._arrived: dict[str, threading.Event] = {}
        self._release: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self.attempts: dict[str, int] = {}
        real = faults.fault_point

        def point(name: str) -> None:
            transaction, _, phase = name.rpartition(":")
            if phase == "before_commit" and transaction in self._release:
                with self._lock:
                    self.attempts[transaction] = self.attempts.get(transaction, 0) + 1
                    first = self.attempts[transaction] == 1
                if first:
                    self._arrived[transaction].set()
                    self._release[transaction].wait(HOLD_SECONDS)
            real(name)

        monkeypatch.setattr(database, "fault_point", point)

    def hold(self, transaction: str) -> None:
        self._arrived[transaction] = threading.Event()
        self._release[transaction] = threading.Event()

    def run(self, transaction: str, call: Callable[[], Any]) -> Callable[[], Any]:
        """Start ``call`` in a thread and wait until it is held; the function returned releases it, gives its result."""
        outcome: dict[str, Any] = {}

        def target() -> None:
            try:
                outcome["value"] = call()
            except BaseException as error:
                outcome["error"] = error
                self._arrived[transaction].set()  # failed before its commit: do not wait for it

        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        assert self._arrived[transaction].wait(HOLD_SECONDS), f"{transaction} never reached its commit"
        assert "error" not in outcome, f"{transaction} failed before its commit: {outcome.get('error')!r}"

        def release() -> Any:
            self._release[transaction].set()
            thread.join(HOLD_SECONDS)
            assert not thread.is_alive(), f"{transaction} did not finish"
            if "error" in outcome:
                raise outcome["error"]
            return outcome["value"]

        return release


@pytest.fixture
def engines(node_dsns: list[str]) -> Iterator[list[sa.Engine]]:
    created = [create_engine(dsn) for dsn in node_dsns]
    try:
        yield created
    finally:
        for engine in created:
            engine.dispose()


def synced(engine: sa.Engine) -> None:
    """Wait until ``engine``'s node has applied everything committed anywhere (the setup's writes)."""
    with engine.connect() as connection:
        connection.exec_driver_sql("SET SESSION wsrep_sync_wait = 1")
        connection.exec_driver_sql("SELECT 1")
        connection.exec_driver_sql("SET SESSION wsrep_sync_wait = 0")


@pytest.mark.parametrize("change", ["arm a namespace fence", "remove the override"])
def test_an_admission_cannot_commit_after_a_fence_change_it_did_not_see(
    engines: list[sa.Engine], monkeypatch: pytest.MonkeyPatch, change: str
) -> None:
    """Fence check vs arming a fence / removing an override: the admission that commits later is fenced."""
    pack = install_pack(engines[0])
    override_of = None
    if change == "remove the override":
        override_of = fences.arm_fence(engines[0], "acme").fence_id
        fences.add_override(engines[0], override_of, pack)
    synced(engines[1])
    gate = Gate(monkeypatch)
    name = "arm fence" if override_of is None else "remove fence override"
    gate.hold(name)
    gate.hold("admission")

    def fence_change() -> None:
        if override_of is None:
            fences.arm_fence(engines[0], "acme")
        else:
            fences.remove_override(engines[0], override_of, pack)

    changed = gate.run(name, fence_change)  # node 1: written, not committed
    admitted = gate.run("admission", lambda: Connectors(engines[1]).ingest(pack, items=[delivery(lane="a")]))
    changed()  # the fence change commits first ...
    [result] = admitted()  # ... then the admission, which read the fences before it
    assert gate.attempts["admission"] >= 2, "the admission was not made to decide again"
    assert result.outcome is Outcome.FENCED, (
        f"the admission committed after '{change}' committed, on the fences it read before: {result.outcome}"
    )
    assert_invariants(engines[0])


def test_a_namespace_fence_covers_a_pack_installed_on_another_node_while_it_was_armed(
    engines: list[sa.Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Fence check vs arming a namespace fence, for a pack the arm could not see (a phantom).

    The arm bumps the namespace's packs it reads; a pack installed and activated on another
    node after that read is not among them, so an admission of it that read the fences before
    the arm committed wrote no row the arm wrote, and both committed: admitted unfenced after
    ArmFence returned. Installing and arming now both write the namespace's NamespaceControl
    row (decision 107, amendment): the arm conflicts with the install, its retry bumps the new
    pack, and the admission, which writes that pack's row, must decide again.
    """
    synced(engines[1])
    gate = Gate(monkeypatch)
    gate.hold("arm fence")
    gate.hold("admission")
    armed = gate.run("arm fence", lambda: fences.arm_fence(engines[0], "acme"))  # node 1: written, not committed
    pack = lifecycle.install_pack(engines[1], "acme", "crm", "1").pack_install_id  # node 2, committed
    lifecycle.activate_pack(engines[1], pack)
    admitted = gate.run("admission", lambda: Connectors(engines[1]).ingest(pack, items=[delivery(lane="a")]))
    armed()  # the fence commits first ...
    [result] = admitted()  # ... then the admission, which read the fences before it
    assert gate.attempts["arm fence"] >= 2, "the arm did not conflict with the install it could not see"
    assert result.outcome is Outcome.FENCED, (
        f"the admission of a pack installed while the fence was armed committed unfenced: {result.outcome}"
    )
    assert_invariants(engines[0])


def test_a_legacy_admission_cannot_commit_beside_the_protocol_row(
    engines: list[sa.Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cutover/activation vs admission: the cutoff is the LastOrdinal the protocol write read (invariant M)."""
    pack = install_pack(engines[0], legacy_max_ordinal=None)  # no protocol row, no history
    synced(engines[1])
    gate = Gate(monkeypatch)
    gate.hold("activate pack")
    gate.hold("legacy ingest")
    activated = gate.run("activate pack", lambda: lifecycle.activate_pack(engines[0], pack))
    old = gate.run("legacy ingest", lambda: LegacyRuntime(engines[1]).ingest(pack, [delivery(lane="a")]))
    row, _ = activated()  # greenfield: LegacyMaxOrdinal 0
    assert row.legacy_max_ordinal == 0
    with pytest.raises(LegacyRefused):  # retried after the conflict, it finds the protocol row
        outcome = old()
        pytest.fail(f"the legacy admission committed beside the protocol row: {outcome}")
    assert_invariants(engines[0])


def test_an_extension_and_a_claim_of_one_generation_cannot_both_commit(
    engines: list[sa.Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Already safe: both write the generation's row, so the claim never misses a member (X, P)."""
    pack = install_pack(engines[0])
    [first] = Connectors(engines[0]).ingest(pack, items=[delivery(lane="a")])
    synced(engines[1])
    gate = Gate(monkeypatch)
    gate.hold("claim")
    gate.hold("admission")
    claimed = gate.run("claim", lambda: Connectors(engines[1]).claim("w", pack_install_ids=[pack]))
    extended = gate.run("admission", lambda: Connectors(engines[0]).ingest(pack, items=[delivery(lane="a")]))
    [claim] = claimed()  # the claim commits first: the generation is [1, 1] ...
    [second] = extended()  # ... so the admission, retried, puts input 2 in a successor
    assert claim.work.work_id == first.work_id and claim.work.lane_ordinal == 1
    assert gate.attempts["admission"] >= 2
    assert second.work_id != first.work_id and second.starts_generation
    assert_invariants(engines[0])


pytestmark = pytest.mark.slow
