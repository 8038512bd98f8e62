"""Packs named as ``NAMESPACE/NAME[@VERSION]``: the one rule that turns a name into a PackInstallId.

A PackInstallId (``pk-`` and 32 hex digits) is known only once a pack is installed; operators
and host configurations name the pack instead. The ``nexuscrm`` command line (every pack
argument) and the Integration host (a pool's ``pack``) resolve a name through this module, so
both answer the same incarnation or the same refusal (decision 178):

- the candidates are the incarnations of the namespace with that name and, when ``@VERSION``
  is given, that version (Controlplane's ListPacks, every page of the namespace);
- one candidate: that one, whatever its protocol state;
- several: the one *active* candidate (with a protocol row: greenfield or cutover), when
  exactly one is; a reinstall not activated yet, or the incarnation it replaced and no longer
  serves, never makes a name ambiguous;
- otherwise ``PackNameAmbiguous`` lists the candidates (id, version, protocol state, install
  time, newest first) and ``PackNotInstalled`` says none is installed, with where to look.

A text without ``/`` is a pack id and is passed on unchanged (the service answers for it),
unless it is not one (``pk-...``) either: ``PackNameInvalid`` then shows both forms. The
namespace ends at the first ``/`` and the version starts at the last ``@``, so a namespace
with a ``/`` or a versionless name with an ``@`` is named by its id.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from nexuscrm.controlplane.v1 import controlplane_pb2 as cp_pb
from nexuscrm.controlplane.v1 import controlplane_pb2_grpc as cp_grpc
from nexuscrm_runtime.clock import iso_utc

PACK_ID_PREFIX = "pk-"  # every PackInstallId Controlplane gives starts so
PROTOCOL_STATE_NONE = "none"  # ListPacks' protocol state of an incarnation without a protocol row
LIST_PAGE_SIZE = 1000  # ListPacks' largest page: a namespace holds few incarnations


class PackNameError(Exception):
    """A pack name that does not resolve to exactly one incarnation; the message says why and what to do."""


class PackNameInvalid(PackNameError):
    """A text that is neither a pack id nor ``NAMESPACE/NAME[@VERSION]``."""


class PackNotInstalled(PackNameError):
    """No incarnation has the name."""


class PackNameAmbiguous(PackNameError):
    """Several incarnations have the name and not exactly one of them is active."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class PackName:
    """A pack by namespace, name and, optionally, version (None: any version)."""

    namespace: str
    name: str
    version: str | None = None

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}" + (f"@{self.version}" if self.version is not None else "")

    @classmethod
    def parse(cls, text: str) -> PackName:
        """``NAMESPACE/NAME[@VERSION]``; raises ``PackNameInvalid`` when a part is empty."""
        namespace, slash, rest = text.partition("/")
        name, at, version = rest.rpartition("@") if "@" in rest else (rest, "", "")
        if not slash or not namespace or not name or (at and not version):
            raise PackNameInvalid(f"pack {text!r} is not NAMESPACE/NAME[@VERSION] ({_HINT})")
        return cls(namespace=namespace, name=name, version=version if at else None)


_HINT = "`nexuscrm packs list` shows every pack's id, namespace, name and version"


def is_pack_id(text: str) -> bool:
    """True for a text named as a pack id (no ``/``), which is used as it is."""
    return "/" not in text


def choose(name: PackName, incarnations: Sequence[cp_pb.PackSummary]) -> cp_pb.PackSummary:
    """The incarnation ``name`` names among ``incarnations`` (those of its namespace), by the rule above."""
    candidates = sorted(
        (
            summary
            for summary in incarnations
            if summary.pack.namespace == name.namespace
            and summary.pack.pack_name == name.name
            and (name.version is None or summary.pack.pack_version == name.version)
        ),
        key=lambda summary: (summary.pack.created_at.ToDatetime(), summary.pack.pack_install_id),
        reverse=True,
    )
    if not candidates:
        raise PackNotInstalled(
            f"pack {name} is not installed; `nexuscrm packs list --namespace {name.namespace}` shows what is"
        )
    if len(candidates) == 1:
        return candidates[0]
    active = [summary for summary in candidates if summary.protocol_state != PROTOCOL_STATE_NONE]
    if len(active) == 1:
        return active[0]
    listed = "; ".join(
        f"{s.pack.pack_install_id} (version {s.pack.pack_version}, protocol {s.protocol_state}, "
        f"installed {iso_utc(s.pack.created_at.ToDatetime())})"
        for s in candidates
    )
    raise PackNameAmbiguous(
        f"pack {name} names {len(candidates)} incarnations, {len(active) or 'none'} of them active: {listed}; "
        "name one by its id" + ("" if name.version is not None else " or add @VERSION")
    )


def incarnations(
    controlplane: cp_grpc.ControlplaneServiceStub, namespace: str, *, timeout: float
) -> list[cp_pb.PackSummary]:
    """Every incarnation of ``namespace`` (ListPacks, page after page), for ``choose``; RPC errors propagate."""
    found: list[cp_pb.PackSummary] = []
    token = ""
    while True:
        response = controlplane.ListPacks(
            cp_pb.ListPacksRequest(namespace=namespace, page_size=LIST_PAGE_SIZE, page_token=token),
            timeout=timeout,
        )
        found += response.packs
        token = response.next_page_token
        if not token:
            return found


def resolve(controlplane: cp_grpc.ControlplaneServiceStub, text: str, *, timeout: float) -> str:
    """The PackInstallId ``text`` names: a pack id as it is, a name through ``choose``.

    Raises ``PackNameError`` (invalid, not installed, ambiguous); RPC errors propagate.
    """
    if is_pack_id(text):
        if not text.startswith(PACK_ID_PREFIX):
            raise PackNameInvalid(
                f"pack {text!r} is neither a pack id ({PACK_ID_PREFIX}...) nor NAMESPACE/NAME[@VERSION] ({_HINT})"
            )
        return text
    name = PackName.parse(text)
    return choose(name, incarnations(controlplane, name.namespace, timeout=timeout)).pack.pack_install_id
