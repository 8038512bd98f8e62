"""Stand-ins for what the activation gate asks: the schema catalog and Controlplane's protocols."""

from __future__ import annotations


class FakeSchema:
    """A schema catalog that misses the columns it is given."""

    def __init__(self, missing: list[str]) -> None:
        self.missing = missing

    def schema_missing(self, feature: str) -> list[str]:
        """What ``feature`` lacks; only the native projection is ever asked for."""
        assert feature == "native_projection"
        return self.missing


class FakeProtocols:
    """Controlplane's protocol receipts: only the packs in ``active`` have one."""

    def __init__(self, active: set[str]) -> None:
        self.active = active

    def protocol_missing(self, pack_install_id: str) -> str | None:
        """None for an active pack, else why it has no protocol."""
        return None if pack_install_id in self.active else f"pack {pack_install_id} has no protocol receipt"
