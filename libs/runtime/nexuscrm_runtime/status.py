"""The ONE place where domain errors become gRPC status codes."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from workqueue.errors import DomainError, ErrorKind

log = logging.getLogger(__name__)

STATUS_CODES: dict[ErrorKind, grpc.StatusCode] = {kind: grpc.StatusCode[kind.value] for kind in ErrorKind}


def _abort(context: grpc.ServicerContext, error: Exception) -> None:
    if isinstance(error, DomainError):
        context.abort(STATUS_CODES[error.kind], str(error))
    if isinstance(error, NotImplementedError):  # generated base servicers raise it
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "method not implemented")
    log.exception("unhandled error in RPC handler")
    context.abort(grpc.StatusCode.INTERNAL, "internal error; see the service log")


class DomainErrorInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg]  # generic only in stubs
    """Turns ``DomainError`` into its status code and anything else into a logged INTERNAL."""

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            def unary_unary(request: Any, context: grpc.ServicerContext) -> Any:
                try:
                    return inner(request, context)
                except Exception as error:
                    _abort(context, error)

            return grpc.unary_unary_rpc_method_handler(
                unary_unary, handler.request_deserializer, handler.response_serializer
            )
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            def unary_stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                try:
                    yield from inner_stream(request, context)
                except Exception as error:
                    _abort(context, error)

            return grpc.unary_stream_rpc_method_handler(
                unary_stream, handler.request_deserializer, handler.response_serializer
            )
        return handler
