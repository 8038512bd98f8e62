"""ConnectorsService over gRPC: proto in, domain call, proto out.

Errors are mapped to status codes by the shared interceptor; nothing here aborts by hand.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterator, Sequence

import grpc

from nexuscrm.connectors.v1 import connectors_pb2 as pb
from nexuscrm.connectors.v1 import connectors_pb2_grpc as pb_grpc
from nexuscrm_connectors import authorization, wire
from nexuscrm_connectors.errors import LimitExceeded
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.operating import flow_versions
from nexuscrm_connectors.queue.deliveries import RefusedItem
from nexuscrm_connectors.release import RELEASE
from nexuscrm_runtime.authorization import recorded_operator
from nexuscrm_runtime.build_info import build_info
from nexuscrm_runtime.requests import item_refusals
from nexuscrm_runtime.server import Registration
from nexuscrm_schema.support import read_version
from nexuscrm_wire import convert
from nexuscrm_wire.timestamps import to_timestamp
from workqueue.limits import REQUEST_FIELD_LIMITS

SERVICE_NAME = "nexuscrm.connectors.v1.ConnectorsService"


class ConnectorsServicer(pb_grpc.ConnectorsServiceServicer):
    """Thin servicer over ``Connectors``."""

    def __init__(self, connectors: Connectors) -> None:
        self._connectors = connectors

    def Ingest(self, request: pb.IngestRequest, context: grpc.ServicerContext) -> pb.IngestResponse:
        if len(request.items) > self._connectors.settings.max_batch_items:  # before converting anything
            raise LimitExceeded(
                f"items has {len(request.items)} deliveries; the limit is {self._connectors.settings.max_batch_items}",
                field="items",
            )
        refusals = item_refusals(request.items, REQUEST_FIELD_LIMITS, field="items")  # a bad item is refused alone
        items = [
            RefusedItem(receipt_key=item.receipt_key, message=str(refusals[index]))
            if index in refusals
            else convert.item_from_proto(item)
            for index, item in enumerate(request.items)
        ]
        results = self._connectors.ingest_received(request.pack_install_id, items=items)
        return pb.IngestResponse(results=[convert.result_to_proto(r) for r in results])

    def Replay(self, request: pb.ReplayRequest, context: grpc.ServicerContext) -> pb.ReplayResponse:
        replayed = self._connectors.replay(request.work_id)
        return pb.ReplayResponse(
            work=convert.work_to_proto(replayed.work), replay_event_ordinal=replayed.replay_event_ordinal
        )

    def Claim(self, request: pb.ClaimRequest, context: grpc.ServicerContext) -> pb.ClaimResponse:
        answer = self._connectors.complete_and_claim(
            request.worker_id,
            completions=[convert.completion_from_proto(c) for c in request.completions],
            pack_install_ids=list(request.pack_install_ids),
            work_types=list(request.work_types),
            flow_versions=list(request.flow_versions),
            max_items=request.max_items if request.HasField("max_items") else 1,  # 0 is refused, unset is 1
            lease=_lease(request.lease_seconds),
            wait=dt.timedelta(milliseconds=request.wait_ms),
            inline_inputs=request.inline_inputs,
        )
        return pb.ClaimResponse(
            claims=[convert.claim_to_proto(c) for c in answer.claims],
            completions=[convert.completion_result_to_proto(r) for r in answer.completed],
        )

    def LoadInputs(
        self, request: pb.LoadInputsRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.LoadInputsResponse]:
        for page in self._connectors.load_inputs(
            request.work_id, lease_token=request.lease_token, page_size=request.page_size
        ):
            if not context.is_active():  # the caller cancelled or its deadline passed
                return
            yield convert.page_to_proto(page)

    def LoadReplayedInputs(
        self, request: pb.LoadReplayedInputsRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.LoadReplayedInputsResponse]:
        for page in self._connectors.load_replayed_inputs(
            request.work_id, lease_token=request.lease_token, page_size=request.page_size
        ):
            if not context.is_active():
                return
            yield convert.replayed_page_to_proto(page)

    def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.ServicerContext) -> pb.HeartbeatResponse:
        expires = self._connectors.heartbeat(
            request.work_id, lease_token=request.lease_token, lease=_lease(request.lease_seconds)
        )
        return pb.HeartbeatResponse(lease_expires_at=to_timestamp(expires))

    def Complete(self, request: pb.CompleteRequest, context: grpc.ServicerContext) -> pb.CompleteResponse:
        work = self._connectors.complete(request.work_id, lease_token=request.lease_token)
        return pb.CompleteResponse(work=convert.work_to_proto(work))

    def Fail(self, request: pb.FailRequest, context: grpc.ServicerContext) -> pb.FailResponse:
        work = self._connectors.fail(
            request.work_id,
            lease_token=request.lease_token,
            error=request.error,
            retryable=request.retryable,
            retry_after=request.retry_after.ToTimedelta() if request.HasField("retry_after") else None,
            traceback=request.traceback or None,
        )
        return pb.FailResponse(work=convert.work_to_proto(work))

    def GetWork(self, request: pb.GetWorkRequest, context: grpc.ServicerContext) -> pb.GetWorkResponse:
        response = convert.work_description_to_proto(self._connectors.get_work(request.work_id))
        self._mark_operated([response.work])
        return response

    def _mark_operated(self, works: Sequence[pb.WorkItem]) -> None:
        """Mark what operators decided of each generation: held by the "block" order policy, or skipped.

        A held (pending) one: behind which WorkId, and why; a skipped (failed) one: who, when and why.
        """
        pending = [work.work_id for work in works if work.status == pb.WORK_STATUS_PENDING]
        held = self._connectors.order_holds(pending) if pending else {}
        failed = [work.work_id for work in works if work.status == pb.WORK_STATUS_FAILED]
        skipped = self._connectors.skips(failed) if failed else {}
        for work in works:
            if work.work_id in held:
                work.blocked_behind_work_id, work.blocked_reason = held[work.work_id]
            if work.work_id in skipped:
                work.skip.CopyFrom(wire.skip_record_to_proto(skipped[work.work_id]))

    def ExplainReceipt(
        self, request: pb.ExplainReceiptRequest, context: grpc.ServicerContext
    ) -> pb.ExplainReceiptResponse:
        explained = self._connectors.explain_receipt(request.pack_install_id, receipt_key=request.receipt_key)
        response = convert.explanation_to_proto(explained)
        if response.HasField("covered_by"):
            self._mark_operated([response.covered_by])
            if response.covered_by.blocked_behind_work_id:
                response.explanation += f" Its generation is {response.covered_by.blocked_reason}."
            if response.covered_by.HasField("skip"):
                skip = response.covered_by.skip
                response.explanation += (
                    f" Its generation failed and was skipped at {skip.skipped_at.ToJsonString()}"
                    f" by {skip.skipped_by}: {skip.reason}."
                )
        return response

    def ListReceipts(self, request: pb.ListReceiptsRequest, context: grpc.ServicerContext) -> pb.ListReceiptsResponse:
        receipts, token = self._connectors.list_receipts(
            request.state,
            pack_install_id=request.pack_install_id,
            page_size=request.page_size,
            page_token=request.page_token,
        )
        return pb.ListReceiptsResponse(receipts=[convert.receipt_to_proto(r) for r in receipts], next_page_token=token)

    def GetQueueState(
        self, request: pb.GetQueueStateRequest, context: grpc.ServicerContext
    ) -> pb.GetQueueStateResponse:
        read = self._connectors.queue_state(request.pack_install_id)
        held = self._connectors.order_held_count(read.pack_install_id)
        failed, dead = self._connectors.failure_tally(read.pack_install_id)
        state = convert.queue_state_to_proto(dataclasses.replace(read, held=held, failed=failed, dead_letters=dead))
        pauses = self._connectors.list_claim_pauses(state.pack_install_id)
        state.paused.extend(wire.pause_to_proto(pause) for pause in pauses)
        return pb.GetQueueStateResponse(state=state)

    def WaitQueueDrained(
        self, request: pb.WaitQueueDrainedRequest, context: grpc.ServicerContext
    ) -> pb.WaitQueueDrainedResponse:
        state = self._connectors.wait_queue_drained_once(
            request.pack_install_id, wait=dt.timedelta(milliseconds=request.wait_ms), active=context.is_active
        )
        return pb.WaitQueueDrainedResponse(state=convert.queue_state_to_proto(state))

    def ListGenerations(
        self, request: pb.ListGenerationsRequest, context: grpc.ServicerContext
    ) -> pb.ListGenerationsResponse:
        page = self._connectors.list_generations(
            request.pack_install_id,
            route=convert.route_from_proto(request.route) if request.HasField("route") else None,
            page_size=request.page_size,
            page_token=request.page_token,
            status=convert.STATUSES_BACK.get(request.status),
        )
        listed = convert.generations_to_proto(page)
        self._mark_operated(listed.generations)
        return listed

    def ListMembers(self, request: pb.ListMembersRequest, context: grpc.ServicerContext) -> pb.ListMembersResponse:
        page = self._connectors.list_members(
            request.work_id, page_size=request.page_size, page_token=request.page_token
        )
        return convert.members_to_proto(page)

    def SetRetentionPolicy(
        self, request: pb.SetRetentionPolicyRequest, context: grpc.ServicerContext
    ) -> pb.SetRetentionPolicyResponse:
        policy = self._connectors.set_retention_policy(
            request.pack_install_id,
            keep_generations=request.keep_generations if request.HasField("keep_generations") else None,
            keep_seconds=request.keep_seconds if request.HasField("keep_seconds") else None,
            duplicate_window_seconds=(
                request.duplicate_window_seconds if request.HasField("duplicate_window_seconds") else None
            ),
        )
        return pb.SetRetentionPolicyResponse(policy=convert.policy_to_proto(policy))

    def GetRetentionPolicy(
        self, request: pb.GetRetentionPolicyRequest, context: grpc.ServicerContext
    ) -> pb.GetRetentionPolicyResponse:
        return pb.GetRetentionPolicyResponse(
            policy=convert.policy_to_proto(self._connectors.get_retention_policy(request.pack_install_id))
        )

    def Prune(self, request: pb.PruneRequest, context: grpc.ServicerContext) -> pb.PruneResponse:
        report = self._connectors.prune(
            request.pack_install_id, dry_run=request.dry_run, max_generations=request.max_generations
        )
        return convert.prune_report_to_proto(report)

    def GetBuildInfo(self, request: pb.GetBuildInfoRequest, context: grpc.ServicerContext) -> pb.GetBuildInfoResponse:
        return pb.GetBuildInfoResponse(build=build_info(RELEASE, read_version(self._connectors.engine)))

    # Operating projections (issue 37): claim pauses and the dead-letter queue.

    def PauseClaims(self, request: pb.PauseClaimsRequest, context: grpc.ServicerContext) -> pb.PauseClaimsResponse:
        pause = self._connectors.pause_claims(
            wire.scope_from_proto(request.scope),
            paused_by=recorded_operator(request.paused_by),
            reason=request.reason,
            expires_at=wire.expiry_from_proto(request),
        )
        return pb.PauseClaimsResponse(pause=wire.pause_to_proto(pause))

    def ResumeClaims(self, request: pb.ResumeClaimsRequest, context: grpc.ServicerContext) -> pb.ResumeClaimsResponse:
        pause = self._connectors.resume_claims(
            wire.scope_from_proto(request.scope), resumed_by=recorded_operator(request.resumed_by)
        )
        return pb.ResumeClaimsResponse(pause=wire.pause_to_proto(pause))

    def ListClaimPauses(
        self, request: pb.ListClaimPausesRequest, context: grpc.ServicerContext
    ) -> pb.ListClaimPausesResponse:
        pauses = self._connectors.list_claim_pauses(request.pack_install_id)
        return pb.ListClaimPausesResponse(pauses=[wire.pause_to_proto(p) for p in pauses])

    def ListDeadLetters(
        self, request: pb.ListDeadLettersRequest, context: grpc.ServicerContext
    ) -> pb.ListDeadLettersResponse:
        pack_install_id, wanted = wire.filter_from_proto(request.filter)
        page = self._connectors.list_dead_letters(
            pack_install_id, wanted, page_size=request.page_size, page_token=request.page_token
        )
        return wire.dead_letter_page_to_proto(page)

    def CountDeadLetters(
        self, request: pb.CountDeadLettersRequest, context: grpc.ServicerContext
    ) -> pb.CountDeadLettersResponse:
        pack_install_id, wanted = wire.filter_from_proto(request.filter)
        return wire.dead_letter_count_to_proto(self._connectors.count_dead_letters(pack_install_id, wanted))

    def ReplayDeadLetters(
        self, request: pb.ReplayDeadLettersRequest, context: grpc.ServicerContext
    ) -> pb.ReplayDeadLettersResponse:
        pack_install_id, wanted = wire.filter_from_proto(request.filter)
        replayed = self._connectors.replay_dead_letters(
            pack_install_id,
            wanted,
            dry_run=request.dry_run,
            max_generations=request.max_generations,
            page_token=request.page_token,
        )
        return wire.bulk_call_to_proto(replayed, pb.ReplayDeadLettersResponse)

    def SetOrderPolicy(
        self, request: pb.SetOrderPolicyRequest, context: grpc.ServicerContext
    ) -> pb.SetOrderPolicyResponse:
        policy = self._connectors.set_order_policy(
            request.pack_install_id,
            wire.policy_from_proto(request.policy),
            set_by=recorded_operator(request.set_by),
            reason=request.reason,
            work_type=request.work_type,
        )
        return pb.SetOrderPolicyResponse(policy=wire.policy_to_proto(policy))

    def GetOrderPolicy(
        self, request: pb.GetOrderPolicyRequest, context: grpc.ServicerContext
    ) -> pb.GetOrderPolicyResponse:
        response = pb.GetOrderPolicyResponse(
            policy=wire.policy_to_proto(self._connectors.get_order_policy(request.pack_install_id, request.work_type))
        )
        if not request.work_type:  # the pack's, with each work type that has a policy of its own
            own = self._connectors.work_type_order_policies(request.pack_install_id)
            response.work_type_policies.extend(wire.policy_to_proto(policy) for policy in own)
        return response

    def SkipDeadLetter(
        self, request: pb.SkipDeadLetterRequest, context: grpc.ServicerContext
    ) -> pb.SkipDeadLetterResponse:
        skipped = self._connectors.skip_dead_letter(
            request.work_id, skipped_by=recorded_operator(request.skipped_by), reason=request.reason
        )
        return wire.skip_to_proto(skipped)

    def SkipDeadLetters(
        self, request: pb.SkipDeadLettersRequest, context: grpc.ServicerContext
    ) -> pb.SkipDeadLettersResponse:
        pack_install_id, wanted = wire.filter_from_proto(request.filter)
        skipped = self._connectors.skip_dead_letters(
            pack_install_id,
            wanted,
            skipped_by=recorded_operator(request.skipped_by),
            reason=request.reason,
            dry_run=request.dry_run,
            max_generations=request.max_generations,
            page_token=request.page_token,
        )
        return wire.bulk_call_to_proto(skipped, pb.SkipDeadLettersResponse)

    def GetCoverage(self, request: pb.GetCoverageRequest, context: grpc.ServicerContext) -> pb.GetCoverageResponse:
        pack_install_id, wanted = wire.coverage_filter_from_proto(request)
        page = self._connectors.get_coverage(
            pack_install_id, wanted, page_size=request.page_size, page_token=request.page_token
        )
        return wire.coverage_page_to_proto(page)

    def SetRetryPolicy(
        self, request: pb.SetRetryPolicyRequest, context: grpc.ServicerContext
    ) -> pb.SetRetryPolicyResponse:
        policy = self._connectors.set_retry_policy(
            request.pack_install_id,
            request.work_type,
            max_attempts=request.max_attempts,
            backoff_base_seconds=request.backoff_base_seconds if request.HasField("backoff_base_seconds") else None,
            backoff_max_seconds=request.backoff_max_seconds if request.HasField("backoff_max_seconds") else None,
            set_by=recorded_operator(request.set_by),
            reason=request.reason,
        )
        return pb.SetRetryPolicyResponse(policy=wire.retry_policy_to_proto(policy))

    def GetRetryPolicy(
        self, request: pb.GetRetryPolicyRequest, context: grpc.ServicerContext
    ) -> pb.GetRetryPolicyResponse:
        policy = self._connectors.get_retry_policy(request.pack_install_id, request.work_type)
        response = pb.GetRetryPolicyResponse(policy=wire.retry_policy_to_proto(policy))
        if not request.work_type:  # Connectors' default, with each work type that has a policy of its own
            own = self._connectors.work_type_retry_policies(request.pack_install_id)
            response.work_type_policies.extend(wire.retry_policy_to_proto(policy) for policy in own)
        return response

    def RetryNow(self, request: pb.RetryNowRequest, context: grpc.ServicerContext) -> pb.RetryNowResponse:
        work = self._connectors.retry_now(
            request.work_id, retried_by=recorded_operator(request.retried_by), reason=request.reason
        )
        return pb.RetryNowResponse(work=convert.work_to_proto(work))

    def BuildFlowVersion(
        self, request: pb.BuildFlowVersionRequest, context: grpc.ServicerContext
    ) -> pb.BuildFlowVersionResponse:
        view, made = flow_versions.build(
            self._connectors.context,
            request.pack_install_id,
            request.work_type,
            request.version,
            from_retained=request.from_retained,
            max_inputs_per_second=request.max_inputs_per_second,
            started_by=recorded_operator(request.started_by),
            reason=request.reason,
        )
        self._connectors.reservations.notify()  # the catch-up's first generations are claimable
        return pb.BuildFlowVersionResponse(
            version=wire.flow_version_to_proto(view),
            catch_up_generations=made.generations,
            catch_up_inputs=made.inputs,
        )

    def ListFlowVersions(
        self, request: pb.ListFlowVersionsRequest, context: grpc.ServicerContext
    ) -> pb.ListFlowVersionsResponse:
        views = flow_versions.list_versions(self._connectors.context, request.pack_install_id, request.work_type)
        return pb.ListFlowVersionsResponse(versions=[wire.flow_version_to_proto(view) for view in views])

    def SwitchFlowVersion(
        self, request: pb.SwitchFlowVersionRequest, context: grpc.ServicerContext
    ) -> pb.SwitchFlowVersionResponse:
        live, previous = flow_versions.switch(
            self._connectors.context,
            request.pack_install_id,
            request.work_type,
            request.version,
            switched_by=recorded_operator(request.switched_by),
            reason=request.reason,
            force=request.force,
        )
        return pb.SwitchFlowVersionResponse(
            live=wire.flow_version_to_proto(live), previous=wire.flow_version_to_proto(previous)
        )

    def RollbackFlowVersion(
        self, request: pb.RollbackFlowVersionRequest, context: grpc.ServicerContext
    ) -> pb.RollbackFlowVersionResponse:
        live, previous, made = flow_versions.rollback(
            self._connectors.context,
            request.pack_install_id,
            request.work_type,
            rolled_back_by=recorded_operator(request.rolled_back_by),
            reason=request.reason,
        )
        self._connectors.reservations.notify()
        return pb.RollbackFlowVersionResponse(
            live=wire.flow_version_to_proto(live),
            previous=wire.flow_version_to_proto(previous),
            catch_up_generations=made.generations,
            catch_up_inputs=made.inputs,
        )

    def RetireFlowVersion(
        self, request: pb.RetireFlowVersionRequest, context: grpc.ServicerContext
    ) -> pb.RetireFlowVersionResponse:
        view = flow_versions.retire(
            self._connectors.context,
            request.pack_install_id,
            request.work_type,
            request.version,
            retired_by=recorded_operator(request.retired_by),
            reason=request.reason,
        )
        return pb.RetireFlowVersionResponse(version=wire.flow_version_to_proto(view))

    def RecordFlowVersionVerification(
        self, request: pb.RecordFlowVersionVerificationRequest, context: grpc.ServicerContext
    ) -> pb.RecordFlowVersionVerificationResponse:
        view = flow_versions.record_verification(
            self._connectors.context,
            request.pack_install_id,
            request.work_type,
            request.version,
            against=request.against_version,
            through_ordinal=request.through_ordinal,
            verdict=wire.verdict_from_proto(request.verdict),
            differing=list(request.differing_projection_keys),
            verified_by=recorded_operator(request.verified_by),
        )
        return pb.RecordFlowVersionVerificationResponse(version=wire.flow_version_to_proto(view))

    def ListIdentities(
        self, request: pb.ListIdentitiesRequest, context: grpc.ServicerContext
    ) -> pb.ListIdentitiesResponse:
        page = self._connectors.list_identities(
            request.pack_install_id,
            wire.wanted_route_from_proto(request),
            page_size=request.page_size,
            page_token=request.page_token,
        )
        listed = wire.identities_page_to_proto(page)
        self._mark_operated([identity.newest for identity in listed.identities if identity.HasField("newest")])
        return listed


def _lease(seconds: int) -> dt.timedelta | None:
    """The lease a request asks for: 0 means the server's default; a negative one is refused downstream."""
    return dt.timedelta(seconds=seconds) if seconds else None


def registration(connectors: Connectors) -> Registration:
    """ConnectorsService over ``connectors``, with its authorization rules."""
    return Registration(
        servicer=ConnectorsServicer(connectors),
        add=pb_grpc.add_ConnectorsServiceServicer_to_server,
        service_name=SERVICE_NAME,
        rules=authorization.rules(connectors.engine),
    )
