"""Every mutating operator RPC raced by two operators through two server processes (issue 53 item 2, decision 183).

Two Connectors and two Controlplane processes serve one database (SQLite, MariaDB); in each
round two clients send the same mutation of the same rows at once, one through each process,
released by a barrier. Each race must end as one of the calls alone would have left the
database, each answer must say what happened (done; already done, naming the other's act;
refused), and the invariants hold at the end. A round counts as overlapping when both calls
were sent before either was answered; each mutation needs at least one such round, so a race
that never happened cannot pass. ``NEXUSCRM_RELIABILITY_FULL=1`` runs more rounds.
The answers are the rows of docs/reliability.md's race table.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import sqlalchemy as sa

from nexuscrm.connectors.v1 import connectors_pb2 as pb
from nexuscrm.controlplane.v1 import controlplane_pb2 as cp
from nexuscrm_controlplane import fences, lifecycle
from nexuscrm_schema.tables import (
    AdmissionFence,
    AdmissionFenceOverride,
    ClaimPause,
    ConnectorProjectionProtocol,
    SkippedWork,
    WorkItem,
)
from tests.conftest import BACKENDS, _migrated, _mysql_database
from tests.connectors.integration.test_dead_letters import fail_all
from tests.connectors.replays import replays_per_work
from tests.support.factories import delivery, install_pack, record_work_item_handoff
from tests.support.invariants import assert_invariants
from tests.system.reliability.conftest import FULL, record_figures
from tests.system.reliability.operator_races import (
    CALL_TIMEOUT,
    Answer,
    Operators,
    Replica,
    Tally,
    race,
    serving_operators,
)

pytestmark = [pytest.mark.database, pytest.mark.acceptance]

ROUNDS = 24 if FULL else 6
DEAD_LETTERS = 6  # per round of the bulk races: one per lane
PAGE_SIZES = (2, 3)  # each bulk call's pages: overlapping windows of the same dead letters


@pytest.fixture(scope="module", params=BACKENDS)
def operators(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Operators]:
    """Two Connectors and two Controlplane processes on one database at the newest schema."""
    workdir = tmp_path_factory.mktemp(f"races-{request.param}")
    databases = (
        iter([f"sqlite:///{workdir / 'nexuscrm.db'}"])
        if request.param == "sqlite"
        else _mysql_database(request.getfixturevalue("mysql_server_dsn"))
    )
    dsn = _migrated(next(databases))
    with serving_operators((dsn, dsn), workdir, request.param) as operators:
        yield operators
    for _ in databases:  # drops the MariaDB database
        pass


def _dead_letters(operators: Operators, count: int) -> tuple[str, list[str]]:
    pack = install_pack(operators.engine)
    operators.connectors.ingest(pack, items=[delivery(lane=f"lane-{n}") for n in range(count)])
    return pack, sorted(fail_all(operators.connectors, pack, "boom"))


def _codes(answers: list[Answer]) -> list[str]:
    return sorted(a.code for a in answers)


def _count(engine: sa.Engine, query: sa.Select[Any]) -> int:
    with engine.connect() as connection:
        return int(connection.execute(query).scalar_one())


def _finish(operators: Operators, mutation: str, tally: Tally) -> None:
    record_figures(f"operator race[{operators.backend}] {mutation}", tally.figures())
    assert tally.overlapping >= 1, f"no round of {mutation} had both calls in flight at once: {tally.figures()}"
    assert_invariants(operators.engine)


def test_replay(operators: Operators) -> None:
    """One replay is made; the other is refused naming it (already done)."""
    tally = Tally()
    for _ in range(ROUNDS):
        pack, (dead,) = _dead_letters(operators, 1)
        answers = operators.both(lambda r: r.connectors.Replay, pb.ReplayRequest(work_id=dead))
        tally.add(answers)
        assert _codes(answers) == ["FAILED_PRECONDITION", "OK"], answers
        (done,) = (a for a in answers if a.code == "OK")
        (refused,) = (a for a in answers if a.code != "OK")
        assert done.response.work.work_id in refused.message  # the loser names the replay made
        with operators.engine.connect() as connection:
            assert replays_per_work(connection, pack) == {dead: 1}
    _finish(operators, "Replay", tally)


def _bulk(rpc: str, replica: Replica, wanted: pb.DeadLetterFilter, size: int) -> list[pb.DeadLetterReplay]:
    """Every page of one bulk replay or skip, paged by ``size``: each dead letter's answer."""
    token, answers = "", list[pb.DeadLetterReplay]()
    while True:
        page: pb.ReplayDeadLettersResponse | pb.SkipDeadLettersResponse
        if rpc == "ReplayDeadLetters":
            page = replica.connectors.ReplayDeadLetters(
                pb.ReplayDeadLettersRequest(filter=wanted, max_generations=size, page_token=token),
                timeout=CALL_TIMEOUT,
            )
        else:
            page = replica.connectors.SkipDeadLetters(
                pb.SkipDeadLettersRequest(
                    filter=wanted, skipped_by="ops", reason="race", max_generations=size, page_token=token
                ),
                timeout=CALL_TIMEOUT,
            )
        answers += page.answers
        token = page.next_page_token
        if not token:
            return answers


