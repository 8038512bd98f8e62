"""The four services as processes with mutual TLS and authorization, end to end, on every backend.

A tenant's client ingests, the worker host (its own certificate) projects, the dashboard
answers only an operator's token over HTTPS, and afterwards no log line or error message
holds the database password, the DSN, a payload, a token or a private key.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import sqlalchemy as sa

from nexuscrm_runtime.database import create_engine
from nexuscrm_runtime.tls import open_channel
from nexuscrm_schema.tables import WorkItem
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_tools import demo
from nexuscrm_tools.launcher import ALL_SERVICES, CONNECTORS, CONTROLPLANE, ServiceProcess, stop_services
from nexuscrm_tools.run import start_system
from tests.support.https import scrape_metrics
from tests.support.invariants import assert_invariants
from tests.support.pki import TOKENS, Pki
from tests.support.waiting import wait_until
from workqueue.statuses import NONTERMINAL_WORK_STATUSES
from workqueue.values import IngestItem, Outcome

pytestmark = [pytest.mark.database, pytest.mark.acceptance]

DELIVERIES = 40


@pytest.fixture
def secret_dsn(empty_dsn: str) -> Iterator[tuple[str, str]]:
    """(DSN, password): on MariaDB a user of its own with a random password; SQLite has none."""
    url = sa.make_url(empty_dsn)
    if url.get_backend_name() == "sqlite":
        yield empty_dsn, ""
        return
    user, password = f"nx_{uuid.uuid4().hex[:10]}", f"pw-{uuid.uuid4().hex}"
    admin = create_engine(empty_dsn)
    grant = sa.text(f"GRANT ALL ON `{url.database}`.* TO :user@'%'")  # identifiers cannot be bound
    with admin.begin() as connection:
        create = sa.text("CREATE USER :user@'%' IDENTIFIED BY :password")
        connection.execute(create, {"user": user, "password": password})
        connection.execute(grant, {"user": user})
    try:
        yield url.set(username=user, password=password).render_as_string(hide_password=False), password
    finally:
        with admin.begin() as connection:
            connection.execute(sa.text("DROP USER :user@'%'"), {"user": user})
        admin.dispose()


def _payload(contact: str, marker: str) -> bytes:
    return demo.ContactUpdate(contact_id=contact, fields={"name": marker}, sent_at=0.0).encode()


def _dashboard(port: int, pki: Pki, authorization: str | None, path: str = "/api/overview") -> tuple[int, str]:
    context = ssl.create_default_context(cafile=pki.env("acme")["NEXUSCRM_TLS_CA"])
    request = urllib.request.Request(f"https://127.0.0.1:{port}{path}")
    if authorization:
        request.add_header("Authorization", authorization)
    try:
        with urllib.request.urlopen(request, context=context, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode() + str(error.headers.get("WWW-Authenticate", ""))


def _settled(engine: sa.Engine) -> bool:
    with engine.connect() as connection:
        statuses = connection.execute(sa.select(WorkItem.c.Status)).scalars().all()
    return bool(statuses) and not set(statuses) & set(NONTERMINAL_WORK_STATUSES)


def test_a_secured_system_projects_and_never_logs_secrets(
    secret_dsn: tuple[str, str], pki: Pki, tmp_path: Path
) -> None:
    dsn, password = secret_dsn
    marker = f"PAYLOAD-MARKER-{uuid.uuid4().hex}"
    env = {
        **pki.server_env(),
        "NEXUSCRM_DASHBOARD_ADDRESS": "127.0.0.1:0",
        "NEXUSCRM_MAX_ATTEMPTS": "2",
        "NEXUSCRM_RETRY_BASE_SECONDS": "1",
        **{f"NEXUSCRM_{spec.env_name}_METRICS_ADDRESS": "127.0.0.1:0" for spec in ALL_SERVICES},
    }
    services, pack = start_system(dsn, tmp_path / "run", namespace="acme", workers=2, extra_env=env)
    seen_errors: list[str] = []
    try:
        by_name: dict[str, ServiceProcess] = {s.spec.name: s for s in services}
        connectors = by_name[CONNECTORS.name].address
        items = [
            IngestItem(receipt_key=f"r-{i}", route=demo.route(f"lane-{i % 4}"), payload=_payload(f"c-{i}", marker))
            for i in range(DELIVERIES)
        ]
        poison = IngestItem(receipt_key="poison", route=demo.route("poison"), payload=marker.encode())
        with open_channel(connectors, pki.tls("acme")) as channel:
            results = ConnectorsClient(channel).ingest(pack, items=[*items, poison])
        assert [r.outcome for r in results] == [Outcome.ADMITTED] * (DELIVERIES + 1)
        with open_channel(connectors, pki.tls("globex")) as channel, pytest.raises(grpc.RpcError) as refused:
            ConnectorsClient(channel).ingest(pack, items=items[:1])
        assert refused.value.code() is grpc.StatusCode.NOT_FOUND
        seen_errors.append(str(refused.value.details()))

        engine = create_engine(dsn)
        try:
            wait_until(lambda: _settled(engine), "every generation to finish (the poison one fails)")
            assert_invariants(engine)
        finally:
            engine.dispose()

        port = by_name[CONTROLPLANE.name].side_port("dashboard")
        assert port is not None
        status, body = _dashboard(port, pki, None)
        assert status == 401 and "Basic realm" in body
        status, body = _dashboard(port, pki, f"Bearer {TOKENS['acme']}")
        assert status == 403 and "'*'" in body
        status, body = _dashboard(port, pki, "Bearer not-a-token")
        assert status == 401
        status, body = _dashboard(port, pki, f"Bearer {TOKENS['operator']}")
        assert status == 200 and pack in json.dumps(json.loads(body))
        basic = base64.b64encode(f"operator:{TOKENS['operator']}".encode()).decode()
        assert _dashboard(port, pki, f"Basic {basic}")[0] == 200
        # Search and the receipt lists ask Connectors over mutual TLS, with the Controlplane's certificate.
        status, body = _dashboard(port, pki, f"Bearer {TOKENS['operator']}", "/api/search?q=poison")
        assert status == 200 and [r["kind"] for r in json.loads(body)] == ["receipt"], body
        status, body = _dashboard(port, pki, f"Bearer {TOKENS['operator']}", "/api/receipts?state=confirmed")
        assert status == 200 and {r["pack_install_id"] for r in json.loads(body)} == {pack}, body
        assert _dashboard(port, pki, f"Bearer {TOKENS['acme']}", "/api/search?q=poison")[0] == 403
        # So do the operating panels, over issue 37's RPCs (decision 164): the poison generation is a dead letter.
        status, body = _dashboard(port, pki, f"Bearer {TOKENS['operator']}", "/api/dead-letters")
        assert status == 200 and [(p["pack_install_id"], p["total"]) for p in json.loads(body)["packs"]] == [(pack, 1)]
        status, body = _dashboard(port, pki, f"Bearer {TOKENS['operator']}", f"/api/packs/{pack}/coverage")
        assert status == 200 and json.loads(body)["provable"], body
        status, body = _dashboard(port, pki, f"Bearer {TOKENS['operator']}", "/api/claim-pauses")
        assert status == 200 and pack in body, body
        seen_errors += [body]
        # Every service's metrics endpoint: mutual TLS, and only for principals of every namespace.
        for service in services:
            metrics = service.side_port("metrics")
            assert metrics is not None, service.spec.name
            assert scrape_metrics(metrics, pki, None, https=False)[0] == 0
            assert scrape_metrics(metrics, pki, None)[0] == 0
            assert scrape_metrics(metrics, pki, pki.tls("acme"))[0] == 403
            status, text = scrape_metrics(metrics, pki, pki.tls("operator"))
            assert status == 200 and "nexuscrm_rpc_server_duration_seconds" in text, service.spec.name
    finally:
        codes = stop_services(services)
    assert set(codes.values()) == {0}, codes

    logs = "\n".join(s.log_path.read_text(errors="replace") for s in services) + "\n".join(seen_errors)
    assert "mutual TLS and authorization" in logs  # every service said how it runs
    secrets = {"the DSN": dsn, "a payload": marker, "the operator token": TOKENS["operator"], "a key": "PRIVATE KEY"}
    if password:
        secrets["the database password"] = password
    for what, secret in secrets.items():
        assert secret not in logs, f"{what} reached a log line or an error message"
