"""The SQLite plan reader: a sort of a growing table fails, a sort of a subquery's rows passes."""

from __future__ import annotations

from tests.support.plans import problems_sqlite

# EXPLAIN QUERY PLAN rows (id, parent, unused, detail) as SQLite 3.40 prints them.
SORTED_SCAN = [
    (3, 0, 0, "SEARCH Event USING INDEX ix_event_source_lane (PackInstallId=?)"),
    (9, 0, 0, "USE TEMP B-TREE FOR ORDER BY"),
]
# event_range_page: the window functions sort the limited candidates (a co-routine), not Event.
WINDOW_OVER_CANDIDATES = [
    (2, 0, 0, "CO-ROUTINE Sized"),
    (8, 2, 0, "CO-ROUTINE (subquery-6)"),
    (13, 8, 0, "CO-ROUTINE Candidates"),
    (23, 13, 0, "SEARCH Event USING INDEX ix_event_source_lane (PackInstallId=? AND ProjectionKey=?)"),
    (51, 8, 0, "SCAN Candidates"),
    (123, 8, 0, "USE TEMP B-TREE FOR ORDER BY"),
    (281, 0, 0, "SCAN Sized"),
    (
        288,
        0,
        0,
        "SEARCH EventPayload USING INDEX sqlite_autoindex_EventPayload_1 (PackInstallId=? AND EnqueueOrdinal=?)",
    ),
]


def test_a_sort_beside_a_read_of_a_table_fails() -> None:
    assert problems_sqlite(SORTED_SCAN) == ["USE TEMP B-TREE FOR ORDER BY"]


def test_a_sort_of_a_subquery_s_rows_passes() -> None:
    assert problems_sqlite(WINDOW_OVER_CANDIDATES) == []


def test_a_full_scan_of_a_growing_table_fails() -> None:
    assert problems_sqlite([(2, 0, 0, "SCAN EventPayload")]) == ["SCAN EventPayload"]


def test_an_unconstrained_index_walk_of_a_growing_table_fails() -> None:
    # MIN(WorkId) of the replays of one WorkId, walking the primary key until one matches.
    walk = (27, 21, 0, "SEARCH WorkItem USING INDEX sqlite_autoindex_WorkItem_1")
    (problem,) = problems_sqlite([walk])
    assert problem.startswith(walk[3]) and "no index constraint" in problem
    assert problems_sqlite([(3, 0, 0, "SEARCH WorkItem USING INDEX ix_workitem_replay_of (ReplayOfWorkId=?)")]) == []
