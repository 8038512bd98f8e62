"""What a running service is: the answer of every service's GetBuildInfo and its start line.

Each service declares its ``Release`` once (owner, distribution, supported schema versions);
the package and contract versions are read from the installed distributions at run time
(``importlib.metadata``), so a build reports what is installed, not what a constant says. The
servicers stay thin: ``build_info(release, database_version)`` is the whole answer (decision 144).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
from typing import Protocol

from nexuscrm.buildinfo.v1 import build_info_pb2 as pb

CONTRACT_DISTRIBUTION = "nexuscrm-protos"  # its version is the wire contract's (protos/CHANGELOG.md)
NOT_INSTALLED = "not installed"  # a version read from a distribution pip does not know


class SupportedSchema(Protocol):
    """The canonical schema versions a service serves (``nexuscrm_schema.support.SchemaSupport``)."""

    @property
    def minimum(self) -> int:
        """The oldest version it serves; 0 serves a database without schema."""
        ...

    @property
    def newest(self) -> int:
        """The newest version it knows."""
        ...

    @property
    def forward_window(self) -> int:
        """How many versions past ``newest`` it still serves, with a warning."""
        ...


def schema_range(schema: SupportedSchema) -> str:
    """``10..10 +1``: the served versions and the forward window, as log lines and tables show them."""
    return f"{schema.minimum}..{schema.newest} +{schema.forward_window}"


def distribution_version(distribution: str) -> str:
    """The installed version of ``distribution``; ``NOT_INSTALLED`` when it is not installed."""
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return NOT_INSTALLED


@dataclasses.dataclass(frozen=True, kw_only=True)
class Release:
    """One service's release: its owner (owners.toml), distribution and supported schema versions."""

    owner: str
    distribution: str
    schema: SupportedSchema

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


def build_info(release: Release, database_version: int) -> pb.BuildInfo:
    """The GetBuildInfo answer of ``release`` serving a database at ``database_version`` (0: no schema)."""
    return pb.BuildInfo(
        owner=release.owner,
        package=release.distribution,
        package_version=release.version,
        contract_version=release.contract_version,
        schema_support=pb.SchemaSupport(
            minimum=release.schema.minimum,
            newest=release.schema.newest,
            forward_window=release.schema.forward_window,
        ),
        database_schema_version=database_version,
    )
