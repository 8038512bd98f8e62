"""The start-up schema gate of a service that reads canonical tables (decision 144).

Reads the database's version (``verification.current_version``) and judges it with
``nexuscrm_runtime.release.check_schema`` against the service's declared release: a refusal
raises ``SchemaRefused``, which ``nexuscrm_runtime.server.run_service`` turns into one log
line and exit 3 before anything is registered; a version inside the forward window logs one
warning; then the service's start line. ``start_gate`` is the ``before_serving`` callable.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy.engine import Engine

from nexuscrm_runtime.release import Release, check_schema
from nexuscrm_schema.verification import current_version


def read_version(engine: Engine) -> int:
    """The database's canonical schema version (``verification.current_version``); 0 without schema."""
    with engine.connect() as connection:
        return current_version(connection)


def start_gate(release: Release, log: logging.Logger) -> Callable[[Engine], None]:
    """The schema gate of ``release`` for ``run_service(before_serving=...)``.

    Reads the database's version; refuses with ``SchemaRefused``, or logs the one warning of a
    database inside the forward window, then the service's start line (``Release.start_line``).
    """

    def gate(engine: Engine) -> None:
        version = read_version(engine)
        warning = check_schema(release, version)
        if warning is not None:
            log.warning(warning)
        log.info(release.start_line(version))

    return gate
