"""Generated old-protocol histories: the cutover passes exactly the packs a simple oracle proves resolved.

Each example is a new pack whose Events and WorkItems are written with raw SQL from
adversarial choices: statuses in other casings, padded, empty or unknown (and a blob on
SQLite); ordinals negative, zero, positive, extreme and above the counter; keys of this pack,
of another pack, empty or malformed; range work (InputStartOrdinal set). The oracle below is an
independent, deliberately naive reading of the specification's rules: it classifies every row
in Python and passes a pack only when every row is inside the documented domain and every
retained input has a responsible completed owner. A dry run must pass exactly those packs:
never one with unresolved or unclassifiable responsibility, and no clean one refused.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
import sqlalchemy as sa
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nexuscrm_controlplane import cutover
from nexuscrm_runtime.database import is_sqlite
from nexuscrm_schema.tables import PackInstall
from tests.controlplane.integration.history import FakeClock, arm, install, route
from tests.support.checksums import database_digest
from tests.support.factories import START

INVARIANTS_NOT_CHECKED = (
    "generated old-protocol histories, written raw and inconsistent on purpose (the audit must refuse them); "
    "the only product call is a dry run, which database_digest proves changed nothing"
)

pytestmark = pytest.mark.database

MAX_BIGINT = 2**63 - 1
MIN_BIGINT = -(2**63)
TERMINAL = ("completed", "failed")
EVENT_STATUSES = ("pending", "processing", "processed", "skipped", "failed")
ODD_STATUSES = ("Completed", "completed ", " failed", "", " ", "Processed", "processed\t", "done", "PENDING")
ORDINALS = st.one_of(st.integers(-2, 6), st.sampled_from([MIN_BIGINT, MAX_BIGINT, MAX_BIGINT - 1]))
COUNTERS = st.one_of(st.integers(-1, 6), st.sampled_from([MIN_BIGINT, MAX_BIGINT]))
KEYS = ("own-a", "own-b", "own-a", "own-b", "foreign", "empty", "garbage")  # own keys are likelier


def statuses(known: tuple[str, ...], blob: bool) -> st.SearchStrategy[Any]:
    odd: list[Any] = list(ODD_STATUSES) + ([b"completed", b"processed"] if blob else [])
    return st.one_of(st.sampled_from(known), st.sampled_from(known), st.sampled_from(odd))


def histories(blob: bool) -> st.SearchStrategy[dict[str, Any]]:
    event = st.tuples(st.sampled_from(KEYS), statuses(EVENT_STATUSES, blob))
    work = st.tuples(
        ORDINALS,
        st.sampled_from(KEYS),
        statuses(("completed", "completed", "failed", "pending", "blocked", "retry", "processing"), blob),
        st.one_of(st.none(), st.none(), st.none(), ORDINALS),
    )
    return st.fixed_dictionaries(
        {
            "counter": COUNTERS,
            "events": st.dictionaries(ORDINALS, event, max_size=6),
            "work": st.lists(work, max_size=6),
        }
    )


@st.composite
def near_clean(draw: st.DrawFn, blob: bool) -> dict[str, Any]:
    """A history the rules accept, then (usually) one row pushed past one rule's boundary."""
    events: dict[int, tuple[str, Any]] = {}
    work: list[tuple[int, str, Any, int | None]] = []
    for key in draw(st.lists(st.sampled_from(("own-a", "own-b")), min_size=1, max_size=2, unique=True)):
        ordinals = draw(
            st.lists(st.integers(1, 12).filter(lambda o: o not in events), min_size=1, max_size=4, unique=True)
        )
        ordinals.sort()
        for ordinal in ordinals:
            events[ordinal] = (key, draw(st.sampled_from(EVENT_STATUSES)))
        work.append((ordinals[-1], key, "completed", None))  # the boundary owner
        for ordinal in ordinals[:-1]:  # a direct task, or a coalesced input inside the boundary
            status = draw(st.sampled_from(["completed", "failed", None]))
            if status is not None:
                work.append((ordinal, key, status, None))
    counter = max(events) + draw(st.sampled_from([0, 0, 1, MAX_BIGINT - max(events)]))
    history = {"counter": counter, "events": events, "work": work}
    odd = draw(st.sampled_from([*ODD_STATUSES, *([b"completed", b"processed"] if blob else [])]))
    some_event = draw(st.sampled_from(sorted(events)))
    index = draw(st.integers(0, len(work) - 1))
    lane, key, status, _ = work[index]
    match draw(
        st.sampled_from(["none", "work_status", "event_status", "above", "negative", "key", "range", "counter"])
    ):
        case "work_status":
            work[index] = (lane, key, odd, None)
        case "event_status":
            events[some_event] = (events[some_event][0], odd)
        case "above":
            events[min(counter + 1, MAX_BIGINT)] = ("own-a", "processed")
            work.append((min(counter + 1, MAX_BIGINT), "own-a", "completed", None))
        case "negative":
            events[draw(st.sampled_from([-1, MIN_BIGINT]))] = ("own-a", "processed")
        case "key":
            events[some_event] = (draw(st.sampled_from(["foreign", "empty", "garbage"])), events[some_event][1])
        case "range":
            work[index] = (lane, key, status, lane)
        case "counter":
            history["counter"] = draw(st.sampled_from([max(events) - 1, -1, MIN_BIGINT]))
    return history


