"""The Flow protocol: what a Flow receives, what it is, how it is built and how a host finds it.

A Flow takes one claimed ``Generation`` and consumes its complete ordered input set (the
``Worker`` of ``nexuscrm_sdk.worker`` runs it). A Flow factory is called once per worker pool
with a ``FlowContext`` and returns the Flow the pool's workers run. A host names a factory by
``module:function`` or by an entry point of the group ``nexuscrm.flows``; ``resolve_flow``
finds it, for the Integration host and for a Flow author's tooling alike (decision 154).

Flow versions (decision 185): a new version of a work type's Flow is built from history beside
the live one. Its generations run in a build (``Generation.build_run``): the inputs ran, or
run, live in another version, so a Flow writes its read model then and causes no side effect
(no e-mail, no call out), which it causes only when ``Generation.live``. A Flow may offer a
digest of its read model (``DigestingFlow``, found by ``flow_digest``): ``nexuscrm versions
verify`` compares two versions' digests identity by identity at one ordinal. Both versions
see the same inputs under the same identity apart from its companion version, so a read model
keyed by ``version_free_key`` meets the digest's ``projection_key`` in either version.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import importlib
import json
from collections.abc import Callable, Iterator, Mapping
from importlib import metadata
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from workqueue import ProjectionIdentity, decode_projection_key
from workqueue.errors import DomainError, ErrorKind
from workqueue.values import InputRow, Route, WorkItemRow

if TYPE_CHECKING:  # the SDK does not need SQLAlchemy installed; a host that passes an engine has it
    from sqlalchemy.engine import Engine

__all__ = [
    "ENTRY_POINT_GROUP",
    "DigestingFlow",
    "Flow",
    "FlowContext",
    "FlowFactory",
    "FlowNotFound",
    "Generation",
    "PermanentFailure",
    "RetryLater",
    "flow_digest",
    "resolve_flow",
    "version_free_key",
]

ENTRY_POINT_GROUP = "nexuscrm.flows"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Generation:
    """What a Flow receives: the claimed generation, its projection identity and an iterator over all its members.

    ``identity`` is decoded from ``work.projection_key`` (``workqueue.decode_projection_key``):
    the pack, Event kind, route and companion versions, work type and source lane the
    generation projects; ``route`` is the same without the pack. ``flow_version`` and
    ``build_run`` / ``live`` say which Flow version it runs for and whether it runs in a build.
    """

    work: WorkItemRow
    inputs: Iterator[InputRow]
    identity: ProjectionIdentity = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "identity", decode_projection_key(self.work.projection_key))

    @property
    def route(self) -> Route:
        """The projection identity without its pack: Event kind, versions, work type and source lane."""
        return Route.of(self.identity)

    @property
    def flow_version(self) -> str:
        """The Flow version the generation runs for: its track's, else the identity's companion version."""
        return self.work.flow_version or self.identity.companion_version

    @property
    def build_run(self) -> bool:
        """True in a version build: write the read model only, cause no side effect (its inputs ran live elsewhere)."""
        return self.work.build_run

    @property
    def live(self) -> bool:
        """True when the generation runs in the live version: the Flow may cause its side effects."""
        return not self.work.build_run


Flow = Callable[[Generation], None]


@runtime_checkable
class DigestingFlow(Protocol):
    """A Flow that can digest its read model: what ``nexuscrm versions verify`` compares between two versions.

    ``digest(projection_key, through_ordinal)``: a text that is equal for two versions exactly
    when their read models of that identity agree after every input at or below
    ``through_ordinal`` (and before any above it). ``projection_key`` is the inputs' identity
    (the companion version they were delivered with), the same for both versions: key the
    read model by ``version_free_key``. A Flow that is a plain function has no digest; the
    verification then compares coverage only.
    """

    def __call__(self, generation: Generation) -> None: ...

    def digest(self, projection_key: str, through_ordinal: int) -> str: ...


def flow_digest(flow: Flow) -> Callable[[str, int], str] | None:
    """``flow``'s digest (``DigestingFlow.digest``), or None when it has none."""
    return flow.digest if isinstance(flow, DigestingFlow) else None


def version_free_key(identity: ProjectionIdentity) -> str:
    """``identity`` without its companion version: the same for every Flow version of it (a read-model key)."""
    fields = dataclasses.asdict(identity)
    del fields["companion_version"]
    return json.dumps(fields, sort_keys=True)  # unambiguous whatever the fields hold


class PermanentFailure(Exception):
    """Raised by a Flow whose generation can never succeed (a poison input): fail it for good, now.

    The worker fails the attempt as not retryable, so the generation is a dead letter after
    this one attempt, whatever attempts remain; any other exception is a retryable failure.
    The message goes to the generation's LastError like any failure's.
    """


class RetryLater(Exception):
    """Raised by a Flow that cannot run its generation yet (a dependency is away): run it again after ``delay``.

    The attempt is not counted against the generation's attempts (a Flow may ask again, each
    time at most a day: Connectors' ``MAX_RETRY_AFTER``); the message goes to LastError.
    """

    def __init__(self, message: str, *, delay: dt.timedelta) -> None:
        super().__init__(message)
        self.delay = delay


@dataclasses.dataclass(frozen=True, kw_only=True)
class FlowContext:
    """What a Flow factory gets: the pool it serves, the host's database and the pool's settings.

    ``engine`` is the database of the host's NEXUSCRM_DSN, for read models the Flow keeps
    there; canonical tables are not the Flow's to write. ``settings`` are the pool's own
    strings (its ``settings`` table in the host configuration), for whatever the Flow needs
    configured: a Flow whose read model lives in a database of its own reads its URL from
    them and opens its own engine, as ``examples/contact_stages.py`` does. ``flow_version``: the
    Flow version the pool claims (empty: the inputs' own version), so versions built beside
    each other keep their read models apart.
    For idempotent read-model writes see ``nexuscrm_sdk.applied``.
    """

    pack_install_id: str
    work_type: str
    engine: Engine
    settings: Mapping[str, str] = dataclasses.field(default_factory=dict)
    flow_version: str = ""


FlowFactory = Callable[[FlowContext], Flow]


class FlowNotFound(DomainError):
    """A Flow reference names no importable, callable ``module:function`` and no registered entry point."""

    kind = ErrorKind.NOT_FOUND


def resolve_flow(reference: str) -> FlowFactory:
    """The Flow factory ``reference`` names (``module:function`` or an entry point name).

    ``module:function`` is imported from ``sys.path`` (the attribute may be dotted); any other
    reference is an entry point name of the group ``nexuscrm.flows``. Raises ``FlowNotFound``
    naming the reference and why.
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
