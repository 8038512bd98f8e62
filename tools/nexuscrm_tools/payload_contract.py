"""``nexuscrm schema contract-payloads``: set the payload contract, then empty the old copies (decision 130).

Run it once every Connectors process runs v10 or later (no v7 left). Each ContractPayloads
call sets the flag (a no-op after the first) and empties a bounded number of batches of old
copies in Event.Payload; this loop calls again from where the last call stopped until none is
left, showing its progress on stderr (a live line on a terminal, a line per call otherwise).
Interrupted, run it again: it skips what was emptied, or starts at ``--after-pack`` and
``--after-ordinal`` as the last line printed them.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from nexuscrm.schemacatalog.v1 import schema_catalog_pb2 as sc_pb
from nexuscrm.schemacatalog.v1 import schema_catalog_pb2_grpc as sc_grpc

RPC_TIMEOUT = 300.0  # seconds per call: each empties at most batches_per_call bounded batches
BATCHES_PER_CALL = 20  # each at most 500 Events and 25 MiB (the schema catalog's copy budgets)


def contract_payloads(
    stub: sc_grpc.SchemaCatalogServiceStub,
    *,
    after_pack: str = "",
    after_ordinal: int = -1,
    batches_per_call: int = BATCHES_PER_CALL,
    progress: Callable[[sc_pb.ContractPayloadsResponse, int, int], None] = lambda *_: None,
) -> tuple[sc_pb.ContractPayloadsResponse, int, int]:
    """Call ContractPayloads until done; return (the first answer, copies emptied, bytes emptied).

    ``progress(answer, emptied, bytes)`` follows every call, with the running totals.
    """
    emptied = emptied_bytes = 0
    first: sc_pb.ContractPayloadsResponse | None = None
    while True:
        answer = stub.ContractPayloads(
            sc_pb.ContractPayloadsRequest(
                max_batches=batches_per_call, after_pack_install_id=after_pack, after_ordinal=after_ordinal
            ),
            timeout=RPC_TIMEOUT,
        )
        first = first or answer
        emptied += answer.emptied
        emptied_bytes += answer.emptied_bytes
        progress(answer, emptied, emptied_bytes)
        if answer.done:
            return first, emptied, emptied_bytes
        after_pack, after_ordinal = answer.next_pack_install_id, answer.next_after_ordinal


@contextlib.contextmanager
def shown_progress() -> Iterator[Callable[[sc_pb.ContractPayloadsResponse, int, int], None]]:
    """A progress callback: a live line on a terminal, else one line per call on stderr."""
    console = Console(stderr=True)

    def line(answer: sc_pb.ContractPayloadsResponse, emptied: int, emptied_bytes: int) -> str:
        return (
            f"emptied {emptied} old payload copies ({emptied_bytes} bytes); "
            f"next: --after-pack {answer.next_pack_install_id} --after-ordinal {answer.next_after_ordinal}"
        )

    if console.is_terminal:
        with Progress(
            SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console, transient=True
        ) as bar:
            task = bar.add_task("setting the payload contract", total=None)
            yield lambda answer, emptied, size: bar.update(task, description=line(answer, emptied, size))
        return
    yield lambda answer, emptied, size: print(line(answer, emptied, size), file=sys.stderr, flush=True)