def oracle(history: dict[str, Any]) -> bool:
    """True when every row is inside the documented domain and every input has a completed owner."""
    counter, events, work = history["counter"], history["events"], history["work"]
    if counter < 0:
        return False
    for lane, key, status, start in work:
        if not (type(status) is str and status in TERMINAL and start is None and 0 <= lane <= counter):
            return False
        if key not in ("own-a", "own-b") or events.get(lane, (None,))[0] != key:  # orphaned, or another identity
            return False
    for ordinal, (key, status) in events.items():
        if not (0 <= ordinal <= counter and type(status) is str and status in EVENT_STATUSES):
            return False
        if key not in ("own-a", "own-b"):
            return False
        completed = [lane for lane, k, s, _ in work if k == key and s == "completed"]
        if not completed:
            return False
        direct = any(lane == ordinal and k == key for lane, k, _, _ in work)
        ordinals = [o for o, (k, _) in events.items() if k == key]
        if not direct and (ordinal > max(completed) or min(ordinals) == 0 < max(ordinals)):
            return False
    return True


def key_of(choice: str, pack: str, other: str) -> str:
    return {
        "own-a": route("lane-a").identity(pack).key,
        "own-b": route("lane-b").identity(pack).key,
        "foreign": route("lane-a").identity(other).key,
        "empty": "",
        "garbage": "pk1|not-a-key",
    }[choice]


def write(engine: sa.Engine, pack: str, other: str, history: dict[str, Any], clock: FakeClock) -> None:
    insert_event = sa.text(
        "INSERT INTO Event (PackInstallId, EnqueueOrdinal, ProjectionKey, ReceiptKey, PayloadHash, Payload,"
        " Status, IsReplay, CreatedAt) VALUES (:p, :o, :k, :r, :h, :b, :s, :i, :c)"
    )
    insert_work = sa.text(
        "INSERT INTO WorkItem (WorkId, PackInstallId, ProjectionKey, WorkType, InputStartOrdinal, LaneOrdinal,"
        " Status, Attempt, MaxAttempts, CreatedAt) VALUES (:w, :p, :k, 'project', :s0, :l, :s, 0, 3, :c)"
    )
    with engine.begin() as connection:
        connection.execute(
            sa.update(PackInstall).where(PackInstall.c.PackInstallId == pack).values(LastOrdinal=history["counter"])
        )
        for ordinal, (key, status) in history["events"].items():
            connection.execute(
                insert_event,
                {
                    "p": pack,
                    "o": ordinal,
                    "k": key_of(key, pack, other),
                    "r": f"r{ordinal}",
                    "h": "0" * 64,
                    "b": b"x",
                    "s": status,
                    "i": False,
                    "c": START,
                },
            )
        for lane, key, status, start in history["work"]:
            connection.execute(
                insert_work,
                {
                    "w": str(uuid.uuid4()),
                    "p": pack,
                    "k": key_of(key, pack, other),
                    "s0": start,
                    "l": lane,
                    "s": status,
                    "c": START,
                },
            )


def test_the_audit_passes_exactly_what_the_oracle_proves(engine: sa.Engine) -> None:
    clock = FakeClock()
    arm(engine, clock)
    other = install(engine, clock)
    seen = {True: 0, False: 0}

    @settings(
        max_examples=150 if is_sqlite(engine) else 80,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(history=st.one_of(histories(blob=is_sqlite(engine)), near_clean(blob=is_sqlite(engine))))
    def check(history: dict[str, Any]) -> None:
        pack = install(engine, clock)
        write(engine, pack, other, history, clock)
        before = database_digest(engine)
        result = cutover.run_cutover(engine, pack, deadline=time.monotonic() + 60, dry_run=True, clock=clock)
        proven = oracle(history)
        seen[proven] += 1
        if proven:
            assert result.outcome is cutover.Outcome.WOULD_WRITE, (history, result.report.summary())
        else:
            assert result.refused, (history, result.outcome)
        assert database_digest(engine) == before  # a dry run writes nothing

    check()
    assert seen[False] and seen[True], f"both verdicts must be generated: {seen}"
    print("oracle verdicts", seen)
