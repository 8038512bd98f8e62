"""A claim that completes the worker's finished generations first (decision 131), on every backend.

The completions run set-wise in one transaction before the claim's, in at most five statements
whatever their number; each is answered on its own, as Complete would answer it, without
failing the claim or the other completions; a retry after the commit changes nothing and is
answered as Complete answers a completed generation. The worker sends its finished
generations in its next claim and calls Complete only when no claim follows.
"""

from __future__ import annotations

from typing import Any

import grpc
import pytest
import sqlalchemy as sa

from nexuscrm.connectors.v1 import connectors_pb2 as cn
from nexuscrm_connectors import authorization
from nexuscrm_connectors.errors import LeaseLost, WorkNotFound
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.servicer import registration
from nexuscrm_runtime import faults
from nexuscrm_runtime.authorization import NotVisible, Principal
from nexuscrm_runtime.faults import InjectedFault
from nexuscrm_runtime.server import create_server
from nexuscrm_schema.tables import Event, WorkItem
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_sdk.flows import Generation
from nexuscrm_sdk.worker import Worker
from tests.connectors.integration.test_claims import CLAIM_STATEMENTS
from tests.support.factories import delivery, install_pack
from tests.support.invariants import assert_invariants
from tests.support.statements import capture
from tests.support.waiting import wait_until
from workqueue import EventStatus, WorkStatus
from workqueue.errors import DomainError, ErrorKind, InvalidArgument
from workqueue.values import Claim, Completion, WorkItemRow

pytestmark = pytest.mark.database

# The held leases read (locked), their compare-and-set, their selected Events, the successors
# of those no admission linked one to, the unblock; then the claim's own statements.
COMPLETION_STATEMENTS = ["SELECT", "UPDATE", "UPDATE", "SELECT", "UPDATE"]


def _done(claims: list[Claim]) -> list[Completion]:
    return [Completion(work_id=c.work.work_id, lease_token=c.lease_token) for c in claims]


def _rows(engine: sa.Engine, work_ids: list[str]) -> dict[str, Any]:
    with engine.connect() as connection:
        rows = connection.execute(sa.select(WorkItem).where(WorkItem.c.WorkId.in_(work_ids))).all()
    return {row.WorkId: row for row in rows}


def _statuses(engine: sa.Engine, work_ids: list[str]) -> list[str]:
    rows = _rows(engine, work_ids)
    return [rows[work_id].Status for work_id in work_ids]


@pytest.mark.parametrize("batch", [2, 8])
def test_completions_run_before_the_claim_in_five_statements_whatever_their_number(
    engine: sa.Engine, connectors: Connectors, batch: int
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane=f"lane-{n}") for n in range(batch)])
    claims = connectors.claim("w", pack_install_ids=[pack], max_items=batch)
    # Half the lanes get a successor behind their running generation (linked by the admission).
    linked = [f"lane-{n}" for n in range(0, batch, 2)]
    connectors.ingest(pack, items=[delivery(lane=lane) for lane in linked])
    with capture(engine) as captured:
        answer = connectors.complete_and_claim("w", completions=_done(claims), pack_install_ids=[pack], max_items=batch)
    statements = captured.round_trips()
    assert statements == [*COMPLETION_STATEMENTS, *CLAIM_STATEMENTS]  # the same for 2 and 8
    assert [r.work_id for r in answer.completed] == [c.work.work_id for c in claims]
    assert all(r.error is None and r.work is not None for r in answer.completed)
    assert {r.work.status for r in answer.completed if r.work} == {WorkStatus.COMPLETED}
    assert _statuses(engine, [c.work.work_id for c in claims]) == [WorkStatus.COMPLETED] * batch
    with engine.connect() as connection:
        processed = connection.execute(
            sa.select(sa.func.count()).select_from(Event).where(Event.c.Status == EventStatus.PROCESSED)
        ).scalar_one()
    assert processed == batch
    # The successors the completions unblocked were claimable by the same call.
    assert len(answer.claims) == len(linked)
    for claim in answer.claims:
        list(connectors.load_inputs(claim.work.work_id, lease_token=claim.lease_token))
        connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    assert_invariants(engine)


