"""What a running service's Prometheus endpoint reports, read the way a scraper reads it."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def counter(metrics_port: int | None, name: str, **labels: str) -> float:
    """The sum of the samples ``name`` (``..._total``, ``..._count``) the endpoint on ``metrics_port`` reports now.

    ``metrics_port``: a launched service's ``side_port("metrics")``. Only samples whose labels
    include ``labels`` count (none given: every sample of ``name``).
    """
    assert metrics_port is not None, "the service published no metrics port"
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name and labels.items() <= sample.labels.items()
    )
