"""Logs, tracing configuration and the RPC latency metric, without a database."""

from __future__ import annotations

import json
import logging
import urllib.request
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.sdk.trace import TracerProvider
from prometheus_client import REGISTRY

from nexuscrm_runtime.config import ConfigError, ServiceConfig
from nexuscrm_runtime.logs import ContextFilter, JsonFormatter, configure_logging
from nexuscrm_runtime.metrics_endpoint import metrics_server
from nexuscrm_runtime.server import create_server, side_port_file
from nexuscrm_runtime.telemetry import configure_tracing
from workqueue.logcontext import log_context

CHECK = "/grpc.health.v1.Health/Check"


def formatted(message: str, *args: object) -> dict[str, str]:
    record = logging.LogRecord("nexuscrm.test", logging.INFO, __file__, 1, message, args, None)
    ContextFilter().filter(record)
    entry: dict[str, str] = json.loads(JsonFormatter().format(record))
    return entry


def test_json_logs_carry_the_bound_pack_work_id_and_trace_ids() -> None:
    plain = formatted("plain %d", 1)
    assert plain.pop("time").endswith("+00:00")
    assert plain == {"level": "INFO", "logger": "nexuscrm.test", "message": "plain 1"}
    tracer = TracerProvider().get_tracer("test")
    with log_context(pack="pk-1", work_id="w-1"), tracer.start_as_current_span("rpc") as span:
        with log_context(work_id=""):  # an empty field keeps the outer value
            entry = formatted("claimed")
    assert entry["pack"] == "pk-1" and entry["work_id"] == "w-1"
    assert entry["trace_id"] == format(span.get_span_context().trace_id, "032x")
    assert "pack" not in formatted("after the context")


def test_unknown_formats_and_exporters_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEXUSCRM_LOG_FORMAT", "xml")
    with pytest.raises(ConfigError, match="NEXUSCRM_LOG_FORMAT"):
        configure_logging()
    monkeypatch.setenv("NEXUSCRM_OTEL", "jaeger")
    with pytest.raises(ConfigError, match="NEXUSCRM_OTEL"):
        configure_tracing("test")
    monkeypatch.delenv("NEXUSCRM_OTEL")
    tracing = configure_tracing("test")
    assert tracing.provider is None and tracing.interceptors == ()
    with pytest.raises(ConfigError, match="metrics address"):
        ServiceConfig(dsn="sqlite://", address="127.0.0.1:0", metrics_address="9100")
    monkeypatch.setenv("NEXUSCRM_CONNECTORS_METRICS_ADDRESS", "127.0.0.1:0")
    assert ServiceConfig.from_env("CONNECTORS", 1).metrics_address == "127.0.0.1:0"


def test_rpc_latency_is_recorded_by_method_and_code_and_served() -> None:
    def count(code: str) -> float:
        return (
            REGISTRY.get_sample_value("nexuscrm_rpc_server_duration_seconds_count", {"method": CHECK, "code": code})
            or 0.0
        )

    before_ok, before_missing = count("OK"), count("NOT_FOUND")
    running = create_server([], "127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{running.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            health.Check(health_pb2.HealthCheckRequest(), timeout=5)
            with pytest.raises(grpc.RpcError) as refused:
                health.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
            assert refused.value.code() is grpc.StatusCode.NOT_FOUND
    finally:
        running.stop(0)
    assert count("OK") == before_ok + 1 and count("NOT_FOUND") == before_missing + 1
    with metrics_server("127.0.0.1:0") as port:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert f'nexuscrm_rpc_server_duration_seconds_count{{code="OK",method="{CHECK}"}}' in text


def test_side_ports_are_published_beside_the_grpc_port_file(tmp_path: Path) -> None:
    assert side_port_file(tmp_path / "controlplane.port", "dashboard") == tmp_path / "controlplane.dashboard.port"
