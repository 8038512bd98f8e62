"""A Flow whose process exits on its first generation (imported by the host process): the runner's host-exited path.

``os._exit`` ends the Integration host at once, as a crash would: no shutdown, no answer to
the claim it holds. The runner must notice, print its summary and exit 9.
"""

from __future__ import annotations

import os

from nexuscrm_sdk.flows import Flow, FlowContext, Generation

EXIT_CODE = 7  # the host's exit code the runner must report


def exit_at_once(context: FlowContext) -> Flow:
    """The Flow: its first generation ends the whole host process with ``EXIT_CODE``."""

    def flow(generation: Generation) -> None:
        os._exit(EXIT_CODE)

    return flow
