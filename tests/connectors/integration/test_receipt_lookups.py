"""ExplainReceipt (``nexuscrm why``) of a key that is not a receipt, on every backend (decision 177).

An unknown pack is "not installed", as every other operation says; a WorkId given as the key,
retained or pruned, is named as one with where to look instead; any other key is "no WorkId
or receipt key", the words of the dashboard's search (``nexuscrm_wire.lookups``). Each is
NOT_FOUND, naming the field at fault, and changes nothing.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.errors import UnknownPack, WorkNotFound
from nexuscrm_connectors.facade import Connectors
from nexuscrm_wire import lookups
from tests.support.checksums import database_digest
from tests.support.factories import delivery, install_pack
from tests.support.invariants import assert_invariants
from workqueue.errors import DomainError, ErrorKind

pytestmark = pytest.mark.database


def _completed(connectors: Connectors, pack: str, lane: str) -> str:
    connectors.ingest(pack, items=[delivery(lane=lane)])
    claim = connectors.claim("w", pack_install_ids=[pack])[0]
    connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    return claim.work.work_id


def _refusal(connectors: Connectors, pack: str, key: str) -> DomainError:
    with pytest.raises((UnknownPack, WorkNotFound)) as refused:
        connectors.explain_receipt(pack, receipt_key=key)
    assert refused.value.kind is ErrorKind.NOT_FOUND
    return refused.value


def test_a_key_that_is_not_a_receipt_is_answered_with_what_it_is(engine: sa.Engine, connectors: Connectors) -> None:
    pack = install_pack(engine)
    pruned, kept = _completed(connectors, pack, "a"), _completed(connectors, pack, "a")
    connectors.set_retention_policy(pack, keep_generations=1, keep_seconds=None)
    assert connectors.prune(pack).generations == 1  # ``pruned`` is now a PrunedWork record only
    with engine.connect() as connection:
        before = database_digest(connection)

    unknown_pack = _refusal(connectors, "pk-nope", "r-1")
    assert (str(unknown_pack), unknown_pack.field) == ("pack_install_id 'pk-nope' is not installed", "pack_install_id")
    for work_id in (kept, pruned):
        given_a_work_id = _refusal(connectors, pack, work_id)
        assert (str(given_a_work_id), given_a_work_id.field) == (lookups.work_id_not_receipt(work_id), "receipt_key")
        assert f"nexuscrm work show {work_id}" in str(given_a_work_id)
    neither = _refusal(connectors, pack, "r-nobody")
    assert (str(neither), neither.field) == (f"no WorkId or receipt key 'r-nobody' in pack {pack}", "receipt_key")

    with engine.connect() as connection:
        assert database_digest(connection) == before
    assert_invariants(engine)
