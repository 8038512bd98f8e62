"""The stubs ``nexuscrm`` calls, each naming its service when a call fails.

Every call of every stub (and of the Connectors SDK's client) goes through ``Named``: a failed
call raises ``ServiceCallFailed``, which says which service answered (or did not) and, when
it is unreachable, the variable that sets its address (``Targets``). ``nexuscrm`` prints
``ServiceCallFailed.message`` and exits with ``exits.rpc_exit_code`` of its status: one place
for every command and every service. ``version`` and ``health`` ask the ``deployed`` services
only: those whose target variable is set (decision 177).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from nexuscrm.buildinfo.v1.build_info_pb2 import BuildInfo
from nexuscrm.connectors.v1 import connectors_pb2 as cn_pb
from nexuscrm.connectors.v1 import connectors_pb2_grpc as cn_grpc
from nexuscrm.controlplane.v1 import controlplane_pb2 as cp_pb
from nexuscrm.controlplane.v1 import controlplane_pb2_grpc as cp_grpc
from nexuscrm.integration.v1 import integration_pb2 as in_pb
from nexuscrm.integration.v1 import integration_pb2_grpc as in_grpc
from nexuscrm.schemacatalog.v1 import schema_catalog_pb2 as sc_pb
from nexuscrm.schemacatalog.v1 import schema_catalog_pb2_grpc as sc_grpc
from nexuscrm_runtime.targets import Targets
from nexuscrm_runtime.tls import open_channel
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_tools import service_health, versions

VERSION_TIMEOUT = 5.0  # seconds per GetBuildInfo: a service that does not answer by then is reported as such
HEALTH_TIMEOUT = 5.0  # seconds per health Check, likewise


@dataclasses.dataclass(frozen=True)
class Service:
    """A service as the operator knows it: its name, the variable holding its address, its gRPC name."""

    title: str  # as people call it: "Controlplane"
    env_name: str  # NEXUSCRM_<env_name>_TARGET
    full_name: str  # the gRPC service's full name, whose health it reports

    @property
    def name(self) -> str:
        """The launcher's name (``schema-catalog``, ``connectors``): what ``version`` and ``health`` print."""
        return self.env_name.lower().replace("_", "-")

    @property
    def variable(self) -> str:
        """The environment variable that sets the service's address."""
        return f"NEXUSCRM_{self.env_name}_TARGET"


SCHEMA_CATALOG = Service(
    "Schema Catalog", "SCHEMA_CATALOG", sc_pb.DESCRIPTOR.services_by_name["SchemaCatalogService"].full_name
)
CONTROLPLANE = Service(
    "Controlplane", "CONTROLPLANE", cp_pb.DESCRIPTOR.services_by_name["ControlplaneService"].full_name
)
CONNECTORS = Service("Connectors", "CONNECTORS", cn_pb.DESCRIPTOR.services_by_name["ConnectorsService"].full_name)
INTEGRATION = Service("Integration", "INTEGRATION", in_pb.DESCRIPTOR.services_by_name["IntegrationService"].full_name)
# In the order the launcher starts them.
SERVICES = (SCHEMA_CATALOG, CONNECTORS, CONTROLPLANE, INTEGRATION)


def deployed(environ: Mapping[str, str] = os.environ) -> tuple[Service, ...]:
    """The services this machine's operator deploys: those whose ``NEXUSCRM_<SERVICE>_TARGET`` is set.

    With none set, all four, at their default local addresses (``nexuscrm_runtime.targets``): a
    local run. A deployment of one owner sets only its services' targets, so that ``version``
    and ``health`` check those and do not report the others as unreachable.
    """
    return tuple(service for service in SERVICES if environ.get(service.variable)) or SERVICES


class ServiceCallFailed(grpc.RpcError):
    """A call to ``service`` at ``address`` that ended with a status other than OK."""

    def __init__(self, service: Service, address: str, error: grpc.RpcError) -> None:
        super().__init__(str(error))
        self.service = service
        self.address = address
        self.error = error

    def code(self) -> grpc.StatusCode:
        """The call's gRPC status."""
        status: grpc.StatusCode = self.error.code()
        return status

    def details(self) -> str:
        """The service's (or the channel's) message."""
        return str(self.error.details() or "")

    @property
    def message(self) -> str:
        """One line for stderr: which service, where, what to set when unreachable, the status and detail."""
        code = self.code()
        status = f"{code.name}: {self.details()}"
        where = f"{self.service.title} at {self.address}"
        if code == grpc.StatusCode.UNAVAILABLE:
            return (
                f"{self.service.title} is unreachable at {self.address} (set {self.service.variable}; "
                f"nexuscrm-run --serve prints the targets): {status}"
            )
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return f"{where} does not implement this call (a release older than this command?): {status}"
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return f"{where} did not answer in time: {status}"
        return status


