"""What this schema catalog release is and which canonical schema versions it serves (decision 144).

Minimum 0: the catalog serves a database without schema, since it is what creates it
(ApplySchema, NEXUSCRM_APPLY_SCHEMA_ON_START). Newest is its last migration; no forward
window: it cannot describe, verify or migrate a schema a newer release wrote.
"""

from __future__ import annotations

from nexuscrm_runtime.release import Release, SchemaSupport

RELEASE = Release(
    owner="schema-catalog",
    distribution="nexuscrm-schema-catalog",
    schema=SchemaSupport(minimum=0, newest=15, forward_window=0),
)
