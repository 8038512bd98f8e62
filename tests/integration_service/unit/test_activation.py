"""The activation gate without processes: what it refuses, what it grants, how it waits and resolves packs."""

from __future__ import annotations

import math
import threading

import pytest

from nexuscrm.controlplane.v1 import controlplane_pb2 as cp_pb
from nexuscrm_integration.activation import ActivationGrant, check_activation, wait_for_activation
from nexuscrm_integration.config import PoolConfig
from nexuscrm_integration.errors import ActivationRefused
from nexuscrm_integration.packs import PackLookupFailed, resolve_pools
from tests.integration_service.fakes import FakeProtocols, FakeSchema


def test_gate_refusal_names_every_missing_piece_and_grants_only_what_it_checked() -> None:
    with pytest.raises(ActivationRefused) as refused:
        check_activation(FakeSchema(["WorkItem.ReplayOfWorkId"]), FakeProtocols({"pk-a"}), ["pk-a", "pk-b"])
    assert refused.value.missing == ("schema: WorkItem.ReplayOfWorkId", "protocol: pack pk-b has no protocol receipt")

    grant = check_activation(FakeSchema([]), FakeProtocols({"pk-a"}), ["pk-a"])
    assert grant.covers("pk-a") and not grant.covers("pk-b")
    with pytest.raises(TypeError, match="issued only by"):
        ActivationGrant(frozenset({"pk-b"}), grant.checked_at, object())


def test_waiting_gate_rechecks_until_it_passes_and_stops_when_asked() -> None:
    protocols = FakeProtocols(set())
    refusals: list[ActivationRefused] = []

    def gate() -> ActivationGrant:
        if refusals:
            protocols.active.add("pk-a")  # activated while the host waits
        return check_activation(FakeSchema([]), protocols, ["pk-a"])

    grant = wait_for_activation(gate, wait_seconds=math.inf, stop=threading.Event(), on_refused=refusals.append)
    assert grant.covers("pk-a") and len(refusals) == 1
    stopped = threading.Event()
    stopped.set()
    with pytest.raises(ActivationRefused):
        wait_for_activation(
            lambda: check_activation(FakeSchema(["X"]), protocols, []), wait_seconds=math.inf, stop=stopped
        )


class FakeFinder:
    """Incarnations by namespace; a namespace in ``failing`` cannot be looked up."""

    def __init__(self, packs: list[cp_pb.PackSummary], failing: frozenset[str] = frozenset()) -> None:
        self.packs = packs
        self.failing = failing
        self.asked: list[str] = []

    def find_packs(self, namespace: str) -> list[cp_pb.PackSummary]:
        self.asked.append(namespace)
        if namespace in self.failing:
            raise PackLookupFailed("ListPacks failed (UNAVAILABLE: connection refused)")
        return [summary for summary in self.packs if summary.pack.namespace == namespace]


def incarnation(pack_id: str, name: str, *, state: str = "greenfield", installed: int = 1) -> cp_pb.PackSummary:
    """A ListPacks row of namespace acme, version 1.0, installed ``installed`` seconds after the epoch."""
    summary = cp_pb.PackSummary(
        pack=cp_pb.PackInstall(pack_install_id=pack_id, namespace="acme", pack_name=name, pack_version="1.0"),
        protocol_state=state,
    )
    summary.pack.created_at.FromSeconds(installed)
    return summary


def named_pool(name: str, work_type: str = "t", namespace: str = "acme") -> PoolConfig:
    return PoolConfig.from_mapping({"pack": f"{namespace}/{name}@1.0", "work_type": work_type, "flow": "m:f"}, "test")


def test_pack_names_resolve_by_the_command_lines_rule_or_name_the_pack_that_did_not() -> None:
    finder = FakeFinder(
        [
            incarnation("pk-c", "contacts"),
            incarnation("pk-old", "deals"),
            incarnation("pk-new", "deals", installed=2),
            incarnation("pk-l1", "ledger", state="none"),  # reinstalled, not activated yet: not ambiguous
            incarnation("pk-l2", "ledger", installed=2),
        ],
        failing=frozenset({"ops"}),
    )
    by_id = PoolConfig(pack_install_id="pk-a", work_type="t", flow="m:f")
    pools = [by_id, named_pool("contacts"), named_pool("contacts", "u"), named_pool("deals"), named_pool("gone")]
    resolution = resolve_pools([*pools, named_pool("ledger"), named_pool("down", namespace="ops")], finder)
    assert [p.name for p in resolution.pools] == ["pk-a/t", "pk-c/t", "pk-c/u", "pk-l2/t"]
    assert resolution.pack_install_ids == ("pk-a", "pk-c", "pk-l2")
    assert resolution.missing == (
        "pack acme/deals@1.0 names 2 incarnations, 2 of them active: "
        "pk-new (version 1.0, protocol greenfield, installed 1970-01-01T00:00:02.000Z); "
        "pk-old (version 1.0, protocol greenfield, installed 1970-01-01T00:00:01.000Z); "
        "name one by its id (pool acme/deals@1.0/t)",
        "pack acme/gone@1.0 is not installed; `nexuscrm packs list --namespace acme` shows what is "
        "(pool acme/gone@1.0/t)",
        "pack ops/down@1.0 could not be resolved: ListPacks failed (UNAVAILABLE: connection refused)",
    )
    assert finder.asked == ["acme", "ops"]  # asked once per namespace

    with pytest.raises(ActivationRefused) as refused:  # the gate lists them with everything else missing
        check_activation(
            FakeSchema(["X"]),
            FakeProtocols({"pk-a", "pk-c", "pk-l2"}),
            resolution.pack_install_ids,
            unresolved=resolution.missing,
        )
    assert refused.value.missing == (*resolution.missing, "schema: X")
    grant = check_activation(
        FakeSchema([]), FakeProtocols({"pk-c"}), resolve_pools([named_pool("contacts")], finder).pack_install_ids
    )
    assert grant.covers("pk-c")
