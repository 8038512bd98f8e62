"""``NAMESPACE/NAME[@VERSION]`` resolved by the one rule of the command line and the Integration host.

Without a server: incarnations are ListPacks rows built here, and a stub answers ListPacks page
by page. An exact name, a name without version, several incarnations with one active, an
ambiguous name and an unknown one; a pack id passes unchanged, without a call.
"""

from __future__ import annotations

from typing import Any

import pytest

from nexuscrm.controlplane.v1 import controlplane_pb2 as cp_pb
from nexuscrm_runtime import pack_names
from nexuscrm_runtime.pack_names import PackName, PackNameAmbiguous, PackNameInvalid, PackNotInstalled


def incarnation(
    pack_id: str, *, name: str = "crm", version: str = "1.0", state: str = "greenfield", installed: int = 1
) -> cp_pb.PackSummary:
    """A ListPacks row of namespace acme, installed ``installed`` seconds after the epoch."""
    summary = cp_pb.PackSummary(
        pack=cp_pb.PackInstall(pack_install_id=pack_id, namespace="acme", pack_name=name, pack_version=version),
        protocol_state=state,
    )
    summary.pack.created_at.FromSeconds(installed)
    return summary


class PagedControlplane:
    """ListPacks over ``packs``, ``page`` rows a page; records every request."""

    def __init__(self, packs: list[cp_pb.PackSummary], page: int) -> None:
        self.packs = packs
        self.page = page
        self.requests: list[cp_pb.ListPacksRequest] = []

    def ListPacks(self, request: cp_pb.ListPacksRequest, timeout: float) -> cp_pb.ListPacksResponse:
        self.requests.append(request)
        start = int(request.page_token or 0)
        rows = [p for p in self.packs if p.pack.namespace == request.namespace][start : start + self.page]
        more = start + self.page < len(self.packs)
        return cp_pb.ListPacksResponse(packs=rows, next_page_token=str(start + self.page) if more else "")


def chosen(text: str, packs: list[cp_pb.PackSummary]) -> str:
    return pack_names.choose(PackName.parse(text), packs).pack.pack_install_id


def test_names_parse_into_namespace_name_and_optional_version() -> None:
    assert PackName.parse("acme/crm@1.0") == PackName(namespace="acme", name="crm", version="1.0")
    assert PackName.parse("acme/crm") == PackName(namespace="acme", name="crm", version=None)
    assert PackName.parse("acme/mail@home@2") == PackName(namespace="acme", name="mail@home", version="2")
    assert str(PackName.parse("acme/crm@1.0")) == "acme/crm@1.0"
    for text in ("acme", "/crm", "acme/", "acme/crm@", "acme/@1.0"):
        with pytest.raises(PackNameInvalid, match="is not NAMESPACE/NAME"):
            PackName.parse(text)


def test_exact_names_and_names_without_version_resolve_to_their_one_incarnation() -> None:
    packs = [
        incarnation("pk-1", version="1.0", state="none"),
        incarnation("pk-2", version="2.0", installed=2),
        incarnation("pk-x", name="ledger"),
    ]
    assert chosen("acme/crm@1.0", packs) == "pk-1"  # the one of that version, active or not
    assert chosen("acme/crm@2.0", packs) == "pk-2"
    assert chosen("acme/ledger", packs) == "pk-x"
    assert chosen("acme/crm", packs) == "pk-2"  # two versions, one active: the active one
    assert chosen("acme/crm", [packs[0]]) == "pk-1"  # installed, not activated yet: still the one


def test_ambiguous_and_unknown_names_say_which_incarnations_or_where_to_look() -> None:
    packs = [incarnation("pk-old", installed=1), incarnation("pk-new", installed=2)]
    with pytest.raises(PackNameAmbiguous) as ambiguous:
        chosen("acme/crm", packs)
    assert str(ambiguous.value) == (
        "pack acme/crm names 2 incarnations, 2 of them active: "
        "pk-new (version 1.0, protocol greenfield, installed 1970-01-01T00:00:02.000Z); "
        "pk-old (version 1.0, protocol greenfield, installed 1970-01-01T00:00:01.000Z); "
        "name one by its id or add @VERSION"
    )
    neither = [incarnation("pk-a", state="none"), incarnation("pk-b", state="none", installed=2)]
    with pytest.raises(
        PackNameAmbiguous, match=r"names 2 incarnations, none of them active: pk-b .*; name one by its id$"
    ):
        chosen("acme/crm@1.0", neither)
    with pytest.raises(PackNotInstalled) as unknown:
        chosen("acme/contacts", packs)
    assert str(unknown.value) == (
        "pack acme/contacts is not installed; `nexuscrm packs list --namespace acme` shows what is"
    )
    with pytest.raises(PackNotInstalled):
        chosen("acme/crm@3.0", packs)
    with pytest.raises(PackNotInstalled):  # another namespace's incarnation never answers
        chosen("other/crm", packs)


def test_resolve_passes_pack_ids_and_lists_every_page_of_the_namespace_for_names() -> None:
    many = [incarnation(f"pk-{n}", name=f"p{n}", state="none") for n in range(5)]
    controlplane = PagedControlplane([*many, incarnation("pk-crm", installed=9)], page=2)
    stub: Any = controlplane
    assert pack_names.resolve(stub, "pk-anything", timeout=1) == "pk-anything"
    assert controlplane.requests == []  # an id is the service's to judge
    assert pack_names.resolve(stub, "acme/crm", timeout=1) == "pk-crm"  # on the third page
    assert [r.page_token for r in controlplane.requests] == ["", "2", "4"]
    assert {r.namespace for r in controlplane.requests} == {"acme"}
    with pytest.raises(PackNameInvalid, match=r"pack 'demo-contacts' is neither a pack id \(pk-\.\.\.\) nor"):
        pack_names.resolve(stub, "demo-contacts", timeout=1)
