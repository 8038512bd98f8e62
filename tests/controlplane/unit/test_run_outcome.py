"""How a ``nexuscrm-run`` wait ends, what its progress line and problems say, and its plain usage errors."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from nexuscrm_runtime.database_check import DatabaseUnusable
from nexuscrm_tools import demo
from nexuscrm_tools.run import Summary, check_sqlite_folder, run_dsn, summary_table
from nexuscrm_tools.run_outcome import WORK_IDS_SHOWN, Ending, ending, failure_problems, held_problems, states_text
from nexuscrm_tools.simulator import SimulatorStats


def test_the_wait_ends_as_soon_as_its_outcome_is_known() -> None:
    def end(delivered: bool = True, projected: bool = False, host: bool = True, **counts: int) -> Ending | None:
        return ending(delivered=delivered, projected=projected, counts=counts, host_running=host)

    assert end(projected=True) is Ending.PROJECTED
    assert end(failed=4) is Ending.STUCK  # every generation failed for good
    assert end(failed=1, blocked=3) is Ending.STUCK  # the rest wait behind it
    assert end(failed=1, retry=1) is None and end(pending=1) is None and end(processing=1) is None
    assert end(delivered=False, failed=4) is None  # more inputs may still come
    assert end(delivered=False, host=False) is Ending.HOST_EXITED
    assert end(host=False, pending=1) is Ending.HOST_EXITED
    # Pending generations the "block" order policy holds behind a dead letter cannot run (decision 165).
    stuck = {"failed": 1, "pending": 2}
    assert ending(delivered=True, projected=False, counts=stuck, host_running=True, held=2) is Ending.STUCK
    assert ending(delivered=True, projected=False, counts=stuck, host_running=True, held=1) is None
    assert ending(delivered=True, projected=False, counts={**stuck, "retry": 1}, host_running=True, held=2) is None


def test_the_progress_line_counts_what_needs_attention() -> None:
    assert states_text({"completed": 9, "pending": 2}) == ""
    assert states_text({"failed": 2, "retry": 1, "blocked": 3}) == "2 failed, 1 retrying, 3 blocked"


def test_failures_are_grouped_by_message_with_their_work_ids() -> None:
    many = [(f"w-{i:02d}", "ValueError: no stage") for i in range(WORK_IDS_SHOWN + 2)]
    problems = failure_problems([("w-x", "KeyError: 'email'\n  at line 3"), *many])
    assert problems[0] == "1 generation failed for good: KeyError: 'email' at line 3 (WorkIds w-x)"
    shown = ", ".join(work_id for work_id, _ in many[:WORK_IDS_SHOWN])
    assert problems[1] == f"12 generations failed for good: ValueError: no stage (WorkIds {shown} and 2 more)"


def test_held_generations_are_grouped_by_the_dead_letter_they_are_blocked_behind() -> None:
    problems = held_problems([("w-2", "w-1"), ("w-3", "w-1"), ("w-9", "w-8")])
    assert problems == [
        "2 generations blocked behind w-1: held by order policy block: predecessor w-1 failed for good; "
        "replay or skip it (WorkIds w-2, w-3)",
        "1 generation blocked behind w-8: held by order policy block: predecessor w-8 failed for good; "
        "replay or skip it (WorkIds w-9)",
    ]


def _rows(flow: str, problems: tuple[str, ...], ended: Ending) -> dict[str, str]:
    """The summary table's rows, measure to value, as a terminal shows them."""
    summary = Summary(
        pack_install_id="pk-1",
        flow=flow,
        stats=SimulatorStats(done=True),
        generations=3,
        executions=None if ended is Ending.HOST_EXITED else 3,
        lag_p50=0.0,
        lag_p99=0.0,
        seconds=1.0,
        problems=problems,
        ending=ended,
        stopped="" if ended is Ending.PROJECTED else ended.reason,
    )
    console = Console(width=200, record=True)
    console.print(summary_table(summary, lanes=3))
    cells = (line.strip("│ ").split(" │ ") for line in console.export_text().splitlines() if line.startswith("│"))
    return {measure.strip(): value.strip() for measure, value in cells}


def test_the_summary_counts_failed_checks_only_and_says_a_stop_unjudged() -> None:
    failed = "1 generation failed for good: ValueError: no (WorkIds w-1)"
    rows = _rows("mine:flow", ("M: Event pk-1/4 is a member of 0 generations []", failed), Ending.STUCK)
    assert rows["invariants M O B D X P (every input in one generation)"] == "1 violation"
    assert rows["every generation completed"] == "1 problem"  # the stop is said apart, not counted
    # Another Flow's generations are judged only by how the run ended: a stopped run never says OK.
    assert _rows("mine:flow", (), Ending.STUCK)["every generation completed"] == "not reached: the run stopped first"
    assert _rows("mine:flow", (), Ending.PROJECTED)["every generation completed"] == "OK"
    assert _rows("mine:flow", (), Ending.INTERRUPTED)["every generation completed"] == "not checked: interrupted"
    # The demo's projection is checked against every input, however the run ended.
    assert _rows(demo.FLOW_NAME, (), Ending.STUCK)["projection equals the inputs"] == "OK"
    exited = _rows("mine:flow", (), Ending.HOST_EXITED)
    assert (exited["executions"], exited["inputs per execution"]) == ("not known: the host exited", "-")


def test_the_runs_own_database_is_named_by_its_absolute_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NEXUSCRM_DSN", raising=False)
    dsn, own = run_dsn(Path("var/run"))
    assert own and dsn == f"sqlite:///{Path.cwd() / 'var/run/nexuscrm.db'}" and dsn.startswith("sqlite:////")


def test_a_sqlite_file_in_a_missing_folder_is_refused_and_the_folder_not_made(tmp_path: Path) -> None:
    check_sqlite_folder(f"sqlite:///{tmp_path / 'x.db'}")
    check_sqlite_folder("mysql://root@127.0.0.1/nexuscrm")  # not a file: check_database judges it
    with pytest.raises(DatabaseUnusable, match=f"the sqlite file {tmp_path}/no/x.db, whose folder"):
        check_sqlite_folder(f"sqlite:///{tmp_path / 'no' / 'x.db'}")
    assert not (tmp_path / "no").exists()
