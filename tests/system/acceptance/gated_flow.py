"""A demo Flow that holds each generation until the test releases it (imported by the host process).

``NEXUSCRM_TEST_GATE_DIR`` names a folder: the Flow writes ``<WorkId>.started`` there, then
waits for a ``release`` file before projecting, so a test can signal the host while a
generation is certainly in flight.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from nexuscrm_sdk.flows import Flow, FlowContext, Generation
from nexuscrm_tools import demo

RELEASE_TIMEOUT = 120.0  # seconds; the test releases long before


def gated_contacts(context: FlowContext) -> Flow:
    inner = demo.contact_projection(context)
    gate = Path(os.environ["NEXUSCRM_TEST_GATE_DIR"])
    waiting = threading.Event()

    def flow(generation: Generation) -> None:
        (gate / f"{generation.work.work_id}.started").touch()
        deadline = time.monotonic() + RELEASE_TIMEOUT
        while not (gate / "release").exists():
            if time.monotonic() > deadline:
                raise TimeoutError("the test never released the gate")
            waiting.wait(0.02)
        inner(generation)

    return flow
