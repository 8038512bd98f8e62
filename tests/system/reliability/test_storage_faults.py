"""Storage faults of the embedded SQLite default while ingest runs: a full disk, a read-only file (issue 53 item 4).

A client ingests batch after batch through a Connectors server on a SQLite file. Midway the
file's storage fails, then recovers, without restarting the server:

- **Full disk**: SQLite's own ``PRAGMA max_page_count``, set on each connection the pool
  hands out to the size the file has, makes the next page the file needs fail with
  ``SQLITE_FULL``, as a full disk does (deterministic, no mount or root needed); space
  returns when the limit is lifted.
- **Read-only file**: each connection opened while the fault holds opens the file read-only
  (``mode=ro``), which is what SQLite does by itself when the operating system refuses write
  access (a ``chmod a-w`` file for a process that is not root, a read-only mount); writing
  fails with ``SQLITE_READONLY``. A ``chmod`` is not used: the tests may run as root, whom it
  does not stop. The fault strikes the pool's connections at once (``Engine.dispose``).

Every answer must be OK or the fault's documented status naming its cause (RESOURCE_EXHAUSTED
for a full disk, UNAVAILABLE for a read-only file; never INTERNAL); every acknowledged receipt
is stored and nothing of a refused batch is; the same server answers OK again once the fault
is lifted, the refused batches sent again are each admitted (not ``duplicate_covered``: none
had committed); the file passes ``PRAGMA integrity_check`` and the invariants hold.
"""

from __future__ import annotations

import dataclasses
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import pytest
import sqlalchemy as sa
from sqlalchemy import event

from nexuscrm.connectors.v1 import connectors_pb2 as pb
from nexuscrm.connectors.v1 import connectors_pb2_grpc as pb_grpc
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.servicer import registration
from nexuscrm_runtime.server import create_server
from nexuscrm_schema.tables import IngressReceipt
from nexuscrm_wire import convert
from tests.support.factories import delivery, install_pack
from tests.support.invariants import assert_invariants
from tests.support.waiting import wait_until
from tests.system.reliability.conftest import record_figures

pytestmark = [pytest.mark.database, pytest.mark.parametrize("empty_dsn", ["sqlite"], indirect=True)]

ITEMS = 5  # per batch
PAYLOAD = 2000  # bytes per item: a batch needs new pages
REFUSALS = 3  # refused batches seen before the fault is lifted
SQLITE_MAX_PAGES = 1073741823  # SQLite's default max_page_count


@dataclasses.dataclass(frozen=True)
class Batch:
    """One Ingest call: its receipt keys, status name and message."""

    keys: tuple[str, ...]
    code: str
    message: str


class Ingesting:
    """A client thread sending Ingest batches until stopped, each answer recorded."""

    def __init__(self, stub: pb_grpc.ConnectorsServiceStub, pack: str) -> None:
        self.stub, self.pack = stub, pack
        self.batches: list[Batch] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)

    def send(self, items: list[pb.IngestItem]) -> Batch:
        """One call; its answer."""
        keys = tuple(item.receipt_key for item in items)
        try:
            self.stub.Ingest(pb.IngestRequest(pack_install_id=self.pack, items=items), timeout=60)
        except grpc.RpcError as error:
            return Batch(keys, error.code().name, error.details() or "")
        return Batch(keys, "OK", "")

    def _run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            items = [delivery(lane=f"lane-{n % 7}", payload=bytes([n % 251]) * PAYLOAD) for _ in range(ITEMS)]
            self.batches.append(self.send([convert.item_to_proto(item) for item in items]))

    def count(self, code: str) -> int:
        """Answers with status ``code`` so far."""
        return sum(batch.code == code for batch in list(self.batches))


@pytest.fixture
def stub(connectors: Connectors) -> Iterator[pb_grpc.ConnectorsServiceStub]:
    """A client of an in-process Connectors server on the test's SQLite file."""
    server = create_server([registration(connectors)], "127.0.0.1:0")
    try:
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            yield pb_grpc.ConnectorsServiceStub(channel)
    finally:
        server.stop(0)


@pytest.fixture
def connectors(engine: sa.Engine) -> Connectors:
    return Connectors(engine)