def test_each_completion_is_answered_on_its_own_and_a_refused_one_changes_nothing(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane=lane) for lane in ("a", "b", "c")])
    held, stale, waiting = connectors.claim("w", pack_install_ids=[pack], max_items=3)
    unknown = "00000000-0000-7000-8000-000000000000"
    answer = connectors.complete_and_claim(
        "w",
        completions=[
            Completion(work_id=held.work.work_id, lease_token=held.lease_token),
            Completion(work_id=stale.work.work_id, lease_token="stale-token"),
            Completion(work_id=unknown, lease_token=held.lease_token),
        ],
        pack_install_ids=[pack],
    )
    first, second, third = answer.completed
    assert first.work is not None and first.work.status is WorkStatus.COMPLETED and first.error is None
    assert isinstance(second.error, LeaseLost) and second.work is None
    assert "was not issued for work" in str(second.error)
    assert isinstance(third.error, WorkNotFound) and f"work {unknown} does not exist" == str(third.error)
    assert _statuses(engine, [stale.work.work_id, waiting.work.work_id]) == [WorkStatus.PROCESSING] * 2
    for claim in (stale, waiting):  # still held: their own tokens complete them
        connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    assert_invariants(engine)


def test_a_completion_refused_for_a_completed_generation_is_what_complete_answers(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane="a")])
    (claim,) = connectors.claim("w", pack_install_ids=[pack])
    connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    (result,) = connectors.complete_and_claim("w", completions=_done([claim]), pack_install_ids=[pack]).completed
    with pytest.raises(LeaseLost) as refused:
        connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    assert isinstance(result.error, LeaseLost) and str(result.error) == str(refused.value)
    assert "is no longer held: the work is completed" in str(result.error)
    assert_invariants(engine)


def test_a_work_named_twice_or_without_a_token_is_refused_naming_it_and_nothing_changes(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane="a"), delivery(lane="b")])
    claims = connectors.claim("w", pack_install_ids=[pack], max_items=2)
    twice = [*_done(claims), _done(claims)[0]]
    with pytest.raises(InvalidArgument, match=f"completions names work {claims[0].work.work_id} twice"):
        connectors.complete_and_claim("w", completions=twice, pack_install_ids=[pack])
    no_token = [Completion(work_id=claims[0].work.work_id, lease_token="")]
    with pytest.raises(InvalidArgument, match=r"completions\[0\].lease_token is required"):
        connectors.complete_and_claim("w", completions=no_token, pack_install_ids=[pack])
    assert _statuses(engine, [c.work.work_id for c in claims]) == [WorkStatus.PROCESSING] * 2
    answer = connectors.complete_and_claim("w", completions=_done(claims), pack_install_ids=[pack])
    assert [r.error for r in answer.completed] == [None, None]
    assert_invariants(engine)


def test_an_invalid_claim_completes_nothing_and_a_claim_refused_later_keeps_its_completions(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane="a")])
    claims = connectors.claim("w", pack_install_ids=[pack])
    with pytest.raises(InvalidArgument, match="max_items"):  # validated before anything runs
        connectors.complete_and_claim("w", completions=_done(claims), pack_install_ids=[pack], max_items=0)
    assert _statuses(engine, [claims[0].work.work_id]) == [WorkStatus.PROCESSING]
    # The pack check is the claim's own transaction: the completions committed before it.
    with pytest.raises(DomainError, match="is not installed"):
        connectors.complete_and_claim("w", completions=_done(claims), pack_install_ids=[pack, "no-such-pack"])
    assert _statuses(engine, [claims[0].work.work_id]) == [WorkStatus.COMPLETED]
    (retried,) = connectors.complete_and_claim("w", completions=_done(claims), pack_install_ids=[pack]).completed
    assert isinstance(retried.error, LeaseLost) and "the work is completed" in str(retried.error)
    assert_invariants(engine)


def test_a_retry_after_the_commit_changes_nothing_and_is_answered_as_complete_answers(
    engine: sa.Engine, connectors: Connectors, monkeypatch: pytest.MonkeyPatch
) -> None:
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane=lane) for lane in ("a", "b", "c")])
    claims = connectors.claim("w", pack_install_ids=[pack], max_items=3)
    monkeypatch.setenv("NEXUSCRM_FAULTS_ENABLED", "1")
    monkeypatch.setenv("NEXUSCRM_FAULTS", "complete:after_commit=raise")
    monkeypatch.setattr(faults, "_fired", set())
    with pytest.raises(InjectedFault):  # committed, but the caller never saw the answer
        connectors.complete_and_claim("w", completions=_done(claims), pack_install_ids=[pack])
    work_ids = [c.work.work_id for c in claims]
    before = _rows(engine, work_ids)
    assert [before[w].Status for w in work_ids] == [WorkStatus.COMPLETED] * 3
    retried = connectors.complete_and_claim("w", completions=_done(claims), pack_install_ids=[pack])
    assert _rows(engine, work_ids) == before  # nothing changed
    for claim, result in zip(claims, retried.completed, strict=True):
        with pytest.raises(LeaseLost) as refused:
            connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
        assert isinstance(result.error, LeaseLost) and str(result.error) == str(refused.value)
    assert_invariants(engine)


