"""Partial identities: the one identity of a pack that some of the five identity flags name (decision 178).

An identity of a pack is its Event kind, route version, companion version, work type and
source lane (``--event-kind --route-version --companion-version --work-type --lane``). All
five are taken as they are, without a read. Fewer are looked up among the pack's identities
(Connectors' ListIdentities with those values, page after page) and must name exactly one;
otherwise ``IdentityUnresolved`` says that none has them or lists the first
``CANDIDATES_SHOWN`` candidates. So a new identity (a lane the pack never had, for
``nexuscrm send``) needs all five.
"""

from __future__ import annotations

import argparse

from nexuscrm.connectors.v1 import connectors_pb2 as cn_pb
from nexuscrm.connectors.v1 import connectors_pb2_grpc as cn_grpc
from nexuscrm_wire import convert
from workqueue.values import Route

# The flags and the Route fields they set, in the identity's order.
FLAG_FIELDS = {
    "--event-kind": "event_kind",
    "--route-version": "route_version",
    "--companion-version": "companion_version",
    "--work-type": "work_type",
    "--lane": "source_lane",
}
CANDIDATES_SHOWN = 10  # candidates an ambiguous partial identity lists


class IdentityUnresolved(Exception):
    """Identity flags that name no identity of the pack, or several; the message lists them."""


def given(args: argparse.Namespace) -> dict[str, str]:
    """The identity flags given: Route field -> value."""
    values = {field: getattr(args, flag.removeprefix("--").replace("-", "_")) for flag, field in FLAG_FIELDS.items()}
    return {field: value for field, value in values.items() if value is not None}


def matching(
    connectors: cn_grpc.ConnectorsServiceStub, pack: str, wanted: dict[str, str], *, limit: int, timeout: float
) -> list[Route]:
    """The first ``limit`` identities of ``pack`` with every value of ``wanted``, by projection key."""
    request = cn_pb.ListIdentitiesRequest(pack_install_id=pack, route=cn_pb.ProjectionRoute(**wanted), page_size=limit)
    found: list[Route] = []
    while len(found) < limit:
        response = connectors.ListIdentities(request, timeout=timeout)
        found += [convert.route_from_proto(identity.route) for identity in response.identities]
        if not response.next_page_token:
            break
        request.page_token = response.next_page_token
    return found[:limit]


def resolve(connectors: cn_grpc.ConnectorsServiceStub, pack: str, wanted: dict[str, str], *, timeout: float) -> Route:
    """The identity the flags ``wanted`` name (``given``); raises ``IdentityUnresolved``."""
    if len(wanted) == len(FLAG_FIELDS):
        return Route(**wanted)
    found = matching(connectors, pack, wanted, limit=CANDIDATES_SHOWN + 1, timeout=timeout)
    if len(found) == 1:
        return found[0]
    named = " ".join(f"{flag} {wanted[field]}" for flag, field in FLAG_FIELDS.items() if field in wanted)
    if not found:
        raise IdentityUnresolved(
            f"pack {pack} has no identity with {named}; `nexuscrm identities {pack}` lists them "
            "(a new identity takes all five identity flags)"
        )
    shown = "; ".join(describe(route) for route in found[:CANDIDATES_SHOWN])
    count = f"more than {CANDIDATES_SHOWN}" if len(found) > CANDIDATES_SHOWN else str(len(found))
    raise IdentityUnresolved(
        f"{named} names {count} identities of pack {pack}: {shown}; add identity flags until one is left"
    )


def describe(route: Route) -> str:
    """A route as the identity flags that name it."""
    return " ".join(f"{flag} {getattr(route, field)}" for flag, field in FLAG_FIELDS.items())
