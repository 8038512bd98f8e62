"""Byte budgets (issue 19 item 2, decision 122): every admission transaction and page is bounded in bytes.

Small budgets stand in for TiDB's limits here: the same code bounds a materializer batch, an
admission group, an Ingest call and a LoadInputs page by the configured bytes on every backend.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.legacy.runtime import LegacyRuntime
from nexuscrm_connectors.settings import Settings
from nexuscrm_runtime.budgets import MAX_ENTRY_PAYLOAD_BYTES, MAX_TRANSACTION_BYTES, MIB, within_bytes
from nexuscrm_runtime.config import ConfigError
from nexuscrm_schema.tables import AdmissionFence, Event, IngressReceipt
from tests.support.factories import START, FakeClock, delivery, install_pack
from tests.support.invariants import assert_invariants
from workqueue import ReceiptState
from workqueue.errors import ErrorKind, InvalidArgument
from workqueue.values import Outcome

KIB = 1024


def budgeted(engine: sa.Engine, **limits: int) -> Connectors:
    return Connectors(engine, Settings(**limits), clock=FakeClock())


def count(engine: sa.Engine, table: sa.Table, *where: sa.ColumnElement[bool]) -> int:
    with engine.connect() as connection:
        return int(connection.execute(sa.select(sa.func.count()).select_from(table).where(*where)).scalar_one())


def test_the_default_payload_limit_fits_tidb_s_entry_limit_and_a_larger_one_is_refused() -> None:
    assert Settings().max_payload_bytes <= MAX_ENTRY_PAYLOAD_BYTES < 6 * MIB
    assert Settings().max_transaction_bytes <= MAX_TRANSACTION_BYTES <= 100 * MIB // 4
    with pytest.raises(ConfigError, match=r"max_payload_bytes must be at most 6225920 \(TiDB's 6 MiB entry limit"):
        Settings(max_payload_bytes=MAX_ENTRY_PAYLOAD_BYTES + 1, max_transaction_bytes=MAX_TRANSACTION_BYTES)
    with pytest.raises(ConfigError, match="max_transaction_bytes must be between max_payload_bytes"):
        Settings(max_transaction_bytes=MAX_TRANSACTION_BYTES + 1)
    with pytest.raises(ConfigError, match="max_transaction_bytes must be between max_payload_bytes"):
        Settings(max_payload_bytes=4 * KIB, max_transaction_bytes=2 * KIB)


def test_within_bytes_takes_the_longest_prefix_and_always_the_first() -> None:
    assert within_bytes([("a", 3), ("b", 3), ("c", 3)], 6) == ["a", "b"]
    assert within_bytes([("a", 9), ("b", 1)], 6) == ["a"]  # alone above the budget: still goes
    assert within_bytes([("a", 1), ("b", 9), ("c", 1)], 6) == ["a"]  # never skips ahead
    assert within_bytes([], 6) == []


def test_a_payload_above_the_limit_is_rejected_naming_the_field_and_the_limit(engine: sa.Engine) -> None:
    connectors = budgeted(engine, max_payload_bytes=4 * KIB)
    pack = install_pack(engine)
    big, fine = connectors.ingest(pack, items=[delivery(payload=b"x" * (4 * KIB + 1)), delivery(payload=b"y")])
    assert big.outcome is Outcome.REJECTED
    assert big.message == f"payload is {4 * KIB + 1} bytes; the limit is {4 * KIB} (max_payload_bytes)"
    assert fine.outcome is Outcome.ADMITTED  # a rejected item does not fail its neighbours
    assert_invariants(engine)


def test_an_ingest_call_above_the_transaction_budget_is_refused_whole_and_writes_nothing(engine: sa.Engine) -> None:
    connectors = budgeted(engine, max_payload_bytes=4 * KIB, max_transaction_bytes=10 * KIB)
    pack = install_pack(engine)
    with pytest.raises(InvalidArgument) as caught:
        connectors.ingest(pack, items=[delivery(payload=b"x" * (4 * KIB)) for _ in range(3)])
    assert caught.value.kind is ErrorKind.INVALID_ARGUMENT and caught.value.field == "items"
    assert f"items carry {12 * KIB} payload bytes; the limit per call is {10 * KIB}" in str(caught.value)
    assert count(engine, IngressReceipt) == 0 and count(engine, Event) == 0
    assert [r.outcome for r in connectors.ingest(pack, items=[delivery(payload=b"x" * (4 * KIB))] * 1)] == [
        Outcome.ADMITTED
    ]


def test_the_materializer_admits_a_backlog_in_batches_within_the_transaction_budget(engine: sa.Engine) -> None:
    """The issue's case: large stored payloads behind a fence are admitted batch by batch, never all at once."""
    connectors = budgeted(engine, max_payload_bytes=4 * KIB, max_transaction_bytes=10 * KIB)
    pack = install_pack(engine)
    with engine.begin() as connection:
        connection.execute(
            sa.insert(AdmissionFence).values(FenceId="f-1", Namespace="acme", Scope="*", Reason="", CreatedAt=START)
        )
    for n in range(7):
        (result,) = connectors.ingest(
            pack, items=[delivery(f"r-{n}", lane=f"lane-{n % 2}", payload=bytes([n]) * 3 * KIB)]
        )
        assert result.outcome is Outcome.FENCED
    with engine.begin() as connection:
        connection.execute(sa.delete(AdmissionFence))
    # 3 KiB each, 10 KiB per transaction: three per pass, oldest first.
    passes = []
    while stored := count(engine, IngressReceipt, IngressReceipt.c.State == ReceiptState.STORED):
        passes.append(connectors.materialize())
        assert len(passes) <= 7, f"{stored} receipts never materialized"
    assert passes == [3, 3, 1]
    with engine.connect() as connection:
        ordinals = dict(connection.execute(sa.select(Event.c.ReceiptKey, Event.c.EnqueueOrdinal)).all())
    assert [ordinals[f"r-{n}"] for n in range(7)] == list(range(1, 8))  # admitted in arrival order
    assert_invariants(engine)


