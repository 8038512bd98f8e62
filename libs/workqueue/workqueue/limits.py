"""The length limits of every identifier a request may carry, in characters.

The canonical tables (``nexuscrm_schema.tables``) size their columns from these numbers, and
the RPC runtime refuses a request whose identifier exceeds its column before any handler
runs (``REQUEST_FIELD_LIMITS``): an id that cannot exist is INVALID_ARGUMENT, never a
lookup that answers NOT_FOUND with the whole input echoed back.
"""

from __future__ import annotations

from workqueue.identity import FIELD_MAX_LENGTHS

PACK_ID_LENGTH = FIELD_MAX_LENGTHS["pack_install_id"]  # characters
WORK_ID_LENGTH = 36  # characters: a UUID
FENCE_ID_LENGTH = 36  # characters: a UUID
LEASE_TOKEN_LENGTH = 36  # characters: a UUID
RECEIPT_KEY_LENGTH = 255  # characters
NAMESPACE_LENGTH = 64  # characters
PACK_NAME_LENGTH = 128  # characters
PACK_VERSION_LENGTH = 64  # characters
WORKER_ID_LENGTH = 128  # characters: WorkItem.LeaseOwner
# A Flow's traceback sent with Fail, in bytes of UTF-8: within a MySQL TEXT
# column, and 50 of them (GetWork's attempts) well within gRPC's 4 MiB message.
TRACEBACK_MAX_BYTES = 16 * 1024

# Request field name (at any depth, repeated or not) -> its limit in characters.
REQUEST_FIELD_LIMITS: dict[str, int] = {
    "pack_install_id": PACK_ID_LENGTH,
    "pack_install_ids": PACK_ID_LENGTH,
    "scope": PACK_ID_LENGTH,  # a fence's scope: a PackInstallId or the whole namespace
    "work_id": WORK_ID_LENGTH,
    "current_work_id": WORK_ID_LENGTH,
    "replay_of_work_id": WORK_ID_LENGTH,
    "fence_id": FENCE_ID_LENGTH,
    "lease_token": LEASE_TOKEN_LENGTH,
    "receipt_key": RECEIPT_KEY_LENGTH,
    "namespace": NAMESPACE_LENGTH,
    "pack_name": PACK_NAME_LENGTH,
    "pack_version": PACK_VERSION_LENGTH,
    "worker_id": WORKER_ID_LENGTH,
    "lease_owner": WORKER_ID_LENGTH,
}

# Messages validated item by item by their handler: a bad item is that item's REJECTED outcome,
# never a refusal of the whole request (``nexuscrm_runtime.requests.validate_request`` skips them).
ITEM_MESSAGES: frozenset[str] = frozenset({"nexuscrm.connectors.v1.IngestItem"})
