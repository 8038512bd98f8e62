"""``nexuscrm_sdk``'s public surface: ``__all__`` names what exists, every module is public and no
module outside the SDK imports a private one; the docstring's Flow and test run as written."""

from __future__ import annotations

import importlib
import itertools
import pkgutil
import textwrap
from typing import Any

import grimp
import sqlalchemy as sa

import nexuscrm_sdk
from nexuscrm_sdk.flows import FlowContext

INVARIANTS_NOT_CHECKED = "the docstring's Flow runs on an in-memory read model, not the canonical database"

# What a Flow author or a source uses (examples/, the README's "Writing a Flow", the SDK's README),
# by the module that defines it.
PUBLIC = {
    "AppliedInputs": "applied",
    "ConnectorsClient": "client",
    "InMemoryWorkSource": "testing",
    **dict.fromkeys(("IngestRetry", "PipelinedIngest"), "pipeline"),
    **dict.fromkeys(
        ("DigestingFlow", "Flow", "FlowContext", "FlowFactory", "Generation", "PermanentFailure", "RetryLater"), "flows"
    ),
    **dict.fromkeys(("WorkSource", "Worker"), "worker"),
}
# The first-party packages whose imports of the SDK are checked (tests/architecture/packages.py
# lists them by distribution; these are their import names above workqueue and the contract).
IMPORTERS = (
    "nexuscrm_wire",
    "nexuscrm_runtime",
    "nexuscrm_schema",
    "nexuscrm_schema_catalog",
    "nexuscrm_controlplane",
    "nexuscrm_connectors",
    "nexuscrm_integration",
    "nexuscrm_tools",
)


def docstring_example(docstring: str, marker: str) -> str:
    """The indented block that follows ``marker`` (a reStructuredText literal block), dedented."""
    lines = docstring.split(marker, 1)[1].splitlines()[1:]
    block = itertools.takewhile(lambda line: line == "" or line.startswith("    "), lines)
    return textwrap.dedent("\n".join(block))


def test_the_public_surface_is_what_a_flow_author_uses_and_each_name_exists() -> None:
    assert sorted(nexuscrm_sdk.__all__) == sorted(PUBLIC)
    # Each name is the object its module defines (a class, or the Flow protocol's callable types).
    for name, module in PUBLIC.items():
        assert getattr(nexuscrm_sdk, name) is getattr(importlib.import_module(f"nexuscrm_sdk.{module}"), name), name
    # A star import gives exactly the surface.
    namespace: dict[str, Any] = {}
    exec("from nexuscrm_sdk import *", namespace)
    assert set(namespace) - {"__builtins__"} == set(PUBLIC)


def test_every_module_is_public_and_in_the_code_map() -> None:
    # The wire conversions the services share with the client are nexuscrm_wire (decision 184):
    # what the SDK ships is its users' to import.
    public = {info.name for info in pkgutil.iter_modules(nexuscrm_sdk.__path__) if not info.name.startswith("_")}
    assert public >= set(PUBLIC.values())
    for name in public:
        module = importlib.import_module(f"nexuscrm_sdk.{name}")
        assert not (module.__doc__ or "").startswith("Internal"), name
        assert f"``nexuscrm_sdk.{name}``" in (nexuscrm_sdk.__doc__ or ""), name


def test_no_package_outside_the_sdk_imports_a_private_module_of_it() -> None:
    graph = grimp.build_graph("nexuscrm_sdk", *IMPORTERS, cache_dir=None)
    private = [m for m in graph.find_descendants("nexuscrm_sdk") if m.rsplit(".", 1)[1].startswith("_")]
    outside = {
        (importer, module)
        for module in private
        for importer in graph.find_modules_that_directly_import(module)
        if not importer.startswith("nexuscrm_sdk.")
    }
    assert not outside, sorted(outside)
    # The check reads the services' imports of the SDK (grimp found the packages).
    assert "nexuscrm_sdk.client" in graph.find_modules_directly_imported_by("nexuscrm_integration.main")


def test_the_flow_and_its_test_in_the_package_docstring_pass() -> None:
    assert nexuscrm_sdk.__doc__ is not None
    example = docstring_example(nexuscrm_sdk.__doc__, "A Flow and its test::")
    assert example.lstrip().startswith("from nexuscrm_sdk import ")  # it imports only the public surface
    namespace: dict[str, Any] = {
        "context": FlowContext(pack_install_id="pk-1", work_type="count", engine=sa.create_engine("sqlite://")),
    }
    exec(compile(example, "nexuscrm_sdk.__doc__", "exec"), namespace)
    namespace["test_count_inputs"]()
    assert namespace["totals"] == {"a": 2}
