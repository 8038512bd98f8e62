"""Every RPC of every service, called across namespaces over mutual TLS, on every backend.

The caller is the principal of its client certificate; requests name acme's packs, WorkIds,
fences and namespace. A globex caller is refused (PERMISSION_DENIED or NOT_FOUND) and no row
changes; the acme caller (or, for host- and schema-wide RPCs, the operator) gets through.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator

import grpc
import pytest
import sqlalchemy as sa
from google.protobuf.message import Message

from nexuscrm.connectors.v1 import connectors_pb2 as cn
from nexuscrm.controlplane.v1 import controlplane_pb2 as cp
from nexuscrm.integration.v1 import integration_pb2 as ig
from nexuscrm.schemacatalog.v1 import schema_catalog_pb2 as sc
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.servicer import registration as connectors_registration
from nexuscrm_controlplane.fences import add_override, arm_fence
from nexuscrm_controlplane.servicer import registration as controlplane_registration
from nexuscrm_integration.host import HostStatus
from nexuscrm_integration.servicer import registration as integration_registration
from nexuscrm_runtime.server import RunningServer, create_server
from nexuscrm_runtime.tls import open_channel
from nexuscrm_schema import tables
from nexuscrm_schema_catalog.servicer import registration as schema_catalog_registration
from nexuscrm_wire import convert
from tests.support.checksums import database_checksums
from tests.support.factories import delivery, install_pack, route
from tests.support.invariants import assert_invariants
from tests.support.pki import Pki

pytestmark = pytest.mark.database

REFUSED = {grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.NOT_FOUND}
TABLES = [t.name for t in tables.metadata.sorted_tables]


@dataclasses.dataclass(frozen=True)
class World:
    """acme's rows the requests name."""

    pack: str
    inactive_pack: str
    work_id: str
    lease_token: str
    done_work_id: str
    fence_id: str
    dead_work_id: str


def _world(engine: sa.Engine) -> World:
    connectors = Connectors(engine)
    pack = install_pack(engine, namespace="acme")
    connectors.ingest(pack, items=[delivery("done-1", lane="done")])
    done = connectors.claim("w-done", pack_install_ids=[pack])[0]
    connectors.complete(done.work.work_id, lease_token=done.lease_token)
    connectors.ingest(pack, items=[delivery("dead-1", lane="dead")])  # a dead letter for the bulk replay
    dead = connectors.claim("w-dead", pack_install_ids=[pack])[0]
    connectors.fail(dead.work.work_id, lease_token=dead.lease_token, error="boom", retryable=False)
    connectors.ingest(pack, items=[delivery("r-1"), delivery("r-2")])
    held = connectors.claim("w-held", pack_install_ids=[pack])[0]
    fence = arm_fence(engine, "acme", reason="security test")
    add_override(engine, fence.fence_id, pack)
    install_pack(engine, namespace="globex")
    return World(
        pack=pack,
        inactive_pack=install_pack(engine, namespace="acme", legacy_max_ordinal=None),
        work_id=held.work.work_id,
        lease_token=held.lease_token,
        done_work_id=done.work.work_id,
        fence_id=fence.fence_id,
        dead_work_id=dead.work.work_id,
    )


Build = Callable[[World], Message]
CONNECTORS = "nexuscrm.connectors.v1.ConnectorsService"
CONTROLPLANE = "nexuscrm.controlplane.v1.ControlplaneService"
CATALOG = "nexuscrm.schemacatalog.v1.SchemaCatalogService"
INTEGRATION = "nexuscrm.integration.v1.IntegrationService"

