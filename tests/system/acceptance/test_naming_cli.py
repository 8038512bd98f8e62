"""``nexuscrm`` names packs and identities as operators know them, and sends and shows payloads (decision 178).

Against the running services, on every backend: a pack named ``NAMESPACE/NAME[@VERSION]``
wherever a pack id is taken (an unknown or ambiguous name exits 2 saying why, naming the
incarnations), and by an Integration host's pool through the same rule; test deliveries
through ``send`` with their outcome each; a partial identity naming exactly one identity
(else the candidates); ``identities``; ``work members`` with each payload decoded; and a
usage error that prints the subcommand's usage.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import grpc
import pytest

from nexuscrm_integration.activation import RemotePackFinder
from nexuscrm_integration.config import PoolConfig
from nexuscrm_integration.packs import resolve_pools
from nexuscrm_runtime.database import create_engine
from nexuscrm_tools import cli
from nexuscrm_tools.launcher import CONTROLPLANE, ServiceProcess
from tests.support.checksums import database_digest
from tests.support.factories import route
from tests.support.invariants import assert_invariants
from tests.system.acceptance.test_cli_discovery_and_exit_codes import run, system
from tests.system.acceptance.test_operating_cli import refused

pytestmark = [pytest.mark.acceptance, pytest.mark.database]
__all__ = ["system"]  # the fixture, shared with the discovery test


def _identity(lane: str, work_type: str = "project") -> list[str]:
    r = route(lane, work_type=work_type)
    return [
        *("--event-kind", r.event_kind, "--route-version", r.route_version),
        *("--companion-version", r.companion_version, "--work-type", r.work_type, "--lane", lane),
    ]


def test_packs_by_name_partial_identities_sending_and_decoded_payloads(
    system: list[ServiceProcess],
    empty_dsn: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    engine = create_engine(empty_dsn)  # the database the services run on
    install = ("packs", "install", "--namespace", "acme", "--name", "crm", "--version", "1.0")
    pack = run(capsys, *install)["pack_install_id"]
    assert run(capsys, "packs", "activate", "acme/crm@1.0")["protocol"]["pack_install_id"] == pack
    capsys.readouterr()
    assert cli.main(["--json", "queue", "state", "acme/crm"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["pack_install_id"] == pack and f"nexuscrm: pack acme/crm is {pack}" in err
    assert "neither a pack id (pk-...) nor NAMESPACE/NAME[@VERSION]" in refused(
        capsys, "queue", "state", "demo-contacts", code=2
    )
    assert "pack acme/nosuch is not installed; `nexuscrm packs list --namespace acme` shows what is" in refused(
        capsys, "queue", "state", "acme/nosuch", code=2
    )
    again = run(capsys, *install)["pack_install_id"]  # a reinstall, not activated: the name still names one
    assert run(capsys, "retention", "show", "acme/crm@1.0")["pack_install_id"] == pack
    finder = RemotePackFinder(grpc.insecure_channel(next(s.address for s in system if s.spec is CONTROLPLANE)))
    pools = [PoolConfig.from_mapping({"pack": "acme/crm", "work_type": "project", "flow": "m:f"}, "test")]
    assert resolve_pools(pools, finder).pack_install_ids == (pack,)  # a host's pool, by the same rule
    run(capsys, "packs", "activate", again)
    ambiguous = refused(capsys, "queue", "state", "acme/crm", code=2)
    assert "pack acme/crm names 2 incarnations, 2 of them active: " in ambiguous
    assert again in ambiguous and pack in ambiguous and "or add @VERSION" in ambiguous
    (refusal,) = resolve_pools(pools, finder).missing
    assert refusal.startswith("pack acme/crm names 2 incarnations, 2 of them active: ") and again in refusal

    before = database_digest(engine)
    assert "has no identity with --lane lane-1" in refused(capsys, "send", pack, "--lane", "lane-1", "{}", code=2)
    assert database_digest(engine) == before  # refused before anything was sent
    sent = run(capsys, "send", pack, *_identity("lane-1"), "--key", "k-1", '{"name": "Ada"}')
    (admitted,) = sent["deliveries"]
    assert (admitted["receipt_key"], admitted["outcome"], admitted["enqueue_ordinal"]) == ("k-1", "admitted", 1)
    (duplicate,) = run(capsys, "send", pack, "--lane", "lane-1", "--key", "k-1", '{"name": "Ada"}')["deliveries"]
    assert (duplicate["outcome"], duplicate["work_id"]) == ("duplicate_covered", admitted["work_id"])
    binary = tmp_path / "payload.bin"
    binary.write_bytes(b"\xff\x00binary")
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"plain text")))
    two = run(capsys, "send", pack, "--lane", "lane-1", f"@{binary}", "-")["deliveries"]
    assert [(d["outcome"], d["enqueue_ordinal"]) for d in two] == [("admitted", 2), ("admitted", 3)]
    assert all(d["receipt_key"].startswith("send-") for d in two)
    before = database_digest(engine)
    conflict = run(capsys, "send", pack, "--lane", "lane-1", "--key", "k-1", "other", code=8)["deliveries"]
    assert conflict[0]["outcome"] == "rejected" and conflict[0]["message"]
    assert database_digest(engine) == before  # a rejected delivery writes nothing

    members = run(capsys, "work", "members", admitted["work_id"])["inputs"]
    assert [(m["payload_format"], m["payload_decoded"]) for m in members] == [
        ("json", {"name": "Ada"}),
        ("bytes", "\\xff\x00binary"),
        ("text", "plain text"),
    ]
    capsys.readouterr()
    assert cli.main(["work", "members", admitted["work_id"]]) == 0
    assert '{"name":"Ada"}' in capsys.readouterr().out

    run(capsys, "send", pack, *_identity("lane-1", "invoice"), "{}")  # a second identity of lane-1
    first = run(capsys, "identities", pack, "--limit", "1")
    rest = run(capsys, "identities", pack, "--page-token", first["next_page_token"])
    listed = first["identities"] + rest["identities"]
    assert sorted(i["route"]["work_type"] for i in listed) == ["invoice", "project"]
    project = next(i for i in listed if i["route"]["work_type"] == "project")
    assert project["depth"] == 1 and project["newest"]["work_id"] == admitted["work_id"]
    assert project["coverage"] == {"tiled": True, "high_water_ordinal": 3, "exception_count": 0, "inputs": 3}
    candidates = refused(capsys, "work", "list", pack, "--lane", "lane-1", code=2)
    assert "--lane lane-1 names 2 identities of pack" in candidates and "--work-type invoice" in candidates
    narrowed = run(capsys, "work", "list", pack, "--lane", "lane-1", "--work-type", "invoice")["generations"]
    assert [g["route"]["work_type"] for g in narrowed] == ["invoice"]

    capsys.readouterr()
    with pytest.raises(SystemExit) as usage:  # flags that parse but do not go together: this command's usage
        cli.main(["claims", "pause", pack, "--scope", "identity", "--by", "o", "--reason", "r"])
    err = capsys.readouterr().err
    assert usage.value.code == 2 and err.startswith("usage: nexuscrm claims pause") and "naming one identity" in err
    try:
        assert_invariants(engine)
    finally:
        engine.dispose()
