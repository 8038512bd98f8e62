"""Every endpoint a service opens, under the same trust: gRPC and metrics, with certificates of every class.

The certificates are signed by the deployment's own CA, so the TLS handshake accepts them;
what the CA signed carelessly (a NUL-prefixed name, a CA certificate, no clientAuth usage,
two principals' names, a URI SAN spelling a principal's DNS identity) must still be refused
after it, with PERMISSION_DENIED, changing nothing. The metrics endpoint speaks mutual TLS
and shows every tenant's packs only to principals of every namespace.
"""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator

import grpc
import pytest
import sqlalchemy as sa
from cryptography.x509.oid import ExtendedKeyUsageOID

from nexuscrm.controlplane.v1 import controlplane_pb2 as cp
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.servicer import registration as connectors_registration
from nexuscrm_controlplane.dashboard.access import token_middleware
from nexuscrm_controlplane.dashboard.app import create_app
from nexuscrm_controlplane.dashboard.connectors import connectors_reads
from nexuscrm_controlplane.dashboard.headers import security_headers
from nexuscrm_controlplane.dashboard.server import DashboardServer
from nexuscrm_controlplane.dashboard.workers import integration_hosts
from nexuscrm_controlplane.servicer import registration as controlplane_registration
from nexuscrm_runtime.metrics_endpoint import metrics_server
from nexuscrm_runtime.server import RunningServer, create_server
from nexuscrm_runtime.targets import Targets
from nexuscrm_runtime.tls import TlsFiles, open_channel
from tests.support.certificates import Issuer, Leaf
from tests.support.checksums import database_digest
from tests.support.https import scrape_metrics
from tests.support.pki import TOKENS, Pki, identity

INVARIANTS_NOT_CHECKED = "refused handshakes and metrics reads: database_digest proves the refusal changed no row"

pytestmark = pytest.mark.database

ACME, OPERATOR = identity("acme"), identity("operator")
# What a CA that signs too much would hand a hostile acme tenant; each one must not act as anyone.
HOSTILE: dict[str, Callable[[Issuer], Leaf]] = {
    "NUL-prefixed dNSName": lambda ca: ca.issue(dns=[f"{OPERATOR}\0.{ACME}"]),
    "NUL-prefixed common name": lambda ca: ca.issue(common_name=f"{OPERATOR}\0.{ACME}"),
    "control character": lambda ca: ca.issue(dns=[f"{OPERATOR}\n"]),
    "CA:TRUE": lambda ca: ca.issue(dns=[OPERATOR], ca=True),
    "no extended key usage": lambda ca: ca.issue(dns=[OPERATOR], usages=None),
    "two principals": lambda ca: ca.issue(dns=[ACME, OPERATOR]),
    "URI SAN spelling a DNS identity": lambda ca: ca.issue(uris=[OPERATOR]),
    "common name beside a SAN": lambda ca: ca.issue(common_name=OPERATOR, dns=["nobody.nexuscrm.test"]),
}
# BoringSSL already refuses a client certificate whose EKU excludes clientAuth (UNAVAILABLE: no RPC
# runs); the identity code refuses it too, should a TLS layer let it through (test_certificate_identity).
REFUSED_IN_HANDSHAKE: dict[str, Callable[[Issuer], Leaf]] = {
    "serverAuth only": lambda ca: ca.issue(dns=[OPERATOR], usages=[ExtendedKeyUsageOID.SERVER_AUTH]),
}


@pytest.fixture
def secure_server(engine: sa.Engine, pki: Pki) -> Iterator[RunningServer]:
    registrations = [connectors_registration(Connectors(engine)), controlplane_registration(engine)]
    running = create_server(registrations, "127.0.0.1:0", security=pki.security())
    yield running
    running.stop(0)