# Requests that name acme's rows or namespace: globex is refused, acme gets through.
NAMESPACED: dict[str, Build] = {
    f"{CONNECTORS}/Ingest": lambda w: cn.IngestRequest(
        pack_install_id=w.pack, items=[convert.item_to_proto(delivery("r-3"))]
    ),
    f"{CONNECTORS}/Replay": lambda w: cn.ReplayRequest(work_id=w.done_work_id),
    f"{CONNECTORS}/Claim": lambda w: cn.ClaimRequest(worker_id="w", pack_install_ids=[w.pack]),
    f"{CONNECTORS}/LoadInputs": lambda w: cn.LoadInputsRequest(work_id=w.work_id, lease_token=w.lease_token),
    f"{CONNECTORS}/LoadReplayedInputs": lambda w: cn.LoadReplayedInputsRequest(
        work_id=w.work_id, lease_token=w.lease_token
    ),
    f"{CONNECTORS}/Heartbeat": lambda w: cn.HeartbeatRequest(work_id=w.work_id, lease_token=w.lease_token),
    f"{CONNECTORS}/Complete": lambda w: cn.CompleteRequest(work_id=w.work_id, lease_token=w.lease_token),
    f"{CONNECTORS}/Fail": lambda w: cn.FailRequest(work_id=w.work_id, lease_token=w.lease_token, error="x"),
    f"{CONNECTORS}/GetWork": lambda w: cn.GetWorkRequest(work_id=w.work_id),
    f"{CONNECTORS}/ExplainReceipt": lambda w: cn.ExplainReceiptRequest(pack_install_id=w.pack, receipt_key="r-1"),
    f"{CONNECTORS}/ListReceipts": lambda w: cn.ListReceiptsRequest(state="stored", pack_install_id=w.pack),
    f"{CONNECTORS}/GetQueueState": lambda w: cn.GetQueueStateRequest(pack_install_id=w.pack),
    f"{CONNECTORS}/WaitQueueDrained": lambda w: cn.WaitQueueDrainedRequest(pack_install_id=w.pack),
    f"{CONNECTORS}/ListGenerations": lambda w: cn.ListGenerationsRequest(
        pack_install_id=w.pack, route=convert.route_to_proto(route())
    ),
    f"{CONNECTORS}/ListGenerations (pack)": lambda w: cn.ListGenerationsRequest(pack_install_id=w.pack),
    f"{CONNECTORS}/ListMembers": lambda w: cn.ListMembersRequest(work_id=w.work_id),
    f"{CONNECTORS}/SetRetentionPolicy": lambda w: cn.SetRetentionPolicyRequest(pack_install_id=w.pack, keep_seconds=60),
    f"{CONNECTORS}/GetRetentionPolicy": lambda w: cn.GetRetentionPolicyRequest(pack_install_id=w.pack),
    f"{CONNECTORS}/Prune": lambda w: cn.PruneRequest(pack_install_id=w.pack, dry_run=True),
    f"{CONNECTORS}/PauseClaims": lambda w: cn.PauseClaimsRequest(
        scope=cn.ClaimScope(pack_install_id=w.pack, scope=cn.PAUSE_SCOPE_PACK), paused_by="ops", reason="test"
    ),
    f"{CONNECTORS}/ResumeClaims": lambda w: cn.ResumeClaimsRequest(
        scope=cn.ClaimScope(pack_install_id=w.pack, scope=cn.PAUSE_SCOPE_PACK), resumed_by="ops"
    ),
    f"{CONNECTORS}/ListClaimPauses": lambda w: cn.ListClaimPausesRequest(pack_install_id=w.pack),
    f"{CONNECTORS}/ListDeadLetters": lambda w: cn.ListDeadLettersRequest(
        filter=cn.DeadLetterFilter(pack_install_id=w.pack)
    ),
    f"{CONNECTORS}/CountDeadLetters": lambda w: cn.CountDeadLettersRequest(
        filter=cn.DeadLetterFilter(pack_install_id=w.pack)
    ),
    f"{CONNECTORS}/ReplayDeadLetters": lambda w: cn.ReplayDeadLettersRequest(
        filter=cn.DeadLetterFilter(pack_install_id=w.pack)
    ),
    f"{CONNECTORS}/SetOrderPolicy": lambda w: cn.SetOrderPolicyRequest(
        pack_install_id=w.pack, policy=cn.ORDER_POLICY_KIND_BLOCK, set_by="ops", reason="test"
    ),
    f"{CONNECTORS}/GetOrderPolicy": lambda w: cn.GetOrderPolicyRequest(pack_install_id=w.pack),
    f"{CONNECTORS}/SkipDeadLetter": lambda w: cn.SkipDeadLetterRequest(
        work_id=w.dead_work_id, skipped_by="ops", reason="test"
    ),
    f"{CONNECTORS}/SkipDeadLetters": lambda w: cn.SkipDeadLettersRequest(
        filter=cn.DeadLetterFilter(pack_install_id=w.pack), skipped_by="ops", reason="test", dry_run=True
    ),
    f"{CONNECTORS}/GetCoverage": lambda w: cn.GetCoverageRequest(pack_install_id=w.pack),
    f"{CONNECTORS}/SetRetryPolicy": lambda w: cn.SetRetryPolicyRequest(
        pack_install_id=w.pack, work_type="project", max_attempts=3, set_by="ops", reason="test"
    ),
    f"{CONNECTORS}/GetRetryPolicy": lambda w: cn.GetRetryPolicyRequest(pack_install_id=w.pack),
    f"{CONNECTORS}/RetryNow": lambda w: cn.RetryNowRequest(work_id=w.work_id, retried_by="ops", reason="test"),
    f"{CONNECTORS}/ListIdentities": lambda w: cn.ListIdentitiesRequest(pack_install_id=w.pack),
    f"{CONNECTORS}/BuildFlowVersion": lambda w: cn.BuildFlowVersionRequest(
        pack_install_id=w.pack, work_type="project", version="crm-2.0", started_by="ops", reason="test"
    ),
    f"{CONNECTORS}/ListFlowVersions": lambda w: cn.ListFlowVersionsRequest(pack_install_id=w.pack),
    f"{CONNECTORS}/SwitchFlowVersion": lambda w: cn.SwitchFlowVersionRequest(
        pack_install_id=w.pack, work_type="project", version="crm-2.0", switched_by="ops", reason="test"
    ),
    f"{CONNECTORS}/RollbackFlowVersion": lambda w: cn.RollbackFlowVersionRequest(
        pack_install_id=w.pack, work_type="project", rolled_back_by="ops", reason="test"
    ),
    f"{CONNECTORS}/RetireFlowVersion": lambda w: cn.RetireFlowVersionRequest(
        pack_install_id=w.pack, work_type="project", version="crm-1.0", retired_by="ops", reason="test"
    ),
    f"{CONNECTORS}/RecordFlowVersionVerification": lambda w: cn.RecordFlowVersionVerificationRequest(
        pack_install_id=w.pack,
        work_type="project",
        version="crm-2.0",
        against_version="crm-1.0",
        through_ordinal=1,
        verdict=cn.FLOW_VERSION_VERDICT_EQUAL,
        verified_by="ops",
    ),
    f"{CONTROLPLANE}/InstallPack": lambda w: cp.InstallPackRequest(namespace="acme", pack_name="crm", pack_version="2"),
    f"{CONTROLPLANE}/ActivatePack": lambda w: cp.ActivatePackRequest(pack_install_id=w.inactive_pack),
    f"{CONTROLPLANE}/GetProtocol": lambda w: cp.GetProtocolRequest(pack_install_id=w.pack),
    f"{CONTROLPLANE}/GetPack": lambda w: cp.GetPackRequest(pack_install_id=w.pack),
    f"{CONTROLPLANE}/FindPacks": lambda w: cp.FindPacksRequest(namespace="acme", pack_name="crm", pack_version="1.0"),
    f"{CONTROLPLANE}/ListPacks": lambda w: cp.ListPacksRequest(namespace="acme"),
    f"{CONTROLPLANE}/DisarmFence (short id)": lambda w: cp.DisarmFenceRequest(fence_id=w.fence_id[:8]),
    f"{CONTROLPLANE}/ArmFence": lambda w: cp.ArmFenceRequest(namespace="acme", scope=w.pack),
    f"{CONTROLPLANE}/DisarmFence": lambda w: cp.DisarmFenceRequest(fence_id=w.fence_id),
    f"{CONTROLPLANE}/ListFences": lambda w: cp.ListFencesRequest(namespace="acme"),
    f"{CONTROLPLANE}/AddFenceOverride": lambda w: cp.AddFenceOverrideRequest(
        fence_id=w.fence_id, pack_install_id=w.inactive_pack
    ),
    f"{CONTROLPLANE}/RemoveFenceOverride": lambda w: cp.RemoveFenceOverrideRequest(
        fence_id=w.fence_id, pack_install_id=w.pack
    ),
    f"{CONTROLPLANE}/GetDrainStatus": lambda w: cp.GetDrainStatusRequest(pack_install_id=w.pack),
    f"{CONTROLPLANE}/AuditCutover": lambda w: cp.AuditCutoverRequest(pack_install_id=w.pack),
    f"{CONTROLPLANE}/Cutover": lambda w: cp.CutoverRequest(pack_install_id=w.pack),
}
# Requests over every namespace: a one-namespace caller is refused, the operator gets through.
SPANNING: dict[str, Build] = {
    f"{CATALOG}/ApplySchema": lambda w: sc.ApplySchemaRequest(),
    f"{CATALOG}/ContractPayloads": lambda w: sc.ContractPayloadsRequest(),
    f"{INTEGRATION}/GetActivation": lambda w: ig.GetActivationRequest(),
    f"{INTEGRATION}/ListWorkers": lambda w: ig.ListWorkersRequest(),
    f"{CONNECTORS}/Claim (every pack)": lambda w: cn.ClaimRequest(worker_id="w"),
    f"{CONNECTORS}/ListReceipts (every pack)": lambda w: cn.ListReceiptsRequest(state="stored"),
    f"{CONTROLPLANE}/ListPacks (every namespace)": lambda w: cp.ListPacksRequest(),
}
# Reads of the schema's shape and of what each service is: any principal of the policy.
OPEN: dict[str, Build] = {
    f"{CATALOG}/DescribeSchema": lambda w: sc.DescribeSchemaRequest(),
    f"{CATALOG}/VerifySchema": lambda w: sc.VerifySchemaRequest(feature="native_projection"),
    f"{CATALOG}/GetBuildInfo": lambda w: sc.GetBuildInfoRequest(),
    f"{CONNECTORS}/GetBuildInfo": lambda w: cn.GetBuildInfoRequest(),
    f"{CONTROLPLANE}/GetBuildInfo": lambda w: cp.GetBuildInfoRequest(),
    f"{INTEGRATION}/GetBuildInfo": lambda w: ig.GetBuildInfoRequest(),
}
ALL = {**NAMESPACED, **SPANNING, **OPEN}


