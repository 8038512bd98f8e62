"""Canonical schema migrations on every backend: each step is additive and changes no row (decision 150)."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from nexuscrm_schema import tables, verification
from nexuscrm_schema_catalog import migrations
from tests.support.checksums import row_checksums

INVARIANTS_NOT_CHECKED = (
    "schema steps over raw v1 rows that predate the newest schema's invariants; each step must change no row"
)

NOW = dt.datetime(2026, 1, 2, 3, 4, 5, 678901)


def _seed_v1_history(connection: sa.Connection) -> None:
    connection.execute(
        sa.insert(tables.PackInstall).values(
            PackInstallId="pack-old", Namespace="acme", PackName="crm", PackVersion="1.0", LastOrdinal=3, CreatedAt=NOW
        )
    )
    for ordinal in (1, 2, 3):
        connection.execute(
            sa.insert(tables.Event).values(
                PackInstallId="pack-old",
                EnqueueOrdinal=ordinal,
                ProjectionKey=f"pk1|key-{ordinal % 2}",
                ReceiptKey=f"r-{ordinal}",
                PayloadHash="h" * 64,
                Payload=b"\x00\xffpayload",
                SourceTime=NOW,
                Status="processed",
                CreatedAt=NOW,
            )
        )
    v1_work_item = sa.Table("WorkItem", sa.MetaData(), autoload_with=connection)
    connection.execute(
        sa.insert(v1_work_item).values(
            WorkId="w-legacy-1",
            PackInstallId="pack-old",
            ProjectionKey="pk1|key-1",
            WorkType="project",
            LaneOrdinal=3,
            ReplayOfWorkId=None,
            Status="completed",
            Attempt=1,
            MaxAttempts=5,
            CreatedAt=NOW,
            FinishedAt=NOW,
        )
    )


def test_v1_to_v2_adds_the_column_and_protocol_table_without_changing_rows(empty_engine: sa.Engine) -> None:
    assert migrations.apply_schema(empty_engine, 1) == (0, 1, ["v1_pre_upgrade_schema"])
    with empty_engine.begin() as connection:
        _seed_v1_history(connection)
    with empty_engine.connect() as connection:
        inspector = sa.inspect(connection)
        v1_columns = {
            name: [c["name"] for c in inspector.get_columns(name)] for name in ("PackInstall", "Event", "WorkItem")
        }
        assert "InputStartOrdinal" not in v1_columns["WorkItem"]
        assert "ReplayOfWorkId" in v1_columns["WorkItem"]
        assert not inspector.has_table(tables.ConnectorProjectionProtocol.name)
        before = {name: row_checksums(connection, name, columns) for name, columns in v1_columns.items()}
    assert sum(len(rows) for rows in before.values()) == 5

    assert migrations.apply_schema(empty_engine) == (
        1,
        verification.NEWEST_VERSION,
        [step.name for step in migrations.STEPS[1:]],
    )
    assert [step.name for step in migrations.STEPS][1:6] == [
        "v2_projection_input_ranges",
        "v3_successor_links",
        "v4_pack_control_version",
        "v5_claimed_member_count",
        "v6_namespace_control",
    ]

    with empty_engine.connect() as connection:
        after = {name: row_checksums(connection, name, columns) for name, columns in v1_columns.items()}
        assert after == before
        # No step wrote a row (decision 150): v8 copied no payload, set no size.
        assert connection.execute(sa.select(tables.Event.c.PayloadBytes)).scalars().all() == [None] * 3
        assert connection.execute(sa.select(sa.func.count()).select_from(tables.EventPayload)).scalar() == 0
        column = next(c for c in sa.inspect(connection).get_columns("WorkItem") if c["name"] == "InputStartOrdinal")
        assert column["nullable"] is True
        assert connection.execute(sa.select(tables.WorkItem.c.InputStartOrdinal)).scalars().all() == [None]
        assert sa.inspect(connection).has_table(tables.ConnectorProjectionProtocol.name)
        assert (
            connection.execute(sa.select(sa.func.count()).select_from(tables.ConnectorProjectionProtocol)).scalar() == 0
        )


def test_verify_schema_lists_what_v1_lacks_and_nothing_on_the_newest(empty_engine: sa.Engine) -> None:
    assert set(verification.verify_schema(empty_engine, verification.NATIVE_PROJECTION)) == set(tables.metadata.tables)
    # What each version lacks: the pieces of the later steps, in the checker's table order.
    later = {
        2: ["WorkItem.InputStartOrdinal", "_System_ConnectorProjectionProtocol"],
        3: ["WorkItem.SuccessorWorkId"],
        4: ["PackInstall.ControlVersion"],
        5: ["WorkItem.ClaimedMemberCount"],
        6: ["NamespaceControl"],
        7: ["PrunedReceipt", "PrunedWork", "RetentionPolicy", "WorkItem(ix_workitem_retention)"],
        8: ["Event.PayloadBytes", "EventPayload"],
        9: [
            "PrunedReceipt.SourceTime",
            "PrunedReceipt(ix_prunedreceipt_source_time)",
            "PrunedWork.SourceTime",
            "PrunedWork(ix_prunedwork_source_time)",
            "RetentionPolicy.DuplicateWindowSeconds",
            "RetentionPolicy.HorizonSourceTime",
            "RetentionPolicy.ExpiredReceipts",
        ],
        10: ["_System_PayloadContract"],
        11: ["WorkItem.AdmittedMemberCount", "WorkItem.AdmittedThroughOrdinal"],
        12: ["ClaimPause", "OrderPolicy", "SkippedWork", "PrunedWork(ix_prunedwork_identity)"],
        13: ["WorkTypeOrderPolicy"],
        14: [
            "WorkAttempt",
            "WorkItem.ClaimedAt",
            "WorkItem.RunsBeforeWorkId",
            "WorkItem(ix_workitem_runs_before)",
            "WorkTypeRetryPolicy",
        ],
        15: ["FlowVersionChange", "FlowVersionTrack", "WorkItem.FlowVersion", "WorkItem.InputKey", "WorkItem.BuildRun"],
    }
    order = [
        "ClaimPause",
        "Event.PayloadBytes",
        "EventPayload",
        "FlowVersionChange",
        "FlowVersionTrack",
        "NamespaceControl",
        "OrderPolicy",
        "PackInstall.ControlVersion",
        "PrunedReceipt",
        "PrunedReceipt.SourceTime",
        "PrunedReceipt(ix_prunedreceipt_source_time)",
        "PrunedWork",
        "PrunedWork.SourceTime",
        "PrunedWork(ix_prunedwork_identity)",
        "PrunedWork(ix_prunedwork_source_time)",
        "RetentionPolicy",
        "RetentionPolicy.DuplicateWindowSeconds",
        "RetentionPolicy.HorizonSourceTime",
        "RetentionPolicy.ExpiredReceipts",
        "SkippedWork",
        "WorkAttempt",
        "WorkItem.InputStartOrdinal",
        "WorkItem.SuccessorWorkId",
        "WorkItem.ClaimedMemberCount",
        "WorkItem.AdmittedMemberCount",
        "WorkItem.AdmittedThroughOrdinal",
        "WorkItem.RunsBeforeWorkId",
        "WorkItem.ClaimedAt",
        "WorkItem.FlowVersion",
        "WorkItem.InputKey",
        "WorkItem.BuildRun",
        "WorkItem(ix_workitem_retention)",
        "WorkItem(ix_workitem_runs_before)",
        "WorkTypeOrderPolicy",
        "WorkTypeRetryPolicy",
        "_System_ConnectorProjectionProtocol",
        "_System_PayloadContract",
    ]
    for version in [step.version for step in migrations.STEPS[:-1]]:  # every version but the newest
        migrations.apply_schema(empty_engine, version)
        lacking = {piece for step, pieces in later.items() if step > version for piece in pieces}
        parts = {piece for piece in lacking if piece.split(".")[0].split("(")[0] in lacking - {piece}}
        lacking -= parts  # a lacking table is listed alone
        assert verification.verify_schema(empty_engine, verification.NATIVE_PROJECTION) == [
            piece for piece in order if piece in lacking
        ], f"version {version}"
    migrations.apply_schema(empty_engine)
    assert verification.verify_schema(empty_engine, verification.NATIVE_PROJECTION) == []


def test_a_schema_without_replay_of_work_id_is_incomplete(empty_engine: sa.Engine) -> None:
    migrations.apply_schema(empty_engine)
    with empty_engine.begin() as connection:  # a database from before ReplayOfWorkId existed
        index = next(i for i in tables.WorkItem.indexes if i.name == "ix_workitem_replay_of")
        connection.execute(sa.schema.DropIndex(index))
        connection.exec_driver_sql("ALTER TABLE WorkItem DROP COLUMN ReplayOfWorkId")
    assert verification.verify_schema(empty_engine, verification.NATIVE_PROJECTION) == [
        "WorkItem.ReplayOfWorkId",
        "WorkItem(ix_workitem_replay_of)",
    ]


def test_migrating_from_empty_equals_the_metadata(empty_engine: sa.Engine) -> None:
    migrations.apply_schema(empty_engine)
    with empty_engine.connect() as connection:
        context = MigrationContext.configure(connection, opts={"compare_type": True})
        diff = compare_metadata(context, tables.metadata)
    assert diff == []


def test_applying_again_is_a_no_op(empty_engine: sa.Engine) -> None:
    names = migrations.apply_schema(empty_engine)[2]
    assert names == [step.name for step in migrations.STEPS]
    assert {"v1_pre_upgrade_schema", "v7_retention", "v9_duplicate_window"} <= set(names)
    described = verification.describe_schema(empty_engine)
    newest = verification.NEWEST_VERSION
    assert migrations.apply_schema(empty_engine) == (newest, newest, [])
    assert verification.describe_schema(empty_engine) == described
    assert described.version == described.newest_version == newest == migrations.STEPS[-1].version


def test_v13_makes_the_replay_index_partial_on_sqlite_only(empty_engine: sa.Engine) -> None:
    migrations.apply_schema(empty_engine, target_version=12)
    with empty_engine.connect() as connection:
        before = _replay_index(connection)
    assert " WHERE " not in before
    migrations.apply_schema(empty_engine)
    with empty_engine.connect() as connection:
        after = _replay_index(connection)
    if empty_engine.dialect.name == "sqlite":
        assert after.endswith('WHERE "ReplayOfWorkId" IS NOT NULL')
    else:
        assert after == before  # MySQL-protocol engines have no partial index: v13 leaves theirs


def _replay_index(connection: sa.Connection) -> str:
    """How ix_workitem_replay_of is defined: SQLite's CREATE INDEX text, else its reflected columns."""
    if connection.dialect.name == "sqlite":
        return str(
            connection.exec_driver_sql(
                "SELECT sql FROM sqlite_master WHERE name = 'ix_workitem_replay_of'"
            ).scalar_one()
        )
    (index,) = (i for i in sa.inspect(connection).get_indexes("WorkItem") if i["name"] == "ix_workitem_replay_of")
    return repr(index)
