"""Index plans of every service's hot queries on every backend: no full table scan, no filesort over a table.

Connectors' admission, claim, retention and read queries and Controlplane's pack reads, drain
counts and cutover audit scans, each run through the real call on one database seeded by the
Connectors plan test's ``seed`` (the real admission, claim and completion paths plus old-protocol
rows), then EXPLAINed exactly as captured (``tests/support/plans.py`` reads TiDB's format).
Two owners' queries in one table, so it is a system test (decision 146); docs/performance.md
lists the expected TiDB operator of each query.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.queries import claims as claims_sql
from nexuscrm_connectors.queries import events as events_sql
from nexuscrm_connectors.queries import operator_reads as operator_reads_sql
from nexuscrm_connectors.queries import order_policy as order_policy_sql
from nexuscrm_connectors.queries import packs as packs_sql
from nexuscrm_connectors.queries import receipts as receipts_sql
from nexuscrm_connectors.queries import retention as retention_sql
from nexuscrm_connectors.queries import retry_policy as retry_policy_sql
from nexuscrm_connectors.queries import work_attempts as work_attempts_sql
from nexuscrm_connectors.queries import work_items as work_items_sql
from nexuscrm_connectors.queries.work_attempts import EndedAttempt
from nexuscrm_connectors.queue.claims import lease_grant
from nexuscrm_controlplane import queries as cp_queries
from nexuscrm_runtime.budgets import MIB
from nexuscrm_runtime.clock import DATABASE_CLOCK
from nexuscrm_runtime.database import is_sqlite
from nexuscrm_schema.hints import NO_DECORRELATE
from nexuscrm_schema.tables import WorkTypeOrderPolicy
from tests.connectors.integration.test_index_plans import LEGACY_HISTORY, Seeded, ranges, seed
from tests.support.factories import START
from tests.support.invariants import assert_invariants
from tests.support.plans import explain_problems
from tests.support.statements import capture
from workqueue import EventStatus, ReceiptState

pytestmark = pytest.mark.database


def hot_queries(seeded: Seeded) -> dict[str, Callable[[sa.Connection], object]]:
    """Every hot query by builder name, each as the real call the runtime makes."""
    now = START + dt.timedelta(hours=1)
    pack, key, legacy, legacy_key = seeded.native_pack, seeded.claimed_key, seeded.legacy_pack, seeded.legacy_key
    after = (pack, START, "h-1")  # a ListReceipts page token's position
    return {
        # Connectors: admission, duplicate verification, claim, payload reads, materializer.
        "receipts_get": lambda c: receipts_sql.receipts_get(c, pack, ["n-1-1", "n-2-2"]),
        "events_by_receipt": lambda c: events_sql.events_by_receipt(c, pack, ["n-1-1", "h-7"]),
        "work_items_covering": lambda c: events_sql.work_items_covering(
            c, pack, events_sql.events_by_receipt(c, pack, ["n-1-1", "h-7", "h-8"])
        ),
        # Every Event of the range already has its receipt: the copy inserts nothing, and EXPLAIN reads its plan.
        "receipts_insert_admitted": lambda c: receipts_sql.receipts_insert_admitted(
            c, pack, range(seeded.start, seeded.end + 1), now
        ),
        "work_items_newest": lambda c: work_items_sql.work_items_newest(
            c, pack, range(seeded.start, seeded.end + 1), seeded.projection_keys
        ),
        "work_items_extend": lambda c: work_items_sql.work_items_extend(
            c, pack, {seeded.claimed_work_id: (seeded.end + 1, 1)}, seeded.end + 1, seeded.end + 1
        ),
        "work_items_get": lambda c: work_items_sql.work_items_get(c, [seeded.claimed_work_id]),
        "work_item_successor": lambda c: work_items_sql.work_item_successor(c, pack, key, seeded.start),
        # Completions (Complete, and a claim's: decision 131): locked read, compare-and-set, successors.
        "work_items_lock": lambda c: claims_sql.work_items_lock(
            c, [seeded.claimed_work_id, "no-such-work"], DATABASE_CLOCK
        ),
        "work_items_complete": lambda c: claims_sql.work_items_complete(
            c, list(claims_sql.work_items_lock(c, [seeded.claimed_work_id], DATABASE_CLOCK).values()), now
        ),
        "work_items_successors": lambda c: work_items_sql.work_items_successors(
            c, list(claims_sql.work_items_lock(c, [seeded.claimed_work_id], DATABASE_CLOCK).values())
        ),
        "work_items_claimable": lambda c: claims_sql.work_items_claimable(
            c, [pack, legacy], ["project"], DATABASE_CLOCK, 10
        ),
        "work_items_claim": lambda c: claims_sql.work_items_claim(
            c, [seeded.claimed_work_id, "no-such-work"], now, lease_grant("plan", "token", now)
        ),
        "work_items_leased": lambda c: claims_sql.work_items_leased(c, [seeded.claimed_work_id], "token"),
        "work_items_record_member_count": lambda c: claims_sql.work_items_record_member_count(
            c, [seeded.claimed_work_id], "token"
        ),
        "selected_events_set_status": lambda c: events_sql.selected_events_set_status(
            c, [(pack, seeded.end, key), (pack, seeded.start, key)], EventStatus.PROCESSING
        ),
        "event_range_count": lambda c: events_sql.event_range_count(c, pack, key, seeded.start, seeded.end),
        "event_range_page": lambda c: events_sql.event_range_page(c, pack, key, seeded.start - 1, seeded.end, 500, MIB),
        # A claim's inline inputs (decision 129): the sizes, one UNION ALL of range scans for its
        # generations; then the members of those that fit, one scan of their OR-ed intervals.
        "event_ranges_sizes (several)": lambda c: events_sql.event_ranges_sizes(c, ranges(seeded), 500),
        "event_ranges_members (several)": lambda c: events_sql.event_ranges_members(c, ranges(seeded)),
        "receipt_pack_stored_after": lambda c: receipts_sql.receipt_pack_stored_after(c, ""),
        # the allocation UPDATE proves no Event sits above the counter (rolled back here)
        "ordinals_allocate": lambda c: packs_sql.ordinals_allocate(c, packs_sql.pack_lock(c, pack, DATABASE_CLOCK), 1),
        # the fence check and the protocol row after the pack lock, one statement (decision 140)
        "admission_guard": lambda c: packs_sql.admission_guard(c, packs_sql.pack_lock(c, pack, DATABASE_CLOCK)),
        "receipts_stored_sizes": lambda c: receipts_sql.receipts_stored_sizes(c, pack, 500),
        "receipts_stored_list": lambda c: receipts_sql.receipts_stored_list(c, pack, ["stored-0", "stored-2"]),
        # Connectors: ListReceipts pages after the first (the dashboard test covers the first).
        "receipts_in_state": lambda c: operator_reads_sql.receipts_in_state(c, ReceiptState.CONFIRMED, pack, after, 50),
        "receipts_in_state (all packs)": lambda c: operator_reads_sql.receipts_in_state(
            c, ReceiptState.STORED, None, after, 50
        ),
        # Connectors: the native queue (GetQueueState, WaitQueueDrained) and generation reads.
        "work_queue_counts": lambda c: operator_reads_sql.work_queue_counts(c, pack),
        "work_oldest_waiting": lambda c: operator_reads_sql.work_oldest_waiting(c, pack),
        "receipt_count_capped": lambda c: operator_reads_sql.receipt_count_capped(c, pack, ReceiptState.STORED, 10_000),
        "work_items_of_identity": lambda c: operator_reads_sql.work_items_of_identity(c, pack, key, None, 50),
        "work_items_of_identity (next page)": lambda c: operator_reads_sql.work_items_of_identity(
            c, pack, key, seeded.end, 50
        ),
        "work_items_of_pack": lambda c: operator_reads_sql.work_items_of_pack(c, pack, None, 50),
        "work_items_of_pack (next page)": lambda c: operator_reads_sql.work_items_of_pack(
            c, pack, (key, seeded.end), 50
        ),
        # Controlplane: pack reads (GetPack, FindPacks, ListPacks) and a fence by its short id.
        "packs_by_name": lambda c: cp_queries.packs_by_name(c, "acme", "crm", "1.0", 100),
        "packs_page": lambda c: cp_queries.packs_page(c, "", "", 100),
        "packs_page (one namespace, next page)": lambda c: cp_queries.packs_page(c, "acme", pack, 100),
        "fence_ids_with_prefix": lambda c: cp_queries.fence_ids_with_prefix(c, "97c1e36e", 2),
        # Connectors: the retention pruner (decision 123); candidates after a keyset position.
        "work_items_retention_candidates": lambda c: retention_sql.work_items_retention_candidates(
            c, pack, finished_before=now, after=(START, "h-1"), limit=50
        ),
        "work_items_superseded": lambda c: retention_sql.work_items_superseded(c, [seeded.claimed_work_id, "h-1"], 2),
        "work_items_by_id": lambda c: retention_sql.work_items_by_id(c, [seeded.claimed_work_id, "h-1"], lock=True),
        "work_items_replays_newest": lambda c: retention_sql.work_items_replays_newest(c, [seeded.claimed_work_id]),
        "work_items_blocked": lambda c: retention_sql.work_items_blocked(c, [seeded.claimed_work_id, "h-1"]),
        "events_members_of": lambda c: retention_sql.events_members_of(c, [seeded.claimed_work_id, "h-1"], 500),
        "events_members_page": lambda c: retention_sql.events_members_page(
            c, retention_sql.work_items_by_id(c, [seeded.claimed_work_id])[0], 500
        ),
        "retention_backlog": lambda c: retention_sql.retention_backlog(c, pack, finished_before=now, keep=1, cap=1000),
        "events_member_counts": lambda c: retention_sql.events_member_counts(c, pack, key, seeded.start, seeded.end),
        "pruned_work_get": lambda c: retention_sql.pruned_work_get(c, seeded.claimed_work_id),
        # Connectors: the order policy's holds (decision 165): retention's check of a dead letter,
        # GetWork's and ListGenerations' marks, GetQueueState's count.
        "work_items_holding_order": lambda c: retention_sql.work_items_holding_order(c, [seeded.claimed_work_id]),
        "work_items_held": lambda c: order_policy_sql.work_items_held(c, [seeded.claimed_work_id, "no-such-work"]),
        "work_items_held_count": lambda c: order_policy_sql.work_items_held_count(c, pack, 10_000),
        # Connectors: the duplicate window's expiry (decision 127), oldest SourceTime first.
        "tombstones_expiring": lambda c: retention_sql.tombstones_expiring(c, pack, now, 500),
        "pruned_work_expiring": lambda c: retention_sql.pruned_work_expiring(c, pack, now, 500),
        "work_namespace": lambda c: operator_reads_sql.work_namespace(c, seeded.claimed_work_id),
        # Fail's retry policy and the attempt history (decision 175).
        "work_type_retry_policy_get": lambda c: retry_policy_sql.work_type_retry_policy_get(c, pack, "project"),
        "work_attempts_record": lambda c: work_attempts_sql.work_attempts_record(
            c,
            [
                EndedAttempt(
                    work_id=seeded.claimed_work_id,
                    pack_install_id=pack,
                    worker_id="w",
                    started_at=now,
                    finished_at=now,
                    outcome="retry",
                    error="e",
                )
            ],
        ),
        "work_attempts_newest": lambda c: work_attempts_sql.work_attempts_newest(c, seeded.claimed_work_id, 50),
        # Controlplane: drain counts (GetDrainStatus, the cutover gate).
        "legacy_work_counts": lambda c: cp_queries.legacy_work_counts(c, legacy),
        "legacy_work_live_sample": lambda c: cp_queries.legacy_work_live_sample(c, legacy, 10),
        "legacy_work_unknown": lambda c: cp_queries.legacy_work_unknown(c, legacy, 10),
        "legacy_retry_waits": lambda c: cp_queries.legacy_retry_waits(c, legacy, now, 10),
        "legacy_retry_wait_count": lambda c: cp_queries.legacy_retry_wait_count(c, legacy, now),
        "legacy_dependency_waits": lambda c: cp_queries.legacy_dependency_waits(c, legacy, 10),
        # Controlplane: the cutover audit scans.
        "legacy_work_count": lambda c: cp_queries.legacy_work_count(c, legacy),
        "legacy_work_orphaned": lambda c: cp_queries.legacy_work_orphaned(c, legacy, 10),
        "event_identity_count": lambda c: cp_queries.event_identity_count(c, legacy),
        "event_identities_page": lambda c: cp_queries.event_identities_page(c, legacy, None, 200),
        "pack_event_count": lambda c: cp_queries.pack_event_count(c, legacy),
        "work_items_above": lambda c: cp_queries.work_items_above(c, legacy, LEGACY_HISTORY, 10),
        "work_items_unclassifiable": lambda c: cp_queries.work_items_unclassifiable(c, legacy, 10),
        "identity_event_bounds": lambda c: cp_queries.identity_event_bounds(c, legacy, legacy_key),
        "identity_completed_boundary": lambda c: cp_queries.identity_completed_boundary(c, legacy, legacy_key),
        "identity_events_page": lambda c: cp_queries.identity_events_page(c, legacy, legacy_key, None, 1000),
    }


def test_hot_queries_use_index_ranges(engine: sa.Engine) -> None:
    seeded = seed(engine)
    with engine.begin() as connection:  # a work type under "block", so the held count reads its pending generations
        connection.execute(
            sa.insert(WorkTypeOrderPolicy).values(
                PackInstallId=seeded.native_pack,
                WorkType="project",
                Policy="block",
                SetBy="plan",
                Reason="r",
                SetAt=START,
            )
        )
    failures: dict[str, list[str]] = {}
    hinted = set()
    for name, call in hot_queries(seeded).items():
        with engine.connect() as connection:
            with capture(engine) as captured:
                call(connection)
            assert captured.statements, f"{name} ran no statement"
            hinted |= {name for statement in captured.statements if NO_DECORRELATE in statement.statement}
            for statement in captured.statements:
                for problem in explain_problems(connection, statement.statement, statement.one_row_parameters):
                    failures.setdefault(name, []).append(f"{problem}\n    in: {statement.statement[:300]}")
    assert not failures, "hot queries without an index range plan:\n" + "\n".join(
        f"{name}: {problem}" for name, found in failures.items() for problem in found
    )
    # Every correlated [NOT] EXISTS over a growing table stays correlated on TiDB (a comment elsewhere).
    probes = {"receipts_insert_admitted", "legacy_dependency_waits", "legacy_work_orphaned", "identity_events_page"}
    probes.add("work_items_claimable")  # its ClaimPause probes (decision 158)
    probes.add("work_items_replays_newest")  # its newer-replay probe
    probes |= {
        "work_items_holding_order",
        "work_items_held",
        "work_items_held_count",
    }  # the holds' probes (decision 165)
    assert hinted == (set() if is_sqlite(engine) else probes)
    assert_invariants(engine)
