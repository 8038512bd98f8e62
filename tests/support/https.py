"""Scraping a metrics endpoint as Prometheus would, with or without TLS and a client certificate."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request

from nexuscrm_runtime.tls import TlsFiles
from tests.support.pki import Pki


def scrape_metrics(port: int, pki: Pki, client: TlsFiles | None, *, https: bool = True) -> tuple[int, str]:
    """GET /metrics; (status, body), or (0, why) when no HTTP exchange happened."""
    context = ssl.create_default_context(cafile=pki.env("acme")["NEXUSCRM_TLS_CA"])
    if client is not None:
        context.load_cert_chain(client.cert_path, client.key_path)
    url = f"{'https' if https else 'http'}://127.0.0.1:{port}/metrics"
    try:
        with urllib.request.urlopen(url, context=context if https else None, timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()
    except (urllib.error.URLError, ConnectionError, ssl.SSLError) as error:
        return 0, str(error)
