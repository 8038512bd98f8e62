"""The activation gate: the ONE check every worker passes before it may claim anything.

Native projection needs a database at a schema version this release serves (asked of the
Schema Catalog, checked against ``release.RELEASE``: decision 144), the complete canonical
schema (asked of the Schema Catalog for the feature ``native_projection``, which includes
WorkItem.InputStartOrdinal, WorkItem.ReplayOfWorkId and the protocol table; there is no
optional-column rolling compatibility) and a protocol receipt (asked of Controlplane) for
every pack served.
``check_activation`` returns an ``ActivationGrant`` or raises ``ActivationRefused`` naming
every missing piece. The process-wide host (``host.WorkerHost``) and standalone workers
(``host.standalone_worker``) both require a grant, and only ``check_activation`` can make one,
so a worker that skipped the gate cannot be built through this package's API.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol

import grpc

from nexuscrm.controlplane.v1 import controlplane_pb2 as cp_pb
from nexuscrm.controlplane.v1 import controlplane_pb2_grpc as cp_grpc
from nexuscrm.schemacatalog.v1 import schema_catalog_pb2 as sc_pb
from nexuscrm.schemacatalog.v1 import schema_catalog_pb2_grpc as sc_grpc
from nexuscrm_integration.config import PoolConfig
from nexuscrm_integration.errors import ActivationRefused
from nexuscrm_integration.packs import PackLookupFailed, Resolution, resolve_pools
from nexuscrm_integration.release import RELEASE
from nexuscrm_runtime import pack_names
from nexuscrm_runtime.clock import utcnow
from nexuscrm_runtime.release import SchemaRefused, check_schema

log = logging.getLogger(__name__)

NATIVE_PROJECTION = "native_projection"
GATE_TIMEOUT = 10.0  # seconds per gate RPC
RECHECK_INTERVAL = 1.0  # seconds between checks while waiting for activation

# Only this module holds the seal, so only ``check_activation`` can construct a grant.
_SEAL = object()


@dataclasses.dataclass(frozen=True)
class ActivationGrant:
    """Proof that the gate passed for ``pack_install_ids`` at ``checked_at`` (UTC).

    Issued only by ``check_activation``; constructing one elsewhere raises ``TypeError``.
    """

    pack_install_ids: frozenset[str]
    checked_at: dt.datetime
    _seal: object = dataclasses.field(repr=False, compare=False)

    def __post_init__(self) -> None:
        if self._seal is not _SEAL:
            raise TypeError("an ActivationGrant is issued only by nexuscrm_integration.activation.check_activation")

    def covers(self, pack_install_id: str) -> bool:
        """True when the gate checked ``pack_install_id``'s protocol receipt."""
        return pack_install_id in self.pack_install_ids


class SchemaVerifier(Protocol):
    """Asks the schema owner what a feature lacks."""

    def schema_missing(self, feature: str) -> list[str]:
        """Each missing schema piece (``Table``, ``Table.Column``, ``Table(index)``); empty when complete."""
        ...


class ProtocolReader(Protocol):
    """Asks the protocol owner whether a pack has its protocol receipt."""

    def protocol_missing(self, pack_install_id: str) -> str | None:
        """Why ``pack_install_id`` cannot be served natively, or None when its protocol row exists."""
        ...


def check_activation(
    schema: SchemaVerifier,
    protocols: ProtocolReader,
    pack_install_ids: Iterable[str],
    *,
    unresolved: Sequence[str] = (),
) -> ActivationGrant:
    """The activation gate: a grant for ``pack_install_ids``, or ``ActivationRefused``.

    Every piece is asked for, so a refusal lists everything missing at once: pack names that
    did not resolve (``unresolved``, from ``packs.resolve_pools``), schema pieces as
    ``schema: WorkItem.ReplayOfWorkId`` and packs as ``protocol: pack <id> ...``. Writes nothing.
    """
    packs = sorted(set(pack_install_ids))
    missing = [*unresolved, *(f"schema: {piece}" for piece in schema.schema_missing(NATIVE_PROJECTION))]
    for pack_install_id in packs:
        reason = protocols.protocol_missing(pack_install_id)
        if reason is not None:
            missing.append(f"protocol: {reason}")
    if missing:
        raise ActivationRefused(missing)
    return ActivationGrant(frozenset(packs), utcnow(), _SEAL)


