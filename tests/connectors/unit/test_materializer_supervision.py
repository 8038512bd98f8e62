"""The background materializer survives any exception of a pass (docs/decisions/109-transport-fails-closed.md)."""

from __future__ import annotations

import logging
from typing import cast

import pytest
from prometheus_client import REGISTRY

from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.queue.materializer import Materializer
from nexuscrm_connectors.settings import Settings
from tests.support.waiting import wait_until


class FlakyConnectors:
    """Raises a non-domain error on the first ``failures`` passes, then admits nothing."""

    def __init__(self, failures: int) -> None:
        self.settings = Settings()
        self.failures = failures
        self.passes = 0
        self.sweeps = 0

    def materialize(self) -> int:
        self.passes += 1
        if self.passes <= self.failures:
            raise KeyError("injected bug")
        return 0

    def heal_stranded(self) -> int:
        self.sweeps += 1
        return 0

    def prune_pass(self) -> list[object]:
        return []


def _failures() -> float:
    return REGISTRY.get_sample_value("nexuscrm_materializer_failures_total", {"step": "materializer"}) or 0.0


def test_a_pass_that_raises_is_logged_counted_reported_and_retried(caplog: pytest.LogCaptureFixture) -> None:
    connectors = FlakyConnectors(failures=2)
    materializer = Materializer(cast(Connectors, connectors), interval=0.01)
    reports: list[bool] = []
    materializer.attach_health(reports.append)
    before = _failures()
    materializer.start()
    try:
        wait_until(lambda: connectors.passes >= 4, timeout=30, what="the materializer to pass after failures")
        assert materializer.is_running()
        assert materializer.healthy
    finally:
        materializer.stop()
    assert _failures() - before == 2
    assert reports == [True, False, True]
    assert REGISTRY.get_sample_value("nexuscrm_materializer_healthy") == 1
    logged = [
        r for r in caplog.records if r.name == "nexuscrm_connectors.queue.materializer" and r.levelno >= logging.ERROR
    ]
    assert len(logged) == 2 and all(r.exc_info for r in logged)
