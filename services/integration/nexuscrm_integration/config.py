"""The host configuration: which Flow serves which pack and work type, with how many workers.

Read once at start from a TOML file and/or the environment:

- ``NEXUSCRM_INTEGRATION_CONFIG``: path of a TOML file with ``[[pool]]`` tables (fields of
  ``PoolConfig``) and optionally ``activation_wait_seconds`` / ``drain_timeout_seconds``.
- ``NEXUSCRM_INTEGRATION_POOLS``: a JSON list of pool objects (same fields), added to the
  file's pools; convenient for launchers.
- ``NEXUSCRM_ACTIVATION_WAIT_SECONDS``: how long a refused host keeps re-checking the gate
  (``0``: exit at once; ``forever``: until stopped). Overrides the file.
- ``NEXUSCRM_DRAIN_TIMEOUT_SECONDS``: how long SIGTERM waits for in-flight generations.
- ``NEXUSCRM_INTEGRATION_HOST_ID``: prefix of worker ids (default: host name and pid).

Example file::

    activation_wait_seconds = 30
    [[pool]]
    pack_install_id = "pk-0123456789ab"
    work_type = "project-contacts"
    flow = "demo-contacts"          # or "package.module:factory"
    size = 4
    batch_size = 4                  # generations per claim, run in turn by each worker
    claim_wait_seconds = 1.0        # each claim waits this long for work when there is none
    poll_interval_seconds = 0.2     # least time between two claims that both came back empty
    complete_in_claim = false       # complete finished generations in the next claim (decision 131)

    [[pool]]                        # the pack named instead of its PackInstallId:
    pack = "acme/contacts@1.0"      # or { namespace = "acme", name = "contacts", version = "1.0" }
    work_type = "project-contacts"  # resolved through Controlplane (ListPacks) at start
    flow = "demo-contacts"          # (nexuscrm_runtime.pack_names; without a version: any)

    [[pool]]                        # a Flow version built beside the live one (decision 185):
    pack_install_id = "pk-0123456789ab"
    work_type = "project-contacts"
    flow = "contacts_v2:factory"    # the new version's Flow
    flow_version = "2"              # claims only version 2's generations (nexuscrm versions build)
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import socket
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nexuscrm_integration.errors import HostConfigError
from nexuscrm_runtime.pack_names import PackName, PackNameError

DEFAULT_LEASE_SECONDS = 30  # seconds
DEFAULT_DRAIN_TIMEOUT = 30.0  # seconds
DEFAULT_CLAIM_WAIT = 1.0  # seconds
DEFAULT_POLL_INTERVAL = 0.2  # seconds


def pack_name_of(raw: object) -> PackName:
    """A pool's ``pack``: ``"NAMESPACE/NAME[@VERSION]"``, or a table of namespace, name and optionally version."""
    if isinstance(raw, PackName):
        return raw
    if isinstance(raw, str):
        try:
            return PackName.parse(raw)
        except PackNameError as error:
            raise HostConfigError(f"pool {error}", field="pack") from None
    required, known = {"namespace", "name"}, {"namespace", "name", "version"}
    if not isinstance(raw, Mapping) or not required <= set(raw) <= known:
        raise HostConfigError(
            f'pool pack must be "NAMESPACE/NAME[@VERSION]" or a table of {sorted(required)} and optionally version, '
            f"got {raw!r}",
            field="pack",
        )
    for key, value in raw.items():
        if not isinstance(value, str) or not value.strip():
            raise HostConfigError(f"pool pack.{key} must be a non-empty string, got {value!r}", field=f"pack.{key}")
    return PackName(**raw)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PoolConfig:
    """One worker pool.

    ``pack_install_id`` and ``work_type``: the generations it claims; instead of the id, ``pack``
    may name the pack by namespace, name and optionally version (``pack_name_of``; resolved
    through Controlplane when the host starts, ``with_pack_install_id``). ``flow``: a Flow reference
    (see ``nexuscrm_sdk.flows.resolve_flow``). ``size``: workers (each runs one generation at a time).
    ``lease_seconds``: claim lease, renewed by heartbeats every third of it. ``page_size``:
    members per LoadInputs page (0: the service default). ``batch_size``: generations a worker
    claims at once and runs in turn (more: fewer claims, but a worker may hold work another
    idle worker could run). ``claim_wait_seconds``: how long a claim waits in Connectors for
    work when there is none; it answers as soon as it claimed some (0: answer at once; at most
    Connectors' NEXUSCRM_MAX_CLAIM_WAIT_MS; a drain waits for a waiting claim too).
    ``poll_interval_seconds``: the least time between two claims that both came back empty.
    ``complete_in_claim``: a worker completes its finished generations in its next claim, one
    call for the batch (lower lag, fewer calls), instead of one Complete each as they finish
    (more coalescing: fewer Flow executions).
    ``settings``: strings the Flow factory gets as ``FlowContext.settings`` (the Flow's own
    configuration, such as the URL of a read-model database of its own).
    ``flow_version``: the pool claims only the generations of this Flow version's track (one
    ``nexuscrm versions build`` started), and its Flow factory gets it as
    ``FlowContext.flow_version``; empty (the default): the generations of the inputs' own
    version, as before versions existed (decision 185). One pool per pack, work type and version.
    """

    work_type: str
    flow: str
    pack_install_id: str = ""
    pack: PackName | None = None
    size: int = 1
    lease_seconds: int = DEFAULT_LEASE_SECONDS
    page_size: int = 0
    batch_size: int = 1
    claim_wait_seconds: float = DEFAULT_CLAIM_WAIT
    poll_interval_seconds: float = DEFAULT_POLL_INTERVAL
    complete_in_claim: bool = False
    settings: Mapping[str, str] = dataclasses.field(default_factory=dict)
    flow_version: str = ""

    def __post_init__(self) -> None:
        if self.pack is not None:
            object.__setattr__(self, "pack", pack_name_of(self.pack))
        if bool(self.pack_install_id) == (self.pack is not None):
            raise HostConfigError(
                "a pool names its pack by pack_install_id or by pack (NAMESPACE/NAME[@VERSION]): exactly one",
                field="pack_install_id",
            )
        for name in ("work_type", "flow") + (("pack_install_id",) if self.pack is None else ()):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise HostConfigError(f"pool {name} must be a non-empty string, got {value!r}", field=name)
        for name, minimum in (("size", 1), ("lease_seconds", 1), ("page_size", 0), ("batch_size", 1)):
            value = getattr(self, name)
            if not isinstance(value, int) or value < minimum:
                raise HostConfigError(f"pool {name} must be an integer >= {minimum}, got {value!r}", field=name)
        if not isinstance(self.complete_in_claim, bool):
            raise HostConfigError(
                f"pool complete_in_claim must be true or false, got {self.complete_in_claim!r}",
                field="complete_in_claim",
            )
        for name in ("claim_wait_seconds", "poll_interval_seconds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
                raise HostConfigError(f"pool {name} must be a number of seconds >= 0, got {value!r}", field=name)
        if not isinstance(self.settings, Mapping) or not all(
            isinstance(key, str) and isinstance(value, str) for key, value in self.settings.items()
        ):
            raise HostConfigError(f"pool settings must map strings to strings, got {self.settings!r}", field="settings")
        if not isinstance(self.flow_version, str) or self.flow_version != self.flow_version.strip():
            raise HostConfigError(
                f"pool flow_version must be a version string without surrounding spaces, got {self.flow_version!r}",
                field="flow_version",
            )

    @property
    def name(self) -> str:
        """``<pack>/<served>``: unique within a host (the pack by id, or by name until resolved)."""
        return f"{self.pack_install_id or self.pack}/{self.served}"

    @property
    def served(self) -> str:
        """What the pool claims of its pack: ``<work type>``, or ``<work type>@<flow version>``."""
        return f"{self.work_type}@{self.flow_version}" if self.flow_version else self.work_type

    def with_pack_install_id(self, pack_install_id: str) -> PoolConfig:
        """This pool serving ``pack_install_id``, which its ``pack`` name resolved to."""
        return dataclasses.replace(self, pack_install_id=pack_install_id, pack=None)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any], where: str) -> PoolConfig:
        """Build from a TOML table or JSON object; ``where`` locates it in error messages."""
        if not isinstance(raw, Mapping):
            raise HostConfigError(f"{where}: a pool must be a table/object, got {type(raw).__name__}")
        known = {field.name for field in dataclasses.fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise HostConfigError(f"{where}: unknown pool fields {unknown}; known: {sorted(known)}")
        try:
            return cls(**raw)
        except TypeError as error:
            raise HostConfigError(f"{where}: {error}") from None
        except HostConfigError as error:
            raise HostConfigError(f"{where}: {error}", field=error.field) from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class HostConfig:
    """Everything the host reads at start; see the module docstring for the sources.

    ``activation_wait_seconds``: 0 exits at the first refusal; ``math.inf`` waits until stopped.
    """

    pools: tuple[PoolConfig, ...] = ()
    activation_wait_seconds: float = 0.0
    drain_timeout_seconds: float = DEFAULT_DRAIN_TIMEOUT
    host_id: str = dataclasses.field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")

    def __post_init__(self) -> None:
        names = [pool.name for pool in self.pools]
        duplicated = sorted({name for name in names if names.count(name) > 1})
        if duplicated:
            raise HostConfigError(f"more than one pool serves {duplicated}; merge them and raise size instead")
        if self.activation_wait_seconds < 0 or self.drain_timeout_seconds < 0:
            raise HostConfigError("activation_wait_seconds and drain_timeout_seconds must not be negative")

    @property
    def pack_install_ids(self) -> tuple[str, ...]:
        """Every pack some pool serves by id: the packs the activation gate must check (after resolution, all)."""
        return tuple(sorted({pool.pack_install_id for pool in self.pools if pool.pack_install_id}))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> HostConfig:
        """Read the file named by NEXUSCRM_INTEGRATION_CONFIG, then the environment."""
        env = os.environ if environ is None else environ
        settings: dict[str, Any] = {}
        pools: list[PoolConfig] = []
        path = env.get("NEXUSCRM_INTEGRATION_CONFIG")
        if path:
            try:
                document = tomllib.loads(Path(path).read_text())
            except (OSError, tomllib.TOMLDecodeError) as error:
                raise HostConfigError(f"NEXUSCRM_INTEGRATION_CONFIG {path}: {error}") from None
            raw_pools = document.pop("pool", [])
            pools += [PoolConfig.from_mapping(raw, f"{path} pool {i + 1}") for i, raw in enumerate(raw_pools)]
            unknown = sorted(set(document) - {"activation_wait_seconds", "drain_timeout_seconds"})
            if unknown:
                raise HostConfigError(f"{path}: unknown settings {unknown}")
            settings.update(document)
        inline = env.get("NEXUSCRM_INTEGRATION_POOLS")
        if inline:
            try:
                raw_list = json.loads(inline)
            except json.JSONDecodeError as error:
                raise HostConfigError(f"NEXUSCRM_INTEGRATION_POOLS is not JSON: {error}") from None
            if not isinstance(raw_list, list):
                raise HostConfigError("NEXUSCRM_INTEGRATION_POOLS must be a JSON list of pool objects")
            pools += [
                PoolConfig.from_mapping(raw, f"NEXUSCRM_INTEGRATION_POOLS item {i + 1}")
                for i, raw in enumerate(raw_list)
            ]
        for key, variable in (
            ("activation_wait_seconds", "NEXUSCRM_ACTIVATION_WAIT_SECONDS"),
            ("drain_timeout_seconds", "NEXUSCRM_DRAIN_TIMEOUT_SECONDS"),
        ):
            if env.get(variable):
                settings[key] = env[variable]
        values = {key: _seconds(key, value) for key, value in settings.items()}
        return cls(
            pools=tuple(pools),
            activation_wait_seconds=values.get("activation_wait_seconds", 0.0),
            drain_timeout_seconds=values.get("drain_timeout_seconds", DEFAULT_DRAIN_TIMEOUT),
            host_id=env.get("NEXUSCRM_INTEGRATION_HOST_ID") or f"{socket.gethostname()}-{os.getpid()}",
        )


def _seconds(name: str, value: object) -> float:
    if value == "forever":
        return math.inf
    try:
        return float(value)  # type: ignore[arg-type]  # a TOML/env scalar; refused below when not numeric
    except (TypeError, ValueError):
        raise HostConfigError(f"{name} must be a number of seconds or 'forever', got {value!r}") from None
