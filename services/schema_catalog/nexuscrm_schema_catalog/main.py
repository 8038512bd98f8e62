"""Entry point of the schema catalog service (``nexuscrm-schema-catalog``).

Environment: NEXUSCRM_DSN, NEXUSCRM_SCHEMA_CATALOG_ADDRESS (default 127.0.0.1:50051),
NEXUSCRM_APPLY_SCHEMA_ON_START (default 1: migrate to the newest version before serving).
The schema gate (``release``) refuses a database newer than the last migration this release
has, before migrating: exit 3 and one log line, nothing written, nothing served.
"""

from __future__ import annotations

import logging

from sqlalchemy.engine import Engine

from nexuscrm_runtime.config import ServiceConfig, env_int
from nexuscrm_runtime.release import check_schema
from nexuscrm_runtime.security import Security
from nexuscrm_runtime.server import Registration, run_service
from nexuscrm_schema.support import read_version, start_gate
from nexuscrm_schema_catalog import migrations
from nexuscrm_schema_catalog.release import RELEASE
from nexuscrm_schema_catalog.servicer import registration

log = logging.getLogger("nexuscrm_schema_catalog")
DEFAULT_PORT = 50051
schema_gate = start_gate(RELEASE, log)


def prepare(engine: Engine) -> None:
    """Apply the schema if configured to, then pass the schema gate (``StartRefused`` refuses).

    A database newer than this release's migrations is refused before the apply: nothing is written.
    """
    check_schema(RELEASE, read_version(engine))
    if env_int("NEXUSCRM_APPLY_SCHEMA_ON_START", 1):
        start, end, applied = migrations.apply_schema(engine)
        log.info("schema at version %d (was %d; applied %s)", end, start, ", ".join(applied) or "nothing")
    schema_gate(engine)


def build(config: ServiceConfig, engine: Engine, security: Security | None) -> list[Registration]:
    """Register the servicer."""
    return [registration(engine)]


def main() -> None:
    """Serve SchemaCatalogService until SIGTERM."""
    run_service(env_name="SCHEMA_CATALOG", default_port=DEFAULT_PORT, build=build, before_serving=prepare)


if __name__ == "__main__":
    main()
