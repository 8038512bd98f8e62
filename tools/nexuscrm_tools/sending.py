"""``nexuscrm send``: test deliveries through the Connectors SDK's pipelined ingest (decision 178).

Each PAYLOAD argument is one delivery of one identity: the text itself (UTF-8), ``@PATH`` the
bytes of a file, ``-`` the bytes of standard input (once). A delivery's receipt key is its
``--key`` (one per payload, in order), else a new ``send-`` key, so sending the same payload
again is a new delivery and the same ``--key`` again a duplicate. The deliveries go as one
batch through ``nexuscrm_sdk.pipeline.PipelinedIngest``, which sends them again after an
outcome-unknown failure as every SDK source does; each is answered on its own.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from nexuscrm_sdk.pipeline import Ingestor, PipelinedIngest
from workqueue.values import IngestItem, IngestResult, Route

STDIN = "-"
FILE_PREFIX = "@"
KEY_PREFIX = "send-"  # of the receipt keys ``send`` makes up


class PayloadUnreadable(Exception):
    """A PAYLOAD argument that cannot be read, or keys that do not pair with the payloads."""


def read_payloads(sources: Sequence[str], stdin: BinaryIO) -> list[bytes]:
    """The bytes of each PAYLOAD argument: text, ``@PATH`` or ``-`` (standard input, at most once)."""
    if sources.count(STDIN) > 1:
        raise PayloadUnreadable(f"standard input ({STDIN}) can be one payload only")
    payloads = []
    for source in sources:
        if source == STDIN:
            payloads.append(stdin.read())
        elif source.startswith(FILE_PREFIX):
            try:
                payloads.append(Path(source.removeprefix(FILE_PREFIX)).read_bytes())
            except OSError as error:
                raise PayloadUnreadable(f"cannot read payload {source}: {error.strerror}") from None
        else:
            payloads.append(source.encode())
    return payloads


def deliveries(
    route: Route, payloads: Sequence[bytes], keys: Sequence[str], source_time: dt.datetime | None
) -> list[IngestItem]:
    """One delivery per payload, with its ``--key`` (none given: new ``send-`` keys)."""
    if keys and len(keys) != len(payloads):
        raise PayloadUnreadable(f"{len(keys)} --key for {len(payloads)} payloads: give one per payload, or none")
    named = keys or [f"{KEY_PREFIX}{uuid.uuid4().hex}" for _ in payloads]
    return [
        IngestItem(receipt_key=key, route=route, payload=payload, source_time=source_time)
        for key, payload in zip(named, payloads, strict=True)
    ]


def send(ingestor: Ingestor, pack_install_id: str, items: Sequence[IngestItem]) -> list[IngestResult]:
    """Send ``items`` as one batch through a pipeline of one call in flight; one result each, in order."""
    with PipelinedIngest(ingestor, pack_install_id, max_in_flight=1) as pipeline:
        return pipeline.submit(items).result()
