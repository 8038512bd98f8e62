"""The four services as processes: configuration refusals, reloads without a restart, bounded shutdown."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import pytest
import sqlalchemy as sa
from cryptography.x509.oid import ExtendedKeyUsageOID

from nexuscrm.connectors.v1 import connectors_pb2 as cn
from nexuscrm.connectors.v1.connectors_pb2_grpc import ConnectorsServiceStub as ConnectorsStub
from nexuscrm_runtime.config import EXIT_CONFIG
from nexuscrm_runtime.server import EXIT_NOT_STOPPED, SHUTDOWN_MARGIN
from nexuscrm_runtime.tls import TlsFiles, open_channel
from nexuscrm_schema import tables
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_tools.launcher import ALL_SERVICES, CONNECTORS, CONTROLPLANE, ServiceSpec, start_service, stop_services
from tests.support.factories import delivery, install_pack
from tests.support.invariants import assert_invariants
from tests.support.pki import TOKENS, Pki, identity
from tests.support.waiting import wait_until

pytestmark = pytest.mark.acceptance

POOLS = [{"pack_install_id": "pk-any", "work_type": "project-contacts", "flow": "demo-contacts", "size": 1}]


def _broken_policy(pki_env: dict[str, str], tmp_path: Path, problem: str) -> dict[str, str]:
    """The server settings with ``problem``; returns the environment."""
    policy = tmp_path / "policy.json"
    shutil.copy(pki_env["NEXUSCRM_AUTHZ_POLICY"], policy)
    env = {**pki_env, "NEXUSCRM_AUTHZ_POLICY": str(policy)}
    if problem == "group-writable policy":
        policy.chmod(0o664)
    elif problem == "world-writable policy":
        policy.chmod(0o646)
    elif problem == "malformed policy":
        policy.write_text(json.dumps({"principals": [{"name": "x", "namespaces": []}]}))
    elif problem == "policy identity with a NUL":
        document = json.loads(policy.read_text())
        document["principals"][0]["certificate_identities"] = ["ops\u0000.acme"]
        policy.write_text(json.dumps(document))
    elif problem == "policy without TLS":
        env = {"NEXUSCRM_AUTHZ_POLICY": str(policy)}
    return env


REFUSALS = {
    "group-writable policy": "its group or others may write (mode 664)",
    "world-writable policy": "its group or others may write (mode 646)",
    "malformed policy": "principals[0]: namespaces must not be empty",
    "policy identity with a NUL": "NUL, control or non-printable",
    "policy without TLS": "needs mutual TLS",
}


# Every problem on one service, and one problem on every service (they share the start-up path).
CASES = [(CONNECTORS, problem) for problem in sorted(REFUSALS)] + [
    (spec, "group-writable policy") for spec in ALL_SERVICES if spec is not CONNECTORS
]


@pytest.mark.parametrize(("spec", "problem"), CASES, ids=[f"{spec.name}-{problem}" for spec, problem in CASES])
def test_a_configuration_refusal_is_one_line_and_exit_code_2(
    pki: Pki, tmp_path: Path, spec: ServiceSpec, problem: str
) -> None:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("NEXUSCRM_")},
        **_broken_policy(pki.server_env(), tmp_path, problem),
        "NEXUSCRM_DSN": f"sqlite:///{tmp_path / 'db.sqlite'}",
        f"NEXUSCRM_{spec.env_name}_ADDRESS": "127.0.0.1:0",
        "NEXUSCRM_INTEGRATION_POOLS": json.dumps(POOLS),
    }
    done = subprocess.run(
        [sys.executable, "-m", spec.module], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == EXIT_CONFIG, done.stderr
    assert len(lines) == 1 and "configuration refused" in lines[0] and REFUSALS[problem] in lines[0], lines


class _Load:
    """Ingests one delivery after another over one channel until stopped; records each call's code."""

    def __init__(self, address: str, tls: TlsFiles, pack: str) -> None:
        self.codes: list[grpc.StatusCode] = []
        self.acknowledged: list[str] = []
        self._stop = threading.Event()
        self._channel = open_channel(address, tls)
        self._client = ConnectorsClient(self._channel)
        self._pack = pack
        self._thread = threading.Thread(target=self._run, name="load", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for n in itertools.count():
            if self._stop.is_set():
                return
            key = f"load-{n}"
            try:
                self._client.ingest(self._pack, items=[delivery(key, lane=f"lane-{n % 8}")])
            except grpc.RpcError as error:
                self.codes.append(error.code())
            else:
                self.codes.append(grpc.StatusCode.OK)
                self.acknowledged.append(key)

    def refused(self) -> bool:
        """True once a call of this load was refused."""
        return grpc.StatusCode.PERMISSION_DENIED in self.codes

    def stop(self) -> None:
        """Stop calling and close the channel."""
        self._stop.set()
        self._thread.join()
        self._channel.close()


def _write_policy(path: Path, acme_identities: list[str] | None, pki: Pki) -> None:
    """The test policy, with acme's identities replaced (None: acme removed); atomically."""
    document = json.loads(pki.policy_path.read_text())
    principals = [p for p in document["principals"] if p["name"] != "acme" or acme_identities is not None]
    for principal in principals:
        if principal["name"] == "acme":
            principal["certificate_identities"] = acme_identities
    partial = path.with_suffix(".partial")
    partial.write_text(json.dumps({"principals": principals}))
    partial.chmod(0o600)
    os.replace(partial, path)


def _ingest(address: str, tls: TlsFiles, pack: str, key: str) -> grpc.StatusCode:
    with open_channel(address, tls) as channel:
        try:
            ConnectorsClient(channel).ingest(pack, items=[delivery(key)])
        except grpc.RpcError as error:
            return error.code()
    return grpc.StatusCode.OK


def _server_certificate(port: int, client: TlsFiles) -> bytes:
    """The certificate the server presents to a new connection (DER)."""
    context = ssl.create_default_context(cadata=client.ca.decode())
    context.load_cert_chain(client.cert_path, client.key_path)
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="localhost") as tls,
    ):
        certificate = tls.getpeercert(binary_form=True)
    assert certificate is not None
    return certificate


