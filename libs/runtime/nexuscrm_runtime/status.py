"""The ONE place where domain errors become gRPC status codes.

A refusal carries its message as the status details and, when the domain error names the
request field at fault, a ``google.rpc.BadRequest`` field violation in the rich status
(read it with ``grpc_status.rpc_status.from_call``). Both are cut to ``MESSAGE_LIMIT`` bytes:
a message may echo what the caller sent, and the status travels in trailing metadata that a
client refuses past its limit (8 KiB by default; the message is sent percent-encoded and
again, base64-encoded, in the rich status).

Before a handler runs, the request is admitted here too (``nexuscrm_runtime.requests``):
bytes that do not parse, an out-of-range Timestamp or an over-long identifier answer
INVALID_ARGUMENT naming the field, without a traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import grpc
from google.protobuf import any_pb2, descriptor_pool
from google.protobuf.descriptor import Descriptor
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from nexuscrm_runtime.database import domain_error
from nexuscrm_runtime.requests import RejectedRequest, guarded_deserializer, validate_request
from workqueue.errors import DomainError, ErrorKind
from workqueue.limits import REQUEST_FIELD_LIMITS

log = logging.getLogger(__name__)

STATUS_CODES: dict[ErrorKind, grpc.StatusCode] = {kind: grpc.StatusCode[kind.value] for kind in ErrorKind}
MESSAGE_LIMIT = 1024  # bytes of UTF-8 in a status message or field name; the rest is cut
FIELD_LIMIT = 256  # bytes of UTF-8 in a field violation's field path


def bounded(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` cut to at most ``limit`` bytes of UTF-8 (on a character boundary), saying so."""
    encoded = text.encode("utf-8", "surrogatepass")
    if len(encoded) <= limit:
        return text
    marker = f"... ({len(encoded)} bytes; cut)"
    kept = encoded[: max(0, limit - len(marker))].decode("utf-8", "ignore")
    return kept + marker


def domain_status(error: DomainError) -> status_pb2.Status:
    """The rich status of a refusal: code, message and the field at fault, if named; all bounded."""
    message = bounded(str(error))
    details = []
    if error.field:
        violation = error_details_pb2.BadRequest.FieldViolation(
            field=bounded(error.field, FIELD_LIMIT), description=message
        )
        detail = any_pb2.Any()
        detail.Pack(error_details_pb2.BadRequest(field_violations=[violation]))
        details.append(detail)
    return status_pb2.Status(code=STATUS_CODES[error.kind].value[0], message=message, details=details)


def _input_type(method: str) -> Descriptor | None:
    """The request descriptor of ``/package.Service/Method``, if the default pool has it."""
    service_name, _, method_name = method.lstrip("/").partition("/")
    try:
        return descriptor_pool.Default().FindServiceByName(service_name).methods_by_name[method_name].input_type
    except KeyError:
        return None


def _admit(request: Any, limits: Mapping[str, int]) -> Any:
    if isinstance(request, RejectedRequest):
        raise request.error
    if hasattr(request, "ListFields"):
        validate_request(request, limits)
    return request


def _abort(context: grpc.ServicerContext, error: Exception) -> None:
    # A database error no handler caught answers by the engine error table (a conflict in a
    # read outside ``run_transaction``: ABORTED); what the table does not list is a bug.
    refusal = domain_error(error)
    if refusal is not None:
        context.abort_with_status(rpc_status.to_status(domain_status(refusal)))
    # The generated base servicer answers an RPC its service does not override this way.
    if isinstance(error, NotImplementedError):
        context.abort(grpc.StatusCode.UNIMPLEMENTED, "method not implemented")
    log.exception("unhandled error in RPC handler")
    context.abort(grpc.StatusCode.INTERNAL, "internal error; see the service log")


class DomainErrorInterceptor(grpc.ServerInterceptor):  # type: ignore[type-arg]  # generic only in stubs
    """Admits each request, turns ``DomainError`` into its status code and anything else into a logged INTERNAL.

    ``limits`` maps request field names to their maximum length in characters (default:
    ``workqueue.limits.REQUEST_FIELD_LIMITS``, every identifier of every service).
    """

    def __init__(self, limits: Mapping[str, int] = REQUEST_FIELD_LIMITS) -> None:
        self._limits = dict(limits)

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        limits = self._limits
        deserializer = handler.request_deserializer
        descriptor = _input_type(handler_call_details.method)
        if deserializer is not None and descriptor is not None:
            deserializer = guarded_deserializer(descriptor, deserializer)
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            def unary_unary(request: Any, context: grpc.ServicerContext) -> Any:
                try:
                    return inner(_admit(request, limits), context)
                except Exception as error:
                    _abort(context, error)

            return grpc.unary_unary_rpc_method_handler(unary_unary, deserializer, handler.response_serializer)
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            def unary_stream(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
                try:
                    yield from inner_stream(_admit(request, limits), context)
                except Exception as error:
                    _abort(context, error)

            return grpc.unary_stream_rpc_method_handler(unary_stream, deserializer, handler.response_serializer)
        return handler
