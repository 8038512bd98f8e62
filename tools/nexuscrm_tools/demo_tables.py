"""The demo's own tables: its read model (not canonical tables).

``DemoContactProjection`` holds one row per contact; ``applied`` is the SDK's ledger
(``nexuscrm_sdk.applied``) in table ``DemoContactApplied``: each input the demo Flow applied,
its idempotency guard and the source of end-to-end lag.
"""

from __future__ import annotations

import sqlalchemy as sa

from nexuscrm_schema.tables import MYSQL_TABLE_OPTIONS, PACK_ID_LENGTH
from nexuscrm_sdk.applied import AppliedInputs

CONTACT_ID_LENGTH = 192

metadata = sa.MetaData()

DemoContactProjection = sa.Table(
    "DemoContactProjection",
    metadata,
    sa.Column("PackInstallId", sa.String(PACK_ID_LENGTH), primary_key=True),
    sa.Column("ContactId", sa.String(CONTACT_ID_LENGTH), primary_key=True),
    sa.Column("Name", sa.String(255), nullable=True),
    sa.Column("Email", sa.String(255), nullable=True),
    sa.Column("Company", sa.String(255), nullable=True),
    sa.Column("Stage", sa.String(64), nullable=True),
    sa.Column("Updates", sa.Integer, nullable=False),  # inputs folded into this row
    sa.Column("LastOrdinal", sa.BigInteger, nullable=False),  # newest input folded in
    **MYSQL_TABLE_OPTIONS,
)

applied = AppliedInputs("DemoContactApplied", metadata)