# The owner's requests the world cannot satisfy, and the service's own answer to each: that exact
# status shows the call passed authorization and reached the domain code. Every other owner's
# request succeeds.
def _no_versions(w: World) -> tuple[grpc.StatusCode, str]:
    return grpc.StatusCode.NOT_FOUND, f"work type 'project' of pack {w.pack} has no Flow versions"


DOMAIN_REFUSALS: dict[str, Callable[[World], tuple[grpc.StatusCode, str]]] = {
    f"{CONNECTORS}/SwitchFlowVersion": _no_versions,
    f"{CONNECTORS}/RollbackFlowVersion": _no_versions,
    f"{CONNECTORS}/RetireFlowVersion": _no_versions,
    f"{CONNECTORS}/RecordFlowVersionVerification": _no_versions,
    f"{CONNECTORS}/RetryNow": lambda w: (
        grpc.StatusCode.FAILED_PRECONDITION,
        f"work {w.work_id} is processing; only a generation waiting in retry can be retried now",
    ),
    f"{CONNECTORS}/ResumeClaims": lambda w: (grpc.StatusCode.FAILED_PRECONDITION, f"pack {w.pack} is not paused"),
    f"{CONNECTORS}/LoadReplayedInputs": lambda w: (
        grpc.StatusCode.FAILED_PRECONDITION,
        f"work {w.work_id} is not a replay: its inputs are all its own (LoadInputs)",
    ),
}
STREAMS = ("/LoadInputs", "/LoadReplayedInputs")  # server-streaming methods: read to the end