@pytest.mark.parametrize("rpc", ["ReplayDeadLetters", "SkipDeadLetters"])
def test_bulk(operators: Operators, rpc: str) -> None:
    """Each dead letter is acted on by exactly one of the two bulk calls; the other answers it refused."""
    tally = Tally()
    for _ in range(ROUNDS):
        pack, dead = _dead_letters(operators, DEAD_LETTERS)
        wanted = pb.DeadLetterFilter(pack_install_id=pack)
        answers = race(
            [
                functools.partial(_bulk, rpc, replica, wanted, size)
                for replica, size in zip(operators.replicas, PAGE_SIZES, strict=True)
            ]
        )
        tally.add(answers)
        done = pb.DEAD_LETTER_VERDICT_REPLAYED if rpc == "ReplayDeadLetters" else pb.DEAD_LETTER_VERDICT_SKIPPED
        acted: list[str] = []
        for answer in answers:
            # NOT_FOUND: the other call took every dead letter before this one listed any.
            assert answer.code in {"OK", "NOT_FOUND"}, answer
            for one in answer.response or ():
                assert one.verdict in {done, pb.DEAD_LETTER_VERDICT_REFUSED}, one
                tally.codes[pb.DeadLetterVerdict.Name(one.verdict)] += 1
                if one.verdict == done:
                    acted.append(one.work_id)
                else:  # already done by the other call, and it says so
                    assert one.error_code == grpc.StatusCode.FAILED_PRECONDITION.value[0], one
                    assert ("replay" if rpc == "ReplayDeadLetters" else "was skipped") in one.message, one
        assert sorted(acted) == dead  # each exactly once
        with operators.engine.connect() as connection:
            if rpc == "ReplayDeadLetters":
                assert replays_per_work(connection, pack) == dict.fromkeys(dead, 1)
            else:
                skipped = connection.execute(sa.select(SkippedWork.c.WorkId).where(SkippedWork.c.PackInstallId == pack))
                assert sorted(skipped.scalars()) == dead
    _finish(operators, rpc, tally)


def test_skip(operators: Operators) -> None:
    """One skip is recorded; the other is refused naming who skipped it."""
    tally = Tally()
    for n in range(ROUNDS):
        _, (dead,) = _dead_letters(operators, 1)
        answers = operators.both(
            lambda r: r.connectors.SkipDeadLetter,
            *(pb.SkipDeadLetterRequest(work_id=dead, skipped_by=who, reason=f"round {n}") for who in ("a", "b")),
        )
        tally.add(answers)
        assert _codes(answers) == ["FAILED_PRECONDITION", "OK"], answers
        (done,) = (a for a in answers if a.code == "OK")
        (refused,) = (a for a in answers if a.code != "OK")
        assert "was skipped at" in refused.message and done.response.skipped_by in refused.message
        skips = operators.connectors.skips([dead])
        assert skips[dead].skipped_by == done.response.skipped_by
    _finish(operators, "SkipDeadLetter", tally)


