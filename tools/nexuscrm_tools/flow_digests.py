"""What ``nexuscrm versions verify`` reads beside the version RPCs: identities, how far a version got, digests.

Two Flow versions of a work type project the same inputs: those of the identities whose
companion version is the inputs' own (``FlowVersion.source_version``). Version X's
generations of such an identity are those of the same route with companion version X
(decision 185). A version has reached an ordinal when it receives or received inputs up to it
and every generation of every identity that starts at or below it is completed; a generation
there that failed for good means it never will, until an operator replays or skips it.
Each version's Flow is built as its host pool builds it (``resolve_flow`` and a
``FlowContext``) and asked for its digest (``nexuscrm_sdk.flows.flow_digest``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping

from sqlalchemy.engine import Engine

from nexuscrm.connectors.v1 import connectors_pb2 as cn_pb
from nexuscrm.connectors.v1 import connectors_pb2_grpc as cn_grpc
from nexuscrm_sdk.flows import FlowContext, flow_digest, resolve_flow
from nexuscrm_wire import convert
from workqueue.values import Route

RPC_TIMEOUT = 30.0  # seconds per call
PAGE_SIZE = 500
NOT_DONE: tuple[cn_pb.WorkStatus, ...] = (
    cn_pb.WORK_STATUS_PENDING,
    cn_pb.WORK_STATUS_BLOCKED,
    cn_pb.WORK_STATUS_RETRY,
    cn_pb.WORK_STATUS_PROCESSING,
)

Digest = Callable[[str, int], str]


@dataclasses.dataclass(frozen=True, kw_only=True)
class VersionFlow:
    """A version's Flow as its host pool names it: a Flow reference and the pool's settings."""

    version: str
    reference: str
    settings: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def digest(self, *, pack_install_id: str, work_type: str, engine: Engine) -> Digest | None:
        """The Flow's digest, built as the host builds the pool's Flow; None when the Flow has none."""
        context = FlowContext(
            pack_install_id=pack_install_id,
            work_type=work_type,
            engine=engine,
            settings=self.settings,
            flow_version=self.version,
        )
        return flow_digest(resolve_flow(self.reference)(context))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Reach:
    """How far a version is from an ordinal: generations at or below it not done yet, and failed for good."""

    waiting: int
    failed: tuple[str, ...]


def input_routes(stub: cn_grpc.ConnectorsServiceStub, pack: str, work_type: str, source_version: str) -> list[Route]:
    """The identities whose inputs the versions project: the work type's, delivered with ``source_version``."""
    wanted = cn_pb.ProjectionRoute(work_type=work_type, companion_version=source_version)
    routes, token = [], ""
    while True:
        page = stub.ListIdentities(
            cn_pb.ListIdentitiesRequest(pack_install_id=pack, route=wanted, page_size=PAGE_SIZE, page_token=token),
            timeout=RPC_TIMEOUT,
        )
        routes += [convert.route_from_proto(identity.route) for identity in page.identities]
        token = page.next_page_token
        if not token:
            return routes


def reach(stub: cn_grpc.ConnectorsServiceStub, pack: str, route: Route, version: str, through: int) -> Reach:
    """Version ``version``'s generations of ``route``'s inputs starting at or below ``through`` not completed."""
    own = convert.route_to_proto(dataclasses.replace(route, companion_version=version))
    waiting = sum(1 for _ in _starting_by(stub, pack, own, through, NOT_DONE))
    failed = tuple(work.work_id for work in _starting_by(stub, pack, own, through, (cn_pb.WORK_STATUS_FAILED,)))
    return Reach(waiting=waiting, failed=failed)


def _starting_by(
    stub: cn_grpc.ConnectorsServiceStub,
    pack: str,
    route: cn_pb.ProjectionRoute,
    through: int,
    statuses: tuple[cn_pb.WorkStatus, ...],
) -> Iterator[cn_pb.WorkItem]:
    """The identity's generations in ``statuses`` whose range starts at or below ``through``."""
    for status in statuses:
        token = ""
        while True:
            request = cn_pb.ListGenerationsRequest(
                pack_install_id=pack, route=route, page_size=PAGE_SIZE, page_token=token, status=status
            )
            page = stub.ListGenerations(request, timeout=RPC_TIMEOUT)
            yield from (work for work in page.generations if (work.input_start_ordinal or work.lane_ordinal) <= through)
            token = page.next_page_token
            if not token:
                break
