"""A MySQL-protocol server raises each class of engine error; the RPC answers with the table's status.

MariaDB's ``SIGNAL`` makes the server send any error number, so TiDB's codes travel the real
path here: server, PyMySQL, the engine's error hook, ``run_transaction``, the status table.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
import sqlalchemy as sa

from nexuscrm_runtime.database import create_engine, normalize_dsn, run_transaction
from nexuscrm_runtime.status import DomainErrorInterceptor

INVARIANTS_NOT_CHECKED = "engine errors forced on scratch objects and their statuses: no projection data"

METHOD = "/test.Forged/Signal"


def signal(connection: sa.Connection, code: int) -> None:
    connection.exec_driver_sql(f"SIGNAL SQLSTATE 'HY000' SET MYSQL_ERRNO = {code}, MESSAGE_TEXT = 'forged'")


@pytest.fixture
def server_engine(mysql_server_dsn: str) -> Iterator[sa.Engine]:
    engine = create_engine(str(normalize_dsn(mysql_server_dsn).set(database=None)), pool_size=1)
    yield engine
    engine.dispose()


@pytest.fixture
def call(server_engine: sa.Engine) -> Iterator[grpc.UnaryUnaryMultiCallable[bytes, bytes]]:
    """A gRPC method whose handler runs ``SIGNAL`` with the code in the request, in a transaction or outside."""

    def handle(request: bytes, context: grpc.ServicerContext) -> bytes:
        mode, _, code = request.decode().partition(":")
        if mode == "transaction":
            run_transaction(server_engine, lambda connection: signal(connection, int(code)), name="forged")
        else:
            with server_engine.connect() as connection:
                signal(connection, int(code))
        return b"not reached"

    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=2),
        interceptors=[DomainErrorInterceptor()],
    )
    server.add_generic_rpc_handlers(
        [grpc.method_handlers_generic_handler("test.Forged", {"Signal": grpc.unary_unary_rpc_method_handler(handle)})]
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
    finally:
        channel.close()
        server.stop(0)


# A conflict inside run_transaction is retried for the whole budget (10 s) before ABORTED: the
# unit tests cover that with a fake clock; here the conflicts run outside a transaction.
@pytest.mark.parametrize(
    ("mode", "code", "status", "says"),
    [
        ("statement", 8028, grpc.StatusCode.ABORTED, "conflicted with a concurrent transaction"),
        ("statement", 9004, grpc.StatusCode.ABORTED, "conflicted with a concurrent transaction"),
        ("statement", 8005, grpc.StatusCode.ABORTED, "conflicted with a concurrent transaction"),
        ("transaction", 9001, grpc.StatusCode.UNAVAILABLE, "during forged; retry the request"),
        ("statement", 9005, grpc.StatusCode.UNAVAILABLE, "retry the request"),
        ("transaction", 8027, grpc.StatusCode.UNAVAILABLE, "during forged; retry the request"),
        ("transaction", 8004, grpc.StatusCode.RESOURCE_EXHAUSTED, "txn-total-size-limit"),
        ("transaction", 8025, grpc.StatusCode.RESOURCE_EXHAUSTED, "txn-entry-size-limit"),
        ("statement", 8175, grpc.StatusCode.RESOURCE_EXHAUSTED, "tidb_mem_quota_query"),
        ("transaction", 1064, grpc.StatusCode.INTERNAL, "internal error"),
        ("statement", 1064, grpc.StatusCode.INTERNAL, "internal error"),
    ],
)
def test_a_server_error_answers_the_table_s_status(
    call: grpc.UnaryUnaryMultiCallable[bytes, bytes], mode: str, code: int, status: grpc.StatusCode, says: str
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        call(f"{mode}:{code}".encode(), timeout=30)
    assert caught.value.code() is status
    assert says in caught.value.details()
