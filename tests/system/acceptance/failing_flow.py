"""A Flow that fails every generation (imported by the host process): the runner must end at once.

Its message names the generation's first contact, as a real Flow's message might; the runner's
summary and the host's log line show it (bounded).
"""

from __future__ import annotations

from nexuscrm_sdk.flows import Flow, FlowContext, Generation

MESSAGE = "this Flow refuses every contact"


def boom(context: FlowContext) -> Flow:
    def flow(generation: Generation) -> None:
        list(generation.inputs)
        raise ValueError(MESSAGE)

    return flow
