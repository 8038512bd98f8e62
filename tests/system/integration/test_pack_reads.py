"""GetPack and FindPacks over gRPC on every backend: a pack's incarnation, counter and protocol state, found by name."""

from __future__ import annotations

from collections.abc import Iterator

import grpc
import pytest
import sqlalchemy as sa

from nexuscrm.controlplane.v1 import controlplane_pb2 as pb
from nexuscrm.controlplane.v1 import controlplane_pb2_grpc as pb_grpc
from nexuscrm_connectors.facade import Connectors
from nexuscrm_controlplane.servicer import registration
from nexuscrm_runtime.server import create_server
from tests.support.checksums import database_digest
from tests.support.factories import FakeClock, delivery, install_pack
from tests.support.invariants import assert_invariants
from tests.support.statuses import violation_field

pytestmark = pytest.mark.database


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def stub(engine: sa.Engine, clock: FakeClock) -> Iterator[pb_grpc.ControlplaneServiceStub]:
    running = create_server([registration(engine, clock)], "127.0.0.1:0")
    with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
        yield pb_grpc.ControlplaneServiceStub(channel)
    running.stop(0)


def test_get_pack_reports_the_counter_and_the_protocol_state(
    engine: sa.Engine, stub: pb_grpc.ControlplaneServiceStub
) -> None:
    installed = stub.InstallPack(
        pb.InstallPackRequest(namespace="acme", pack_name="contacts", pack_version="1.0"), timeout=30
    ).pack
    fresh = stub.GetPack(pb.GetPackRequest(pack_install_id=installed.pack_install_id), timeout=30)
    assert fresh.pack == installed and fresh.protocol_state == "none" and not fresh.HasField("protocol")

    stub.ActivatePack(pb.ActivatePackRequest(pack_install_id=installed.pack_install_id), timeout=30)
    Connectors(engine).ingest(installed.pack_install_id, items=[delivery(), delivery(lane="b")])
    active = stub.GetPack(pb.GetPackRequest(pack_install_id=installed.pack_install_id), timeout=30)
    assert active.protocol_state == "greenfield" and active.protocol.legacy_max_ordinal == 0
    assert active.pack.last_ordinal == 2  # the ordinal counter: the last ordinal allocated

    cut_over = install_pack(engine, legacy_max_ordinal=7, last_ordinal=7)
    described = stub.GetPack(pb.GetPackRequest(pack_install_id=cut_over), timeout=30)
    assert (described.protocol_state, described.protocol.legacy_max_ordinal, described.pack.last_ordinal) == (
        "cutover",
        7,
        7,
    )
    assert_invariants(engine)


def test_find_packs_lists_every_incarnation_of_a_name_newest_first(
    stub: pb_grpc.ControlplaneServiceStub, clock: FakeClock
) -> None:
    def install(namespace: str, version: str) -> str:
        request = pb.InstallPackRequest(namespace=namespace, pack_name="contacts", pack_version=version)
        pack_id: str = stub.InstallPack(request, timeout=30).pack.pack_install_id
        clock.advance(1)
        return pack_id

    first, reinstalled = install("acme", "1.0"), install("acme", "1.0")
    install("acme", "2.0")
    install("globex", "1.0")

    def found(namespace: str, name: str, version: str) -> list[str]:
        request = pb.FindPacksRequest(namespace=namespace, pack_name=name, pack_version=version)
        return [p.pack_install_id for p in stub.FindPacks(request, timeout=30).packs]

    assert found("acme", "contacts", "1.0") == [reinstalled, first]
    assert found("acme", "contacts", "3.0") == [] and found("acme", "Contacts", "1.0") == []  # exact, byte for byte


def test_bad_input_is_refused_naming_the_field_and_unknown_packs_are_not_found(
    engine: sa.Engine, stub: pb_grpc.ControlplaneServiceStub
) -> None:
    install_pack(engine)
    with engine.connect() as connection:
        before = database_digest(connection)
    invalid, missing = grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND
    cases = [
        (stub.GetPack, pb.GetPackRequest(), invalid, "pack_install_id"),
        (stub.GetPack, pb.GetPackRequest(pack_install_id="p" * 10_000), invalid, "pack_install_id"),
        (stub.GetPack, pb.GetPackRequest(pack_install_id="pk-nope"), missing, "pack_install_id"),
        (stub.FindPacks, pb.FindPacksRequest(namespace="acme", pack_version="1.0"), invalid, "pack_name"),
        (stub.FindPacks, pb.FindPacksRequest(namespace="acme", pack_name="crm"), invalid, "pack_version"),
        (stub.FindPacks, pb.FindPacksRequest(namespace="*", pack_name="crm", pack_version="1"), invalid, "namespace"),
        (
            stub.FindPacks,
            pb.FindPacksRequest(namespace="acme", pack_name="c" * 129, pack_version="1.0"),
            invalid,
            "pack_name",
        ),
        (
            stub.FindPacks,
            pb.FindPacksRequest(namespace="acme", pack_name="crm", pack_version="v" * 65),
            invalid,
            "pack_version",
        ),
    ]
    for call, request, code, field in cases:
        with pytest.raises(grpc.RpcError) as raised:
            call(request, timeout=30)
        error = raised.value
        assert (error.code(), violation_field(error)) == (code, field), error.details()
        assert len(error.details() or "") < 2000
    with engine.connect() as connection:
        assert database_digest(connection) == before
