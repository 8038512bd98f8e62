"""An example Flow with a side effect that only its live version causes, and a digest of its read model.

It reads deal updates (JSON: ``deal_id``, ``stage``, ``amount``) and keeps a read model: one
``DealUpdate`` row per input, keyed by the identity without its companion version
(``nexuscrm_sdk.flows.version_free_key``) and the input's ordinal. When a deal is won it also
asks for an e-mail: a row in ``DealAlertOutbox``, which a mailer (not part of the example)
sends. That row is the side effect: only a generation that runs live writes it
(``Generation.live``). A Flow version built beside the live one (``nexuscrm versions build``)
runs the same inputs in a build (``Generation.build_run``): it writes its read model and no
outbox row, so no customer gets the e-mail twice (docs/operations.md, "Changing a Flow version").

``DealAlerts.digest`` makes it a ``nexuscrm_sdk.DigestingFlow``: SHA-256 over the read-model
rows of one identity derived from inputs at or below an ordinal, which ``nexuscrm versions
verify`` compares between two versions. Each version keeps its read model in a database of its
own (the pool setting ``database``, a SQLAlchemy URL; default ``sqlite:///var/deal-alerts.db``)::

    [[pool]]                                  # the live version
    pack_install_id = "pk-..."
    work_type = "deal-alerts"
    flow = "examples.deal_alerts:deal_alerts"
    [pool.settings]
    database = "sqlite:///var/deal-alerts-1.db"

    [[pool]]                                  # version 2, built beside it
    pack_install_id = "pk-..."
    work_type = "deal-alerts"
    flow = "examples.deal_alerts:deal_alerts"
    flow_version = "2"
    [pool.settings]
    database = "sqlite:///var/deal-alerts-2.db"

The read model and the SDK's ledger of applied inputs (``nexuscrm_sdk.applied``) share one
transaction per generation, so a generation that runs again changes nothing, outbox included.
Its test is ``tests/connectors/unit/test_example_deal_alerts.py``.
"""

from __future__ import annotations

import hashlib
import json
from decimal import Decimal
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from nexuscrm_sdk import AppliedInputs, FlowContext, Generation
from nexuscrm_sdk.flows import version_free_key
from workqueue import decode_projection_key
from workqueue.values import InputRow

DEFAULT_DATABASE = "sqlite:///var/deal-alerts.db"

metadata = sa.MetaData()
DealUpdate = sa.Table(
    "DealUpdate",
    metadata,
    sa.Column("IdentityKey", sa.String(1024), primary_key=True),  # version_free_key of the input's identity
    sa.Column("EnqueueOrdinal", sa.BigInteger, primary_key=True, autoincrement=False),
    sa.Column("DealId", sa.String(192), nullable=False),
    sa.Column("Stage", sa.String(64), nullable=False),
    sa.Column("Amount", sa.String(32), nullable=False),  # a decimal as text: exact in every backend
)
DealAlertOutbox = sa.Table(
    "DealAlertOutbox",
    metadata,
    sa.Column("EnqueueOrdinal", sa.BigInteger, primary_key=True, autoincrement=False),  # one e-mail per input
    sa.Column("DealId", sa.String(192), nullable=False),
    sa.Column("Message", sa.Text, nullable=False),
)
applied = AppliedInputs("DealAlertApplied", metadata)


class DealAlerts:
    """The Flow: a read model always, an outbox row only when live; ``digest`` for ``nexuscrm versions verify``."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def derive(self, row: InputRow) -> tuple[str, str, Decimal]:
        """(deal, stage, amount) of a deal update; ``ValueError`` for a payload that is none."""
        try:
            body = json.loads(row.payload)
            return str(body["deal_id"]), str(body["stage"]), Decimal(str(body["amount"]))
        except (ValueError, KeyError, TypeError, ArithmeticError) as error:
            # The type, not the message: a decoding error's message may quote the payload.
            raise ValueError(f"input {row.enqueue_ordinal} is not a deal update ({type(error).__name__})") from None

    def __call__(self, generation: Generation) -> None:
        inputs = list(generation.inputs)  # the whole set first: the stream must not wait on the write lock
        key = version_free_key(generation.identity)

        def write(connection: Connection, fresh: list[InputRow]) -> None:
            for row in fresh:
                if row.is_replay:  # a replay input carries no deal
                    continue
                deal, stage, amount = self.derive(row)
                connection.execute(
                    sa.insert(DealUpdate).values(
                        IdentityKey=key,
                        EnqueueOrdinal=row.enqueue_ordinal,
                        DealId=deal,
                        Stage=stage,
                        Amount=str(amount),
                    )
                )
                if generation.live and stage == "won":  # the side effect: never in a build
                    message = f"deal {deal} won: {amount}"
                    connection.execute(
                        sa.insert(DealAlertOutbox).values(
                            EnqueueOrdinal=row.enqueue_ordinal, DealId=deal, Message=message
                        )
                    )

        applied.apply(self.engine, generation.work, inputs, write)

    def digest(self, projection_key: str, through_ordinal: int) -> str:
        """SHA-256 of the identity's read-model rows from inputs at or below ``through_ordinal``, in ordinal order."""
        key = version_free_key(decode_projection_key(projection_key))
        columns = (DealUpdate.c.EnqueueOrdinal, DealUpdate.c.DealId, DealUpdate.c.Stage, DealUpdate.c.Amount)
        statement = (
            sa.select(*columns)
            .where(DealUpdate.c.IdentityKey == key, DealUpdate.c.EnqueueOrdinal <= through_ordinal)
            .order_by(DealUpdate.c.EnqueueOrdinal)
        )
        digest = hashlib.sha256()
        with self.engine.connect() as connection:
            for row in connection.execute(statement):
                digest.update(json.dumps(list(row)).encode() + b"\n")
        return digest.hexdigest()


def open_database(url: str) -> Engine:
    """An engine on a version's read-model database, its tables created if absent."""
    engine = sa.create_engine(url)
    database = engine.url.database if engine.dialect.name == "sqlite" else None
    if database and database != ":memory:":
        Path(database).parent.mkdir(parents=True, exist_ok=True)
    metadata.create_all(engine, checkfirst=True)
    return engine


def deal_alerts(context: FlowContext) -> DealAlerts:
    """The Flow factory: opens the version's read-model database (setting ``database``), returns the Flow."""
    return DealAlerts(open_database(context.settings.get("database", DEFAULT_DATABASE)))
