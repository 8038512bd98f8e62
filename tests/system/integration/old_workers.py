"""Old-protocol workers of the cutover tests: the legacy (v0) runtime draining a pack."""

from __future__ import annotations

from nexuscrm_connectors.legacy.runtime import LegacyRuntime


def run_old_workers(legacy: LegacyRuntime, pack: str) -> int:
    """Run old workers until nothing of the pack is claimable; return how many WorkItems completed."""
    completed = 0
    while (claim := legacy.claim("old-worker", pack)) is not None:
        legacy.complete(claim.work.work_id, claim.lease_token)
        completed += 1
    return completed