class _CountingCompletes:
    """A work source that counts the Complete calls it passes on."""

    def __init__(self, source: Any) -> None:
        self._source = source
        self.completes: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._source, name)

    def complete(self, work_id: str, *, lease_token: str) -> WorkItemRow:
        self.completes.append(work_id)
        work: WorkItemRow = self._source.complete(work_id, lease_token=lease_token)
        return work


def test_over_grpc_a_running_worker_completes_in_its_next_claim_and_a_stopping_one_with_complete(
    engine: sa.Engine, connectors: Connectors
) -> None:
    server = create_server([registration(connectors)], "127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            client = ConnectorsClient(channel)
            pack = install_pack(engine)
            connectors.ingest(pack, items=[delivery(lane=f"lane-{n % 6}") for n in range(30)])
            source = _CountingCompletes(client)
            ran: list[str] = []

            def flow(generation: Generation) -> None:
                list(generation.inputs)
                ran.append(generation.work.work_id)

            worker = Worker(source, flow, worker_id="w", pack_install_ids=[pack], batch_size=4, complete_in_claim=True)
            worker.start()
            wait_until(lambda: connectors.queue_state(pack).drained, "the queue to drain")
            assert source.completes == []  # every generation completed by a claim
            assert worker.run_until_drained(timeout=30)
            assert worker.stats.completed == len(ran) == 6

            # A refusal over the wire is a DomainError of Complete's kind; run_once completes with Complete.
            connectors.ingest(pack, items=[delivery(lane="late")])
            (claim,) = client.claim("other", pack_install_ids=[pack])
            (refused,) = client.complete_and_claim(
                "other", completions=[Completion(work_id=claim.work.work_id, lease_token="stale")]
            ).completed
            assert refused.error is not None and refused.error.kind is ErrorKind.FAILED_PRECONDITION
            assert "was not issued for work" in str(refused.error)
            client.complete(claim.work.work_id, lease_token=claim.lease_token)
            connectors.ingest(pack, items=[delivery(lane="last")])
            assert worker.run_once()
            assert len(source.completes) == 1 and worker.stats.completed == 7
    finally:
        server.stop(0)
    assert_invariants(engine)


def test_a_default_worker_completes_each_generation_with_complete_as_it_finishes(
    engine: sa.Engine, connectors: Connectors
) -> None:
    """Without ``complete_in_claim`` no claim carries a completion: each finished generation is completed alone."""
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(lane=f"lane-{n % 5}") for n in range(20)])
    source = _CountingCompletes(connectors)
    ran: list[str] = []

    def flow(generation: Generation) -> None:
        list(generation.inputs)
        ran.append(generation.work.work_id)

    worker = Worker(source, flow, worker_id="w", pack_install_ids=[pack], batch_size=4)
    while worker.run_once():
        pass
    assert sorted(source.completes) == sorted(ran) and len(ran) == 5
    assert worker.stats.completed == 5
    assert connectors.queue_state(pack).drained
    assert_invariants(engine)


def test_under_authorization_a_completion_of_another_namespace_refuses_the_claim_not_found(
    engine: sa.Engine, connectors: Connectors
) -> None:
    ours, theirs = install_pack(engine, namespace="globex"), install_pack(engine)  # theirs: acme's
    connectors.ingest(theirs, items=[delivery(lane="a")])
    (claim,) = connectors.claim("w", pack_install_ids=[theirs])
    rule = authorization.rules(engine)[f"{authorization.SERVICE}Claim"]
    globex = Principal(name="globex", namespaces=frozenset({"globex"}))
    for work_id in (claim.work.work_id, "no-such-work"):  # another namespace's and an unknown one: alike
        request = cn.ClaimRequest(
            worker_id="w", pack_install_ids=[ours], completions=[cn.CompleteRequest(work_id=work_id, lease_token="t")]
        )
        with pytest.raises(NotVisible, match=f"completions.work_id '{work_id}' not found"):
            rule(globex, request)
    rule(globex, cn.ClaimRequest(worker_id="w", pack_install_ids=[ours]))  # its own pack, no completions
    acme = Principal(name="acme", namespaces=frozenset({"acme"}))
    mine = cn.CompleteRequest(work_id=claim.work.work_id, lease_token=claim.lease_token)
    rule(acme, cn.ClaimRequest(worker_id="w", pack_install_ids=[theirs], completions=[mine]))
    connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    assert_invariants(engine)
