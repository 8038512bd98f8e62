"""``nexuscrm_sdk.flows.resolve_flow``: a Flow reference names a factory by ``module:function`` or entry point."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from nexuscrm_sdk.flows import ENTRY_POINT_GROUP, FlowNotFound, resolve_flow
from workqueue.errors import ErrorKind

FLOW_MODULE = """
def factory(context):
    return lambda generation: None

class Holder:
    @staticmethod
    def nested(context):
        return lambda generation: None

not_callable = 42
"""


@pytest.fixture
def on_path(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path`` on ``sys.path``: the module ``sample_flows`` and a distribution naming it as a Flow entry point."""
    (tmp_path / "sample_flows.py").write_text(FLOW_MODULE)
    info = tmp_path / "sample_flows-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sample-flows\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[{ENTRY_POINT_GROUP}]\nsample-counting = sample_flows:factory\n")
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("sample_flows", None)


def test_a_module_function_and_a_dotted_attribute_resolve_to_the_factory(on_path: Path) -> None:
    import sample_flows  # type: ignore[import-not-found]

    assert resolve_flow("sample_flows:factory") is sample_flows.factory
    assert resolve_flow("sample_flows:Holder.nested") is sample_flows.Holder.nested


def test_an_entry_point_name_resolves_to_the_factory_it_names(on_path: Path) -> None:
    import sample_flows

    assert resolve_flow("sample-counting") is sample_flows.factory


@pytest.mark.parametrize(
    ("reference", "why"),
    [
        ("sample_no_such_module:factory", "cannot be imported: No module named 'sample_no_such_module'"),
        ("sample_flows:no_such_factory", "cannot be imported"),
        ("sample_flows:not_callable", "is not callable"),
        ("sample-no-such-flow", f"is neither module:function nor an entry point of group {ENTRY_POINT_GROUP}"),
    ],
)
def test_a_reference_that_names_no_factory_is_not_found_naming_it_and_why(
    on_path: Path, reference: str, why: str
) -> None:
    with pytest.raises(FlowNotFound) as raised:
        resolve_flow(reference)
    assert str(raised.value).startswith(f"flow {reference!r}") and why in str(raised.value)
    assert raised.value.kind is ErrorKind.NOT_FOUND and raised.value.field == "flow"
