"""docs/output-conventions.md, pinned: JSON words and numbers, whole titles, "none", plurals, help text, errors."""

from __future__ import annotations

import argparse
import io
import re
import socket

import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from rich.console import Console

from nexuscrm.connectors.v1 import connectors_pb2 as cn_pb
from nexuscrm.controlplane.v1 import controlplane_pb2 as cp_pb
from nexuscrm_tools import cli, tables
from nexuscrm_tools.commands.generations import attempts_text
from nexuscrm_tools.exits import ExitCode
from nexuscrm_tools.json_view import message_data

PACK = "pk-6fc5bc72c8af4e3987abea21e348bbf2"


def test_json_has_plain_enum_words_integer_numbers_utc_times_and_one_name_per_concept() -> None:
    created, finished = Timestamp(), Timestamp()
    created.FromJsonString("2026-05-01T12:00:00Z")
    finished.FromJsonString("2026-05-01T12:00:01.999999999Z")
    work = cn_pb.WorkItem(
        work_id="w-1",
        pack_install_id=PACK,
        input_start_ordinal=12,
        lane_ordinal=6000,
        status=cn_pb.WORK_STATUS_COMPLETED,
        attempt=0,
        max_attempts=5,
        created_at=created,
        finished_at=finished,
    )
    data = message_data(cn_pb.GetWorkResponse(work=work, member_count=3))
    assert data["member_count"] == 3
    shown = data["work"]
    assert shown["status"] == "completed"
    assert (shown["first_ordinal"], shown["last_ordinal"]) == (12, 6000)
    assert "lane_ordinal" not in shown and "input_start_ordinal" not in shown
    # Times to the millisecond whatever the value holds (cut, never rounded up)
    assert (shown["created_at"], shown["finished_at"]) == ("2026-05-01T12:00:00.000Z", "2026-05-01T12:00:01.999Z")
    assert "lease_expires_at" not in shown  # an unset message is left out
    pack = message_data(cp_pb.PackInstall(pack_install_id=PACK, last_ordinal=6000))
    assert pack["ordinal_counter"] == 6000 and "last_ordinal" not in pack
    outcome = message_data(cn_pb.IngestResult(outcome=cn_pb.INGEST_OUTCOME_DUPLICATE_COVERED))
    assert outcome["outcome"] == "duplicate_covered"
    age = message_data(cn_pb.QueueState(pending=2, oldest_waiting_age={"seconds": 90, "nanos": 500_000_000}))
    assert age["pending"] == 2 and age["oldest_waiting_age_seconds"] == 90.5


def _printed(title: str, rows: list[tuple[str, ...]]) -> str:
    out = io.StringIO()
    tables.print_whole(Console(file=out, width=80), tables.table(title, ("held by", "count"), rows))
    return out.getvalue()


def test_a_title_is_one_whole_line_above_its_table_however_narrow_the_table() -> None:
    title = f"{PACK}: not drained (pending 1, blocked 0, retry 0, processing 0)"
    printed = _printed(title, [("pending", "1")])
    assert printed.splitlines()[0].strip() == title
    assert "coverage missing: 0" in _printed("receipts with coverage missing: 0", [])


def test_an_empty_listing_says_none_and_counts_agree_with_their_noun() -> None:
    assert tables.listing("fences", ("fence",), []) == "fences: none"
    assert [tables.plural(n, "incarnation") for n in (0, 1, 2)] == ["0 incarnations", "1 incarnation", "2 incarnations"]
    assert tables.plural(1, "problem") == "1 problem"


@pytest.mark.parametrize(
    ("status", "attempt", "said"),
    [
        (cn_pb.WORK_STATUS_COMPLETED, 0, "completed on attempt 1 of 5"),
        (cn_pb.WORK_STATUS_FAILED, 5, "failed for good after 5 attempts of 5"),
        (cn_pb.WORK_STATUS_PROCESSING, 1, "attempt 2 of 5 running"),
        (cn_pb.WORK_STATUS_RETRY, 1, "1 failed; attempt 2 of 5 next"),
        (cn_pb.WORK_STATUS_PENDING, 0, "not attempted yet (up to 5)"),
    ],
)
def test_attempts_say_what_was_used_never_attempts_0_of_5_for_completed_work(
    status: cn_pb.WorkStatus, attempt: int, said: str
) -> None:
    assert attempts_text(cn_pb.WorkItem(status=status, attempt=attempt, max_attempts=5)) == said


def _helps() -> list[str]:
    """The --help of ``nexuscrm`` and of every group and subcommand."""
    parser = cli.build_parser()
    texts = [parser.format_help()]
    stack = [parser]
    while stack:
        for action in stack.pop()._actions:
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    texts.append(child.format_help())
                    stack.append(child)
    return texts


def test_help_has_no_backticks_and_points_only_at_commands_that_exist() -> None:
    helps = _helps()
    assert len(helps) > 30
    for text in helps:
        assert "``" not in text
        assert not re.search(r"\bsee targets\b", text)
    main = helps[0]
    for variable in ("CONTROLPLANE", "CONNECTORS", "INTEGRATION", "SCHEMA_CATALOG"):
        assert f"NEXUSCRM_{variable}_TARGET" in main


def test_an_unreachable_service_is_named_with_the_variable_to_set(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{probe.getsockname()[1]}"
    for variable, argv, name in (
        ("NEXUSCRM_CONTROLPLANE_TARGET", ["fences", "list", "--namespace", "n"], "Controlplane"),
        ("NEXUSCRM_CONNECTORS_TARGET", ["work", "show", "w-1"], "Connectors"),
        ("NEXUSCRM_CONNECTORS_TARGET", ["queue", "state", PACK], "Connectors"),  # through the SDK's client
        ("NEXUSCRM_INTEGRATION_TARGET", ["workers"], "Integration"),
    ):
        monkeypatch.setenv(variable, address)
        capsys.readouterr()
        assert cli.main(argv) == ExitCode.UNREACHABLE
        err = capsys.readouterr().err
        expected = f"nexuscrm: {name} is unreachable at {address} (set {variable}; nexuscrm-run --serve prints"
        assert err.startswith(expected), err
        assert re.search(r"\): UNAVAILABLE: ", err), err
