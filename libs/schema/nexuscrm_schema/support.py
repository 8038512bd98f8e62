"""Which canonical schema versions a service serves, and the start-up gate that enforces it (decision 144).

Every owner that touches the database declares one ``SchemaSupport`` of literal numbers in
its own package: the oldest version it can serve (``minimum``), the newest it knows
(``newest``), and how many versions past that it still serves (``forward_window``; safe
because every migration only adds, so a newer schema still holds everything this release
reads and writes). At start, before anything is registered, the service reads the database's
version and ``fit`` places it:

- no schema, or older than ``minimum``: refused (``SchemaRefused``: one line naming both
  versions, the service and the command that migrates);
- ``minimum`` .. ``newest``: served;
- past ``newest`` but within the window: served, with one warning line;
- past the window: refused, naming both versions.

``start_gate`` is the ``before_serving`` callable ``nexuscrm_runtime.server.run_service``
runs; the Integration host checks what the schema catalog reports with ``check_schema``.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Callable

from sqlalchemy.engine import Engine

from nexuscrm_runtime.build_info import Release, SupportedSchema, schema_range
from nexuscrm_runtime.prerequisites import StartRefused
from nexuscrm_schema.verification import current_version

MIGRATE_COMMAND = 'nexuscrm-schema migrate --dsn "$NEXUSCRM_DSN"'  # the schema catalog's command
STATUS_COMMAND = 'nexuscrm-schema status --dsn "$NEXUSCRM_DSN"'


@dataclasses.dataclass(frozen=True, kw_only=True)
class SchemaSupport:
    """The canonical schema versions one release serves (see the module docstring).

    ``minimum`` 0 serves a database without schema (the schema catalog, which creates it);
    ``forward_window`` 0 refuses every version past ``newest``.
    """

    minimum: int
    newest: int
    forward_window: int

    def __post_init__(self) -> None:
        if not 0 <= self.minimum <= self.newest or self.newest < 1 or self.forward_window < 0:
            raise ValueError(
                f"a schema range needs 0 <= minimum <= newest, newest >= 1 and forward_window >= 0, got {self}"
            )


class Fit(enum.StrEnum):
    """Where a database's schema version falls against a ``SchemaSupport``."""

    MISSING = "missing"  # no schema at all (version 0), and the release needs one
    TOO_OLD = "too old"  # older than the minimum: migrate first
    SUPPORTED = "supported"  # minimum .. newest
    AHEAD = "ahead"  # past newest, inside the forward window: served with a warning
    TOO_NEW = "too new"  # past the forward window: this release cannot serve it

    @property
    def serves(self) -> bool:
        """True when a release may serve a database at this fit."""
        return self in (Fit.SUPPORTED, Fit.AHEAD)


def fit(support: SupportedSchema, version: int) -> Fit:
    """Where ``version`` (0: no schema) falls against ``support``."""
    if version < support.minimum:
        return Fit.MISSING if version == 0 else Fit.TOO_OLD
    if version <= support.newest:
        return Fit.SUPPORTED
    return Fit.AHEAD if version <= support.newest + support.forward_window else Fit.TOO_NEW


class SchemaRefused(StartRefused):
    """The database's schema is one this release cannot serve; the message says which and what to do."""


def check_schema(release: Release, version: int) -> str | None:
    """Judge a database at ``version`` for ``release``: ``SchemaRefused``, a warning to log once, or None.

    Every message names the database's version, the release (distribution and version) and
    the versions it serves; a refusal also says what to run.
    """
    support = release.schema
    found = fit(support, version)
    serves = f"{release.distribution} {release.version} serves schema {schema_range(support)}"
    if found is Fit.MISSING:
        raise SchemaRefused(
            f"the database has no canonical schema (version 0); {serves}; migrate it first: {MIGRATE_COMMAND}"
        )
    if found is Fit.TOO_OLD:
        raise SchemaRefused(f"the database is at schema {version}; {serves}; migrate it: {MIGRATE_COMMAND}")
    if found is Fit.TOO_NEW:
        raise SchemaRefused(
            f"the database is at schema {version}, past what {release.distribution} {release.version} serves "
            f"({schema_range(support)}); migrations never go back: run a release that serves schema {version} "
            f"({STATUS_COMMAND} shows the database's versions)"
        )
    if found is Fit.AHEAD:
        return (
            f"the database is at schema {version}, newer than {release.distribution} {release.version} knows "
            f"({support.newest}); serving it inside the forward window ({schema_range(support)}): migrations only add"
        )
    return None


def read_version(engine: Engine) -> int:
    """The database's canonical schema version (``verification.current_version``); 0 without schema."""
    with engine.connect() as connection:
        return current_version(connection)


def start_gate(release: Release, log: logging.Logger) -> Callable[[Engine], None]:
    """The schema gate of ``release`` for ``run_service(before_serving=...)``.

    Reads the database's version; refuses with ``SchemaRefused``, or logs the one warning of a
    database inside the forward window, then the service's start line
    (``Release.start_line``).
    """

    def gate(engine: Engine) -> None:
        version = read_version(engine)
        warning = check_schema(release, version)
        if warning is not None:
            log.warning(warning)
        log.info(release.start_line(version))

    return gate
