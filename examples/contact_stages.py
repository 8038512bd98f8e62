"""An example Flow whose read model lives in a SQLite file of its own, not in the host's database.

It keeps, per contact, the newest sales stage and how many updates named a stage, from the
contact updates the demo's sources send (JSON: ``contact_id`` and ``fields``, see the
the demo of docs/tutorial/first-flow.md). Its read model and the SDK's ledger of applied inputs
(``nexuscrm_sdk.applied``) share one transaction per generation, so a generation that runs
again changes nothing. It needs only the SDK, ``nexuscrm-workqueue`` and SQLAlchemy.

Its database is the pool setting ``database`` (a SQLAlchemy URL; default
``sqlite:///var/contact-stages.db``)::

    [[pool]]
    pack_install_id = "pk-..."
    work_type = "project-contacts"
    flow = "examples.contact_stages:contact_stages"
    [pool.settings]
    database = "sqlite:///var/contact-stages.db"

or, from the repository root, ``.venv/bin/nexuscrm-run --flow examples.contact_stages:contact_stages
--setting database=sqlite:///var/contact-stages.db``. Its test, on the SDK's in-memory work
source, is ``tests/connectors/unit/test_example_flow.py``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from nexuscrm_sdk import AppliedInputs, Flow, FlowContext, Generation
from workqueue.values import InputRow

DEFAULT_DATABASE = "sqlite:///var/contact-stages.db"
BUSY_TIMEOUT = 30.0  # seconds a writer waits for another's transaction on the SQLite file

metadata = sa.MetaData()
ContactStage = sa.Table(
    "ContactStage",
    metadata,
    sa.Column("PackInstallId", sa.String(64), primary_key=True),
    sa.Column("ContactId", sa.String(192), primary_key=True),
    sa.Column("Stage", sa.String(64), nullable=False),  # the newest stage an input named
    sa.Column("Updates", sa.Integer, nullable=False),  # inputs that named a stage
)
applied = AppliedInputs("ContactStageApplied", metadata)


def open_database(url: str) -> Engine:
    """An engine on the read model's database, its tables created if absent.

    On SQLite every transaction takes the write lock at BEGIN (``BEGIN IMMEDIATE``), so the
    ledger's read and the writes after it see one state even with several workers.
    """
    engine = sa.create_engine(url)
    if engine.dialect.name == "sqlite":
        database = engine.url.database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        engine = sa.create_engine(url, connect_args={"timeout": BUSY_TIMEOUT, "check_same_thread": False})

        @sa.event.listens_for(engine, "connect")
        def _no_implicit_transactions(dbapi_connection: Any, _record: Any) -> None:
            dbapi_connection.isolation_level = None  # BEGIN is issued below
            dbapi_connection.execute("PRAGMA journal_mode=WAL")

        @sa.event.listens_for(engine, "begin")
        def _begin_immediate(connection: Connection) -> None:
            connection.exec_driver_sql("BEGIN IMMEDIATE")

    metadata.create_all(engine, checkfirst=True)
    return engine


def stage_updates(inputs: list[InputRow]) -> list[tuple[str, str]]:
    """(contact, stage) of each input that names a stage, in order; ``ValueError`` for a payload that is no update."""
    found = []
    for row in inputs:
        if row.is_replay:  # a replay input carries no contact data
            continue
        try:
            body = json.loads(row.payload)
            contact, stage = body["contact_id"], body["fields"].get("stage")
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            # The type, not the message: a decoding error's message or repr may quote the payload.
            raise ValueError(f"input {row.enqueue_ordinal} is not a contact update ({type(error).__name__})") from None
        if stage is not None:
            found.append((str(contact), str(stage)))
    return found


def write_stages(connection: Connection, pack_install_id: str, inputs: list[InputRow]) -> None:
    """Fold the inputs' stages into ``ContactStage`` on the ledger's transaction."""
    for contact, stage in stage_updates(inputs):
        key = (ContactStage.c.PackInstallId == pack_install_id) & (ContactStage.c.ContactId == contact)
        changed = connection.execute(
            sa.update(ContactStage).where(key).values(Stage=stage, Updates=ContactStage.c.Updates + 1)
        ).rowcount
        if not changed:
            connection.execute(
                sa.insert(ContactStage).values(PackInstallId=pack_install_id, ContactId=contact, Stage=stage, Updates=1)
            )


def contact_stages(context: FlowContext) -> Flow:
    """The Flow factory: opens the read model's own database, returns the Flow."""
    engine = open_database(context.settings.get("database", DEFAULT_DATABASE))

    def project(generation: Generation) -> None:
        inputs = list(generation.inputs)  # the whole set first: the stream must not wait on the write lock
        pack = generation.work.pack_install_id
        applied.apply(engine, generation.work, inputs, lambda connection, fresh: write_stages(connection, pack, fresh))

    return project
