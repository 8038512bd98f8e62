"""The ONE place where domain errors become gRPC status codes.

A refusal carries its message as the status details and, when the domain error names the
request field at fault, a ``google.rpc.BadRequest`` field violation in the rich status
(read it with ``grpc_status.rpc_status.from_call``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from workqueue.errors import DomainError, ErrorKind

log = logging.getLogger(__name__)

STATUS_CODES: dict[ErrorKind, grpc.StatusCode] = {kind: grpc.StatusCode[kind.value] for kind in ErrorKind}


def domain_status(error: DomainError) -> status_pb2.Status:
    """The rich status of a refusal: code, message and the field at fault, if named."""
    details = []
    if error.field:
        violation = error_details_pb2.BadRequest.FieldViolation(field=error.field, description=str(error))
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.BadRequest(field_violations=[violation]))
        details.append(detail)
    return status_pb2.Status(code=STATUS_CODES[error.kind].value[0], message=str(error), details=details)


def _abort(context: grpc.ServicerContext, error: Exception) -> None:
    if isinstance(error, DomainError):
        context.abort_with_status(rpc_status.to_status(domain_status(error)))
    # The generated base servicer answers an RPC its service does not override this way.
    if isinstance(error, NotImplementedError):
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
