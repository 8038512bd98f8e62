"""``nexuscrm-run`` decides the end of its wait from one snapshot (issue 57, decision 172).

The wait reads the inputs in completed generations (tombstones and expired ones included) and
the generations per status. Read statement by statement at READ COMMITTED, a generation that
completed (or completed and was pruned) between the reads counted neither as finished nor as
open, and the run ended "stuck" (exit 9) on a database where every input was applied. Here
Connectors completes and prunes on a connection of its own right after the first statement
of the runner's read: on a database server the read waits for that commit, so the rest of
the read comes after it; on SQLite the read holds the writer (``BEGIN IMMEDIATE``), so the
step commits once the read ended. Either way the decision is that of one moment. Two
owners' code (Connectors writes, the tools read), so a system test (decision 146).
"""

from __future__ import annotations

import collections
import contextlib
import threading
from collections.abc import Callable, Iterator

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.facade import Connectors
from nexuscrm_runtime.database import create_engine, is_sqlite
from nexuscrm_tools.run import decide
from nexuscrm_tools.run_outcome import Ending
from nexuscrm_tools.simulator import SimulatorStats
from tests.support.factories import FakeClock, delivery, install_pack
from tests.support.invariants import assert_invariants
from tests.support.statements import after_each_statement
from workqueue.values import Outcome

pytestmark = pytest.mark.database

STEP_DEADLINE = 60.0  # seconds a step may wait for the writer the runner's read holds (SQLite)

Step = Callable[[], object]


@contextlib.contextmanager
def after_the_first_read(runner: sa.Engine, step: Step | None) -> Iterator[None]:
    """Run ``step`` once the first statement on WorkItem of the block's read on ``runner`` returned.

    On a database server it runs at once, inside the read. On SQLite it runs on a thread of its
    own and waits for the writer; the block ends once it has committed.
    """
    if step is None:
        yield
        return
    started: list[threading.Thread] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            step()
        except BaseException as error:  # raised in the test's thread below
            errors.append(error)

    def after(statement: str) -> None:
        if started or "WorkItem" not in statement:
            return
        started.append(threading.Thread(target=run, name="between-the-reads"))
        started[0].start()
        if not is_sqlite(runner):
            started[0].join()

    with after_each_statement(runner, after):
        yield
    assert started, "the runner's read never read WorkItem"
    started[0].join(STEP_DEADLINE)
    assert not started[0].is_alive(), f"the step still waits after {STEP_DEADLINE:g} s"
    if errors:
        raise errors[0]


@pytest.mark.parametrize(
    ("policy", "plan"),
    [
        # A generation and its successor complete between the reads.
        (None, [("finish", None, 0, {"processing": 1, "blocked": 1}), (None, Ending.PROJECTED, 2, {"completed": 2})]),
        # Both complete and retention prunes the first into a tombstone between the reads (issue 57's run).
        (
            1,
            [("finish+prune", None, 0, {"processing": 1, "blocked": 1}), (None, Ending.PROJECTED, 2, {"completed": 1})],
        ),
        # Both complete between the reads; then a prune commits between the next ones: counted once, not twice.
        (
            1,
            [
                ("finish", None, 0, {"processing": 1, "blocked": 1}),
                ("prune", Ending.PROJECTED, 2, {"completed": 2}),
                (None, Ending.PROJECTED, 2, {"completed": 1}),
            ],
        ),
    ],
    ids=["completes", "completes-and-is-pruned", "is-pruned-later"],
)
def test_the_wait_is_decided_from_one_read_while_generations_complete_and_are_pruned(
    engine: sa.Engine,
    dsn: str,
    policy: int | None,
    plan: list[tuple[str | None, Ending | None, int, dict[str, int]]],
) -> None:
    connectors = Connectors(engine, clock=FakeClock())
    pack = install_pack(engine)
    if policy is not None:
        connectors.set_retention_policy(pack, keep_generations=policy, keep_seconds=None)
    connectors.ingest(pack, items=[delivery(lane="a")])
    (first,) = connectors.claim("w", pack_install_ids=[pack])
    connectors.ingest(pack, items=[delivery(lane="a")])  # its successor waits behind it (blocked)
    stats = SimulatorStats(outcomes=collections.Counter({Outcome.ADMITTED: 2}), done=True)

    def finish() -> None:
        connectors.complete(first.work.work_id, lease_token=first.lease_token)
        (second,) = connectors.claim("w", pack_install_ids=[pack])
        connectors.complete(second.work.work_id, lease_token=second.lease_token)

    def prune() -> None:
        assert connectors.prune(pack).generations == 1

    def finish_and_prune() -> None:
        finish()
        prune()

    steps: dict[str | None, Step | None] = {
        None: None,
        "finish": finish,
        "prune": prune,
        "finish+prune": finish_and_prune,
    }
    runner = create_engine(dsn)  # the runner's own engine, as its process has
    try:
        for step, wanted, finished, counts in plan:
            with after_the_first_read(runner, steps[step]):
                reached, state = decide(runner, pack, stats, host_running=True)
            assert (reached, state.finished, dict(state.counts), state.held) == (wanted, finished, counts, 0)
    finally:
        runner.dispose()
    assert_invariants(engine)
