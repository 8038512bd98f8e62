"""ControlplaneService over gRPC: proto in, domain call, proto out.

Domain errors become status codes in the shared interceptor; nothing here aborts.
"""

from __future__ import annotations

import time

import grpc
from sqlalchemy.engine import Engine

from nexuscrm.controlplane.v1 import controlplane_pb2 as pb
from nexuscrm.controlplane.v1 import controlplane_pb2_grpc as pb_grpc
from nexuscrm_controlplane import authorization, cutover, drain, fences, lifecycle
from nexuscrm_controlplane.audit import CutoverReport
from nexuscrm_controlplane.release import RELEASE
from nexuscrm_runtime.build_info import build_info
from nexuscrm_runtime.clock import DATABASE_CLOCK, DatabaseClock
from nexuscrm_runtime.server import Registration
from nexuscrm_schema.support import read_version
from nexuscrm_wire.timestamps import to_timestamp
from workqueue.errors import InvalidArgument

SERVICE_NAME = "nexuscrm.controlplane.v1.ControlplaneService"
MAX_TIMEOUT_SECONDS = 24 * 3600  # a cutover RPC may not hold its locks longer than a day


def _pack(row: lifecycle.PackInstallRow) -> pb.PackInstall:
    return pb.PackInstall(
        pack_install_id=row.pack_install_id,
        namespace=row.namespace,
        pack_name=row.pack_name,
        pack_version=row.pack_version,
        last_ordinal=row.last_ordinal,
        created_at=to_timestamp(row.created_at),
    )


def _protocol(row: lifecycle.ProtocolRow) -> pb.ProjectionProtocol:
    return pb.ProjectionProtocol(
        pack_install_id=row.pack_install_id,
        protocol_version=row.protocol_version,
        legacy_max_ordinal=row.legacy_max_ordinal,
        origin=row.origin,
        created_at=to_timestamp(row.created_at),
        audit_report=row.audit_report or "",
    )


def _fence(row: fences.FenceRow) -> pb.Fence:
    return pb.Fence(
        fence_id=row.fence_id,
        namespace=row.namespace,
        scope=row.scope,
        expires_at=to_timestamp(row.expires_at),
        reason=row.reason,
        overrides=[
            pb.FenceOverride(pack_install_id=o.pack_install_id, expires_at=to_timestamp(o.expires_at))
            for o in row.overrides
        ],
    )


def _report(report: CutoverReport) -> pb.CutoverReport:
    return pb.CutoverReport(
        pack_install_id=report.pack_install_id,
        passed=report.passed,
        refusals=[
            pb.AuditFinding(
                rule=f.rule.value, count=f.count, sample_ids=f.sample_ids, detail=f.detail, category=f.category.value
            )
            for f in report.findings
        ],
        legacy_max_ordinal=report.legacy_max_ordinal,
        events_audited=report.events_audited,
        work_items_audited=report.work_items_audited,
    )


def _deadline(timeout_seconds: int) -> float:
    if not 0 <= timeout_seconds <= MAX_TIMEOUT_SECONDS:
        raise InvalidArgument(
            f"timeout_seconds must be between 0 (default) and {MAX_TIMEOUT_SECONDS}", field="timeout_seconds"
        )
    return time.monotonic() + (timeout_seconds or cutover.DEFAULT_TIMEOUT)


