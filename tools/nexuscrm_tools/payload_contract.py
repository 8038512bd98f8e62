"""``nexuscrm schema contract-payloads``: set the payload contract, then move payloads out of Event.Payload.

Run it once every Connectors process runs v10 or later (no v7 left), as an operation of its
own: applying the schema never moves a payload (decision 150). Each ContractPayloads call
sets the flag (a no-op after the first) and moves a bounded number of batches: a payload
still only in Event.Payload (an Event admitted before schema v8) is copied into
EventPayload, and every Event.Payload is emptied (decision 130's old copies too). This loop
calls again from where the last call stopped until none is left, showing its progress on
stderr: a bar of Events out of the dry run's count on a terminal, else a line per call naming
where the next starts. Interrupted, run it again: it skips what was moved, or starts at
``--after-pack`` and ``--after-ordinal`` as the last line printed them. ``--dry-run`` makes
one call that counts and changes nothing.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from nexuscrm.schemacatalog.v1 import schema_catalog_pb2 as sc_pb
from nexuscrm.schemacatalog.v1 import schema_catalog_pb2_grpc as sc_grpc

RPC_TIMEOUT = 300.0  # seconds per call: each moves at most batches_per_call bounded batches
BATCHES_PER_CALL = 20  # each at most 500 Events and 25 MiB (the schema catalog's move budgets)

# progress(answer, totals so far): after every call.
ShowProgress = Callable[[sc_pb.ContractPayloadsResponse, sc_pb.ContractPayloadsResponse], None]


def count_moves(stub: sc_grpc.SchemaCatalogServiceStub) -> sc_pb.ContractPayloadsResponse:
    """The dry run: what a move would change now (``emptied``, ``emptied_bytes``, ``moved``); changes nothing."""
    counted: sc_pb.ContractPayloadsResponse = stub.ContractPayloads(
        sc_pb.ContractPayloadsRequest(dry_run=True), timeout=RPC_TIMEOUT
    )
    return counted


def contract_payloads(
    stub: sc_grpc.SchemaCatalogServiceStub,
    *,
    after_pack: str = "",
    after_ordinal: int = -1,
    batches_per_call: int = BATCHES_PER_CALL,
    progress: ShowProgress = lambda *_: None,
) -> tuple[sc_pb.ContractPayloadsResponse, sc_pb.ContractPayloadsResponse]:
    """Call ContractPayloads until done; return (the first answer, the totals: emptied, emptied_bytes, moved).

    ``progress(answer, totals)`` follows every call.
    """
    totals = sc_pb.ContractPayloadsResponse()
    first: sc_pb.ContractPayloadsResponse | None = None
    while True:
        answer = stub.ContractPayloads(
            sc_pb.ContractPayloadsRequest(
                max_batches=batches_per_call, after_pack_install_id=after_pack, after_ordinal=after_ordinal
            ),
            timeout=RPC_TIMEOUT,
        )
        first = first or answer
        totals.emptied += answer.emptied
        totals.emptied_bytes += answer.emptied_bytes
        totals.moved += answer.moved
        progress(answer, totals)
        if answer.done:
            return first, totals
        after_pack, after_ordinal = answer.next_pack_install_id, answer.next_after_ordinal


@contextlib.contextmanager
def shown_progress(total: int) -> Iterator[ShowProgress]:
    """A progress callback: a bar of ``total`` Events on a terminal, else one line per call on stderr."""
    console = Console(stderr=True)
    if console.is_terminal:
        bar = Progress(
            TextColumn("moving payloads"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
        )
        with bar:
            task = bar.add_task("move", total=total)
            yield lambda _answer, totals: bar.update(task, completed=totals.emptied)
        return

    def line(answer: sc_pb.ContractPayloadsResponse, totals: sc_pb.ContractPayloadsResponse) -> None:
        print(
            f"emptied {totals.emptied} of {total} Event payloads ({totals.moved} moved into EventPayload, "
            f"{totals.emptied_bytes} bytes); "
            f"next: --after-pack {answer.next_pack_install_id} --after-ordinal {answer.next_after_ordinal}",
            file=sys.stderr,
            flush=True,
        )

    yield line
