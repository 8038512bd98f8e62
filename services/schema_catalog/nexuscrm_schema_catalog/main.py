"""Entry point of the schema catalog service (``nexuscrm-schema-catalog``).

Environment: NEXUSCRM_DSN, NEXUSCRM_SCHEMA_CATALOG_ADDRESS (default 127.0.0.1:50051),
NEXUSCRM_APPLY_SCHEMA_ON_START (default 1: migrate to the newest version before serving).
"""

from __future__ import annotations

import logging

from sqlalchemy.engine import Engine

from nexuscrm_runtime.config import ServiceConfig, env_int
from nexuscrm_runtime.security import Security
from nexuscrm_runtime.server import Registration, run_service
from nexuscrm_schema_catalog import migrations
from nexuscrm_schema_catalog.servicer import registration

log = logging.getLogger("nexuscrm_schema_catalog")
DEFAULT_PORT = 50051


def build(config: ServiceConfig, engine: Engine, security: Security | None) -> list[Registration]:
    """Apply the schema if configured to, and register the servicer."""
    if env_int("NEXUSCRM_APPLY_SCHEMA_ON_START", 1):
        start, end, applied = migrations.apply_schema(engine)
        log.info("schema at version %d (was %d; applied %s)", end, start, ", ".join(applied) or "nothing")
    return [registration(engine)]


def main() -> None:
    """Serve SchemaCatalogService until SIGTERM."""
    run_service(env_name="SCHEMA_CATALOG", default_port=DEFAULT_PORT, build=build)


if __name__ == "__main__":
    main()