def test_skip_against_replay(operators: Operators) -> None:
    """One operator replays a dead letter while the other skips it: one act wins, the other is refused naming it."""
    tally = Tally()
    for _ in range(ROUNDS):
        pack, (dead,) = _dead_letters(operators, 1)
        first, second = operators.replicas
        answers = race(
            [
                functools.partial(first.connectors.Replay, pb.ReplayRequest(work_id=dead), timeout=CALL_TIMEOUT),
                functools.partial(
                    second.connectors.SkipDeadLetter,
                    pb.SkipDeadLetterRequest(work_id=dead, skipped_by="ops", reason="race"),
                    timeout=CALL_TIMEOUT,
                ),
            ]
        )
        tally.add(answers)
        assert _codes(answers) == ["FAILED_PRECONDITION", "OK"], answers
        replayed, skipped = answers[0].code == "OK", answers[1].code == "OK"
        with operators.engine.connect() as connection:
            assert replays_per_work(connection, pack) == ({dead: 1} if replayed else {})
        assert list(operators.connectors.skips([dead])) == ([dead] if skipped else [])
        loser = answers[1] if replayed else answers[0]
        assert ("was replayed as" if replayed else "was skipped at") in loser.message, loser
    _finish(operators, "Replay against SkipDeadLetter", tally)


def _pack_scope(pack: str) -> pb.ClaimScope:
    return pb.ClaimScope(pack_install_id=pack, scope=pb.PAUSE_SCOPE_PACK)


def _active_pauses(engine: sa.Engine, pack: str) -> int:
    return _count(
        engine,
        sa.select(sa.func.count())
        .select_from(ClaimPause)
        .where(ClaimPause.c.PackInstallId == pack, ClaimPause.c.ResumedAt.is_(None)),
    )


def test_pause_and_resume(operators: Operators) -> None:
    """One pause holds, the other is ALREADY_EXISTS naming it; one resume ends it, the other is 'not paused'."""
    pauses, resumes = Tally(), Tally()
    for _ in range(ROUNDS):
        pack = install_pack(operators.engine)
        answers = operators.both(
            lambda r: r.connectors.PauseClaims,
            pb.PauseClaimsRequest(scope=_pack_scope(pack), paused_by="ops", reason="race"),
        )
        pauses.add(answers)
        assert _codes(answers) == ["ALREADY_EXISTS", "OK"], answers
        (done,) = (a for a in answers if a.code == "OK")
        assert f"already paused (pause {done.response.pause.pause_id}" in next(
            a.message for a in answers if a.code != "OK"
        )
        assert _active_pauses(operators.engine, pack) == 1

        answers = operators.both(
            lambda r: r.connectors.ResumeClaims, pb.ResumeClaimsRequest(scope=_pack_scope(pack), resumed_by="ops")
        )
        resumes.add(answers)
        assert _codes(answers) == ["FAILED_PRECONDITION", "OK"], answers
        assert "is not paused" in next(a.message for a in answers if a.code != "OK")
        assert _active_pauses(operators.engine, pack) == 0
    _finish(operators, "PauseClaims", pauses)
    _finish(operators, "ResumeClaims", resumes)


