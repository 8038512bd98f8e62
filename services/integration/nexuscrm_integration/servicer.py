"""IntegrationService over gRPC: proto in, host status out."""

from __future__ import annotations

import grpc

from nexuscrm.integration.v1 import integration_pb2 as pb
from nexuscrm.integration.v1 import integration_pb2_grpc as pb_grpc
from nexuscrm_integration.host import HostStatus
from nexuscrm_integration.release import RELEASE
from nexuscrm_runtime.authorization import allow_any_principal, require_all_namespaces
from nexuscrm_runtime.build_info import build_info
from nexuscrm_runtime.server import Registration

SERVICE_NAME = "nexuscrm.integration.v1.IntegrationService"


class IntegrationServicer(pb_grpc.IntegrationServiceServicer):
    """Thin servicer over ``HostStatus``."""

    def __init__(self, status: HostStatus) -> None:
        self._status = status

    def GetActivation(
        self, request: pb.GetActivationRequest, context: grpc.ServicerContext
    ) -> pb.GetActivationResponse:
        activation = self._status.activation()
        return pb.GetActivationResponse(
            active=activation.active, missing=activation.missing, pack_install_ids=activation.pack_install_ids
        )

    def ListWorkers(self, request: pb.ListWorkersRequest, context: grpc.ServicerContext) -> pb.ListWorkersResponse:
        return pb.ListWorkersResponse(
            workers=[
                pb.WorkerInfo(
                    worker_id=w.worker_id,
                    pack_install_id=w.pack_install_id,
                    work_type=w.work_type,
                    flow=w.flow,
                    state=w.state,
                    current_work_id=w.current_work_id or "",
                    executions=w.executions,
                    clock_skew_seconds=w.clock_skew_seconds,
                    lease_seconds=w.lease_seconds,
                )
                for w in self._status.workers()
            ]
        )

    def GetBuildInfo(self, request: pb.GetBuildInfoRequest, context: grpc.ServicerContext) -> pb.GetBuildInfoResponse:
        return pb.GetBuildInfoResponse(build=build_info(RELEASE, self._status.schema_version()))


def registration(status: HostStatus) -> Registration:
    """IntegrationService over the host's ``status``; host-wide, so only callers of every namespace.

    GetBuildInfo reveals nothing of any namespace: any caller the policy knows may ask.
    """
    method = f"/{SERVICE_NAME}/"
    return Registration(
        servicer=IntegrationServicer(status),
        add=pb_grpc.add_IntegrationServiceServicer_to_server,
        service_name=SERVICE_NAME,
        rules={
            method + "GetActivation": require_all_namespaces,
            method + "ListWorkers": require_all_namespaces,
            method + "GetBuildInfo": allow_any_principal,
        },
    )
