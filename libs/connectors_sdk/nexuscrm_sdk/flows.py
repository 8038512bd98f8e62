"""What a Flow author writes: a Flow, and the factory the Integration host calls to build it.

A Flow takes one claimed generation and consumes its complete ordered input set
(``nexuscrm_sdk.worker``). A Flow factory is called once per worker pool with a
``FlowContext`` and returns the Flow the pool's workers run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from nexuscrm_sdk.worker import Flow

if TYPE_CHECKING:  # the SDK does not need SQLAlchemy installed; a host that passes an engine has it
    from sqlalchemy.engine import Engine

__all__ = ["Flow", "FlowContext", "FlowFactory"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class FlowContext:
    """What a Flow factory gets: the pool it serves, the host's database and the pool's settings.

    ``engine`` is the database of the host's NEXUSCRM_DSN, for read models the Flow keeps
    there; canonical tables are not the Flow's to write. ``settings`` are the pool's own
    strings (its ``settings`` table in the host configuration), for whatever the Flow needs
    configured: a Flow whose read model lives in a database of its own reads its URL from
    them and opens its own engine, as ``examples/contact_stages.py`` does.
    For idempotent read-model writes see ``nexuscrm_sdk.applied``.
    """

    pack_install_id: str
    work_type: str
    engine: Engine
    settings: Mapping[str, str] = dataclasses.field(default_factory=dict)


FlowFactory = Callable[[FlowContext], Flow]
