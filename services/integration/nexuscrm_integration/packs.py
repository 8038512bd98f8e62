"""Pools that name their pack by namespace, name and version: resolving the PackInstallId through Controlplane.

A PackInstallId is random (``pk-`` + 32 hex digits), known only once the pack is installed;
a pool may name the pack instead (``config.PackName``), and the host asks Controlplane's
FindPacks for it (``activation.RemotePackFinder``) on every activation check until the gate passes. A name resolves when
exactly one incarnation has it. None (not installed) and several (a reinstall made another
incarnation of the same name and version) are refusals naming the pack: the gate reports
them with everything else missing and, when the host may wait, checks again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

from nexuscrm_integration.config import PackName, PoolConfig


class PackFinder(Protocol):
    """Asks the pack owner for the incarnations of a pack name."""

    def find_packs(self, pack: PackName) -> list[str]:
        """The PackInstallIds with that namespace, name and version, newest first."""
        ...


class PackLookupFailed(Exception):
    """The pack owner could not be asked; the message says why."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Resolution:
    """The pools whose pack is known by id, and why each other pool's name did not resolve."""

    pools: tuple[PoolConfig, ...]
    missing: tuple[str, ...]

    @property
    def pack_install_ids(self) -> tuple[str, ...]:
        """Every pack a resolved pool serves."""
        return tuple(sorted({pool.pack_install_id for pool in self.pools}))


def resolve_pools(pools: Sequence[PoolConfig], finder: PackFinder) -> Resolution:
    """Each pool with its PackInstallId, asking ``finder`` once per distinct pack name."""
    answers: dict[PackName, list[str] | str] = {}
    resolved: list[PoolConfig] = []
    missing: list[str] = []
    for pool in pools:
        if pool.pack is None:
            resolved.append(pool)
            continue
        if pool.pack not in answers:
            try:
                answers[pool.pack] = finder.find_packs(pool.pack)
            except PackLookupFailed as error:
                answers[pool.pack] = str(error)
        found = answers[pool.pack]
        if isinstance(found, str):
            missing.append(f"pack: {pool.pack} could not be resolved: {found}")
        elif not found:
            missing.append(f"pack: {pool.pack} is not installed (pool {pool.name})")
        elif len(found) > 1:
            missing.append(
                f"pack: {pool.pack} has {len(found)} incarnations ({', '.join(found)}); "
                f"name one by pack_install_id in pool {pool.name}"
            )
        else:
            resolved.append(pool.with_pack_install_id(found[0]))
    return Resolution(pools=tuple(resolved), missing=tuple(dict.fromkeys(missing)))
