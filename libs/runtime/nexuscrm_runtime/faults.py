"""Fault points for crash-safety tests; inert unless a test enables them explicitly.

A test sets ``NEXUSCRM_FAULTS`` to ``name:phase=action[,...]`` where name is a transaction
name given to ``run_transaction`` ("admission", "claim", "complete", ...), phase is
``before_commit`` or ``after_commit`` (inside ``run_transaction``), or ``follow_up`` (a
step after the commit, run by ``database.follow_up``, whose failure the caller never
sees), and action is ``kill`` (SIGKILL this process: the
crash a test wants to survive) or ``raise`` (an ``InjectedFault``, which callers see as
UNAVAILABLE: the outcome is unknown to them, as after a lost connection). Each point
fires once per process unless the action ends in ``*`` (``kill*``: every time). Nothing
happens unless ``NEXUSCRM_FAULTS_ENABLED=1`` is also set, so a stray variable in production
cannot crash a service.
"""

from __future__ import annotations

import os
import signal
import threading

from workqueue.errors import DomainError, ErrorKind

_fired: set[str] = set()
_lock = threading.Lock()


class InjectedFault(DomainError):
    """Raised by a fault point whose action is ``raise``."""

    kind = ErrorKind.UNAVAILABLE


def _configured() -> dict[str, str]:
    if os.environ.get("NEXUSCRM_FAULTS_ENABLED") != "1":
        return {}
    points: dict[str, str] = {}
    for part in filter(None, os.environ.get("NEXUSCRM_FAULTS", "").split(",")):
        point, _, action = part.partition("=")
        points[point.strip()] = action.strip()
    return points


def fault_point(point: str) -> None:
    """Fire the fault configured for ``point`` (e.g. ``admission:after_commit``), if any."""
    action = _configured().get(point)
    if not action:
        return
    with _lock:
        if not action.endswith("*"):
            if point in _fired:
                return
            _fired.add(point)
    if action.rstrip("*") == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise InjectedFault(f"fault injected at {point}")