def wait_for_activation(
    gate: Callable[[], ActivationGrant],
    *,
    wait_seconds: float,
    stop: threading.Event,
    on_refused: Callable[[ActivationRefused], None] = lambda _error: None,
) -> ActivationGrant:
    """Run ``gate`` until it grants, ``wait_seconds`` pass, or ``stop`` is set.

    ``wait_seconds`` 0 checks once; ``math.inf`` waits until stopped. ``on_refused`` sees
    every refusal (to publish what is missing). Raises the last ``ActivationRefused``.
    """
    deadline = time.monotonic() + wait_seconds
    while True:
        try:
            return gate()
        except ActivationRefused as error:
            on_refused(error)
            if time.monotonic() >= deadline or stop.wait(min(RECHECK_INTERVAL, max(0.0, deadline - time.monotonic()))):
                raise
            log.info("waiting for activation: %s", error)


def _rpc_problem(what: str, error: grpc.RpcError) -> str:
    code = error.code()
    return f"{what} failed ({code.name if code else 'UNKNOWN'}: {error.details()})"


class RemoteSchemaVerifier:
    """``SchemaVerifier`` over SchemaCatalogService; an RPC failure counts as missing.

    First the database's version (DescribeSchema), passed to ``on_version`` and checked
    against ``release.RELEASE``: a version this release does not serve is the one missing
    piece (``nexuscrm_runtime.release.check_schema`` names both versions and what to run).
    Then the pieces ``feature`` lacks (VerifySchema).
    """

    def __init__(self, channel: grpc.Channel, on_version: Callable[[int], None] = lambda _version: None) -> None:
        self._stub = sc_grpc.SchemaCatalogServiceStub(channel)
        self._on_version = on_version

    def schema_missing(self, feature: str) -> list[str]:
        """See ``SchemaVerifier``."""
        try:
            version = self._stub.DescribeSchema(sc_pb.DescribeSchemaRequest(), timeout=GATE_TIMEOUT).version
        except grpc.RpcError as error:
            return [_rpc_problem("DescribeSchema", error)]
        self._on_version(version)
        try:
            check_schema(RELEASE, version)
        except SchemaRefused as refused:
            return [str(refused)]
        try:
            response = self._stub.VerifySchema(sc_pb.VerifySchemaRequest(feature=feature), timeout=GATE_TIMEOUT)
        except grpc.RpcError as error:
            return [_rpc_problem(f"VerifySchema({feature})", error)]
        return list(response.missing) if not response.complete else []


class RemoteProtocolReader:
    """``ProtocolReader`` over ControlplaneService.GetProtocol; an RPC failure counts as missing."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._stub = cp_grpc.ControlplaneServiceStub(channel)

    def protocol_missing(self, pack_install_id: str) -> str | None:
        """See ``ProtocolReader``."""
        try:
            response = self._stub.GetProtocol(
                cp_pb.GetProtocolRequest(pack_install_id=pack_install_id), timeout=GATE_TIMEOUT
            )
        except grpc.RpcError as error:
            if error.code() == grpc.StatusCode.NOT_FOUND:
                return f"pack {pack_install_id} is not installed"
            return f"pack {pack_install_id}: " + _rpc_problem("GetProtocol", error)
        if not response.exists:
            return f"pack {pack_install_id} has no protocol receipt (_System_ConnectorProjectionProtocol row)"
        return None


class RemotePackFinder:
    """``packs.PackFinder`` over ControlplaneService.ListPacks; a failed call raises ``PackLookupFailed``."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._stub = cp_grpc.ControlplaneServiceStub(channel)

    def find_packs(self, namespace: str) -> list[cp_pb.PackSummary]:
        """See ``packs.PackFinder``: ``nexuscrm_runtime.pack_names.incarnations``."""
        try:
            return pack_names.incarnations(self._stub, namespace, timeout=GATE_TIMEOUT)
        except grpc.RpcError as error:
            raise PackLookupFailed(_rpc_problem("ListPacks", error)) from None


def remote_gate(
    schema_catalog: grpc.Channel,
    controlplane: grpc.Channel,
    pools: Sequence[PoolConfig],
    on_resolved: Callable[[Resolution], None],
    on_schema_version: Callable[[int], None] = lambda _version: None,
) -> Callable[[], ActivationGrant]:
    """``check_activation`` over the two owners' services, ready for ``wait_for_activation``.

    Each check first resolves the pools that name their pack (``packs.resolve_pools``) and
    passes the resolution to ``on_resolved``: the grant covers the resolved pools' packs.
    ``on_schema_version`` gets the database's schema version each check read.
    """
    schema = RemoteSchemaVerifier(schema_catalog, on_schema_version)
    protocols = RemoteProtocolReader(controlplane)
    finder = RemotePackFinder(controlplane)

    def gate() -> ActivationGrant:
        resolution = resolve_pools(pools, finder)
        on_resolved(resolution)
        return check_activation(schema, protocols, resolution.pack_install_ids, unresolved=resolution.missing)

    return gate