def _full_disk(engine: sa.Engine) -> Callable[[bool], None]:
    """A switch: on, every connection handed out may not grow the file (SQLITE_FULL); off, space returns."""
    full = threading.Event()

    @event.listens_for(engine.pool, "checkout")
    def _limit(dbapi_connection: Any, *_: Any) -> None:
        cursor = dbapi_connection.cursor()
        pages = cursor.execute("PRAGMA page_count").fetchone()[0] if full.is_set() else SQLITE_MAX_PAGES
        cursor.execute(f"PRAGMA max_page_count = {int(pages)}")
        cursor.close()

    return lambda on: full.set() if on else full.clear()


def _read_only(engine: sa.Engine) -> Callable[[bool], None]:
    """A switch: on, the pool's connections are reopened read-only (SQLITE_READONLY); off, new ones write."""
    read_only = threading.Event()

    @event.listens_for(engine, "do_connect")
    def _open(_dialect: Any, _record: Any, cargs: list[Any], cparams: dict[str, Any]) -> None:
        if read_only.is_set():
            cargs[0] = f"file:{cargs[0]}?mode=ro"
            cparams["uri"] = True

    def switch(on: bool) -> None:
        read_only.set() if on else read_only.clear()
        if on:
            engine.dispose()  # the open connections were writable: the fault strikes them too

    return switch


def _stored(engine: sa.Engine, pack: str, keys: list[str]) -> set[str]:
    with engine.connect() as connection:
        rows = connection.execute(
            sa.select(IngressReceipt.c.ReceiptKey).where(
                IngressReceipt.c.PackInstallId == pack, IngressReceipt.c.ReceiptKey.in_(keys)
            )
        )
        return set(rows.scalars())


@pytest.mark.parametrize(
    ("fault", "code", "cause"),
    [
        (_full_disk, "RESOURCE_EXHAUSTED", "the disk holding the database file is full (SQLITE_FULL)"),
        (_read_only, "UNAVAILABLE", "the database file is read-only (SQLITE_READONLY"),
    ],
    ids=["disk-full", "read-only"],
)
def test_a_storage_fault_while_ingest_runs_is_answered_by_cause_and_passes(
    engine: sa.Engine,
    stub: pb_grpc.ConnectorsServiceStub,
    fault: Callable[[sa.Engine], Callable[[bool], None]],
    code: str,
    cause: str,
) -> None:
    pack = install_pack(engine)
    switch = fault(engine)
    client = Ingesting(stub, pack)
    client.thread.start()
    try:
        wait_until(lambda: client.count("OK") >= 3, "ingest running")
        switch(True)
        wait_until(lambda: client.count(code) >= REFUSALS, f"{REFUSALS} batches answered {code}")
        refused_during = client.count(code)
        switch(False)
        ok_before = client.count("OK")
        wait_until(lambda: client.count("OK") >= ok_before + 3, "ingest answered OK again, same server")
    finally:
        client.stop.set()
        client.thread.join()

    answers = Counter(batch.code for batch in client.batches)
    assert set(answers) == {"OK", code}, answers  # never INTERNAL, nor anything else
    refused = [batch for batch in client.batches if batch.code == code]
    assert all(cause in batch.message and "nothing was committed" in batch.message for batch in refused), refused
    acknowledged = [key for batch in client.batches if batch.code == "OK" for key in batch.keys]
    lost = set(acknowledged) - _stored(engine, pack, acknowledged)
    assert lost == set()
    refused_keys = [key for batch in refused for key in batch.keys]
    assert _stored(engine, pack, refused_keys) == set()  # nothing of a refused batch committed

    resent = Counter(
        result.outcome
        for batch in refused
        for result in stub.Ingest(
            pb.IngestRequest(
                pack_install_id=pack,
                items=[
                    convert.item_to_proto(delivery(key, lane="lane-resent", payload=key.encode())) for key in batch.keys
                ],
            ),
            timeout=60,
        ).results
    )
    assert resent == {pb.INGEST_OUTCOME_ADMITTED: len(refused_keys)}
    with engine.connect() as connection:
        assert connection.exec_driver_sql("PRAGMA integrity_check").scalars().all() == ["ok"]
    assert_invariants(engine)
    record_figures(
        f"storage fault[{code}]",
        {"batches": len(client.batches), "answers": dict(answers), "refused_while_faulty": refused_during},
    )
