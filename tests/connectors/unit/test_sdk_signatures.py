"""The in-process facade, the gRPC client and the SDK's in-memory source keep the same signatures."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import pytest

from nexuscrm_connectors.facade import Connectors
from nexuscrm_sdk.client import ConnectorsClient
from nexuscrm_sdk.testing import InMemoryWorkSource
from nexuscrm_sdk.worker import WorkSource

WORK_SOURCE_METHODS = ("complete_and_claim", "load_inputs", "load_replayed_inputs", "heartbeat", "complete", "fail")


def signature(function: Callable[..., Any]) -> inspect.Signature:
    return inspect.signature(function, eval_str=True)


def public_methods(cls: type) -> list[str]:
    return sorted(name for name, value in vars(cls).items() if callable(value) and not name.startswith("_"))


def test_work_source_protocol_lists_what_the_worker_calls() -> None:
    assert public_methods(WorkSource) == sorted(WORK_SOURCE_METHODS)


@pytest.mark.parametrize("name", WORK_SOURCE_METHODS)
@pytest.mark.parametrize("source", [Connectors, ConnectorsClient, InMemoryWorkSource], ids=lambda c: c.__name__)
def test_every_work_source_has_the_protocols_signatures(source: type, name: str) -> None:
    assert signature(getattr(source, name)) == signature(getattr(WorkSource, name))


@pytest.mark.parametrize("name", public_methods(ConnectorsClient))
def test_every_client_method_has_the_facades_signature(name: str) -> None:
    assert signature(getattr(ConnectorsClient, name)) == signature(getattr(Connectors, name))


@pytest.mark.parametrize("name", ["ingest", "get_work"])
def test_the_in_memory_source_takes_inputs_and_describes_work_like_connectors(name: str) -> None:
    assert signature(getattr(InMemoryWorkSource, name)) == signature(getattr(Connectors, name))


def test_public_sdk_methods_are_keyword_only_after_the_first_argument() -> None:
    for cls in (ConnectorsClient, InMemoryWorkSource):
        for name in public_methods(cls):
            parameters = list(signature(getattr(cls, name)).parameters.values())[1:]  # after self
            positional = [p.name for p in parameters if p.kind is not inspect.Parameter.KEYWORD_ONLY]
            assert len(positional) <= 1, f"{cls.__name__}.{name}: {positional} are positional"