def test_loadinputs_pages_are_bounded_in_bytes_and_stream_every_member_in_order(engine: sa.Engine) -> None:
    connectors = budgeted(engine, max_payload_bytes=4 * KIB, max_page_bytes=5 * KIB)
    pack = install_pack(engine)
    sizes = [2 * KIB, 2 * KIB, 2 * KIB, 4 * KIB, 1 * KIB, 1 * KIB]
    results = connectors.ingest(pack, items=[delivery(payload=bytes([n]) * size) for n, size in enumerate(sizes)])
    assert {r.work_id for r in results} == {results[0].work_id}  # one generation of six members
    (claim,) = connectors.claim("w", pack_install_ids=[pack])
    pages = list(connectors.load_inputs(claim.work.work_id, lease_token=claim.lease_token, page_size=500))
    assert [[len(i.payload) for i in page.inputs] for page in pages] == [
        [2 * KIB, 2 * KIB],
        [2 * KIB],
        [4 * KIB, KIB],
        [KIB],
    ]
    assert [page.last for page in pages] == [False, False, False, True]
    members = [i for page in pages for i in page.inputs]
    assert [i.enqueue_ordinal for i in members] == [r.enqueue_ordinal for r in results]
    assert [i.payload for i in members] == [bytes([n]) * size for n, size in enumerate(sizes)]
    connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
    assert_invariants(engine)


def test_a_member_larger_than_the_page_budget_gets_a_page_of_its_own(engine: sa.Engine) -> None:
    connectors = budgeted(engine, max_payload_bytes=4 * KIB, max_page_bytes=1 * KIB)
    pack = install_pack(engine)
    connectors.ingest(pack, items=[delivery(payload=b"a" * 3 * KIB), delivery(payload=b"b" * 3 * KIB)])
    (claim,) = connectors.claim("w", pack_install_ids=[pack])
    pages = list(connectors.load_inputs(claim.work.work_id, lease_token=claim.lease_token))
    assert [len(page.inputs) for page in pages] == [1, 1] and pages[-1].last


def test_listmembers_pages_are_bounded_in_bytes_like_loadinputs(engine: sa.Engine) -> None:
    connectors = budgeted(engine, max_payload_bytes=4 * KIB, max_page_bytes=5 * KIB)
    pack = install_pack(engine)
    sizes = [2 * KIB, 2 * KIB, 2 * KIB, 4 * KIB, 1 * KIB, 1 * KIB]
    (first, *_) = connectors.ingest(pack, items=[delivery(payload=bytes([n]) * s) for n, s in enumerate(sizes)])
    pages: list[list[int]] = []
    token = ""
    while not pages or token:
        page = connectors.list_members(str(first.work_id), page_size=500, page_token=token)
        pages.append([len(i.payload) for i in page.inputs])
        token = page.next_page_token
    assert pages == [[2 * KIB, 2 * KIB], [2 * KIB], [4 * KIB, KIB], [KIB]]
    assert_invariants(engine)


def test_the_legacy_runtime_applies_native_ingest_s_byte_limits(engine: sa.Engine) -> None:
    """Issue 19 item 2 for the old-protocol writer: a payload and a call above the limits are refused whole."""
    settings = Settings(max_payload_bytes=4 * KIB, max_transaction_bytes=10 * KIB)
    legacy = LegacyRuntime(engine, FakeClock(), settings=settings)
    pack = install_pack(engine, legacy_max_ordinal=None)  # an old-protocol pack
    with pytest.raises(InvalidArgument) as too_big:
        legacy.ingest(pack, [delivery(payload=b"y"), delivery(payload=b"x" * (4 * KIB + 1))])
    assert too_big.value.field == "payload"
    assert str(too_big.value) == f"payload is {4 * KIB + 1} bytes; the limit is {4 * KIB} (max_payload_bytes)"
    with pytest.raises(InvalidArgument) as too_many:
        legacy.ingest(pack, [delivery(payload=b"x" * (4 * KIB)) for _ in range(3)])
    assert too_many.value.field == "items"
    assert f"items carry {12 * KIB} payload bytes; the limit per call is {10 * KIB}" in str(too_many.value)
    assert count(engine, IngressReceipt) == 0 and count(engine, Event) == 0  # nothing written
    (admitted,) = legacy.ingest(pack, [delivery(payload=b"x" * (4 * KIB))])
    assert admitted.outcome is Outcome.ADMITTED
    assert_invariants(engine)
