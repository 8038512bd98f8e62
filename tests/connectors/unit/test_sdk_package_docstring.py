"""The Flow and its test in ``nexuscrm_sdk``'s package docstring run as written."""

from __future__ import annotations

import itertools
import textwrap
from typing import Any

import sqlalchemy as sa

import nexuscrm_sdk
from nexuscrm_sdk.flows import Flow, FlowContext
from nexuscrm_sdk.testing import InMemoryWorkSource
from nexuscrm_sdk.worker import Generation, Worker
from workqueue import ProjectionIdentity, WorkStatus


def docstring_example(docstring: str, marker: str) -> str:
    """The indented block that follows ``marker`` (a reStructuredText literal block), dedented."""
    lines = docstring.split(marker, 1)[1].splitlines()[1:]
    block = itertools.takewhile(lambda line: line == "" or line.startswith("    "), lines)
    return textwrap.dedent("\n".join(block))


def test_the_flow_and_its_test_in_the_package_docstring_pass() -> None:
    assert nexuscrm_sdk.__doc__ is not None
    example = docstring_example(nexuscrm_sdk.__doc__, "A Flow and its test::")
    namespace: dict[str, Any] = {
        "Flow": Flow,
        "FlowContext": FlowContext,
        "Generation": Generation,
        "InMemoryWorkSource": InMemoryWorkSource,
        "ProjectionIdentity": ProjectionIdentity,
        "Worker": Worker,
        "WorkStatus": WorkStatus,
        "context": FlowContext(pack_install_id="pk-1", work_type="count", engine=sa.create_engine("sqlite://")),
    }
    exec(compile(example, "nexuscrm_sdk.__doc__", "exec"), namespace)
    namespace["test_count_inputs"]()
    assert namespace["totals"] == {"a": 2}
