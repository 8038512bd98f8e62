"""``nexuscrm claims``, ``dead-letters`` and ``coverage`` against the running services, on every backend.

A Flow that fails for good (here a worker that fails what it claims) leaves dead letters; the
operator lists them, counts them per identity, replays them with a dry run first, pauses and
resumes claims while admission goes on, and proves each identity's coverage. Bad input exits 2
(or 8 for a refusal of a valid request) with the service's message, nothing changed; the final
database keeps every invariant. Every time the commands print, in tables, JSON and refusals,
is UTC to the millisecond with a Z (docs/output-conventions.md, decision 179).
"""

from __future__ import annotations

import re
import sys

import grpc
import pytest

from nexuscrm_runtime.database import create_engine
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_tools import cli
from nexuscrm_tools.exits import ExitCode
from nexuscrm_tools.launcher import CONNECTORS, ServiceProcess
from tests.support.factories import delivery, route
from tests.support.invariants import assert_invariants
from tests.system.acceptance.test_cli_discovery_and_exit_codes import run, system

pytestmark = [pytest.mark.acceptance, pytest.mark.database]
__all__ = ["system"]  # the fixture, shared with the discovery test

# A time as every surface prints it, and any text that looks like a time (to its next space,
# quote or bracket), whatever its zone, separator or precision.
PRINTED_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z")
TIME_LIKE = re.compile(r"\d{4}-\d\d-\d\d[T ]\d\d:\d\d[^\s\"',;()\[\]]*")


