"""The dashboard's Connectors: a real ConnectorsService in this process, reached over gRPC.

The dashboard reads Connectors only through its RPCs (``dashboard.connectors``); these
fixtures serve ``Connectors`` over the test's engine on an OS-chosen port and hand the
dashboard reads over a channel to it, so the test's statement capture still sees every
statement the RPCs run.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.servicer import registration
from nexuscrm_controlplane.dashboard.connectors import ConnectorsReads, connectors_reads
from nexuscrm_runtime.server import create_server
from nexuscrm_runtime.targets import Targets


@pytest.fixture
def connectors_target(engine: sa.Engine) -> Iterator[str]:
    """host:port of a ConnectorsService over ``engine``, stopped after the test."""
    running = create_server([registration(Connectors(engine))], "127.0.0.1:0")
    yield f"127.0.0.1:{running.port}"
    running.stop(0)


@pytest.fixture
def connectors(connectors_target: str) -> Iterator[ConnectorsReads]:
    """The dashboard's reads of that ConnectorsService, over a plaintext channel."""
    with connectors_reads(Targets(connectors=connectors_target), None) as reads:
        yield reads


@pytest.fixture
def unreachable_target() -> str:
    """host:port where nothing listens (bound, then closed, so no one else got it yet)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{probe.getsockname()[1]}"


@pytest.fixture
def unreachable_connectors(unreachable_target: str) -> Iterator[ConnectorsReads]:
    """Reads aimed at ``unreachable_target``."""
    with connectors_reads(Targets(connectors=unreachable_target), None) as reads:
        yield reads
