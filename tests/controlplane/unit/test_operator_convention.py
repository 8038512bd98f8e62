"""One operator convention: the exit-code table, the duration parser and the wait loop every command shares."""

from __future__ import annotations

import argparse
import datetime as dt
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from nexuscrm.controlplane.v1 import controlplane_pb2 as cp_pb
from nexuscrm_controlplane import cutover, runbook
from nexuscrm_controlplane.audit import Category
from nexuscrm_controlplane.dashboard import overview
from nexuscrm_runtime import durations, exit_codes
from nexuscrm_runtime.clock import iso_utc
from nexuscrm_runtime.durations import InvalidDuration, format_duration, parse_duration, whole_seconds
from nexuscrm_runtime.polling import poll_until
from nexuscrm_tools import cli, exits, run
from nexuscrm_tools.commands import drain
from nexuscrm_tools.commands.cutover import refusal_code
from nexuscrm_tools.commands.shared import Outcome
from nexuscrm_tools.exits import DESCRIPTIONS, REFUSAL_EXIT_CODES, ExitCode

# Every operator command's module: the tools' and the Controlplane's runbook commands.
COMMAND_SOURCES = [*Path(exits.__file__).parent.rglob("*.py"), Path(runbook.__file__)]
# Which codes each command returns, from the module of the command (decision 154).
COMMAND_EXIT_CODES = {**exits.COMMAND_EXIT_CODES, **runbook.COMMAND_EXIT_CODES}

# --- the exit-code table ----------------------------------------------------------------------


def test_the_cutover_codes_are_the_specifications() -> None:
    assert [int(c) for c in (ExitCode.OK, ExitCode.FAILURE, ExitCode.USAGE, ExitCode.UNREACHABLE)] == [0, 1, 2, 3]
    assert [int(c) for c in (ExitCode.REFUSED_GATE, ExitCode.REFUSED_AUDIT, ExitCode.MISSING_PREREQUISITE)] == [4, 5, 6]
    assert int(ExitCode.TIMEOUT) == 7
    # the RPC command's own meanings collide with none of them
    assert {ExitCode.REFUSED, ExitCode.CHECK_FAILED}.isdisjoint(COMMAND_EXIT_CODES["connector-projection-cutover"])


def test_every_code_is_described_in_the_table_and_its_docstring() -> None:
    assert set(DESCRIPTIONS) == set(ExitCode)
    table = exit_codes.__doc__ or ""
    for code in ExitCode:
        assert re.search(rf"^\s*{code.value}\s+{code.name}\s", table, re.MULTILINE), code