@pytest.fixture
def secure_server(engine: sa.Engine, pki: Pki) -> Iterator[tuple[RunningServer, World]]:
    world = _world(engine)
    registrations = [
        schema_catalog_registration(engine),
        connectors_registration(Connectors(engine)),
        controlplane_registration(engine),
        integration_registration(HostStatus([world.pack])),
    ]
    running = create_server(registrations, "127.0.0.1:0", security=pki.security())
    yield running, world
    running.stop(0)


def _call(running: RunningServer, pki: Pki, caller: str, name: str, request: Message) -> None:
    """Call method ``name`` (a key of ``ALL``) as ``caller``; raises ``grpc.RpcError`` on refusal."""
    path = "/" + name.split(" ")[0]
    with open_channel(f"127.0.0.1:{running.port}", pki.tls(caller)) as channel:
        method = channel.unary_stream if path.endswith(STREAMS) else channel.unary_unary
        call = method(path, request_serializer=lambda m: m.SerializeToString(), response_deserializer=lambda b: b)
        response = call(request, timeout=30)
        if path.endswith(STREAMS):
            list(response)


def _checksums(engine: sa.Engine) -> object:
    with engine.connect() as connection:
        return database_checksums(connection, TABLES)


def _refused(server: tuple[RunningServer, World], engine: sa.Engine, pki: Pki, caller: str, name: str) -> grpc.RpcError:
    """The refusal of ``caller``'s call of ``name`` (from ``ALL``), after checking it changed no row."""
    running, world = server
    before = _checksums(engine)
    with pytest.raises(grpc.RpcError) as refused:
        _call(running, pki, caller, name, ALL[name](world))
    assert _checksums(engine) == before
    return refused.value


