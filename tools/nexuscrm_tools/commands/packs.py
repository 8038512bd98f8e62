"""``nexuscrm packs``: a pack's incarnations, as Controlplane installs, activates, finds and lists them."""

from __future__ import annotations

import argparse
from typing import Any

from nexuscrm.controlplane.v1 import controlplane_pb2 as cp_pb
from nexuscrm_tools.clients import Clients
from nexuscrm_tools.commands.shared import RPC_TIMEOUT, Outcome, fields, leaf, paged, title_count
from nexuscrm_tools.exits import ExitCode
from nexuscrm_tools.json_view import message_data, timestamp_text
from nexuscrm_tools.tables import listing, plural


def packs_install(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Install a new pack incarnation."""
    response = clients.controlplane.InstallPack(
        cp_pb.InstallPackRequest(namespace=args.namespace, pack_name=args.name, pack_version=args.version),
        timeout=RPC_TIMEOUT,
    )
    data = message_data(response.pack)
    return Outcome(data=data, view=fields("pack installed", data))


def packs_activate(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Greenfield activation: protocol 1 with LegacyMaxOrdinal 0."""
    response = clients.controlplane.ActivatePack(
        cp_pb.ActivatePackRequest(pack_install_id=args.pack), timeout=RPC_TIMEOUT
    )
    data = message_data(response)
    return Outcome(
        data=data,
        view=fields("already active" if response.already_active else "activated", message_data(response.protocol)),
    )


def packs_protocol(clients: Clients, args: argparse.Namespace) -> Outcome:
    """The pack's protocol row; exit 4 when it has none."""
    response = clients.controlplane.GetProtocol(
        cp_pb.GetProtocolRequest(pack_install_id=args.pack), timeout=RPC_TIMEOUT
    )
    data = message_data(response)
    if not response.exists:
        return Outcome(data=data, view=f"pack {args.pack} has no protocol row", code=ExitCode.CHECK_FAILED)
    return Outcome(data=data, view=fields(f"protocol of {args.pack}", message_data(response.protocol)))


def _pack_view(response: cp_pb.GetPackResponse) -> dict[str, object]:
    pack = response.pack
    protocol = response.protocol_state
    if response.HasField("protocol"):
        protocol += f" (LegacyMaxOrdinal {response.protocol.legacy_max_ordinal})"
    return {
        "pack": pack.pack_install_id,
        "namespace": pack.namespace,
        "name": pack.pack_name,
        "version": pack.pack_version,
        "ordinal counter": pack.last_ordinal,
        "protocol": protocol,
        "installed at": timestamp_text(pack.created_at),
    }


def packs_show(clients: Clients, args: argparse.Namespace) -> Outcome:
    """One pack incarnation: namespace, name, version, ordinal counter and protocol state."""
    response = clients.controlplane.GetPack(cp_pb.GetPackRequest(pack_install_id=args.pack), timeout=RPC_TIMEOUT)
    return Outcome(data=message_data(response), view=fields(f"pack {args.pack}", _pack_view(response)))


def packs_find(clients: Clients, args: argparse.Namespace) -> Outcome:
    """The incarnations of a pack by namespace, name and version, newest first; exit 9 when none."""
    response = clients.controlplane.FindPacks(
        cp_pb.FindPacksRequest(namespace=args.namespace, pack_name=args.name, pack_version=args.version),
        timeout=RPC_TIMEOUT,
    )
    rows = [(p.pack_install_id, p.last_ordinal, timestamp_text(p.created_at)) for p in response.packs]
    view = listing(
        f"{args.namespace}/{args.name} {args.version}: {plural(len(rows), 'incarnation')}",
        ("pack", "ordinal counter", "installed at"),
        rows,
    )
    return Outcome(
        data=[message_data(p) for p in response.packs], view=view, code=ExitCode.OK if rows else ExitCode.CHECK_FAILED
    )


def packs_list(clients: Clients, args: argparse.Namespace) -> Outcome:
    """Every pack incarnation (of ``--namespace``, or of all) with its protocol state, by pack id; paged."""
    response = clients.controlplane.ListPacks(
        cp_pb.ListPacksRequest(namespace=args.namespace, page_size=args.page_size, page_token=args.page_token),
        timeout=RPC_TIMEOUT,
    )
    rows = [
        (
            p.pack.pack_install_id,
            p.pack.namespace,
            p.pack.pack_name,
            p.pack.pack_version,
            p.protocol_state,
            p.pack.last_ordinal,
            timestamp_text(p.pack.created_at),
        )
        for p in response.packs
    ]
    title = f"packs{title_count(rows, response.next_page_token, 'incarnation')}"
    columns = ("pack", "namespace", "name", "version", "protocol", "ordinal counter", "installed at")
    return Outcome(data=message_data(response), view=listing(title, columns, rows))


def add_commands(commands: Any) -> None:
    """``packs list|install|activate|protocol|show|find``."""
    packs = commands.add_parser("packs", help="pack incarnations").add_subparsers(dest="action", required=True)
    sub = leaf(packs, "list", packs_list, "every incarnation with its protocol state")
    sub.add_argument("--namespace", default="", help="only this namespace (default: every namespace)")
    paged(sub)
    sub = leaf(packs, "install", packs_install, "install a new pack incarnation")
    sub.add_argument("--namespace", required=True)
    sub.add_argument("--name", required=True)
    sub.add_argument("--version", required=True)
    leaf(packs, "activate", packs_activate, "greenfield activation (cutoff 0)").add_argument("pack")
    leaf(packs, "protocol", packs_protocol, "show the protocol row").add_argument("pack")
    leaf(packs, "show", packs_show, "incarnation, ordinal counter, protocol state").add_argument("pack")
    sub = leaf(packs, "find", packs_find, "incarnations by namespace, name and version")
    sub.add_argument("--namespace", required=True)
    sub.add_argument("--name", required=True)
    sub.add_argument("--version", required=True)
