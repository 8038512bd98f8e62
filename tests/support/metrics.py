"""What a running service's Prometheus endpoint reports, read the way a scraper reads it."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from nexuscrm_tools.launcher import ServiceProcess


def counter(service: ServiceProcess, name: str, **labels: str) -> float:
    """The sum of the samples ``name`` (``..._total``, ``..._count``) a service reports now.

    Only samples whose labels include ``labels`` count (none given: every sample of ``name``).
    """
    port = service.side_port("metrics")
    assert port is not None, f"{service.spec.name} published no metrics port"
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )
