"""Limits and policies of the Connectors runtime, read from the environment once."""

from __future__ import annotations

import dataclasses

from nexuscrm_runtime.budgets import MAX_ENTRY_PAYLOAD_BYTES, MAX_TRANSACTION_BYTES, MIB
from nexuscrm_runtime.config import ConfigError, env_int
from workqueue.errors import InvalidArgument


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """Connectors limits and retry policy; each field names its environment variable.

    ``max_batch_items``: deliveries per Ingest call (NEXUSCRM_MAX_BATCH_ITEMS).
    ``admission_group_items``: deliveries of concurrent Ingest calls of one pack admitted in
    one transaction; a single call always goes whole (NEXUSCRM_ADMISSION_GROUP_ITEMS).
    ``max_payload_bytes``: bytes per delivery payload (NEXUSCRM_MAX_PAYLOAD_BYTES); at most
    ``MAX_ENTRY_PAYLOAD_BYTES`` so that a row fits TiDB's entry limit.
    ``max_transaction_bytes``: payload bytes one admission transaction writes: an Ingest call
    (refused whole above it), an admission group, a materializer batch of one pack
    (NEXUSCRM_MAX_TRANSACTION_BYTES); at most ``MAX_TRANSACTION_BYTES``, at least one payload.
    ``max_attempts``: attempts of a generation before it fails for good (NEXUSCRM_MAX_ATTEMPTS).
    ``retry_base_seconds`` / ``retry_max_seconds``: exponential backoff after a failed attempt
    (NEXUSCRM_RETRY_BASE_SECONDS, NEXUSCRM_RETRY_MAX_SECONDS).
    ``default_lease_seconds`` / ``max_lease_seconds``: claim and heartbeat lease bounds
    (NEXUSCRM_DEFAULT_LEASE_SECONDS, NEXUSCRM_MAX_LEASE_SECONDS).
    ``max_claim_items``: generations per Claim call (NEXUSCRM_MAX_CLAIM_ITEMS).
    ``max_claim_wait_ms``: the longest wait for work a Claim may ask for, and the longest one
    WaitQueueDrained waits (NEXUSCRM_MAX_CLAIM_WAIT_MS).
    ``claim_poll_ms``: how often a waiting Claim looks for work that another process made
    claimable, or that became due (NEXUSCRM_CLAIM_POLL_MS); work of this process wakes it at once.
    ``max_claim_waiters``: Claims waiting at once; more return at once (NEXUSCRM_MAX_CLAIM_WAITERS).
    Keep it below the RPC handler threads (NEXUSCRM_MAX_WORKERS) so that Ingest always finds one.
    ``default_page_size`` / ``max_page_size``: rows per page of every paged read (LoadInputs,
    ListMembers, ListGenerations, ListReceipts) (NEXUSCRM_DEFAULT_PAGE_SIZE, NEXUSCRM_MAX_PAGE_SIZE).
    ``max_page_bytes``: payload bytes per LoadInputs or ListMembers page; a page holds at least one member
    (NEXUSCRM_MAX_PAGE_BYTES; the default stays below gRPC's 4 MiB default receive limit).
    ``materialize_interval_seconds``: how often the service admits stored receipts; 0 = never
    (NEXUSCRM_MATERIALIZE_INTERVAL_SECONDS). The background retention pass runs on the same
    interval.
    ``prune_generations_per_pass``: generations a retention pass prunes per pack at most
    (NEXUSCRM_PRUNE_GENERATIONS_PER_PASS).
    ``prune_batch_events``: Events (with their receipts) one pruning transaction deletes at
    most; a larger generation goes in several (NEXUSCRM_PRUNE_BATCH_EVENTS).
    """

    max_batch_items: int = 1000
    admission_group_items: int = 2000
    max_payload_bytes: int = 1 * MIB
    max_transaction_bytes: int = 16 * MIB
    max_attempts: int = 5
    retry_base_seconds: int = 1
    retry_max_seconds: int = 300
    default_lease_seconds: int = 30
    max_lease_seconds: int = 3600
    max_claim_items: int = 100
    max_claim_wait_ms: int = 20_000
    claim_poll_ms: int = 250
    max_claim_waiters: int = 8
    default_page_size: int = 500
    max_page_size: int = 5000
    max_page_bytes: int = 3 * MIB
    materialize_interval_seconds: int = 2
    prune_generations_per_pass: int = 1000
    prune_batch_events: int = 500

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            if getattr(self, field.name) < (0 if field.name == "materialize_interval_seconds" else 1):
                raise ConfigError(f"{field.name} must be positive, got {getattr(self, field.name)}")
        if self.default_lease_seconds > self.max_lease_seconds:
            raise ConfigError("default_lease_seconds exceeds max_lease_seconds")
        if self.default_page_size > self.max_page_size:
            raise ConfigError("default_page_size exceeds max_page_size")
        if self.max_payload_bytes > MAX_ENTRY_PAYLOAD_BYTES:
            raise ConfigError(
                f"max_payload_bytes must be at most {MAX_ENTRY_PAYLOAD_BYTES} (TiDB's 6 MiB entry limit "
                f"less the row's other columns), got {self.max_payload_bytes}"
            )
        if not self.max_payload_bytes <= self.max_transaction_bytes <= MAX_TRANSACTION_BYTES:
            raise ConfigError(
                f"max_transaction_bytes must be between max_payload_bytes ({self.max_payload_bytes}) and "
                f"{MAX_TRANSACTION_BYTES} (a quarter of TiDB's 100 MiB transaction limit), "
                f"got {self.max_transaction_bytes}"
            )

    @classmethod
    def from_env(cls) -> Settings:
        """Read every field from its NEXUSCRM_<FIELD> variable, defaulting as above."""
        defaults = cls()
        return cls(
            **{
                field.name: env_int(f"NEXUSCRM_{field.name.upper()}", getattr(defaults, field.name))
                for field in dataclasses.fields(cls)
            }
        )

    def page_size(self, requested: int) -> int:
        """The page size a paged read asks for: 0 means the default; outside 1..max is refused."""
        size = requested or self.default_page_size
        if not 1 <= size <= self.max_page_size:
            raise InvalidArgument(
                f"page_size must be between 1 and {self.max_page_size}, got {requested}", field="page_size"
            )
        return size

    def backoff_seconds(self, attempt: int) -> int:
        """Delay before attempt ``attempt + 1`` after ``attempt`` failed attempts."""
        return exponential_backoff(self.retry_base_seconds, self.retry_max_seconds, attempt)


def exponential_backoff(base_seconds: int, max_seconds: int, attempt: int) -> int:
    """Seconds to wait after ``attempt`` failed attempts: ``base_seconds`` doubled per later one, up to ``max_seconds``.

    One formula for Connectors' settings and every work type's retry policy.
    """
    return int(min(max_seconds, base_seconds * 2 ** max(0, attempt - 1)))