class Named:
    """Wraps a stub or client: every method's ``grpc.RpcError`` becomes ``ServiceCallFailed``."""

    def __init__(self, wrapped: object, service: Service, address: str) -> None:
        self._wrapped = wrapped
        self._service = service
        self._address = address

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._wrapped, name)
        if not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return attribute(*args, **kwargs)
            except ServiceCallFailed:
                raise
            except grpc.RpcError as error:
                raise ServiceCallFailed(self._service, self._address, error) from error

        return call


class Clients:
    """Stubs of every service, over channels opened lazily from ``Targets``, each ``Named``."""

    def __init__(self, targets: Targets) -> None:
        self._targets = targets
        self._channels: list[grpc.Channel] = []

    def _address(self, service: Service) -> str:
        address: str = getattr(self._targets, service.env_name.lower())
        return address

    def _open(self, service: Service, make: Callable[[grpc.Channel], object]) -> Any:
        address = self._address(service)
        channel = open_channel(address)
        self._channels.append(channel)
        return Named(make(channel), service, address)

    @property
    def schema_catalog(self) -> sc_grpc.SchemaCatalogServiceStub:
        """SchemaCatalogService."""
        return cast(sc_grpc.SchemaCatalogServiceStub, self._open(SCHEMA_CATALOG, sc_grpc.SchemaCatalogServiceStub))

    @property
    def controlplane(self) -> cp_grpc.ControlplaneServiceStub:
        """ControlplaneService."""
        return cast(cp_grpc.ControlplaneServiceStub, self._open(CONTROLPLANE, cp_grpc.ControlplaneServiceStub))

    @property
    def connectors(self) -> cn_grpc.ConnectorsServiceStub:
        """ConnectorsService."""
        return cast(cn_grpc.ConnectorsServiceStub, self._open(CONNECTORS, cn_grpc.ConnectorsServiceStub))

    @property
    def connectors_client(self) -> ConnectorsClient:
        """The Connectors SDK's client (for the calls that loop, like ``queue wait``)."""
        return cast(ConnectorsClient, self._open(CONNECTORS, ConnectorsClient))

    @property
    def integration(self) -> in_grpc.IntegrationServiceStub:
        """IntegrationService."""
        return cast(in_grpc.IntegrationServiceStub, self._open(INTEGRATION, in_grpc.IntegrationServiceStub))

    def build_infos(self, services: Sequence[Service]) -> list[versions.Answer]:
        """The GetBuildInfo answers of ``services``, in the order the launcher starts them (``versions.ask``)."""
        calls: dict[Service, Callable[[], BuildInfo]] = {
            SCHEMA_CATALOG: lambda: (
                self.schema_catalog.GetBuildInfo(sc_pb.GetBuildInfoRequest(), timeout=VERSION_TIMEOUT).build
            ),
            CONNECTORS: lambda: (
                self.connectors.GetBuildInfo(cn_pb.GetBuildInfoRequest(), timeout=VERSION_TIMEOUT).build
            ),
            CONTROLPLANE: lambda: (
                self.controlplane.GetBuildInfo(cp_pb.GetBuildInfoRequest(), timeout=VERSION_TIMEOUT).build
            ),
            INTEGRATION: lambda: (
                self.integration.GetBuildInfo(in_pb.GetBuildInfoRequest(), timeout=VERSION_TIMEOUT).build
            ),
        }
        return [
            versions.ask(service.name, service.variable, self._address(service), call)
            for service, call in calls.items()
            if service in services
        ]

    def health(self, services: Sequence[Service]) -> list[service_health.Answer]:
        """The gRPC health of each of ``services``, for its full name (``service_health.ask``)."""

        def check(service: Service) -> int:
            stub = self._open(service, health_pb2_grpc.HealthStub)
            request = health_pb2.HealthCheckRequest(service=service.full_name)
            status: int = stub.Check(request, timeout=HEALTH_TIMEOUT).status
            return status

        return [
            service_health.ask(
                service.name, service.variable, self._address(service), functools.partial(check, service)
            )
            for service in services
        ]

    def close(self) -> None:
        """Close every channel opened."""
        for channel in self._channels:
            channel.close()