@pytest.mark.parametrize("shape", sorted({**HOSTILE, **REFUSED_IN_HANDSHAKE}))
def test_a_certificate_the_ca_should_not_have_signed_is_refused_after_the_handshake(
    secure_server: RunningServer, engine: sa.Engine, pki: Pki, shape: str
) -> None:
    tls = pki.tls_of({**HOSTILE, **REFUSED_IN_HANDSHAKE}[shape](pki.issuer()), f"hostile-{len(shape)}")
    before = database_digest(engine)
    with open_channel(f"127.0.0.1:{secure_server.port}", tls) as channel:
        install = channel.unary_unary(
            "/nexuscrm.controlplane.v1.ControlplaneService/InstallPack",
            request_serializer=cp.InstallPackRequest.SerializeToString,
            response_deserializer=cp.InstallPackResponse.FromString,
        )
        with pytest.raises(grpc.RpcError) as refused:
            install(cp.InstallPackRequest(namespace="globex", pack_name="crm", pack_version="1"), timeout=10)
    expected = grpc.StatusCode.UNAVAILABLE if shape in REFUSED_IN_HANDSHAKE else grpc.StatusCode.PERMISSION_DENIED
    assert refused.value.code() is expected, refused.value.details()
    assert "operator" not in (refused.value.details() or "")
    assert database_digest(engine) == before


def _client_files(pki: Pki, client: str) -> TlsFiles | None:
    if client in ("plaintext", "no certificate"):
        return None
    if client == "two principals":
        return pki.tls_of(pki.issuer().issue(dns=[ACME, OPERATOR]), "metrics-two")
    return pki.tls(client)


@pytest.mark.parametrize(
    ("client", "expected"),
    [
        ("plaintext", 0),
        ("no certificate", 0),
        ("impostor", 0),  # another CA's certificate
        ("stranger", 403),  # signed by the CA, unknown to the policy
        ("acme", 403),  # one namespace: the metrics name every tenant's packs
        ("two principals", 403),
        ("operator", 200),
        ("services", 200),
    ],
)
def test_the_metrics_endpoint_speaks_mutual_tls_to_principals_of_every_namespace(
    pki: Pki, client: str, expected: int
) -> None:
    files = _client_files(pki, client)
    with metrics_server("127.0.0.1:0", security=pki.security()) as port:
        status, body = scrape_metrics(port, pki, files, https=client != "plaintext")
    assert status == expected, body
    if expected == 200:
        assert "nexuscrm_rpc_server_duration_seconds" in body


@pytest.fixture
def secure_dashboard(engine: sa.Engine, pki: Pki) -> Iterator[int]:
    """The dashboard over HTTPS behind the policy's tokens, in this process; yields its port."""
    security = pki.security()
    with (  # search is not asked here; the worker list answers 200, its one host unreachable
        connectors_reads(Targets(connectors="127.0.0.1:1"), None) as connectors,
        integration_hosts(["127.0.0.1:1"], None) as workers,
    ):
        app = create_app(
            engine,
            connectors=connectors,
            workers=workers,
            middleware=[token_middleware(lambda: security.policy)],
            https=True,
        )
        dashboard = DashboardServer(app, "127.0.0.1:0", security.tls, grace=1)
        dashboard.start()
        yield dashboard.port
        dashboard.stop()


@pytest.mark.parametrize(
    ("path", "token", "expected"),
    [
        ("/", "operator", 200),
        ("/api/overview", "operator", 200),
        ("/static/app.js", "operator", 200),
        ("/no/such/page", "operator", 404),
        ("/api/overview", None, 401),
        ("/api/overview", "acme", 403),
        ("/api/workers", "operator", 200),
        ("/api/workers", "acme", 403),
    ],
)
def test_every_dashboard_answer_carries_the_browser_security_headers(
    secure_dashboard: int, pki: Pki, path: str, token: str | None, expected: int
) -> None:
    context = ssl.create_default_context(cafile=pki.env("acme")["NEXUSCRM_TLS_CA"])
    request = urllib.request.Request(f"https://127.0.0.1:{secure_dashboard}{path}")
    if token is not None:
        request.add_header("Authorization", f"Bearer {TOKENS[token]}")
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            status, headers = response.status, response.headers
    except urllib.error.HTTPError as error:
        status, headers = error.code, error.headers
    assert status == expected
    for name, value in security_headers(https=True):
        assert headers.get(name.decode()) == value.decode(), name
    assert "max-age=" in headers["Strict-Transport-Security"]
    assert "frame-ancestors 'none'" in headers["Content-Security-Policy"]
    assert "script-src 'self'" in headers["Content-Security-Policy"]


def test_hsts_is_sent_over_https_only() -> None:
    names = {name for name, _ in security_headers(https=False)}
    assert b"strict-transport-security" not in names and b"x-frame-options" in names
