"""What ``nexuscrm-schema migrate`` shows while ``migrations.apply_schema`` runs, and how Ctrl-C stops it.

A ``migrations.Observer``: one line per step as it starts, one when its version is recorded.
Every step is DDL only (no step copies data, decision 150), so there is no progress within a
step to show. A stop request (the command's SIGINT handler sets ``stop``) takes effect
between steps: the observer raises ``Stopped`` before the next step or after the one that
committed, naming how far it got.
"""

from __future__ import annotations

import threading

from rich.console import Console

from nexuscrm_schema_catalog.migrations import Observer, Step


class Stopped(Exception):
    """The operator asked to stop; everything before this point committed. The message says where."""


class MigrateProgress(Observer):
    """Shows each step on ``console``; honours ``stop`` between steps."""

    def __init__(self, console: Console, stop: threading.Event) -> None:
        self._console = console
        self._stop = stop

    def step_started(self, step: Step) -> None:
        """Name the step; stop before it if asked."""
        self._check(f"before {step.name}")
        self._console.print(f"applying {step.name} ...")

    def step_applied(self, step: Step) -> None:
        """Say the version is recorded; stop here if asked."""
        self._console.print(f"  version {step.version} recorded")
        self._check(f"after {step.name}: the schema is at version {step.version}")

    def _check(self, where: str) -> None:
        if self._stop.is_set():
            raise Stopped(f"stopped {where}")
