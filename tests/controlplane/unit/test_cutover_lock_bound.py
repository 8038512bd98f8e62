"""The cutover's deadline bounds its lock waits on SQLite too (``cutover.bound_lock_waits``, decision 171).

A real SQLite file: one engine holds the writer, as an admission would, while the bounded
engine of a one-shot command begins.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from nexuscrm_controlplane import cutover
from nexuscrm_runtime import database


def test_the_deadline_bounds_the_wait_for_another_engines_writer(tmp_path: Path) -> None:
    holder = database.create_engine(f"sqlite:///{tmp_path / 'bound.db'}")
    bounded = database.create_engine(f"sqlite:///{tmp_path / 'bound.db'}")
    try:
        cutover.bound_lock_waits(bounded, time.monotonic() + 0.3)
        with holder.begin() as connection:
            connection.exec_driver_sql("SELECT 1")
            # The time left (under a second), not the engine's default 30 s.
            with pytest.raises(sa.exc.OperationalError, match=r"held the writer for 0\.\d+ s") as refused:
                with bounded.begin():
                    pass
        assert database.is_retryable(refused.value)  # the command turns it into its timeout exit code
    finally:
        holder.dispose()
        bounded.dispose()