def test_order_and_retry_policies(operators: Operators) -> None:
    """Two different policies set at once: both done, and the policy left is one call's whole (the later commit)."""
    orders, retries = Tally(), Tally()
    for _ in range(ROUNDS):
        pack = install_pack(operators.engine)
        operators.connectors.ingest(pack, items=[delivery()])
        kinds = (pb.ORDER_POLICY_KIND_BLOCK, pb.ORDER_POLICY_KIND_CONTINUE)
        answers = operators.both(
            lambda r: r.connectors.SetOrderPolicy,
            *(
                pb.SetOrderPolicyRequest(pack_install_id=pack, policy=kind, set_by=f"ops-{kind}", reason="race")
                for kind in kinds
            ),
        )
        orders.add(answers)
        assert _codes(answers) == ["OK", "OK"], answers
        left = operators.connectors.get_order_policy(pack)
        assert (left.policy.value, left.set_by) in {("block", "ops-1"), ("continue", "ops-2")}, left

        attempts = (3, 7)
        answers = operators.both(
            lambda r: r.connectors.SetRetryPolicy,
            *(
                pb.SetRetryPolicyRequest(
                    pack_install_id=pack, work_type="project", max_attempts=n, set_by=f"ops-{n}", reason="race"
                )
                for n in attempts
            ),
        )
        retries.add(answers)
        assert _codes(answers) == ["OK", "OK"], answers
        kept = operators.connectors.get_retry_policy(pack, "project")
        assert (kept.max_attempts, kept.set_by) in {(3, "ops-3"), (7, "ops-7")}, kept
    _finish(operators, "SetOrderPolicy", orders)
    _finish(operators, "SetRetryPolicy", retries)


def _attempt(engine: sa.Engine, work_id: str) -> tuple[str, int]:
    with engine.connect() as connection:
        row = connection.execute(sa.select(WorkItem.c.Status, WorkItem.c.Attempt).where(WorkItem.c.WorkId == work_id))
        status, attempt = row.one()
    return str(status), int(attempt)


def test_retry_now(operators: Operators) -> None:
    """Both answer OK with the generation claimable now; the attempt count is unchanged (one act, not two)."""
    tally = Tally()
    for _ in range(ROUNDS):
        pack = install_pack(operators.engine)
        operators.connectors.ingest(pack, items=[delivery()])
        (claim,) = operators.connectors.claim("w", pack_install_ids=[pack])
        operators.connectors.fail(claim.work.work_id, lease_token=claim.lease_token, error="later", retryable=True)
        work_id = claim.work.work_id
        before = _attempt(operators.engine, work_id)
        answers = operators.both(
            lambda r: r.connectors.RetryNow, pb.RetryNowRequest(work_id=work_id, retried_by="ops", reason="race")
        )
        tally.add(answers)
        assert _codes(answers) == ["OK", "OK"], answers
        assert {a.response.work.status for a in answers} == {pb.WORK_STATUS_RETRY}
        assert _attempt(operators.engine, work_id) == before
        (reclaimed,) = operators.connectors.claim("w", pack_install_ids=[pack])  # claimable at once
        operators.connectors.complete(work_id, lease_token=reclaimed.lease_token)
    _finish(operators, "RetryNow", tally)


def test_retention_set_and_prune(operators: Operators) -> None:
    """Two policies set at once leave one whole; two prunes at once prune each generation once between them."""
    sets, prunes = Tally(), Tally()
    generations = 4
    for _ in range(ROUNDS):
        pack = install_pack(operators.engine)
        for _ in range(generations):  # one identity, each generation completed before the next
            operators.connectors.ingest(pack, items=[delivery()])
            (claim,) = operators.connectors.claim("w", pack_install_ids=[pack])
            operators.connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
        answers = operators.both(
            lambda r: r.connectors.SetRetentionPolicy,
            *(
                pb.SetRetentionPolicyRequest(pack_install_id=pack, keep_generations=keep, keep_seconds=0)
                for keep in (1, 2)
            ),
        )
        sets.add(answers)
        assert _codes(answers) == ["OK", "OK"], answers
        kept = operators.connectors.get_retention_policy(pack).keep_generations
        assert kept in {1, 2}

        answers = operators.both(lambda r: r.connectors.Prune, pb.PruneRequest(pack_install_id=pack))
        prunes.add(answers)
        assert _codes(answers) == ["OK", "OK"], answers
        assert sum(a.response.generations for a in answers) == generations - kept  # each pruned once
        left = _count(
            operators.engine, sa.select(sa.func.count()).select_from(WorkItem).where(WorkItem.c.PackInstallId == pack)
        )
        assert left == kept
    _finish(operators, "SetRetentionPolicy", sets)
    _finish(operators, "Prune", prunes)


