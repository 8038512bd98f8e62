"""A generation knows its member count from the admission on (schema v11, decision 149).

Admission writes WorkItem.AdmittedMemberCount with AdmittedThroughOrdinal, the pack ordinal it
counts through, in the INSERT that creates a generation and the UPDATE that extends it.
A member lost before the first claim is refused by the claim (the generation is failed as
damaged, DATA_LOSS naming the WorkId and both counts) and reported by the invariant checker;
an extension by the previous release (which knows only v10) makes the count unknown and the
first claim's count (decision 110) guards the range again, as it does for rows from before v11.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.queries.retention import events_delete
from nexuscrm_schema.tables import WorkItem
from tests.support.factories import delivery, install_pack
from tests.support.invariants import assert_invariants, check_invariants
from workqueue import WorkStatus
from workqueue.values import IngestResult

pytestmark = pytest.mark.database


def _counts(engine: sa.Engine, work_id: object) -> tuple[int | None, int | None, int]:
    """(AdmittedMemberCount, AdmittedThroughOrdinal, LaneOrdinal) of ``work_id``."""
    with engine.connect() as connection:
        row = connection.execute(
            sa.select(WorkItem.c.AdmittedMemberCount, WorkItem.c.AdmittedThroughOrdinal, WorkItem.c.LaneOrdinal).where(
                WorkItem.c.WorkId == str(work_id)
            )
        ).one()
    return row.AdmittedMemberCount, row.AdmittedThroughOrdinal, row.LaneOrdinal


def _set_counts(engine: sa.Engine, work_id: object, admitted: int | None, through: int | None) -> None:
    with engine.begin() as connection:
        connection.execute(
            sa.update(WorkItem)
            .where(WorkItem.c.WorkId == str(work_id))
            .values(AdmittedMemberCount=admitted, AdmittedThroughOrdinal=through)
        )


def _claim_and_load_all(connectors: Connectors, pack: str) -> dict[str, int]:
    """Claim every claimable generation of ``pack``, load and complete it: inputs loaded by WorkId."""
    loaded: dict[str, int] = {}
    while claims := connectors.claim("w", pack_install_ids=[pack], max_items=10):
        for claim in claims:
            pages = list(connectors.load_inputs(claim.work.work_id, lease_token=claim.lease_token))
            loaded[claim.work.work_id] = sum(len(page.inputs) for page in pages)
            connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    return loaded


def test_a_member_lost_before_the_first_claim_is_refused_by_the_claim_and_reported(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    damaged = connectors.ingest(pack, items=[delivery(lane="a") for _ in range(3)])
    healthy = connectors.ingest(pack, items=[delivery(lane="b")])[0]
    work_id = str(damaged[0].work_id)
    first, middle, last = (r.enqueue_ordinal for r in damaged)
    assert _counts(engine, work_id) == (3, last, last)
    with engine.begin() as connection:  # lost after its admission, before any claim
        events_delete(connection, pack, [middle])

    # One item per claim: the damaged generation is the oldest candidate, yet the healthy
    # identity is claimed by the same call.
    claims = connectors.claim("w", pack_install_ids=[pack], max_items=1)

    assert [c.work.work_id for c in claims] == [str(healthy.work_id)]
    work = connectors.get_work(work_id).work
    assert work.status == WorkStatus.FAILED
    assert work.last_error == (
        f"damaged: DATA_LOSS: work {work_id}: its range [{first}, {last}] holds 2 inputs but admission recorded 3"
    )
    lost = (pack, damaged[1].receipt_key)
    assert sorted(check_invariants(engine)) == [  # the damage, and nothing else
        f"D: receipt {lost} is confirmed but has no Event (an acknowledged input was lost)",
        f"P: {work_id} [{first},{last}] has 2 members but admission recorded 3",
    ]
    assert not connectors.claim("w", pack_install_ids=[pack])  # quarantined: never claimed again
    connectors.complete(claims[0].work.work_id, lease_token=claims[0].lease_token)


def test_an_extension_keeps_the_count_exact_for_every_generation_it_extends(
    engine: sa.Engine, connectors: Connectors
) -> None:
    """One extension UPDATE raises three generations by different numbers of members.

    Three rows pad the statement to four pairs (the last one repeated); MariaDB assigns SET
    columns left to right, SQLite from the old row: both must count the same. Each count then
    runs through the batch's last ordinal.
    """
    pack = install_pack(engine)
    created = {lane: connectors.ingest(pack, items=[delivery(lane=lane) for _ in range(2)]) for lane in "abc"}
    added = {"a": 3, "b": 1, "c": 2}
    lanes = [lane for lane, n in added.items() for _ in range(n)]
    extension = connectors.ingest(pack, items=[delivery(lane=lane) for lane in lanes])

    for lane, results in created.items():
        extended = [r for r, of in zip(extension, lanes, strict=True) if of == lane]
        assert {r.work_id for r in extended} == {results[0].work_id}
        through = extension[-1].enqueue_ordinal
        assert _counts(engine, results[0].work_id) == (2 + added[lane], through, extended[-1].enqueue_ordinal)
    assert _claim_and_load_all(connectors, pack) == {str(created[lane][0].work_id): 2 + added[lane] for lane in "abc"}
    assert_invariants(engine)


def _admit_two_then_one(connectors: Connectors, pack: str) -> tuple[list[IngestResult], IngestResult]:
    first = connectors.ingest(pack, items=[delivery(lane="a"), delivery(lane="a")])
    (extension,) = connectors.ingest(pack, items=[delivery(lane="a")])
    assert extension.work_id == first[0].work_id
    return first, extension


def test_an_extension_by_the_previous_release_leaves_the_count_unknown(
    engine: sa.Engine, connectors: Connectors
) -> None:
    """The previous release (schema v10) raises LaneOrdinal and adds an Event without the count columns.

    The columns stay as this release's first admission left them: a count through the older
    ordinal, which the raised LaneOrdinal passed.
    """
    pack = install_pack(engine)
    first, old_extension = _admit_two_then_one(connectors, pack)
    work_id = first[0].work_id
    _set_counts(engine, work_id, 2, first[1].enqueue_ordinal)  # the columns as the old release leaves them
    assert check_invariants(engine) == []  # a count through an older LaneOrdinal is not trusted

    (extension,) = connectors.ingest(pack, items=[delivery(lane="a")])  # this release extends it again

    assert extension.work_id == work_id
    assert _counts(engine, work_id) == (None, None, extension.enqueue_ordinal)
    assert _claim_and_load_all(connectors, pack) == {str(work_id): 4}  # today's rule: no false DATA_LOSS
    assert old_extension.enqueue_ordinal < extension.enqueue_ordinal
    assert_invariants(engine)


def test_a_generation_from_before_v11_keeps_the_first_claim_rule(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    first, _ = _admit_two_then_one(connectors, pack)
    work_id = first[0].work_id
    _set_counts(engine, work_id, None, None)  # what applying v11 leaves on an existing row

    (extension,) = connectors.ingest(pack, items=[delivery(lane="a")])

    assert _counts(engine, work_id) == (None, None, extension.enqueue_ordinal)  # still unknown
    assert _claim_and_load_all(connectors, pack) == {str(work_id): 4}
    assert_invariants(engine)