@pytest.fixture
def printed(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Everything the test's ``cli.main`` calls print, stdout and stderr, still captured for the test."""
    outputs: list[str] = []
    main = cli.main

    def recording(argv: list[str] | None = None) -> ExitCode:
        try:
            return main(argv)
        finally:
            out, err = capsys.readouterr()
            outputs.append(out + err)
            sys.stdout.write(out)
            sys.stderr.write(err)

    monkeypatch.setattr(cli, "main", recording)
    return outputs


def printed_times(outputs: list[str]) -> list[str]:
    """Every time-like text of ``outputs`` that is not printed the one way (UTC, milliseconds, Z)."""
    times = [t.rstrip(".") for text in outputs for t in TIME_LIKE.findall(text)]
    assert len(times) >= 10, times  # the scenario printed times: the check below can fail
    return [t for t in times if not PRINTED_TIME.fullmatch(t)]


def shown(capsys: pytest.CaptureFixture[str], *argv: str, code: int = 0) -> str:
    """The table (or line) a command prints for people."""
    capsys.readouterr()
    assert cli.main(list(argv)) == code, argv
    return capsys.readouterr().out


def refused(capsys: pytest.CaptureFixture[str], *argv: str, code: int) -> str:
    """The message of a command that exits ``code``."""
    capsys.readouterr()
    assert cli.main(list(argv)) == code, argv
    return capsys.readouterr().err


def _identity(lane: str) -> list[str]:
    r = route(lane)
    return [
        *("--event-kind", r.event_kind, "--route-version", r.route_version),
        *("--companion-version", r.companion_version, "--work-type", r.work_type, "--lane", lane),
    ]


def test_dead_letters_and_claim_pauses_from_the_command_line(
    system: list[ServiceProcess], empty_dsn: str, capsys: pytest.CaptureFixture[str], printed: list[str]
) -> None:
    pack = run(capsys, "packs", "install", "--namespace", "acme", "--name", "crm", "--version", "1.0")[
        "pack_install_id"
    ]
    run(capsys, "packs", "activate", pack)
    client = ConnectorsClient(grpc.insecure_channel(next(s.address for s in system if s.spec is CONNECTORS)))
    client.ingest(pack, items=[delivery(f"k-{n}", lane=f"lane-{n % 3}") for n in range(6)])
    for claim in client.claim("flow", pack_install_ids=[pack], max_items=10):
        lane = claim.work.projection_key.rsplit(":", 1)[1]
        if lane == "lane-2":
            client.complete(claim.work.work_id, lease_token=claim.lease_token)
        else:
            client.fail(
                claim.work.work_id, lease_token=claim.lease_token, error=f"Flow refused {lane}", retryable=False
            )

    listed = run(capsys, "dead-letters", "list", pack)["dead_letters"]
    assert sorted(d["route"]["source_lane"] for d in listed) == ["lane-0", "lane-1"]
    assert all(d["status"] == "failed" and d["last_error"].startswith("Flow refused") for d in listed)
    assert "failed at" in shown(capsys, "dead-letters", "list", pack)
    assert "installed at" in shown(capsys, "packs", "show", pack)
    assert "received at" in shown(capsys, "receipts", "list", pack)
    settled = run(capsys, "queue", "state", pack, code=9)  # drained, but two inputs were never applied
    assert (settled["drained"], settled["failed"], settled["dead_letters"]) == (True, 2, 2)
    only = run(capsys, "dead-letters", "list", pack, "--error", "lane-1")["dead_letters"]
    assert [d["route"]["source_lane"] for d in only] == ["lane-1"]
    counted = run(capsys, "dead-letters", "count", pack)
    assert counted["total"] == 2 and counted["complete"] is True
    dry = run(capsys, "dead-letters", "replay", pack, "--dry-run")
    assert dry["dry_run"] is True and {a["verdict"] for a in dry["answers"]} == {"would_replay"}
    assert len(run(capsys, "dead-letters", "list", pack)["dead_letters"]) == 2  # the dry run changed nothing
    replayed = run(capsys, "dead-letters", "replay", pack, *_identity("lane-0"))
    assert [a["verdict"] for a in replayed["answers"]] == ["replayed"] and replayed["refused"] == 0
    assert [d["route"]["source_lane"] for d in run(capsys, "dead-letters", "list", pack)["dead_letters"]] == ["lane-1"]

    paused = run(capsys, "claims", "pause", pack, "--by", "ops@acme", "--reason", "flow fix going out", "--for", "1h")
    assert paused["paused_by"] == "ops@acme" and paused["scope"]["scope"] == "pack" and paused["expires_at"]
    client.ingest(pack, items=[delivery("k-late", lane="lane-2")])  # admission goes on
    assert client.claim("flow", pack_install_ids=[pack], max_items=10) == []
    assert [p["pause_id"] for p in run(capsys, "claims", "list", pack)["pauses"]] == [paused["pause_id"]]
    queue = run(capsys, "queue", "state", pack, code=9)  # not drained: the late input waits
    assert [p["pause_id"] for p in queue["paused"]] == [paused["pause_id"]]
    assert "waiting since" in shown(capsys, "queue", "state", pack, code=9)
    assert paused["pause_id"] in shown(capsys, "claims", "list", pack)  # since and until
    again = refused(capsys, "claims", "pause", pack, "--by", "ops", "--reason", "twice", code=8)
    assert "already paused" in again
    past = refused(
        capsys,
        "claims",
        "pause",
        pack,
        "--scope",
        "work_type",
        "--work-type",
        "project",
        "--by",
        "o",
        "--reason",
        "r",
        "--until",
        "2000-01-01T00:00:00Z",
        code=2,
    )
    assert "is not after the database's now" in past
    unknown = refused(
        capsys,
        "claims",
        "pause",
        pack,
        "--scope",
        "identity",
        *_identity("lane-9"),
        "--by",
        "o",
        "--reason",
        "r",
        code=2,
    )
    assert "the pack has no generation of it" in unknown
    resumed = run(capsys, "claims", "resume", pack, "--by", "ops@acme")
    assert resumed["resumed_by"] == "ops@acme" and resumed["resumed_at"]
    claims = client.claim("flow", pack_install_ids=[pack], max_items=10)
    assert sorted(c.work.projection_key.rsplit(":", 1)[1] for c in claims) == ["lane-0", "lane-2"]
    for claim in claims:
        client.complete(claim.work.work_id, lease_token=claim.lease_token)
    assert "is not paused" in refused(capsys, "claims", "resume", pack, "--by", "ops", code=8)

    assert run(capsys, "order-policy", "show", pack)["policy"] == "continue"  # the default, never set
    blocking = run(capsys, "order-policy", "set", pack, "block", "--by", "ops@acme", "--reason", "ledger order")
    assert (blocking["policy"], blocking["set_by"]) == ("block", "ops@acme") and blocking["set_at"]
    assert "by ops@acme: ledger order" in shown(capsys, "order-policy", "show", pack)
    (left,) = run(capsys, "dead-letters", "list", pack)["dead_letters"]
    skipped = run(capsys, "dead-letters", "skip", left["work_id"], "--by", "ops@acme", "--reason", "fixed upstream")
    assert skipped["work_id"] == left["work_id"] and skipped["skipped_by"] == "ops@acme"
    assert "was skipped at" in refused(
        capsys, "dead-letters", "skip", left["work_id"], "--by", "o", "--reason", "r", code=8
    )
    assert run(capsys, "dead-letters", "list", pack)["dead_letters"] == []

    recovered = run(capsys, "queue", "state", pack)  # replayed and skipped: no dead letter is left
    assert (recovered["drained"], recovered["failed"], recovered["dead_letters"]) == (True, 2, 0)

    proven = run(capsys, "coverage", pack)
    by_lane = {i["route"]["source_lane"]: i for i in proven["identities"]}
    assert sorted(by_lane) == ["lane-0", "lane-1", "lane-2"] and all(i["tiled"] for i in by_lane.values())
    assert [r["state"] for r in by_lane["lane-0"]["ranges"]] == ["replayed", "completed"]
    assert [r["state"] for r in by_lane["lane-1"]["ranges"]] == ["skipped"]
    assert [r["state"] for r in by_lane["lane-2"]["ranges"]] == ["completed", "completed"]
    one = run(capsys, "coverage", pack, *_identity("lane-1"), "--page-size", "1")
    assert [i["route"]["source_lane"] for i in one["identities"]] == ["lane-1"]
    assert "page_token is not a token from a previous GetCoverage page" in refused(
        capsys, "coverage", pack, "--page-token", "garbage", code=2
    )
    capsys.readouterr()
    assert cli.main(["coverage", pack]) == 0
    assert "replayed" in capsys.readouterr().out
    assert printed_times(printed) == []  # tables, JSON and refusals alike

    engine = create_engine(empty_dsn)
    try:
        assert_invariants(engine)
    finally:
        engine.dispose()


def test_a_work_types_order_policy_and_held_work_from_the_command_line(
    system: list[ServiceProcess], empty_dsn: str, capsys: pytest.CaptureFixture[str], printed: list[str]
) -> None:
    pack = run(capsys, "packs", "install", "--namespace", "acme", "--name", "ledger", "--version", "1.0")[
        "pack_install_id"
    ]
    run(capsys, "packs", "activate", pack)
    client = ConnectorsClient(grpc.insecure_channel(next(s.address for s in system if s.spec is CONNECTORS)))
    client.ingest(pack, items=[delivery(lane="x")])
    (first,) = client.claim("flow", pack_install_ids=[pack])
    second = delivery(lane="x")
    (successor,) = [r.work_id for r in client.ingest(pack, items=[second])]
    assert successor is not None
    blocking = run(
        capsys, "order-policy", "set", pack, "block", "--work-type", "project", "--by", "ops", "--reason", "ledger"
    )
    assert (blocking["policy"], blocking["work_type"], blocking["source"]) == ("block", "project", "work_type")
    client.fail(first.work.work_id, lease_token=first.lease_token, error="Flow refused x", retryable=False)
    packs_own = run(capsys, "order-policy", "show", pack)
    assert packs_own["policy"] == "continue"  # the pack's own
    assert [(p["work_type"], p["policy"]) for p in packs_own["work_type_policies"]] == [("project", "block")]
    shown = run(capsys, "order-policy", "show", pack, "--work-type", "project")
    assert (shown["policy"], shown["source"]) == ("block", "work_type")

    work = run(capsys, "work", "show", successor)["work"]
    assert work["blocked_behind_work_id"] == first.work.work_id
    assert work["blocked_reason"].startswith("held by order policy block: predecessor")
    listed = run(capsys, "work", "list", pack)["generations"]
    assert {w["work_id"]: w["blocked_behind_work_id"] for w in listed} == {
        first.work.work_id: "",
        successor: first.work.work_id,
    }
    capsys.readouterr()
    assert cli.main(["work", "list", pack]) == 0
    assert f"blocked behind {first.work.work_id}" in capsys.readouterr().out
    assert run(capsys, "queue", "state", pack, code=9)["held"] == 1
    why = run(capsys, "why", pack, second.receipt_key)
    assert why["covered_by"]["blocked_behind_work_id"] == first.work.work_id
    assert why["explanation"].endswith(
        f"held by order policy block: predecessor {first.work.work_id} failed for good; replay or skip it."
    )

    unknown = refused(
        capsys, "order-policy", "set", pack, "block", "--work-type", "refund", "--by", "o", "--reason", "r", code=2
    )
    assert "work type 'refund'" in unknown and "has no generation of it" in unknown
    assert "has no generation of it" in refused(capsys, "order-policy", "show", pack, "--work-type", "refund", code=2)
    with pytest.raises(SystemExit) as usage:  # argparse refuses a policy outside block|continue
        cli.main(["order-policy", "set", pack, "sometimes", "--by", "o", "--reason", "r"])
    assert usage.value.code == 2 and "invalid choice: 'sometimes'" in capsys.readouterr().err
    assert run(capsys, "order-policy", "show", pack, "--work-type", "project")["policy"] == "block"  # unchanged

    run(capsys, "dead-letters", "skip", first.work.work_id, "--by", "ops", "--reason", "fixed upstream")
    assert run(capsys, "work", "show", successor)["work"]["blocked_behind_work_id"] == ""
    (released,) = client.claim("flow", pack_install_ids=[pack])
    assert released.work.work_id == successor
    client.complete(released.work.work_id, lease_token=released.lease_token)
    assert printed_times(printed) == []
    engine = create_engine(empty_dsn)
    try:
        assert_invariants(engine)
    finally:
        engine.dispose()


def test_dead_letters_skipped_by_filter_from_the_command_line(
    system: list[ServiceProcess], empty_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pack = run(capsys, "packs", "install", "--namespace", "acme", "--name", "skips", "--version", "1.0")[
        "pack_install_id"
    ]
    run(capsys, "packs", "activate", pack)
    client = ConnectorsClient(grpc.insecure_channel(next(s.address for s in system if s.spec is CONNECTORS)))
    client.ingest(pack, items=[delivery(f"k-{n}", lane=f"lane-{n}") for n in range(3)])
    for claim in client.claim("flow", pack_install_ids=[pack], max_items=10):
        client.fail(claim.work.work_id, lease_token=claim.lease_token, error="Flow refused", retryable=False)
    settled = run(capsys, "queue", "state", pack, code=9)  # drained, yet three inputs were never applied
    assert (settled["drained"], settled["failed"], settled["dead_letters"], settled["held"]) == (True, 3, 3, 0)

    by = ("--by", "ops@acme", "--reason", "deleted upstream")
    dry = run(capsys, "dead-letters", "skip", "--pack", pack, "--work-type", "project", "--dry-run", *by)
    assert dry["dry_run"] is True and [a["verdict"] for a in dry["answers"]] == ["would_skip"] * 3
    assert len(run(capsys, "dead-letters", "list", pack)["dead_letters"]) == 3  # the dry run changed nothing
    skipped = run(capsys, "dead-letters", "skip", "--pack", pack, *_identity("lane-0"), *by)
    [answer] = skipped["answers"]
    assert (answer["verdict"], answer["route"]["source_lane"], skipped["refused"]) == ("skipped", "lane-0", 0)

    shown = run(capsys, "work", "show", answer["work_id"])["work"]
    assert (shown["skip"]["skipped_by"], shown["skip"]["reason"]) == ("ops@acme", "deleted upstream")
    capsys.readouterr()
    assert cli.main(["work", "list", pack]) == 0
    assert "failed, skipped at" in capsys.readouterr().out
    assert "no dead letter of pack" in refused(
        capsys, "dead-letters", "skip", "--pack", pack, *_identity("lane-0"), *by, code=2
    )
    for both in (["--lane", "x"], ["--pack", pack]):  # a WORK_ID or --pack and filters, not both
        with pytest.raises(SystemExit) as usage:
            cli.main(["dead-letters", "skip", answer["work_id"], *both, *by])
        assert usage.value.code == 2
    assert "--lane: only with --pack PACK, not with a WORK_ID" in capsys.readouterr().err
    assert run(capsys, "queue", "state", pack, code=9)["dead_letters"] == 2
    engine = create_engine(empty_dsn)
    try:
        assert_invariants(engine)
    finally:
        engine.dispose()


def test_a_work_types_retry_policy_attempt_history_and_retry_now_from_the_command_line(
    system: list[ServiceProcess], empty_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pack = run(capsys, "packs", "install", "--namespace", "acme", "--name", "retries", "--version", "1.0")[
        "pack_install_id"
    ]
    run(capsys, "packs", "activate", pack)
    client = ConnectorsClient(grpc.insecure_channel(next(s.address for s in system if s.spec is CONNECTORS)))
    (admitted,) = client.ingest(pack, items=[delivery(lane="r")])
    work_id = str(admitted.work_id)
    by = ("--by", "ops@acme", "--reason", "the CRM is slow")
    project = ("--work-type", "project")
    policy = run(capsys, "retry-policy", "set", pack, *project, "--max-attempts", "2", "--backoff-base", "3600", *by)
    assert (policy["max_attempts"], policy["backoff_max_seconds"], policy["source"]) == (2, 3600, "work_type")
    listed = run(capsys, "retry-policy", "show", pack)
    assert listed["source"] == "default" and [p["work_type"] for p in listed["work_type_policies"]] == ["project"]
    assert "2 attempts, backoff 3600s" in shown(capsys, "retry-policy", "show", pack)
    out_of_range = refused(capsys, "retry-policy", "set", pack, *project, "--max-attempts", "0", *by, code=2)
    assert "max_attempts must be between 1 and 100, got 0" in out_of_range
    assert run(capsys, "retry-policy", "show", pack, *project)["max_attempts"] == 2  # unchanged

    (claim,) = client.claim("flow-1", pack_install_ids=[pack])
    traceback = 'Traceback (most recent call last):\n  File "flow.py", line 9, in project\nValueError: no e-mail\n'
    client.fail(work_id, lease_token=claim.lease_token, error="ValueError: no e-mail", traceback=traceback)
    described = run(capsys, "work", "show", work_id)
    assert (described["work"]["max_attempts"], described["attempt_count"]) == (2, 1)
    [attempt] = described["attempts"]
    assert (attempt["attempt"], attempt["worker_id"], attempt["outcome"]) == (1, "flow-1", "retry")
    assert (attempt["error"], attempt["traceback"]) == ("ValueError: no e-mail", traceback)
    table = shown(capsys, "work", "show", work_id)
    assert "retry, worker flow-1" in table and 'File "flow.py", line 9, in project' in table

    assert client.claim("flow-2", pack_install_ids=[pack]) == []  # an hour of backoff
    run(capsys, "work", "retry-now", work_id, *by)
    (again,) = client.claim("flow-2", pack_install_ids=[pack])
    assert "is processing; only a generation waiting in retry" in refused(
        capsys, "work", "retry-now", work_id, *by, code=8
    )
    client.complete(work_id, lease_token=again.lease_token)
    engine = create_engine(empty_dsn)
    try:
        assert_invariants(engine)
    finally:
        engine.dispose()
