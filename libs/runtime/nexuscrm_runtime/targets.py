"""Where the other services listen, as clients of this package (host, CLI, ``nexuscrm-run``) find them.

Each address comes from ``NEXUSCRM_<NAME>_TARGET`` (the launcher sets these for the services
it starts after the named one), else the service's default local port.
"""

from __future__ import annotations

import dataclasses

from nexuscrm_runtime.config import env_str

DEFAULT_TARGETS = {
    "SCHEMA_CATALOG": "127.0.0.1:50051",
    "CONTROLPLANE": "127.0.0.1:50052",
    "CONNECTORS": "127.0.0.1:50053",
    "INTEGRATION": "127.0.0.1:50054",
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Targets:
    """host:port of each service.

    ``schema_catalog``: NEXUSCRM_SCHEMA_CATALOG_TARGET. ``controlplane``:
    NEXUSCRM_CONTROLPLANE_TARGET. ``connectors``: NEXUSCRM_CONNECTORS_TARGET.
    ``integration``: NEXUSCRM_INTEGRATION_TARGET. Defaults: 127.0.0.1 and the default ports.
    """

    schema_catalog: str = DEFAULT_TARGETS["SCHEMA_CATALOG"]
    controlplane: str = DEFAULT_TARGETS["CONTROLPLANE"]
    connectors: str = DEFAULT_TARGETS["CONNECTORS"]
    integration: str = DEFAULT_TARGETS["INTEGRATION"]

    @classmethod
    def from_env(cls) -> Targets:
        """Read every ``NEXUSCRM_<NAME>_TARGET`` variable, defaulting as above."""
        return cls(
            **{name.lower(): env_str(f"NEXUSCRM_{name}_TARGET", default) for name, default in DEFAULT_TARGETS.items()}
        )
