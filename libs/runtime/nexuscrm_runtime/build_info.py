"""The answer of every service's GetBuildInfo (contract 1.2.0, decision 144).

The servicers stay thin: ``build_info(release, database_version)`` is the whole answer, from
the service's declared ``release.Release`` and the database's version as it reads it.
"""

from __future__ import annotations

from nexuscrm.buildinfo.v1 import build_info_pb2 as pb
from nexuscrm_runtime.release import Release


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