def _help_of(main: Callable[[list[str]], Any], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as stopped:
        main(["--help"])
    assert stopped.value.code == 0
    return capsys.readouterr().out


COMMANDS: dict[str, Callable[[list[str]], Any]] = {
    "nexuscrm": cli.main,
    "nexuscrm-run": run.main,
    "connector-projection-cutover": runbook.cutover_main,
    "connector-projection-drain": runbook.drain_main,
    "connector-admission-fence": runbook.fence_main,
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_commands_help_lists_its_codes_from_the_table(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    shown = _help_of(COMMANDS[command], capsys)
    listed = [int(n) for n in re.findall(r"^\s+(\d+)\s{2}", shown.split("exit codes", 1)[1], re.MULTILINE)]
    assert listed == [int(code) for code in COMMAND_EXIT_CODES[command]]
    for code in COMMAND_EXIT_CODES[command]:
        assert " ".join(DESCRIPTIONS[code].split()[:4]) in " ".join(shown.split())


def test_no_command_defines_exit_codes_of_its_own() -> None:
    for source in COMMAND_SOURCES:
        if source.name != "exits.py":
            assert not re.search(r"^EXIT_\w+\s*=", source.read_text(), re.MULTILINE), source.name


@pytest.mark.parametrize("outcome", list(cutover.Outcome))
def test_cutover_outcomes_and_rpc_refusals_map_alike(outcome: cutover.Outcome) -> None:
    code = runbook.outcome_exit_code(outcome)
    refused = {refusal: category for category, refusal in cutover.REFUSALS.items()}
    if outcome in refused:
        report = cp_pb.CutoverReport(refusals=[cp_pb.AuditFinding(category=refused[outcome].value)])
        assert code == refusal_code(report) == {"gate": 4, "audit": 5, "prerequisite": 6}[refused[outcome]]
    else:
        assert code == ExitCode.OK
    assert set(REFUSAL_EXIT_CODES) == set(Category)
    assert exits.REFUSAL_EXIT_CODES is exit_codes.REFUSAL_EXIT_CODES  # one table, re-exported for the tools


def test_a_usage_error_exits_with_the_usage_code(capsys: pytest.CaptureFixture[str]) -> None:
    for main, argv in (
        (runbook.cutover_main, ["-pack-install-id", "p", "-timeout=-5s"]),
        (cli.main, ["drain", "wait", "p", "--timeout", "5 minutes"]),
        (run.main, ["--timeout", "10d"]),
    ):
        with pytest.raises(SystemExit) as stopped:
            main(argv)
        assert stopped.value.code == ExitCode.USAGE
        assert "invalid duration" in capsys.readouterr().err


# --- the duration parser ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("30s", dt.timedelta(seconds=30)),
        ("5m", dt.timedelta(minutes=5)),
        ("1h", dt.timedelta(hours=1)),
        ("1h30m", dt.timedelta(hours=1, minutes=30)),
        ("500ms", dt.timedelta(milliseconds=500)),
        ("1.5s", dt.timedelta(seconds=1.5)),
        (".5s", dt.timedelta(milliseconds=500)),
        ("2h45m30.5s", dt.timedelta(hours=2, minutes=45, seconds=30.5)),
        ("250us", dt.timedelta(microseconds=250)),
        ("250µs", dt.timedelta(microseconds=250)),
        ("1500ns", dt.timedelta(microseconds=2)),
        ("1m1m", dt.timedelta(minutes=2)),
    ],
)
def test_go_durations_parse_to_timedeltas(text: str, expected: dt.timedelta) -> None:
    assert parse_duration(text) == expected
    assert parse_duration(format_duration(expected)) == expected


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "empty"),
        ("-1s", "sign"),
        ("+1s", "sign"),
        ("0s", "positive"),
        ("0", "missing unit"),
        ("5", "missing unit"),
        ("1h30", "missing unit"),
        ("1d", "unknown unit 'd'"),
        ("5 minutes", "unknown unit"),
        ("s", "cannot read 's'"),
        ("1s!", "unknown unit"),
        ("100ns", "positive"),
        ("2562048h", "overflow"),
        ("99999999999999999999999h", "overflow"),
    ],
)
def test_bad_durations_are_usage_errors_naming_the_value(text: str, why: str) -> None:
    with pytest.raises(InvalidDuration) as raised:
        parse_duration(text)
    assert f"invalid duration {text!r}" in str(raised.value) and why in str(raised.value)
    assert isinstance(raised.value, argparse.ArgumentTypeError)  # argparse reports it as a usage error


def test_durations_print_as_go_prints_them() -> None:
    shown = [
        format_duration(dt.timedelta(**kwargs))
        for kwargs in ({"hours": 1, "minutes": 30}, {"minutes": 5}, {"seconds": 1.5}, {"milliseconds": 300}, {})
    ]
    assert shown == ["1h30m0s", "5m0s", "1.5s", "300ms", "0s"]
    assert [
        whole_seconds(None),
        whole_seconds(dt.timedelta(milliseconds=10)),
        whole_seconds(dt.timedelta(hours=1)),
    ] == [
        0,
        1,
        3600,
    ]


def test_no_command_parses_durations_of_its_own() -> None:
    assert "def parse_duration" in Path(durations.__file__).read_text()
    for source in COMMAND_SOURCES:
        text = source.read_text()
        assert "(ms|s|m|h)" not in text and "def parse_duration" not in text, source.name


# --- UTC formatting ---------------------------------------------------------------------------