@pytest.mark.database
def test_certificates_and_policy_reload_on_sighup_under_load(
    dsn: str, engine: sa.Engine, pki: Pki, tmp_path: Path
) -> None:
    pack = install_pack(engine, namespace="acme")
    policy, server_cert, server_key = tmp_path / "policy.json", tmp_path / "server.pem", tmp_path / "server.key"
    _write_policy(policy, [identity("acme")], pki)
    shutil.copy(pki.env("services")["NEXUSCRM_TLS_CERT"], server_cert)
    shutil.copy(pki.env("services")["NEXUSCRM_TLS_KEY"], server_key)
    env = {
        **pki.server_env(),
        "NEXUSCRM_TLS_CERT": str(server_cert),
        "NEXUSCRM_TLS_KEY": str(server_key),
        "NEXUSCRM_AUTHZ_POLICY": str(policy),
        "NEXUSCRM_DSN": dsn,
    }
    service = start_service(CONNECTORS, env=env, workdir=tmp_path)
    try:
        load = _Load(service.address, pki.tls("acme"), pack)
        wait_until(lambda: len(load.acknowledged) >= 5, "the load to run")
        # The tenant's certificate is rotated to a new identity: the policy lists both, then the new one only.
        rotated = pki.tls_of(pki.issuer().issue(dns=["acme-2027.nexuscrm.test"]), "acme-rotated")
        assert _ingest(service.address, rotated, pack, "rotated-0") is grpc.StatusCode.PERMISSION_DENIED
        _write_policy(policy, [identity("acme"), "acme-2027.nexuscrm.test"], pki)
        service.process.send_signal(signal.SIGHUP)
        wait_until(
            lambda: _ingest(service.address, rotated, pack, "rotated-1") is grpc.StatusCode.OK,
            "the rotated certificate to be admitted",
        )
        # The server's own certificate is rotated too: new handshakes present the new one.
        before = _server_certificate(service.port, rotated)
        renewed = pki.issuer().issue(
            dns=[identity("services"), "localhost"],
            ips=["127.0.0.1"],
            usages=[ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
        )
        server_key.write_bytes(renewed.key)
        server_cert.write_bytes(renewed.cert)
        service.process.send_signal(signal.SIGHUP)
        wait_until(lambda: _server_certificate(service.port, rotated) != before, "the new server certificate")
        assert _ingest(service.address, rotated, pack, "rotated-2") is grpc.StatusCode.OK
        assert set(load.codes) == {grpc.StatusCode.OK}, "a call failed while certificates were rotated"
        # The old identity is withdrawn: the tenant's next call on its open channel is refused.
        _write_policy(policy, None, pki)
        service.process.send_signal(signal.SIGHUP)
        wait_until(load.refused, "the removed principal's call to be refused")
        refused_at = load.codes.index(grpc.StatusCode.PERMISSION_DENIED)
        wait_until(lambda: len(load.codes) > refused_at + 3, "more calls after the refusal")
        load.stop()
        assert set(load.codes[refused_at:]) == {grpc.StatusCode.PERMISSION_DENIED}
        assert _ingest(service.address, rotated, pack, "rotated-3") is grpc.StatusCode.PERMISSION_DENIED
        # A reload that is refused (a group-writable policy) keeps the policy in force.
        _write_policy(policy, ["acme-2027.nexuscrm.test"], pki)
        policy.chmod(0o664)
        service.process.send_signal(signal.SIGHUP)
        wait_until(lambda: "reload refused" in service.log_path.read_text(), "the refused reload to be logged")
        assert _ingest(service.address, rotated, pack, "rotated-4") is grpc.StatusCode.PERMISSION_DENIED
    finally:
        codes = stop_services([service])
    assert codes == {CONNECTORS.name: 0}
    with engine.connect() as connection:
        keys = set(connection.execute(sa.select(tables.Event.c.ReceiptKey)).scalars())
    assert set(load.acknowledged) | {"rotated-1", "rotated-2"} <= keys  # nothing acknowledged was lost
    assert_invariants(engine)


GRACE = 2  # seconds: NEXUSCRM_GRACE_SECONDS of the services under test
STREAMED_INPUTS = 200  # inputs of one generation, 8 KiB each: more than the stream's flow-control window


@pytest.mark.database
def test_sigterm_ends_every_service_within_its_grace_period_plus_the_margin(
    dsn: str, engine: sa.Engine, pki: Pki, tmp_path: Path
) -> None:
    pack = install_pack(engine, namespace="acme")
    idle = install_pack(engine, namespace="acme")
    env = {
        **pki.server_env(),
        "NEXUSCRM_DSN": dsn,
        "NEXUSCRM_GRACE_SECONDS": str(GRACE),
        "NEXUSCRM_DASHBOARD_ADDRESS": "127.0.0.1:0",
        "NEXUSCRM_CONNECTORS_METRICS_ADDRESS": "127.0.0.1:0",
        "NEXUSCRM_CONTROLPLANE_METRICS_ADDRESS": "127.0.0.1:0",
    }
    services = [start_service(CONNECTORS, env=env, workdir=tmp_path)]
    env["NEXUSCRM_CONNECTORS_TARGET"] = services[0].address
    services.append(start_service(CONTROLPLANE, env=env, workdir=tmp_path))
    connectors, controlplane = services
    held: list[object] = []
    try:
        channel = open_channel(connectors.address, pki.tls("acme"))
        held.append(channel)
        client = ConnectorsClient(channel)
        client.ingest(pack, items=[delivery(f"s-{i}", payload=os.urandom(8192)) for i in range(STREAMED_INPUTS)])
        claim = client.claim("streamer", pack_install_ids=[pack])[0]
        stream = client.load_inputs(claim.work.work_id, lease_token=claim.lease_token, page_size=1)
        next(stream)  # the rest stays in flight: the server blocks on the full window
        held.append(stream)
        # A long-polling Claim on a pack without work, in flight when SIGTERM comes.
        waiting = ConnectorsStub(channel).Claim.future(
            cn.ClaimRequest(worker_id="poller", pack_install_ids=[idle], wait_ms=20_000), timeout=60
        )
        held.append(waiting)
        client.get_work(claim.work.work_id)  # the poll was sent on this channel before this call
        # The dashboard: a request whose headers never end, and connections that never say anything.
        dashboard, metrics = controlplane.side_port("dashboard"), controlplane.side_port("metrics")
        assert dashboard is not None and metrics is not None
        context = ssl.create_default_context(cafile=pki.env("operator")["NEXUSCRM_TLS_CA"])
        slow = context.wrap_socket(socket.create_connection(("127.0.0.1", dashboard)), server_hostname="127.0.0.1")
        slow.sendall(
            f"GET /api/overview HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKENS['operator']}\r\n".encode()
        )
        held.append(slow)
        for port in (dashboard, metrics, connectors.side_port("metrics")):
            assert port is not None
            held.append(socket.create_connection(("127.0.0.1", port)))
        for service in services:
            service.process.send_signal(signal.SIGTERM)
        bound = GRACE + SHUTDOWN_MARGIN
        codes = {s.spec.name: s.process.wait(timeout=bound) for s in services}  # TimeoutExpired fails the test
        assert codes == {CONNECTORS.name: 0, CONTROLPLANE.name: 0}, codes
    finally:
        stop_services(services)
        for resource in held:
            close = getattr(resource, "close", None) or getattr(resource, "cancel", None)
            if close is not None:
                close()
    logs = "".join(s.log_path.read_text() for s in services)
    assert "did not stop within" not in logs and "stopped" in logs


STUCK = """
import threading
from nexuscrm_runtime.server import Signals
signals = Signals(deadline=1.0)
threading.Thread(target=threading.Event().wait, name="stuck handler").start()  # never ends, not a daemon
print("ready", flush=True)
signals.wait()
"""


def test_a_service_stuck_in_its_shutdown_is_ended_at_its_deadline() -> None:
    process = subprocess.Popen([sys.executable, "-c", STUCK], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None and process.stdout.readline() == "ready\n"
        process.send_signal(signal.SIGTERM)
        _, errors = process.communicate(timeout=60)  # the interpreter alone would wait for the thread forever
    finally:
        process.kill()
    assert process.returncode == EXIT_NOT_STOPPED, errors
    assert "did not stop within 1s of SIGTERM; exiting now" in errors
