"""The activation gate without processes: what it refuses, what it grants, how it waits and resolves packs."""

from __future__ import annotations

import math
import threading

import pytest

from nexuscrm_integration.activation import ActivationGrant, check_activation, wait_for_activation
from nexuscrm_integration.config import PackName, PoolConfig
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
    """Incarnations by pack name; a name in ``failing`` cannot be looked up."""

    def __init__(self, packs: dict[str, list[str]], failing: frozenset[str] = frozenset()) -> None:
        self.packs = packs
        self.failing = failing
        self.asked: list[str] = []

    def find_packs(self, pack: PackName) -> list[str]:
        self.asked.append(str(pack))
        if str(pack) in self.failing:
            raise PackLookupFailed("FindPacks failed (UNAVAILABLE: connection refused)")
        return self.packs.get(str(pack), [])


def named_pool(name: str, work_type: str = "t") -> PoolConfig:
    return PoolConfig.from_mapping(
        {"pack": {"namespace": "acme", "name": name, "version": "1.0"}, "work_type": work_type, "flow": "m:f"}, "test"
    )


def test_pack_names_resolve_to_exactly_one_incarnation_or_name_the_pack_that_did_not() -> None:
    finder = FakeFinder(
        {"acme/contacts 1.0": ["pk-c"], "acme/deals 1.0": ["pk-new", "pk-old"]}, failing=frozenset({"acme/down 1.0"})
    )
    by_id = PoolConfig(pack_install_id="pk-a", work_type="t", flow="m:f")
    pools = [by_id, named_pool("contacts"), named_pool("contacts", "u"), named_pool("deals"), named_pool("gone")]
    resolution = resolve_pools([*pools, named_pool("down")], finder)
    assert [p.name for p in resolution.pools] == ["pk-a/t", "pk-c/t", "pk-c/u"]
    assert resolution.pack_install_ids == ("pk-a", "pk-c")
    assert resolution.missing == (
        "pack: acme/deals 1.0 has 2 incarnations (pk-new, pk-old); "
        "name one by pack_install_id in pool acme/deals 1.0/t",
        "pack: acme/gone 1.0 is not installed (pool acme/gone 1.0/t)",
        "pack: acme/down 1.0 could not be resolved: FindPacks failed (UNAVAILABLE: connection refused)",
    )
    assert finder.asked.count("acme/contacts 1.0") == 1  # asked once per name

    with pytest.raises(ActivationRefused) as refused:  # the gate lists them with everything else missing
        check_activation(
            FakeSchema(["X"]),
            FakeProtocols({"pk-a", "pk-c"}),
            resolution.pack_install_ids,
            unresolved=resolution.missing,
        )
    assert refused.value.missing == (*resolution.missing, "schema: X")
    grant = check_activation(
        FakeSchema([]), FakeProtocols({"pk-c"}), resolve_pools([named_pool("contacts")], finder).pack_install_ids
    )
    assert grant.covers("pk-c")
