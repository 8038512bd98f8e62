"""The generated protobuf package imports cleanly and is what the protos generate today."""

from __future__ import annotations

import filecmp
import importlib
import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
# Loaded by its path: protos/ on sys.path would make its .proto tree the namespace package
# ``nexuscrm`` and hide the generated one.
_spec = importlib.util.spec_from_file_location("generate", ROOT / "protos" / "generate.py")
assert _spec is not None and _spec.loader is not None
generate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(generate)

MODULES = [
    "nexuscrm.schemacatalog.v1.schema_catalog_pb2_grpc",
    "nexuscrm.controlplane.v1.controlplane_pb2_grpc",
    "nexuscrm.connectors.v1.connectors_pb2_grpc",
    "nexuscrm.integration.v1.integration_pb2_grpc",
]


@pytest.mark.parametrize("module", MODULES)
def test_generated_modules_import(module: str) -> None:
    assert importlib.import_module(module)


def test_regenerating_changes_nothing(tmp_path: Path) -> None:
    fresh = generate.generate(tmp_path)
    installed = generate.DEFAULT_OUTPUT
    names = [path.relative_to(tmp_path) for path in fresh]
    assert sorted(names) == sorted(
        p.relative_to(installed)
        for p in (installed / "nexuscrm").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    stale = [str(name) for name in names if not filecmp.cmp(tmp_path / name, installed / name, shallow=False)]
    assert not stale, f"generated code is stale; run `make protos`: {stale}"