def test_utc_timestamps_end_in_z_and_have_milliseconds_always() -> None:
    naive = dt.datetime(2024, 5, 1, 12, 0, 0, 250999)
    assert iso_utc(naive) == "2024-05-01T12:00:00.250Z"  # cut, never rounded up
    assert iso_utc(naive.replace(microsecond=0)) == "2024-05-01T12:00:00.000Z"
    aware = naive.replace(tzinfo=dt.timezone(dt.timedelta(hours=2)))
    assert iso_utc(aware) == "2024-05-01T10:00:00.250Z"
    assert iso_utc(None) is None


def test_no_operator_surface_formats_times_of_its_own() -> None:
    """The command lines, the dashboard and the runbook print times through ``iso_utc`` only."""
    dashboard = Path(overview.__file__).parent
    sources = [*COMMAND_SOURCES, *dashboard.glob("*.py"), dashboard / "static" / "app.js"]
    for source in sources:
        text = source.read_text()
        assert not re.search(r"(?<!from)isoformat\(|ToJsonString\(|strftime\(|\.slice\(0, 19\)", text), source.name


# --- the wait loop ----------------------------------------------------------------------------


class FakeTime:
    """A monotonic clock that only the injected wait advances; nothing sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.waits: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        self.now += seconds
        return False


def statuses(drained_after: int | None, pack: str = "pk-1") -> Iterator[cp_pb.GetDrainStatusResponse]:
    """GetDrainStatus answers: retry 1 until the read numbered ``drained_after``, then drained."""
    read = 0
    while True:
        read += 1
        drained = drained_after is not None and read >= drained_after
        yield cp_pb.GetDrainStatusResponse(
            pack_install_id=pack,
            drained=drained,
            retry=0 if drained else 1,
            holds=[] if drained else [cp_pb.DrainHold(reason="retry_wait", count=1, sample_work_ids=["w-1"])],
        )


class FakeControlplane:
    def __init__(self, answers: Iterator[cp_pb.GetDrainStatusResponse]) -> None:
        self.answers = answers
        self.calls = 0

    def GetDrainStatus(self, request: cp_pb.GetDrainStatusRequest, timeout: float) -> cp_pb.GetDrainStatusResponse:
        self.calls += 1
        return next(self.answers)


class FakeClients:
    def __init__(self, controlplane: FakeControlplane) -> None:
        self.controlplane = controlplane


def drain_wait(answers: Iterator[cp_pb.GetDrainStatusResponse], clock: FakeTime) -> tuple[Outcome, int]:
    stub = FakeControlplane(answers)
    args = cli.build_parser().parse_args(["drain", "wait", "pk-1", "--timeout", "10s", "--interval", "3s"])
    outcome = drain.drain_wait(FakeClients(stub), args, monotonic=clock.monotonic, wait=clock.wait)  # type: ignore[arg-type]
    return outcome, stub.calls


def test_the_drain_wait_ends_in_the_timeout_code_when_the_deadline_passes() -> None:
    clock = FakeTime()
    outcome, calls = drain_wait(statuses(drained_after=None), clock)
    assert outcome.code == ExitCode.TIMEOUT
    assert outcome.data["drained"] is False and outcome.data["holds"][0]["reason"] == "retry_wait"
    assert clock.waits == [3.0, 3.0, 3.0, 1.0] and calls == 5  # never waits past the deadline; reads once after


def test_the_drain_wait_ends_ok_when_the_status_becomes_drained() -> None:
    clock = FakeTime()
    outcome, calls = drain_wait(statuses(drained_after=3), clock)
    assert outcome.code == ExitCode.OK and outcome.data["drained"] is True
    assert calls == 3 and clock.waits == [3.0, 3.0]


def test_poll_until_stops_early_and_reports_every_read() -> None:
    clock = FakeTime()
    seen: list[int] = []
    reads = iter(range(100))

    def stopping_wait(seconds: float) -> bool:
        clock.wait(seconds)
        return len(seen) == 2  # a signal arrives during the second wait

    polled = poll_until(
        lambda: next(reads),
        lambda value: False,
        timeout=dt.timedelta(minutes=1),
        interval=dt.timedelta(seconds=1),
        on_poll=seen.append,
        monotonic=clock.monotonic,
        wait=stopping_wait,
    )
    assert (polled.status, polled.done, seen) == (1, False, [0, 1])
