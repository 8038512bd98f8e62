"""The cutover's deadline bounds its lock waits on SQLite too (``cutover.bound_lock_waits``, decision 171).

A real SQLite file: one engine holds the writer, as an admission would, while the bounded
engine of a one-shot command begins.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import sqlalchemy as sa

from nexuscrm_controlplane import audit, cutover
from nexuscrm_runtime import database

INVARIANTS_NOT_CHECKED = "no scenario: an empty SQLite file, of which only the writer lock is used"
NOW = 1000.0  # the command's monotonic clock, stopped there
LEFT = 0.25  # seconds from NOW to the command's deadline


def test_the_deadline_bounds_the_wait_for_another_engines_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The command's clock stands still, so the time left is exactly LEFT however late the machine
    # runs the begin; the wait for the writer itself runs on the real clock.
    stopped = types.SimpleNamespace(monotonic=lambda: NOW)
    monkeypatch.setattr(cutover, "time", stopped)
    monkeypatch.setattr(audit, "time", stopped)
    holder = database.create_engine(f"sqlite:///{tmp_path / 'bound.db'}")
    bounded = database.create_engine(f"sqlite:///{tmp_path / 'bound.db'}")
    try:
        cutover.bound_lock_waits(bounded, NOW + LEFT)
        with holder.begin() as connection:
            connection.exec_driver_sql("SELECT 1")
            with pytest.raises(sa.exc.OperationalError) as refused:
                with bounded.begin():
                    pass
        # The time left, not the engine's default 30 s.
        assert str(refused.value.orig) == f"database is locked: another process held the writer for {LEFT:g} s"
        assert database.is_retryable(refused.value)  # the command turns it into its timeout exit code
    finally:
        holder.dispose()
        bounded.dispose()