class ControlplaneServicer(pb_grpc.ControlplaneServiceServicer):
    """Thin servicer over the lifecycle, fences, drain and cutover modules."""

    def __init__(self, engine: Engine, clock: DatabaseClock = DATABASE_CLOCK) -> None:
        self._engine = engine
        self._clock = clock

    def InstallPack(self, request: pb.InstallPackRequest, context: grpc.ServicerContext) -> pb.InstallPackResponse:
        row = lifecycle.install_pack(
            self._engine, request.namespace, request.pack_name, request.pack_version, self._clock
        )
        return pb.InstallPackResponse(pack=_pack(row))

    def ActivatePack(self, request: pb.ActivatePackRequest, context: grpc.ServicerContext) -> pb.ActivatePackResponse:
        row, already_active = lifecycle.activate_pack(self._engine, request.pack_install_id, self._clock)
        return pb.ActivatePackResponse(protocol=_protocol(row), already_active=already_active)

    def GetProtocol(self, request: pb.GetProtocolRequest, context: grpc.ServicerContext) -> pb.GetProtocolResponse:
        row = lifecycle.get_protocol(self._engine, request.pack_install_id)
        if row is None:
            return pb.GetProtocolResponse(exists=False)
        return pb.GetProtocolResponse(protocol=_protocol(row), exists=True)

    def GetPack(self, request: pb.GetPackRequest, context: grpc.ServicerContext) -> pb.GetPackResponse:
        described = lifecycle.get_pack(self._engine, request.pack_install_id)
        response = pb.GetPackResponse(pack=_pack(described.pack), protocol_state=described.protocol_state)
        if described.protocol is not None:
            response.protocol.CopyFrom(_protocol(described.protocol))
        return response

    def FindPacks(self, request: pb.FindPacksRequest, context: grpc.ServicerContext) -> pb.FindPacksResponse:
        rows = lifecycle.find_packs(self._engine, request.namespace, request.pack_name, request.pack_version)
        return pb.FindPacksResponse(packs=[_pack(row) for row in rows])

    def ListPacks(self, request: pb.ListPacksRequest, context: grpc.ServicerContext) -> pb.ListPacksResponse:
        page = lifecycle.list_packs(self._engine, request.namespace, request.page_size, request.page_token)
        return pb.ListPacksResponse(
            packs=[pb.PackSummary(pack=_pack(row), protocol_state=state) for row, state in page.packs],
            next_page_token=page.next_page_token,
        )

    def ArmFence(self, request: pb.ArmFenceRequest, context: grpc.ServicerContext) -> pb.ArmFenceResponse:
        row = fences.arm_fence(
            self._engine,
            request.namespace,
            request.scope,
            expires_in_seconds=request.expires_in_seconds,
            reason=request.reason,
            clock=self._clock,
        )
        return pb.ArmFenceResponse(fence=_fence(row))

    def DisarmFence(self, request: pb.DisarmFenceRequest, context: grpc.ServicerContext) -> pb.DisarmFenceResponse:
        fences.disarm_fence(self._engine, request.fence_id)
        return pb.DisarmFenceResponse()

    def ListFences(self, request: pb.ListFencesRequest, context: grpc.ServicerContext) -> pb.ListFencesResponse:
        return pb.ListFencesResponse(fences=[_fence(f) for f in fences.list_fences(self._engine, request.namespace)])

    def AddFenceOverride(
        self, request: pb.AddFenceOverrideRequest, context: grpc.ServicerContext
    ) -> pb.AddFenceOverrideResponse:
        row = fences.add_override(
            self._engine,
            request.fence_id,
            request.pack_install_id,
            expires_in_seconds=request.expires_in_seconds,
            clock=self._clock,
        )
        return pb.AddFenceOverrideResponse(fence=_fence(row))

    def RemoveFenceOverride(
        self, request: pb.RemoveFenceOverrideRequest, context: grpc.ServicerContext
    ) -> pb.RemoveFenceOverrideResponse:
        fences.remove_override(self._engine, request.fence_id, request.pack_install_id)
        return pb.RemoveFenceOverrideResponse()

    def GetDrainStatus(
        self, request: pb.GetDrainStatusRequest, context: grpc.ServicerContext
    ) -> pb.GetDrainStatusResponse:
        status = drain.drain_status(self._engine, request.pack_install_id, self._clock)
        return pb.GetDrainStatusResponse(
            pack_install_id=status.pack_install_id,
            drained=status.drained,
            pending=status.pending,
            blocked=status.blocked,
            retry=status.retry,
            processing=status.processing,
            holds=[
                pb.DrainHold(reason=h.reason, count=h.count, sample_work_ids=h.sample_work_ids) for h in status.holds
            ],
        )

    def AuditCutover(self, request: pb.AuditCutoverRequest, context: grpc.ServicerContext) -> pb.AuditCutoverResponse:
        result = cutover.run_cutover(
            self._engine,
            request.pack_install_id,
            deadline=_deadline(request.timeout_seconds),
            dry_run=True,
            clock=self._clock,
        )
        return pb.AuditCutoverResponse(report=_report(result.report))

    def Cutover(self, request: pb.CutoverRequest, context: grpc.ServicerContext) -> pb.CutoverResponse:
        result = cutover.require_written(
            cutover.run_cutover(
                self._engine, request.pack_install_id, deadline=_deadline(request.timeout_seconds), clock=self._clock
            )
        )
        if result.protocol is None:  # require_written answered, so the protocol row exists
            raise RuntimeError(f"cutover of {request.pack_install_id} wrote no protocol row")
        return pb.CutoverResponse(
            protocol=_protocol(result.protocol),
            already_written=result.outcome is cutover.Outcome.ALREADY_WRITTEN,
            report=_report(result.report),
        )

    def GetBuildInfo(self, request: pb.GetBuildInfoRequest, context: grpc.ServicerContext) -> pb.GetBuildInfoResponse:
        return pb.GetBuildInfoResponse(build=build_info(RELEASE, read_version(self._engine)))


def registration(engine: Engine, clock: DatabaseClock = DATABASE_CLOCK) -> Registration:
    """ControlplaneService over ``engine``, with its authorization rules."""
    return Registration(
        servicer=ControlplaneServicer(engine, clock),
        add=pb_grpc.add_ControlplaneServiceServicer_to_server,
        service_name=SERVICE_NAME,
        rules=authorization.rules(engine),
    )
