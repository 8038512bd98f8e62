"""A pack's identities on every backend: depth, newest generation, coverage, and a partial identity (decision 178)."""

from __future__ import annotations

import dataclasses

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.errors import UnknownPack
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.legacy.runtime import LegacyRuntime
from nexuscrm_connectors.operating.coverage import RangeState
from nexuscrm_connectors.operating.identities import IdentityOverview
from tests.support.factories import FakeClock, delivery, install_pack, route
from tests.support.invariants import assert_invariants
from workqueue import WorkStatus
from workqueue.errors import InvalidArgument
from workqueue.identity import decode_projection_key
from workqueue.values import Route

pytestmark = pytest.mark.database


def _listed(connectors: Connectors, pack: str, wanted: dict[str, str], page_size: int) -> dict[Route, IdentityOverview]:
    """Every identity ``wanted`` keeps, all pages walked, by route."""
    found: dict[Route, IdentityOverview] = {}
    token = ""
    while True:
        page = connectors.list_identities(pack, wanted, page_size=page_size, page_token=token)
        found |= {identity.route: identity for identity in page.identities}
        token = page.next_page_token
        if not token:
            return found


def test_identities_show_depth_newest_generation_and_coverage_and_a_partial_identity_keeps_its_own(
    engine: sa.Engine, connectors: Connectors
) -> None:
    pack = install_pack(engine)
    invoice = dataclasses.replace(delivery(lane="a"), route=route("a", work_type="invoice"))
    connectors.ingest(pack, items=[delivery(lane="a"), delivery(lane="b"), invoice])
    (claimed,) = connectors.claim("w", pack_install_ids=[pack], max_items=1)
    connectors.complete(claimed.work.work_id, lease_token=claimed.lease_token)
    finished = Route.of(decode_projection_key(claimed.work.projection_key))
    (successor,) = connectors.ingest(pack, items=[dataclasses.replace(delivery(), route=finished)])

    every = _listed(connectors, pack, {}, page_size=1)
    assert set(every) == {route("a"), route("b"), route("a", work_type="invoice")}
    proven = every[finished]
    assert proven.depth == 1 and proven.newest is not None and proven.newest.work_id == successor.work_id
    assert proven.newest.status is WorkStatus.PENDING
    assert proven.coverage is not None and proven.coverage.tiled and proven.coverage.high_water_ordinal == 4
    assert [r.state for r in proven.coverage.ranges] == [RangeState.COMPLETED, RangeState.QUEUED]
    for other in (identity for key, identity in every.items() if key != finished):
        assert other.depth == 1 and other.newest is not None and other.newest.status is WorkStatus.PENDING
        assert other.coverage is not None and other.coverage.tiled

    assert sorted(r.work_type for r in _listed(connectors, pack, {"source_lane": "a"}, page_size=1)) == [
        "invoice",
        "project",
    ]
    assert list(_listed(connectors, pack, {"source_lane": "a", "work_type": "invoice"}, page_size=10)) == [
        route("a", work_type="invoice")
    ]
    assert _listed(connectors, pack, {"source_lane": "z"}, page_size=10) == {}
    assert_invariants(engine)


def test_an_old_protocol_pack_has_identities_without_proof_and_bad_requests_are_refused(
    engine: sa.Engine, connectors: Connectors
) -> None:
    legacy_pack = install_pack(engine, legacy_max_ordinal=None)
    legacy = LegacyRuntime(engine, FakeClock())
    legacy.record_work_item_handoff(legacy_pack)
    legacy.ingest(legacy_pack, [delivery(lane="old")])
    (old,) = connectors.list_identities(legacy_pack, {"source_lane": "old"}).identities
    assert (old.route, old.depth, old.coverage) == (route("old"), 0, None)  # no native work, nothing to prove
    assert old.newest is not None and old.newest.input_start_ordinal is None  # its old-protocol work

    with pytest.raises(UnknownPack, match="is not installed"):
        connectors.list_identities("pk-nosuch", {})
    with pytest.raises(InvalidArgument, match="page_token is not a token from a previous ListIdentities page"):
        connectors.list_identities(legacy_pack, {}, page_token="garbage")
    with pytest.raises(InvalidArgument, match="route has no field 'lane'"):
        connectors.list_identities(legacy_pack, {"lane": "old"})
    assert_invariants(engine)
