"""What ``nexuscrm-schema migrate`` shows while ``migrations.apply_schema`` runs, and how Ctrl-C stops it.

A ``migrations.Observer``: one line per step; during a data step a rich progress bar when the
output is a terminal, else a plain line at most every ``PLAIN_INTERVAL`` seconds (and at the
end), so a deployment log stays short. A stop request (the command's SIGINT handler sets
``stop``) takes effect between batches and between steps: the observer raises ``Stopped``
after the batch or step committed, naming how far it got.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from nexuscrm_schema_catalog.migrations import Observer, Step
from nexuscrm_schema_catalog.payload_copy import Batch

PLAIN_INTERVAL = 5.0  # seconds between two plain progress lines of one data step


class Stopped(Exception):
    """The operator asked to stop; everything before this point committed. The message says where."""


class MigrateProgress(Observer):
    """Shows each step on ``console``, a data step's copy as a bar (``live``) or plain lines; honours ``stop``."""

    def __init__(
        self, console: Console, stop: threading.Event, *, live: bool, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._console = console
        self._stop = stop
        self._live = live
        self._clock = clock
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        self._unit = ""
        self._total = 0
        self._copied = 0
        self._shown_at = 0.0

    def step_started(self, step: Step, rows: int | None) -> None:
        """Name the step; for a data step, open its bar (or its first plain line)."""
        self._check(f"before {step.name}")
        if step.copy is None or rows is None:
            self._console.print(f"applying {step.name} ...")
            return
        self._unit, self._total, self._copied = step.copy.unit, rows, 0
        self._console.print(f"applying {step.name}: copying {rows} {self._unit} in committed batches ...")
        if self._live:
            self._bar = Progress(
                TextColumn(f"  {step.name}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self._console,
            )
            self._bar.start()
            self._task = self._bar.add_task(step.name, total=rows)
        self._shown_at = self._clock()

    def batch_copied(self, step: Step, batch: Batch) -> None:
        """Advance the bar or print a plain line when due; stop here if asked."""
        self._copied += batch.rows
        if self._bar is not None and self._task is not None:
            self._bar.update(self._task, completed=self._copied)
        elif self._clock() - self._shown_at >= PLAIN_INTERVAL:
            self._plain_line(step)
        self._check(
            f"during {step.name} after {self._copied} of {self._total} {self._unit} copied "
            "(each batch is committed; the step's version is not recorded yet)"
        )

    def step_applied(self, step: Step) -> None:
        """Close the step's bar and say the version is recorded; stop here if asked."""
        if self._bar is not None:
            self._bar.stop()
            self._bar = self._task = None
        elif step.copy is not None:
            self._plain_line(step)
        self._console.print(f"  version {step.version} recorded")
        self._check(f"after {step.name}: the schema is at version {step.version}")

    def _plain_line(self, step: Step) -> None:
        self._console.print(f"  {step.name}: copied {self._copied} of {self._total} {self._unit}")
        self._shown_at = self._clock()

    def _check(self, where: str) -> None:
        if self._stop.is_set():
            if self._bar is not None:
                self._bar.stop()
            raise Stopped(f"stopped {where}")
