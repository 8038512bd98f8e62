"""OpenTelemetry tracing of gRPC servers and clients and of SQLAlchemy, off unless configured.

``NEXUSCRM_OTEL`` selects the exporter: empty or ``off`` (default) installs nothing, so
tracing costs nothing; ``console`` prints each finished span as JSON on stderr. The gRPC
client instrumentation is process-wide (every channel opened afterwards is traced); server
spans come from an interceptor that ``Tracing.interceptors`` hands to ``create_server``;
``Tracing.instrument_engine`` traces one engine's statements (the statement text with its
bind parameters left out, so no payload reaches a span).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import grpc
from opentelemetry import trace
from opentelemetry.instrumentation.grpc import GrpcInstrumentorClient, server_interceptor
from opentelemetry.instrumentation.sqlalchemy import SQLAlchemyInstrumentor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
from sqlalchemy.engine import Engine

from nexuscrm_runtime.config import ConfigError, env_str

EXPORTERS = ("off", "console")


@dataclasses.dataclass(kw_only=True)
class Tracing:
    """The tracing of one process; ``provider`` is None when tracing is off."""

    provider: TracerProvider | None = None

    @property
    def interceptors(self) -> tuple[grpc.ServerInterceptor[Any, Any], ...]:
        """Server interceptors that open a span per RPC (none when off)."""
        if self.provider is None:
            return ()
        return (server_interceptor(tracer_provider=self.provider),)  # type: ignore[no-untyped-call]  # untyped upstream

    def instrument_engine(self, engine: Engine) -> None:
        """Trace every statement of ``engine`` (no-op when off)."""
        if self.provider is not None:
            # 0.66b2 declares "sqlalchemy < 2.1" and would refuse 2.1.9 without instrumenting;
            # the engine events it uses are unchanged in 2.1 (the dashboard acceptance test
            # checks that statements are traced), so its version check is skipped. It also
            # wraps create_async_engine, which is why greenlet is a dependency.
            SQLAlchemyInstrumentor().instrument(
                engine=engine,
                tracer_provider=self.provider,
                enable_commenter=False,
                skip_dep_check=True,
            )

    def shutdown(self) -> None:
        """Flush and stop the exporter (no-op when off)."""
        if self.provider is not None:
            self.provider.shutdown()


def configure_tracing(service_name: str) -> Tracing:
    """Set up tracing for ``service_name`` as ``NEXUSCRM_OTEL`` asks; raises ``ConfigError`` for an unknown value."""
    exporter = env_str("NEXUSCRM_OTEL", "off")
    if exporter not in EXPORTERS:
        raise ConfigError(f"NEXUSCRM_OTEL must be one of {', '.join(EXPORTERS)}, got {exporter!r}")
    if exporter == "off":
        return Tracing()
    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    trace.set_tracer_provider(provider)
    GrpcInstrumentorClient().instrument(tracer_provider=provider)  # type: ignore[no-untyped-call]  # untyped upstream
    return Tracing(provider=provider)
