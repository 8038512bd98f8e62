"""Pools that name their pack: resolving the PackInstallId through Controlplane.

A PackInstallId is random (``pk-`` + 32 hex digits), known only once the pack is installed;
a pool may name the pack instead (``NAMESPACE/NAME[@VERSION]``, ``config.pack_name_of``), and
the host lists the incarnations of its namespace (``activation.RemotePackFinder``, Controlplane's
ListPacks) on every activation check until the gate passes. The name resolves by the rule the
``nexuscrm`` command line applies too (``nexuscrm_runtime.pack_names.choose``, decision 178):
the one incarnation with it, else the one active among several. None (not installed) and
several without exactly one active are refusals naming the pack: the gate reports them with
everything else missing and, when the host may wait, checks again.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Protocol

from nexuscrm.controlplane.v1 import controlplane_pb2 as cp_pb
from nexuscrm_integration.config import PoolConfig
from nexuscrm_runtime.pack_names import PackNameError, choose


class PackFinder(Protocol):
    """Asks the pack owner for the incarnations of a namespace."""

    def find_packs(self, namespace: str) -> Sequence[cp_pb.PackSummary]:
        """Every incarnation of ``namespace`` with its protocol state."""
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
    """Each pool with its PackInstallId, asking ``finder`` once per namespace named."""
    answers: dict[str, Sequence[cp_pb.PackSummary] | str] = {}
    resolved: list[PoolConfig] = []
    missing: list[str] = []
    for pool in pools:
        if pool.pack is None:
            resolved.append(pool)
            continue
        if pool.pack.namespace not in answers:
            try:
                answers[pool.pack.namespace] = finder.find_packs(pool.pack.namespace)
            except PackLookupFailed as error:
                answers[pool.pack.namespace] = str(error)
        found = answers[pool.pack.namespace]
        if isinstance(found, str):
            missing.append(f"pack {pool.pack} could not be resolved: {found}")
            continue
        try:
            resolved.append(pool.with_pack_install_id(choose(pool.pack, found).pack.pack_install_id))
        except PackNameError as error:
            missing.append(f"{error} (pool {pool.name})")
    return Resolution(pools=tuple(resolved), missing=tuple(dict.fromkeys(missing)))
