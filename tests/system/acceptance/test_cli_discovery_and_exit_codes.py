"""``nexuscrm`` against the running services: the documented exit code for every unknown id, discovery, JSON.

Every command that takes a pack, fence, receipt or WorkId is run with one the services do not
know and must exit with the code the exit-code table gives for an unknown one (the test reads
``nexuscrm_runtime.exit_codes.DESCRIPTIONS``, which the site's exit-code page is rendered from,
so the two cannot drift). Then the discovery commands find what a new
operator has no other way to learn: the packs (``packs list``), a pack's generations
(``work list PACK``) and receipts (``receipts list PACK``), and a fence by the short id the
dashboard shows. Their JSON follows docs/output-conventions.md.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from nexuscrm_runtime.database import create_engine
from nexuscrm_runtime.exit_codes import DESCRIPTIONS
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_tools import cli
from nexuscrm_tools.launcher import (
    CONNECTORS,
    CONTROLPLANE,
    SCHEMA_CATALOG,
    ServiceProcess,
    start_services,
    stop_services,
    target_env,
)
from tests.support.factories import delivery
from tests.support.invariants import assert_invariants

pytestmark = [pytest.mark.acceptance, pytest.mark.database]

PACK, FENCE, RECEIPT, WORK = "pk-nosuch", "97c1e36e", "r-nonexistent", "w-nosuch"
UTC_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")

# Every command that names a pack, fence, receipt or WorkId, with one nobody knows (and a known
# pack where another argument is the unknown one, filled in as {pack}).
UNKNOWN: list[tuple[str, list[str]]] = [
    ("pack", ["packs", "activate", PACK]),
    ("pack", ["packs", "protocol", PACK]),
    ("pack", ["packs", "show", PACK]),
    ("pack", ["fences", "arm", "--namespace", "acme", "--scope", PACK]),
    ("pack", ["fences", "override", "add", "{fence}", PACK]),
    ("pack", ["drain", "status", PACK]),
    ("pack", ["drain", "wait", PACK, "--timeout", "1s"]),
    ("pack", ["queue", "state", PACK]),
    ("pack", ["queue", "wait", PACK, "--timeout", "1s"]),
    ("pack", ["cutover", "audit", PACK]),
    ("pack", ["cutover", "run", PACK]),
    ("pack", ["work", "list", PACK]),
    ("pack", ["receipts", "list", PACK]),
    ("pack", ["receipts", "missing", "--pack", PACK]),
    ("pack", ["retention", "set", PACK, "--keep-generations", "1"]),
    ("pack", ["retention", "show", PACK]),
    ("pack", ["retention", "prune", PACK, "--dry-run"]),
    ("pack", ["why", PACK, "r-1"]),
    ("pack", ["claims", "pause", PACK, "--by", "ops", "--reason", "r"]),
    ("pack", ["claims", "resume", PACK, "--by", "ops"]),
    ("pack", ["claims", "list", PACK]),
    ("pack", ["dead-letters", "list", PACK]),
    ("pack", ["dead-letters", "count", PACK]),
    ("pack", ["dead-letters", "replay", PACK, "--dry-run"]),
    ("pack", ["dead-letters", "skip", "--pack", PACK, "--dry-run", "--by", "ops", "--reason", "r"]),
    ("pack", ["order-policy", "set", PACK, "block", "--by", "ops", "--reason", "r"]),
    ("pack", ["order-policy", "show", PACK]),
    ("pack", ["coverage", PACK]),
    ("WorkId", ["dead-letters", "skip", WORK, "--by", "ops", "--reason", "r"]),
    ("fence", ["fences", "disarm", FENCE]),
    ("fence", ["fences", "override", "add", FENCE, "{pack}"]),
    ("fence", ["fences", "override", "remove", FENCE, "{pack}"]),
    ("receipt", ["why", "{pack}", RECEIPT]),
    ("WorkId", ["work", "show", WORK]),
    ("WorkId", ["work", "members", WORK]),
]


def documented_code(kind: str) -> int:
    """The exit code the exit-code table (``DESCRIPTIONS``, the reference page's source) gives an unknown ``kind``.

    The row that names "unknown" and the kind, else the row of unknown ids in general.
    """
    unknown = [(int(code), meaning) for code, meaning in DESCRIPTIONS.items() if "unknown" in meaning]
    assert unknown, "the exit-code table has no row for an unknown id"
    naming = [code for code, meaning in unknown if kind.lower() in meaning.lower()]
    return (naming or [code for code, _ in unknown])[0]


@pytest.fixture
def system(empty_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[ServiceProcess]]:
    services = start_services(
        (SCHEMA_CATALOG, CONTROLPLANE, CONNECTORS), env={"NEXUSCRM_DSN": empty_dsn}, workdir=tmp_path
    )
    for name, address in target_env(services).items():
        monkeypatch.setenv(name, address)
    yield services
    assert set(stop_services(services).values()) == {0}


def run(capsys: pytest.CaptureFixture[str], *argv: str, code: int = 0) -> Any:
    capsys.readouterr()
    exited = cli.main(["--json", *argv])
    out, err = capsys.readouterr()
    assert exited == code, (argv, exited, err)
    return json.loads(out) if out.strip() else None


def test_unknown_ids_exit_with_the_readmes_code_and_discovery_finds_them(
    system: list[ServiceProcess], empty_dsn: str, capsys: pytest.CaptureFixture[str]
) -> None:
    installed = run(capsys, "packs", "install", "--namespace", "acme", "--name", "crm", "--version", "1.0")
    pack = installed["pack_install_id"]
    assert installed["ordinal_counter"] == 0 and UTC_TIME.match(installed["created_at"])
    run(capsys, "packs", "activate", pack)
    fence = run(capsys, "fences", "arm", "--namespace", "acme", "--reason", "exit-code test")["fence_id"]

    for kind, argv in UNKNOWN:
        filled = [arg.format(pack=pack, fence=fence) for arg in argv]
        expected = documented_code(kind)
        capsys.readouterr()
        assert cli.main(filled) == expected, (kind, filled, capsys.readouterr().err)
        err = capsys.readouterr().err
        assert "NOT_FOUND" in err, (filled, err)

    # packs list: every incarnation with its protocol state; JSON by the conventions.
    second = run(capsys, "packs", "install", "--namespace", "acme", "--name", "crm", "--version", "1.0")
    listed = run(capsys, "packs", "list")
    assert [(p["pack"]["pack_install_id"], p["protocol_state"]) for p in listed["packs"]] == sorted(
        [(pack, "greenfield"), (second["pack_install_id"], "none")]
    )
    first_page = run(capsys, "packs", "list", "--namespace", "acme", "--limit", "1")
    assert len(first_page["packs"]) == 1 and first_page["next_page_token"]
    rest = run(
        capsys, "packs", "list", "--namespace", "acme", "--limit", "1", "--page-token", first_page["next_page_token"]
    )
    assert {first_page["packs"][0]["pack"]["pack_install_id"], rest["packs"][0]["pack"]["pack_install_id"]} == {
        pack,
        second["pack_install_id"],
    }
    assert run(capsys, "packs", "list", "--namespace", "nobody") == {"packs": [], "next_page_token": ""}

    # The short fence id the dashboard shows (8 hex digits) works wherever an id is taken.
    short = fence[:8]
    added = run(capsys, "fences", "override", "add", short, pack)
    assert added["fence_id"] == fence and [o["pack_install_id"] for o in added["overrides"]] == [pack]
    run(capsys, "fences", "override", "remove", short, pack)
    capsys.readouterr()
    assert cli.main(["fences", "disarm", fence[:7]]) == documented_code("fence")  # too short to be a short id
    assert "at least 8 hex digits" in capsys.readouterr().err
    assert run(capsys, "fences", "disarm", short) == {"fence_id": short, "disarmed": True}
    assert run(capsys, "fences", "list", "--namespace", "acme") == []
    capsys.readouterr()
    assert cli.main(["fences", "list", "--namespace", "acme"]) == 0
    assert capsys.readouterr().out.strip() == "fences: none"

    # A pack's generations and receipts, without knowing any identity.
    client = ConnectorsClient(grpc.insecure_channel(next(s.address for s in system if s.spec is CONNECTORS)))
    client.ingest(pack, items=[delivery(f"k-{n}", lane=f"lane-{n % 3}") for n in range(6)])
    generations = run(capsys, "work", "list", pack)["generations"]
    assert len(generations) == 3 and {g["route"]["source_lane"] for g in generations} == {"lane-0", "lane-1", "lane-2"}
    for generation in generations:
        assert generation["status"] == "pending"  # the plain word, not WORK_STATUS_PENDING
        assert isinstance(generation["first_ordinal"], int) and isinstance(generation["last_ordinal"], int)
        assert generation["first_ordinal"] <= generation["last_ordinal"]
        assert "lane_ordinal" not in generation and "input_start_ordinal" not in generation
        assert UTC_TIME.match(generation["created_at"])
    paged = run(capsys, "work", "list", pack, "--limit", "2")
    after = run(capsys, "work", "list", pack, "--limit", "2", "--page-token", paged["next_page_token"])
    assert [g["work_id"] for g in paged["generations"] + after["generations"]] == [g["work_id"] for g in generations]
    assert run(capsys, "work", "list", pack, "--status", "completed")["generations"] == []
    one = generations[0]
    identity = ["--event-kind", one["route"]["event_kind"], "--route-version", one["route"]["route_version"]]
    identity += ["--companion-version", one["route"]["companion_version"], "--work-type", one["route"]["work_type"]]
    of_lane = run(capsys, "work", "list", pack, *identity, "--lane", one["route"]["source_lane"])
    assert [g["work_id"] for g in of_lane["generations"]] == [one["work_id"]]
    of_lane_0 = run(capsys, "work", "list", pack, "--lane", "lane-0")  # a partial identity naming one (decision 178)
    assert {g["route"]["source_lane"] for g in of_lane_0["generations"]} == {"lane-0"}

    shown = run(capsys, "work", "show", one["work_id"])
    assert shown["work"]["status"] == "pending" and shown["member_count"] == 2
    capsys.readouterr()
    assert cli.main(["work", "show", one["work_id"]]) == 0
    assert "not attempted yet (up to" in capsys.readouterr().out

    receipts = run(capsys, "receipts", "list", pack)["receipts"]
    assert sorted(r["receipt_key"] for r in receipts) == [f"k-{n}" for n in range(6)]
    assert all(r["state"] == "confirmed" and UTC_TIME.match(r["received_at"]) for r in receipts)
    assert run(capsys, "receipts", "list", pack, "--state", "stored")["receipts"] == []
    capsys.readouterr()
    assert cli.main(["receipts", "missing", "--pack", pack]) == 0
    assert capsys.readouterr().out.strip() == "coverage missing receipts: none"

    queue = run(capsys, "queue", "state", pack, code=9)
    assert queue["pending"] == 3 and queue["receipts_waiting"] == 0 and queue["drained"] is False
    assert queue["oldest_waiting_work_id"] and isinstance(queue["oldest_waiting_age_seconds"], float)
    assert UTC_TIME.match(queue["oldest_waiting_since"]) and UTC_TIME.match(queue["read_at"])
    engine = create_engine(empty_dsn)  # the database the services ran on
    try:
        assert_invariants(engine)
    finally:
        engine.dispose()
