"""The dashboard's reads of Connectors' data that Connectors explains: over its RPCs, never its code.

GetWork, ExplainReceipt and ListReceipts answer through the Connectors SDK client
(``nexuscrm_sdk.client.ConnectorsClient``); the operating reads of issue 37 (ListClaimPauses,
GetOrderPolicy, GetRetentionPolicy, CountDeadLetters, ListDeadLetters, GetCoverage) and
ListFlowVersions (decision 185) through the generated stub, as
the CLI calls them, because their answers have no shared value type the client could return
with the facade's signature (docs/decisions/164-dashboard-operating-panels.md). This module is
the ONE place where their status codes become what the dashboard answers:

| status | dashboard |
|---|---|
| NOT_FOUND | nothing found (``None``, an empty listing): an unknown WorkId, ReceiptKey or pack |
| FAILED_PRECONDITION from GetWork | retention pruned the WorkId (decision 124): ``PrunedWork``, "pruned at ..." |
| FAILED_PRECONDITION from GetCoverage | the pack has no protocol row: ``Unprovable``, with Connectors' words |
| INVALID_ARGUMENT | ``InvalidArgument`` with Connectors' message (HTTP 400) |
| UNAVAILABLE, DEADLINE_EXCEEDED | ``ConnectorsUnavailable`` (HTTP 503, "Connectors unavailable: ...") |
| anything else | ``ConnectorsRefused`` naming the code (HTTP 502) |

Identity: with security, the calls carry the Controlplane's certificate, so its principal must
span every namespace (``*``), as the dashboard's own operators must (``access``). The page
filters nothing by namespace itself: only a principal of every namespace may open it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
from collections.abc import Callable, Iterator
from typing import TypeVar

import grpc

from nexuscrm.connectors.v1 import connectors_pb2 as pb
from nexuscrm.connectors.v1 import connectors_pb2_grpc as pb_grpc
from nexuscrm_controlplane.errors import ControlplaneError
from nexuscrm_runtime.targets import Targets
from nexuscrm_runtime.tls import TlsFiles, open_channel
from nexuscrm_sdk.client import ConnectorsClient
from workqueue.errors import ErrorKind, InvalidArgument
from workqueue.values import ReceiptExplanation, ReceiptSummary, WorkDescription

TIMEOUT = dt.timedelta(seconds=5)  # per call: a page refresh must not hang on a stuck Connectors
T = TypeVar("T")
UNREACHABLE = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED})


class ConnectorsUnavailable(ControlplaneError):
    """Connectors did not answer (not reachable, or not within ``TIMEOUT``)."""

    kind = ErrorKind.UNAVAILABLE


class ConnectorsRefused(ControlplaneError):
    """Connectors answered with a status the dashboard does not expect (e.g. PERMISSION_DENIED)."""

    def __init__(self, message: str, *, code: grpc.StatusCode, details: str) -> None:
        super().__init__(message)
        self.code = code
        self.details = details


def _call(read: Callable[[], T], field: str) -> T | None:
    """``read()``, None on NOT_FOUND, any other ``grpc.RpcError`` translated per the module's table."""
    try:
        return read()
    except grpc.RpcError as error:
        code, details = error.code(), error.details() or ""
        if code is grpc.StatusCode.NOT_FOUND:
            return None
        if code in UNREACHABLE:
            raise ConnectorsUnavailable(f"Connectors unavailable: {code.name} ({details})") from None
        if code is grpc.StatusCode.INVALID_ARGUMENT:
            raise InvalidArgument(details, field=field) from None
        raise ConnectorsRefused(
            f"Connectors refused the dashboard's read: {code.name} ({details})", code=code, details=details
        ) from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrunedWork:
    """A WorkId whose generation retention pruned, and Connectors' words on when and what it was."""

    work_id: str
    explanation: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class Unprovable:
    """A pack GetCoverage cannot prove (no protocol row yet), and Connectors' words on why."""

    pack_install_id: str
    explanation: str


