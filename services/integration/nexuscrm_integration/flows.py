"""Flows: how the host finds them (what they receive is the SDK's ``nexuscrm_sdk.flows``).

A Flow reference in the host configuration is either ``module:function`` or the name of a
Python entry point in the group ``nexuscrm.flows``. Either names a *Flow factory*: called once
per worker pool with a ``FlowContext``, it returns the Flow (``nexuscrm_sdk.flows.Flow``)
that the pool's workers run on each claimed generation.
"""

from __future__ import annotations

import importlib
from importlib import metadata

from nexuscrm_integration.errors import FlowNotFound
from nexuscrm_sdk.flows import FlowFactory

ENTRY_POINT_GROUP = "nexuscrm.flows"


def resolve_flow(reference: str) -> FlowFactory:
    """The Flow factory ``reference`` names (``module:function`` or an entry point name).

    Raises ``FlowNotFound`` naming the reference and why.
    """
    if ":" in reference:
        module_name, _, attribute = reference.partition(":")
        try:
            target: object = importlib.import_module(module_name)
            for part in attribute.split("."):
                target = getattr(target, part)
        except (ImportError, AttributeError) as error:
            raise FlowNotFound(f"flow {reference!r} cannot be imported: {error}", field="flow") from error
    else:
        found = metadata.entry_points(group=ENTRY_POINT_GROUP, name=reference)
        if not found:
            raise FlowNotFound(
                f"flow {reference!r} is neither module:function nor an entry point of group {ENTRY_POINT_GROUP}",
                field="flow",
            )
        target = next(iter(found)).load()
    if not callable(target):
        raise FlowNotFound(f"flow {reference!r} is not callable", field="flow")
    factory: FlowFactory = target
    return factory
