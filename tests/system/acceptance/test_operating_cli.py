"""``nexuscrm claims``, ``dead-letters`` and ``coverage`` against the running services, on every backend.

A Flow that fails for good (here a worker that fails what it claims) leaves dead letters; the
operator lists them, counts them per identity, replays them with a dry run first, pauses and
resumes claims while admission goes on, and proves each identity's coverage. Bad input exits 2
(or 8 for a refusal of a valid request) with the service's message, nothing changed; the final
database keeps every invariant.
"""

from __future__ import annotations

import grpc
import pytest

from nexuscrm_runtime.database import create_engine
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_tools import cli
from nexuscrm_tools.launcher import CONNECTORS, ServiceProcess
from tests.support.factories import delivery, route
from tests.support.invariants import assert_invariants
from tests.system.acceptance.test_cli_discovery_and_exit_codes import run, system

pytestmark = [pytest.mark.acceptance, pytest.mark.database]
__all__ = ["system"]  # the fixture, shared with the discovery test


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
    system: list[ServiceProcess], empty_dsn: str, capsys: pytest.CaptureFixture[str]
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

    engine = create_engine(empty_dsn)
    try:
        assert_invariants(engine)
    finally:
        engine.dispose()


def test_a_work_types_order_policy_and_held_work_from_the_command_line(
    system: list[ServiceProcess], empty_dsn: str, capsys: pytest.CaptureFixture[str]
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
    engine = create_engine(empty_dsn)
    try:
        assert_invariants(engine)
    finally:
        engine.dispose()
