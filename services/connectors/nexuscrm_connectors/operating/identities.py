"""A pack's projection identities for operators: each one's depth, newest generation and coverage state.

Where an operator learns the identities of a pack (``nexuscrm identities PACK``) and where the
command line finds the one identity some identity flags name (a partial identity, decision
178). The identities are those the coverage proof walks (a generation, an input or a pruned
record with the key: ``queries.coverage.identity_next``), in projection-key order; a partial
identity keeps those whose decoded route has its values. Per identity kept: its coverage
(``coverage.identity_coverage``, the proof GetCoverage gives), its depth (its queued and
in-flight ranges: only native generations, which all have a range, as GetQueueState counts a
pack's) and its newest generation (ListGenerations' first row). A pack without a protocol row
has neither native work nor a proof: depth 0, no coverage.

Reads never change a row. A page examines ``page_size`` identities, or ten times as many with
a partial identity (it keeps at most ``page_size``); each examined costs the seeks of
``identity_next``, each kept one its coverage reads and one seek of its newest generation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from nexuscrm_connectors import page_tokens
from nexuscrm_connectors.context import Context
from nexuscrm_connectors.errors import UnknownPack
from nexuscrm_connectors.operating import coverage
from nexuscrm_connectors.queries import coverage as coverage_sql
from nexuscrm_connectors.queries import flow_versions as flow_versions_sql
from nexuscrm_connectors.queries import operator_reads as operator_reads_sql
from nexuscrm_connectors.queries import packs as packs_sql
from nexuscrm_connectors.queries import work_items as work_items_sql
from workqueue.errors import InvalidArgument
from workqueue.identity import decode_projection_key
from workqueue.values import Route, WorkItemRow

SCAN_FACTOR = 10  # identities a page with a partial identity examines per one asked for
_ROUTE_FIELDS = frozenset(field.name for field in dataclasses.fields(Route))
_WAITING = frozenset({coverage.RangeState.QUEUED, coverage.RangeState.IN_FLIGHT})


@dataclasses.dataclass(frozen=True, kw_only=True)
class IdentityOverview:
    """One identity: ``depth`` nonterminal generations, its ``newest`` (None: all pruned), its ``coverage``."""

    route: Route
    depth: int
    newest: WorkItemRow | None
    coverage: coverage.IdentityCoverage | None  # None for a pack without a protocol row


@dataclasses.dataclass(frozen=True, kw_only=True)
class IdentityPage:
    """One page of identities by projection key; ``next_page_token`` is "" after the last."""

    identities: tuple[IdentityOverview, ...]
    next_page_token: str
    examined: int  # identities this page examined (a partial identity keeps fewer)


def list_identities(
    context: Context,
    pack_install_id: str,
    wanted: Mapping[str, str],
    page_size: int = 0,
    page_token: str = "",
) -> IdentityPage:
    """One page of the pack's identities whose route has every value of ``wanted`` (Route field -> value).

    An empty ``wanted`` keeps every identity. Raises ``UnknownPack``, and ``InvalidArgument``
    for a page size out of range, a token that is not one of this read's or a field that is
    not a route's.
    """
    engine, settings = context.engine, context.settings
    unknown = sorted(set(wanted) - _ROUTE_FIELDS)
    if unknown:
        raise InvalidArgument(f"route has no field {unknown[0]!r}", field="route")
    size = settings.page_size(page_size)
    scan = size * SCAN_FACTOR if wanted else size
    key = page_tokens.decode_token(page_token, "ListIdentities", _position)
    kept: list[IdentityOverview] = []
    examined = 0
    with engine.connect() as connection:
        if operator_reads_sql.pack_namespace(connection, pack_install_id) is None:
            raise UnknownPack(f"pack_install_id {pack_install_id!r} is not installed", field="pack_install_id")
        protocol = packs_sql.protocol_get(connection, pack_install_id)
        tracks = flow_versions_sql.tracks_of(connection, pack_install_id)
        while examined < scan and len(kept) < size:
            key = coverage_sql.identity_next(connection, pack_install_id, key)
            if key is None:
                break
            examined += 1
            route = Route.of(decode_projection_key(key))
            if any(getattr(route, field) != value for field, value in wanted.items()):
                continue
            proof = (
                coverage.identity_coverage(connection, pack_install_id, key, protocol.legacy_max_ordinal, tracks)
                if protocol is not None
                else None
            )
            newest = operator_reads_sql.work_items_of_identity(connection, pack_install_id, key, None, 1)
            kept.append(
                IdentityOverview(
                    route=route,
                    depth=sum(r.state in _WAITING for r in proof.ranges) if proof is not None else 0,
                    newest=work_items_sql.work_item_value(newest[0]) if newest else None,
                    coverage=proof,
                )
            )
    token = page_tokens.encode_token((key,)) if key is not None and (examined == scan or len(kept) == size) else ""
    return IdentityPage(identities=tuple(kept), next_page_token=token, examined=examined)


def _position(values: list[object]) -> str:
    """The position a page token carries: the last projection key examined."""
    (key,) = values
    return page_tokens.string(key)
