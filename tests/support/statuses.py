"""What a refused RPC says: the field its rich status names."""

from __future__ import annotations

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status


def violation_field(error: grpc.RpcError) -> str:
    """The field of the first ``BadRequest`` field violation in the refusal's rich status ("" if none)."""
    status = rpc_status.from_call(error)  # type: ignore[arg-type]  # the RpcError of a call is a Call
    assert status is not None, "a refusal carries the rich status"
    for detail in status.details:
        request = error_details_pb2.BadRequest()
        if detail.Unpack(request):
            return str(request.field_violations[0].field)
    return ""
