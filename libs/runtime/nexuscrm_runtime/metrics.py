"""Prometheus metrics shared by every service: RPC latency, and the wrapper every interceptor uses.

Metric objects live in the process-wide ``prometheus_client`` registry, so counting costs the
same whether or not an endpoint serves them; ``metrics_endpoint`` exposes the registry on
the address of ``NEXUSCRM_<SERVICE>_METRICS_ADDRESS``. Label values are bounded: gRPC method
names and status code names, never request fields.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from prometheus_client import Histogram

from workqueue.logcontext import log_context

RPC_SECONDS = Histogram(
    "nexuscrm_rpc_server_duration_seconds",
    "Time from the start of an RPC to its last response, by method and status code.",
    ["method", "code"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0),
)

Around = Callable[[Any, grpc.ServicerContext], contextlib.AbstractContextManager[None]]


def wrap_rpc_handler(handler: grpc.RpcMethodHandler[Any, Any], around: Around) -> grpc.RpcMethodHandler[Any, Any]:
    """The same handler, with each unary or server-streaming call run inside ``around(request, context)``.

    A stream's context stays open until its last response is sent. Other shapes are returned
    unchanged (the services have none).
    """
    if handler.unary_unary is not None:
        inner = handler.unary_unary

        def unary_unary(request: Any, context: grpc.ServicerContext) -> Any:
            with around(request, context):
                return inner(request, context)

        return grpc.unary_unary_rpc_method_handler(
            unary_unary, handler.request_deserializer, handler.response_serializer
        )
    if handler.unary_stream is not None:
        inner_stream = handler.unary_stream

        def unary_stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            with around(request, context):
                yield from inner_stream(request, context)

        return grpc.unary_stream_rpc_method_handler(
            unary_stream, handler.request_deserializer, handler.response_serializer
        )
    return handler


class RpcObservingInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg]  # generic only in stubs
    """Times every RPC into ``nexuscrm_rpc_server_duration_seconds`` and binds its log context.

    The log context is the request's ``pack_install_id`` and ``work_id`` fields, where the
    message has them (``workqueue.logcontext``). The status code is what the handler (or the
    domain error interceptor inside this one) set: OK when it returned normally.
    """

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        method = handler_call_details.method

        @contextlib.contextmanager
        def observed(request: Any, context: grpc.ServicerContext) -> Iterator[None]:
            started = time.perf_counter()
            try:
                with log_context(
                    pack=str(getattr(request, "pack_install_id", "")), work_id=str(getattr(request, "work_id", ""))
                ):
                    yield
            finally:
                code = context.code() or grpc.StatusCode.OK  # type: ignore[attr-defined]  # grpcio has it; grpc-stubs lag
                RPC_SECONDS.labels(method, code.name).observe(time.perf_counter() - started)

        return wrap_rpc_handler(handler, observed)