class ConnectorsReads:
    """The Connectors reads the dashboard shows: ``client``'s, and the operating reads over ``stub``."""

    def __init__(self, client: ConnectorsClient, stub: pb_grpc.ConnectorsServiceStub) -> None:
        self._client = client
        self._stub = stub
        self._timeout = TIMEOUT.total_seconds()

    def get_work(self, work_id: str) -> WorkDescription | PrunedWork | None:
        """The generation ``work_id`` and its member count; ``PrunedWork`` when retention pruned it; None when none."""
        try:
            return _call(lambda: self._client.get_work(work_id), "q")
        except ConnectorsRefused as refused:
            if refused.code is not grpc.StatusCode.FAILED_PRECONDITION:  # GetWork's only one: pruned
                raise
            return PrunedWork(work_id=work_id, explanation=refused.details)

    def explain_receipt(self, pack_install_id: str, receipt_key: str) -> ReceiptExplanation | None:
        """Why receipt ``receipt_key`` of the pack has (no) work; None when the pack has no such receipt."""
        return _call(lambda: self._client.explain_receipt(pack_install_id, receipt_key=receipt_key), "q")

    def list_receipts(self, state: str, pack_install_id: str, limit: int) -> list[ReceiptSummary]:
        """The oldest ``limit`` receipts in ``state`` (of one pack, or of every pack when it is "")."""
        page = _call(
            lambda: self._client.list_receipts(state, pack_install_id=pack_install_id, page_size=limit), "state"
        )
        return [] if page is None else page[0]

    def list_claim_pauses(self, pack_install_id: str) -> list[pb.ClaimPause] | None:
        """The pack's active claim pauses (ListClaimPauses); None for a pack Connectors does not know."""
        request = pb.ListClaimPausesRequest(pack_install_id=pack_install_id)
        answer = _call(lambda: self._stub.ListClaimPauses(request, timeout=self._timeout), "pack")
        return None if answer is None else list(answer.pauses)

    def get_order_policy(self, pack_install_id: str) -> pb.GetOrderPolicyResponse | None:
        """The pack's order policy and its work types' own (GetOrderPolicy); None for an unknown pack."""
        request = pb.GetOrderPolicyRequest(pack_install_id=pack_install_id)
        return _call(lambda: self._stub.GetOrderPolicy(request, timeout=self._timeout), "pack")

    def get_retention_policy(self, pack_install_id: str) -> pb.RetentionPolicy | None:
        """The pack's retention policy and the pruner's backlog (GetRetentionPolicy); None for an unknown pack."""
        request = pb.GetRetentionPolicyRequest(pack_install_id=pack_install_id)
        return _call(lambda: self._stub.GetRetentionPolicy(request, timeout=self._timeout).policy, "pack")

    def count_dead_letters(self, pack_install_id: str) -> pb.CountDeadLettersResponse | None:
        """The pack's dead letters per identity (CountDeadLetters, unfiltered); None for an unknown pack."""
        request = pb.CountDeadLettersRequest(filter=pb.DeadLetterFilter(pack_install_id=pack_install_id))
        return _call(lambda: self._stub.CountDeadLetters(request, timeout=self._timeout), "pack")

    def list_dead_letters(self, pack_install_id: str, limit: int) -> pb.ListDeadLettersResponse | None:
        """The first page of the pack's dead letters, oldest finished first (ListDeadLetters); None: unknown pack."""
        request = pb.ListDeadLettersRequest(
            filter=pb.DeadLetterFilter(pack_install_id=pack_install_id), page_size=limit
        )
        return _call(lambda: self._stub.ListDeadLetters(request, timeout=self._timeout), "pack")

    def list_flow_versions(self, pack_install_id: str) -> list[pb.FlowVersion] | None:
        """The pack's Flow versions of every work type, with progress (ListFlowVersions); None for an unknown pack."""
        request = pb.ListFlowVersionsRequest(pack_install_id=pack_install_id)
        answer = _call(lambda: self._stub.ListFlowVersions(request, timeout=self._timeout), "pack")
        return None if answer is None else list(answer.versions)

    def get_coverage(
        self, pack_install_id: str, page_token: str, limit: int
    ) -> pb.GetCoverageResponse | Unprovable | None:
        """One page of the pack's coverage proof by identity (GetCoverage); ``Unprovable``; None for an unknown pack.

        An invalid ``page_token`` is Connectors' INVALID_ARGUMENT, answered as a 400 naming ``page_token``.
        """
        request = pb.GetCoverageRequest(pack_install_id=pack_install_id, page_size=limit, page_token=page_token)
        try:
            return _call(lambda: self._stub.GetCoverage(request, timeout=self._timeout), "page_token")
        except ConnectorsRefused as refused:
            if refused.code is not grpc.StatusCode.FAILED_PRECONDITION:  # GetCoverage's only one: no protocol row
                raise
            return Unprovable(pack_install_id=pack_install_id, explanation=refused.details)


@contextlib.contextmanager
def connectors_reads(targets: Targets, tls: TlsFiles | None) -> Iterator[ConnectorsReads]:
    """Reads over a channel to ``targets.connectors`` (mutual TLS with ``tls``), closed on exit.

    The channel connects on the first read, so Connectors may start after the Controlplane.
    """
    with open_channel(targets.connectors, tls) as channel:
        yield ConnectorsReads(ConnectorsClient(channel, timeout=TIMEOUT), pb_grpc.ConnectorsServiceStub(channel))