def test_the_tables_cover_every_rpc_of_every_service() -> None:
    names = {name.split(" ")[0] for name in ALL}
    described = {
        f"{service.full_name}/{method.name}"
        for module in (cn, cp, ig, sc)
        for service in module.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    assert names == described


@pytest.mark.parametrize("name", sorted(NAMESPACED))
def test_a_caller_of_another_namespace_is_refused_and_changes_nothing(
    secure_server: tuple[RunningServer, World], engine: sa.Engine, pki: Pki, name: str
) -> None:
    refused = _refused(secure_server, engine, pki, "globex", name)
    assert refused.code() in REFUSED, refused.details()
    assert "may not act in namespace" in refused.details() or "not found" in refused.details()
    assert "globex" not in refused.details()  # the caller's principal is never named back
    assert_invariants(engine)


@pytest.mark.parametrize("name", sorted(NAMESPACED))
def test_the_owner_of_the_namespace_gets_through(
    secure_server: tuple[RunningServer, World], engine: sa.Engine, pki: Pki, name: str
) -> None:
    running, world = secure_server
    if name in DOMAIN_REFUSALS:
        with pytest.raises(grpc.RpcError) as refused:
            _call(running, pki, "acme", name, NAMESPACED[name](world))
        code, details = DOMAIN_REFUSALS[name](world)
        assert (refused.value.code(), refused.value.details()) == (code, details)
    else:
        _call(running, pki, "acme", name, NAMESPACED[name](world))
    assert_invariants(engine)


@pytest.mark.parametrize("name", sorted(SPANNING))
def test_operations_over_every_namespace_need_the_star(
    secure_server: tuple[RunningServer, World], engine: sa.Engine, pki: Pki, name: str
) -> None:
    refused = _refused(secure_server, engine, pki, "acme", name)
    assert refused.code() is grpc.StatusCode.PERMISSION_DENIED
    assert "'*'" in refused.details()
    running, world = secure_server
    _call(running, pki, "operator", name, SPANNING[name](world))
    assert_invariants(engine)


@pytest.mark.parametrize("name", sorted(ALL))
def test_a_certificate_the_policy_does_not_know_is_refused(
    secure_server: tuple[RunningServer, World], engine: sa.Engine, pki: Pki, name: str
) -> None:
    refused = _refused(secure_server, engine, pki, "stranger", name)
    assert refused.code() is grpc.StatusCode.PERMISSION_DENIED
    assert refused.details() == "the client certificate is not admitted by the authorization policy"


def test_schema_reads_are_open_to_every_known_principal(secure_server: tuple[RunningServer, World], pki: Pki) -> None:
    running, world = secure_server
    for name, build in OPEN.items():
        _call(running, pki, "globex", name, build(world))


@pytest.mark.parametrize(
    "channel_of",
    [
        pytest.param(lambda address, pki: grpc.insecure_channel(address), id="plaintext"),
        pytest.param(
            lambda address, pki: grpc.secure_channel(address, grpc.ssl_channel_credentials(pki.tls("acme").ca)),
            id="no client certificate",
        ),
        pytest.param(lambda address, pki: open_channel(address, pki.tls("impostor")), id="certificate of another CA"),
    ],
)
def test_a_client_without_a_valid_certificate_is_refused(
    secure_server: tuple[RunningServer, World],
    engine: sa.Engine,
    pki: Pki,
    channel_of: Callable[[str, Pki], grpc.Channel],
) -> None:
    running, world = secure_server
    before = _checksums(engine)
    with channel_of(f"127.0.0.1:{running.port}", pki) as channel:
        ingest = channel.unary_unary(
            f"/{CONNECTORS}/Ingest", request_serializer=lambda m: m.SerializeToString(), response_deserializer=bytes
        )
        with pytest.raises(grpc.RpcError) as refused:
            ingest(NAMESPACED[f"{CONNECTORS}/Ingest"](world), timeout=5)
    assert refused.value.code() is grpc.StatusCode.UNAVAILABLE  # the handshake fails: no RPC ran
    assert _checksums(engine) == before


def test_an_operator_act_records_the_certificate_s_principal_before_the_declared_name(
    secure_server: tuple[RunningServer, World], engine: sa.Engine, pki: Pki
) -> None:
    running, world = secure_server
    pause = cn.PauseClaimsRequest(
        scope=cn.ClaimScope(pack_install_id=world.pack, scope=cn.PAUSE_SCOPE_PACK), paused_by="alice", reason="r"
    )
    _call(running, pki, "acme", f"{CONNECTORS}/PauseClaims", pause)
    skip = cn.SkipDeadLetterRequest(work_id=world.dead_work_id, skipped_by="", reason="r")
    _call(running, pki, "acme", f"{CONNECTORS}/SkipDeadLetter", skip)
    policy = cn.SetOrderPolicyRequest(
        pack_install_id=world.pack, policy=cn.ORDER_POLICY_KIND_BLOCK, set_by="acme", reason="r"
    )
    _call(running, pki, "acme", f"{CONNECTORS}/SetOrderPolicy", policy)
    with engine.connect() as connection:
        assert connection.execute(sa.select(tables.ClaimPause.c.PausedBy)).scalars().all() == ["acme (alice)"]
        assert connection.execute(sa.select(tables.SkippedWork.c.SkippedBy)).scalars().all() == ["acme"]
        assert connection.execute(sa.select(tables.OrderPolicy.c.SetBy)).scalars().all() == ["acme"]
    assert_invariants(engine)
