"""The Integration package's own tables: the demo's read model (not canonical tables).

``DemoContactProjection`` holds one row per contact; ``DemoContactApplied`` records each input
the demo Flow applied (its idempotency guard and the source of end-to-end lag).
"""

from __future__ import annotations

import sqlalchemy as sa

from nexuscrm_schema.tables import MYSQL_TABLE_OPTIONS, PACK_ID_LENGTH

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

DemoContactApplied = sa.Table(
    "DemoContactApplied",
    metadata,
    sa.Column("PackInstallId", sa.String(PACK_ID_LENGTH), primary_key=True),
    sa.Column("EnqueueOrdinal", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("ContactId", sa.String(CONTACT_ID_LENGTH), nullable=False),
    sa.Column("WorkId", sa.String(36), nullable=False),
    sa.Column("SentAt", sa.Float(precision=53), nullable=False),  # the source's send time, epoch seconds
    sa.Column("AppliedAt", sa.Float(precision=53), nullable=False),  # commit time of the projection, epoch seconds
    **MYSQL_TABLE_OPTIONS,
)