def _fences(engine: sa.Engine, namespace: str) -> int:
    return _count(
        engine, sa.select(sa.func.count()).select_from(AdmissionFence).where(AdmissionFence.c.Namespace == namespace)
    )


def test_fences_and_overrides(operators: Operators) -> None:
    """Arms create (two fences, each its own id); a disarm or removal happens once, the other NOT_FOUND."""
    arms, disarms, adds, removes = Tally(), Tally(), Tally(), Tally()
    for n in range(ROUNDS):
        namespace = f"race-{operators.backend}-{n}"
        pack = install_pack(operators.engine, namespace=namespace)
        answers = operators.both(
            lambda r: r.controlplane.ArmFence, cp.ArmFenceRequest(namespace=namespace, reason="race")
        )
        arms.add(answers)
        assert _codes(answers) == ["OK", "OK"], answers
        assert answers[0].response.fence.fence_id != answers[1].response.fence.fence_id
        assert _fences(operators.engine, namespace) == 2  # as the two arms one after the other
        fence_id, other = (a.response.fence.fence_id for a in answers)

        request = cp.AddFenceOverrideRequest(fence_id=fence_id, pack_install_id=pack)
        answers = operators.both(lambda r: r.controlplane.AddFenceOverride, request)
        adds.add(answers)
        assert _codes(answers) == ["OK", "OK"], answers  # the later replaces the earlier: one override
        overrides = sa.select(sa.func.count()).select_from(AdmissionFenceOverride)
        assert _count(operators.engine, overrides.where(AdmissionFenceOverride.c.FenceId == fence_id)) == 1

        removal = cp.RemoveFenceOverrideRequest(fence_id=fence_id, pack_install_id=pack)
        answers = operators.both(lambda r: r.controlplane.RemoveFenceOverride, removal)
        removes.add(answers)
        assert _codes(answers) == ["NOT_FOUND", "OK"], answers
        assert f"has no override for {pack}" in next(a.message for a in answers if a.code != "OK")
        assert _count(operators.engine, overrides.where(AdmissionFenceOverride.c.FenceId == fence_id)) == 0

        answers = operators.both(lambda r: r.controlplane.DisarmFence, cp.DisarmFenceRequest(fence_id=fence_id))
        disarms.add(answers)
        assert _codes(answers) == ["NOT_FOUND", "OK"], answers
        assert _fences(operators.engine, namespace) == 1
        fences.disarm_fence(operators.engine, other)
    _finish(operators, "ArmFence", arms)
    _finish(operators, "AddFenceOverride", adds)
    _finish(operators, "RemoveFenceOverride", removes)
    _finish(operators, "DisarmFence", disarms)


def test_cutover(operators: Operators) -> None:
    """One call writes the checkpoint; the other answers the same one, already written."""
    tally = Tally()
    for n in range(ROUNDS):
        namespace = f"cutover-{operators.backend}-{n}"
        pack = lifecycle.install_pack(operators.engine, namespace, "crm", "1.0").pack_install_id
        record_work_item_handoff(operators.engine, pack)
        fences.arm_fence(operators.engine, namespace, reason="cutover race")
        answers = operators.both(lambda r: r.controlplane.Cutover, cp.CutoverRequest(pack_install_id=pack))
        tally.add(answers)
        assert _codes(answers) == ["OK", "OK"], answers
        assert sorted(a.response.already_written for a in answers) == [False, True]
        assert answers[0].response.protocol == answers[1].response.protocol
        protocols = sa.select(sa.func.count()).select_from(ConnectorProjectionProtocol)
        assert _count(operators.engine, protocols.where(ConnectorProjectionProtocol.c.PackInstallId == pack)) == 1
    _finish(operators, "Cutover", tally)
