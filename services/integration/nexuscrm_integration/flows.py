"""Flows: how the host finds them and what they receive.

A Flow reference in the host configuration is either ``module:function`` or the name of a
Python entry point in the group ``nexuscrm.flows``. Either names a *Flow factory*: called once
per worker pool with a ``FlowContext``, it returns the Flow (``nexuscrm_connectors.worker.Flow``)
that the pool's workers run on each claimed generation.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from importlib import metadata

from sqlalchemy.engine import Engine

from nexuscrm_connectors.worker import Flow
from nexuscrm_integration.errors import FlowNotFound

ENTRY_POINT_GROUP = "nexuscrm.flows"


@dataclasses.dataclass(frozen=True, kw_only=True)
class FlowContext:
    """What a Flow factory gets: the pool it serves and the host's database.

    ``engine`` is the database of NEXUSCRM_DSN, for read models the Flow owns; canonical tables
    are not the Flow's to write.
    """

    pack_install_id: str
    work_type: str
    engine: Engine


FlowFactory = Callable[[FlowContext], Flow]


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
