"""A schema-catalog server in process, named to the ``nexuscrm`` CLI as its target."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import sqlalchemy as sa

from nexuscrm_runtime.server import create_server
from nexuscrm_schema_catalog.servicer import registration

TARGET_ENV = "NEXUSCRM_SCHEMA_CATALOG_TARGET"


@contextlib.contextmanager
def serving_schema_catalog(engine: sa.Engine, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Serve SchemaCatalogService over ``engine`` on a free port and point ``TARGET_ENV`` at it until the block ends."""
    running = create_server([registration(engine)], "127.0.0.1:0")
    monkeypatch.setenv(TARGET_ENV, f"127.0.0.1:{running.port}")
    try:
        yield
    finally:
        running.stop(0)
