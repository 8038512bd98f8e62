"""The TiDB plan reader on TiDB's EXPLAIN format: plan shapes of TiDB's documentation, for our statements.

No TiDB runs here. Each fixture is a plan as TiDB prints it (id tree, estRows, task, access
object, operator info), in the operator shapes TiDB's documentation shows (explain-overview,
explain-indexes, explain-subqueries, explain-joins, explain-aggregation), written for our
tables: the shapes our hot queries must have (docs/performance.md) pass, and the shapes the
issue feared fail with a message naming the operator and the table.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.plans import parse_tidb, problems_tidb

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "tidb_explain"


def plan(name: str) -> str:
    """A plan of ``tests/fixtures/tidb_explain`` (its ``--`` lines say which statement and shape)."""
    return (FIXTURES / f"{name}.txt").read_text()


def rows(table: str) -> list[tuple[str, ...]]:
    """The rows of a plan as the mysql client prints it: header, borders and comments skipped.

    The id cell keeps its tree drawing (leading spaces included), as the driver returns it.
    """
    found = []
    for line in table.splitlines():
        if not line.startswith("|"):
            continue
        cells = tuple(cell.removeprefix(" ").rstrip() for cell in line.strip().strip("|").split("|"))
        if cells[0] != "id":
            found.append(cells)
    return found


RANGE_PAGE = plan("range_page")
POINT_GETS = plan("point_gets")
PAYLOAD_PAGE = plan("payload_page")
NEXT_PACK = plan("next_pack")
GROUP_BY_BACKLOG = plan("group_by_backlog")
GROUP_BY_PAGE = plan("group_by_page")
ANTI_SEMI_HASH_JOIN = plan("anti_semi_hash_join")
ANTI_SEMI_APPLY = plan("anti_semi_apply")
NEWEST_BESIDE_EVENTS = plan("newest_beside_events")
TOPN_OVER_RANGE = plan("topn_over_range")
FULL_SCAN = plan("full_scan")


@pytest.mark.parametrize(
    "plan", [RANGE_PAGE, PAYLOAD_PAGE, POINT_GETS, NEXT_PACK, GROUP_BY_PAGE, ANTI_SEMI_APPLY, NEWEST_BESIDE_EVENTS]
)
def test_the_shapes_our_hot_queries_must_have_pass(plan: str) -> None:
    assert problems_tidb(rows(plan)) == []


@pytest.mark.parametrize(
    ("plan", "problem"),
    [
        (GROUP_BY_BACKLOG, "StreamAgg groups a whole range of IngressReceipt (no loose index scan)"),
        (ANTI_SEMI_HASH_JOIN, "HashJoin (anti semi join) reads a range of Event, IngressReceipt"),
        (TOPN_OVER_RANGE, "TopN over WorkItem"),
        (FULL_SCAN, "TableFullScan of Event"),
    ],
)
def test_the_shapes_that_read_a_growing_range_fail_naming_operator_and_table(plan: str, problem: str) -> None:
    assert problem in problems_tidb(rows(plan))


def test_the_operator_tree_is_read_from_the_id_column() -> None:
    (root,) = parse_tidb(rows(ANTI_SEMI_HASH_JOIN))
    (join,) = root.children
    assert (root.name, join.name) == ("Insert", "HashJoin")
    assert [child.name for child in join.children] == ["IndexReader", "TableReader"]
    assert join.children[0].children[0].table == "IngressReceipt"
    (point,) = parse_tidb(rows(POINT_GETS))
    assert point.name == "Batch_Point_Get" and point.table == "IngressReceipt"


def test_a_row_that_is_not_tidb_s_format_is_refused() -> None:
    with pytest.raises(ValueError, match="not a TiDB plan row"):
        parse_tidb([("1", "SIMPLE", "Event", "ALL", "")])
