"""Reading service configuration from the environment, once, with errors that name the variable."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
from collections.abc import Iterator

from sqlalchemy.engine import make_url

DEFAULT_DSN = "sqlite:///var/nexuscrm.db"
DEFAULT_READINESS_INTERVAL_MS = 1000  # milliseconds between readiness probes of the database
MIN_READINESS_INTERVAL_MS = 50  # milliseconds
EXIT_CONFIG = 2  # a service refused its configuration at start (docs/security.md, "Exit codes")
log = logging.getLogger(__name__)


class ConfigError(ValueError):
    """A configuration variable is missing or malformed; the message names it."""


@contextlib.contextmanager
def refusing_bad_configuration() -> Iterator[None]:
    """Turn a ``ConfigError`` inside into one log line naming the problem and exit ``EXIT_CONFIG``.

    No traceback: the message is for an operator, and names the variable or file at fault.
    """
    try:
        yield
    except ConfigError as error:
        log.error("configuration refused: %s", " ".join(str(error).split("\n")))
        sys.exit(EXIT_CONFIG)


def env_str(name: str, default: str) -> str:
    """The variable's value, or ``default`` when unset or empty."""
    return os.environ.get(name) or default


def env_int(name: str, default: int, *, minimum: int = 0) -> int:
    """The variable as an integer of at least ``minimum``."""
    raw = os.environ.get(name)
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {raw!r}") from None
    if value < minimum:
        raise ConfigError(f"{name} must be at least {minimum}, got {value}")
    return value


def check_address(name: str, address: str) -> str:
    """``address`` if it is host:port (port 0 = any free port); else ``ConfigError`` naming ``name``."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ConfigError(f"{name} must be host:port, got {address!r}")
    return address


def dsn_backend(dsn: str) -> str:
    """The backend a DSN names ("sqlite", "mysql"): all of a DSN that may reach a log line."""
    return make_url(dsn).get_backend_name()


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServiceConfig:
    """Settings every service reads from the environment.

    ``dsn``: database URL (``NEXUSCRM_DSN``; default: embedded SQLite under ``var/``).
    ``address``: host:port to listen on (``NEXUSCRM_<SERVICE>_ADDRESS``; port 0 = any free port).
    ``grace_seconds``: how long SIGTERM waits for in-flight RPCs and side servers' requests
    (``NEXUSCRM_GRACE_SECONDS``); the process ends within this plus ``server.SHUTDOWN_MARGIN``.
    ``max_workers``: RPC handler threads (``NEXUSCRM_MAX_WORKERS``).
    ``port_file``: where to write the bound port once serving (``NEXUSCRM_PORT_FILE``; for
    launchers and tests that bind port 0). Side servers (metrics, dashboard) publish theirs
    beside it (``server.side_port_file``).
    ``metrics_address``: host:port of the Prometheus endpoint
    (``NEXUSCRM_<SERVICE>_METRICS_ADDRESS``; empty: no endpoint; port 0 = any free port).
    ``readiness_interval_ms``: how often the service probes its database for its readiness
    health (``NEXUSCRM_READINESS_INTERVAL_MS``, at least 50; ``nexuscrm_runtime.readiness``).
    """

    dsn: str
    address: str
    grace_seconds: int = 10
    max_workers: int = 16
    port_file: str = ""
    metrics_address: str = ""
    readiness_interval_ms: int = DEFAULT_READINESS_INTERVAL_MS

    def __post_init__(self) -> None:
        check_address("the listen address", self.address)
        if self.metrics_address:
            check_address("the metrics address", self.metrics_address)
        try:
            make_url(self.dsn)
        except Exception:
            raise ConfigError("NEXUSCRM_DSN is not a valid database URL") from None

    @classmethod
    def from_env(cls, service: str, default_port: int) -> ServiceConfig:
        """Read the configuration of ``service`` (for example ``CONNECTORS``)."""
        return cls(
            dsn=env_str("NEXUSCRM_DSN", DEFAULT_DSN),
            address=env_str(f"NEXUSCRM_{service}_ADDRESS", f"127.0.0.1:{default_port}"),
            grace_seconds=env_int("NEXUSCRM_GRACE_SECONDS", 10),
            max_workers=env_int("NEXUSCRM_MAX_WORKERS", 16, minimum=1),
            port_file=env_str("NEXUSCRM_PORT_FILE", ""),
            metrics_address=env_str(f"NEXUSCRM_{service}_METRICS_ADDRESS", ""),
            readiness_interval_ms=env_int(
                "NEXUSCRM_READINESS_INTERVAL_MS", DEFAULT_READINESS_INTERVAL_MS, minimum=MIN_READINESS_INTERVAL_MS
            ),
        )
