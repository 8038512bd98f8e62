"""What a Flow author writes: a Flow, and the factory the Integration host calls to build it.

A Flow takes one claimed generation and consumes its complete ordered input set
(``nexuscrm_sdk.worker``). A Flow factory is called once per worker pool with a
``FlowContext`` and returns the Flow the pool's workers run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from nexuscrm_sdk.worker import Flow

if TYPE_CHECKING:  # the SDK does not need SQLAlchemy installed; a host that passes an engine has it
    from sqlalchemy.engine import Engine

__all__ = ["Flow", "FlowContext", "FlowFactory"]


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
