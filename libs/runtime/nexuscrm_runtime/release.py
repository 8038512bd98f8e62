"""What a release of a service is, which canonical schema versions it serves, and the verdict on a database's.

Each owner that touches the database declares one ``Release`` in its own package
(``nexuscrm_<owner>/release.py``) with a ``SchemaSupport`` of literal numbers: the oldest
version it serves (``minimum``), the newest it knows (``newest``), and how many versions past
that it still serves (``forward_window``; safe because every migration only adds, so a newer
schema still holds everything the release reads and writes). ``check_schema`` places a
database's version:

- no schema, or older than ``minimum``: refused (``SchemaRefused``: one line naming both
  versions, the release and the command that migrates);
- ``minimum`` .. ``newest``: served;
- past ``newest`` but within the window: served, with one warning line;
- past the window: refused, naming both versions.

Pure, without SQL, so the Integration host (which reads no canonical table and declares no
SQL library) judges the version the schema catalog reports with it; the gate that reads the
database itself is ``nexuscrm_schema.support.start_gate``. Package and contract versions are
read from the installed distributions (``importlib.metadata``): a build reports what is
installed, not what a constant says (decision 144).
"""

from __future__ import annotations

import dataclasses
import enum
import importlib.metadata
from typing import Protocol

from nexuscrm_runtime.prerequisites import StartRefused

CONTRACT_DISTRIBUTION = "nexuscrm-protos"  # its version is the wire contract's (protos/CHANGELOG.md)
NOT_INSTALLED = "not installed"  # a version read from a distribution pip does not know
MIGRATE_COMMAND = 'nexuscrm-schema migrate --dsn "$NEXUSCRM_DSN"'  # the schema catalog's command
STATUS_COMMAND = 'nexuscrm-schema status --dsn "$NEXUSCRM_DSN"'


class SupportedSchema(Protocol):
    """A schema range as declared (``SchemaSupport``) or as a service answered it (GetBuildInfo)."""

    @property
    def minimum(self) -> int:
        """The oldest version served; 0 serves a database without schema."""
        ...

    @property
    def newest(self) -> int:
        """The newest version known."""
        ...

    @property
    def forward_window(self) -> int:
        """How many versions past ``newest`` are still served, with a warning."""
        ...


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


def schema_range(schema: SupportedSchema) -> str:
    """``10..10 +1``: the served versions and the forward window, as log lines and tables show them."""
    return f"{schema.minimum}..{schema.newest} +{schema.forward_window}"


class Fit(enum.StrEnum):
    """Where a database's schema version falls against a schema range."""

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


def distribution_version(distribution: str) -> str:
    """The installed version of ``distribution``; ``NOT_INSTALLED`` when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return NOT_INSTALLED


@dataclasses.dataclass(frozen=True, kw_only=True)
class Release:
    """One service's release: its owner (owners.toml), distribution and the schema versions it serves."""

    owner: str
    distribution: str
    schema: SchemaSupport

    @property
    def version(self) -> str:
        """The installed version of the service's distribution."""
        return distribution_version(self.distribution)

    @property
    def contract_version(self) -> str:
        """The installed version of the wire contract (``CONTRACT_DISTRIBUTION``)."""
        return distribution_version(CONTRACT_DISTRIBUTION)

    def start_line(self, database_version: int) -> str:
        """``nexuscrm-connectors 0.2.0 (contract 1.2.0, schema 10..10 +1, database at 10)``."""
        return (
            f"{self.distribution} {self.version} (contract {self.contract_version}, "
            f"schema {schema_range(self.schema)}, database at {database_version})"
        )


class SchemaRefused(StartRefused):
    """The database's schema is one this release cannot serve; the message says which and what to do."""


def check_schema(release: Release, version: int) -> str | None:
    """Judge a database at ``version`` for ``release``: ``SchemaRefused``, a warning to log once, or None.

    Every message is one line naming the database's version, the release (distribution and
    version) and the versions it serves; a refusal also says what to run.
    """
    support = release.schema
    found = fit(support, version)
    who = f"{release.distribution} {release.version}"
    serves = f"{who} serves schema {schema_range(support)}"
    if found is Fit.MISSING:
        raise SchemaRefused(
            f"the database has no canonical schema (version 0); {serves}; migrate it first: {MIGRATE_COMMAND}"
        )
    if found is Fit.TOO_OLD:
        raise SchemaRefused(f"the database is at schema {version}; {serves}; migrate it: {MIGRATE_COMMAND}")
    if found is Fit.TOO_NEW:
        raise SchemaRefused(
            f"the database is at schema {version}, past what {who} serves ({schema_range(support)}); "
            f"migrations never go back: run a release that serves schema {version} "
            f"({STATUS_COMMAND} shows the database's versions)"
        )
    if found is Fit.AHEAD:
        return (
            f"the database is at schema {version}, newer than {who} knows ({support.newest}); "
            f"serving it inside the forward window ({schema_range(support)}): migrations only add"
        )
    return None
