"""The demo Flow under a Worker, on the SDK's in-memory work source and an in-memory SQLite read model."""

from __future__ import annotations

import json
import logging

import pytest
import sqlalchemy as sa
from sqlalchemy.pool import StaticPool

from nexuscrm_sdk.flows import FlowContext
from nexuscrm_sdk.testing import InMemoryWorkSource
from nexuscrm_sdk.worker import Worker
from nexuscrm_tools import demo, demo_tables
from nexuscrm_tools import demo_queries as queries
from workqueue import WorkStatus

INVARIANTS_NOT_CHECKED = "the demo Flow on the SDK's in-memory work source; its database is the Flow's read model"

PACK = "pk-demo"


def update(contact: str, sent_at: float, **fields: str) -> bytes:
    return demo.ContactUpdate(contact_id=contact, fields=fields, sent_at=sent_at).encode()


def test_the_demo_flow_folds_each_generation_in_ordinal_order_and_a_bad_payload_fails_for_good() -> None:
    engine = sa.create_engine("sqlite://", poolclass=StaticPool)  # one shared in-memory database
    flow = demo.contact_projection(FlowContext(pack_install_id=PACK, work_type=demo.WORK_TYPE, engine=engine))
    source = InMemoryWorkSource(max_attempts=2)
    lane_a, lane_b = demo.route("lane-a").identity(PACK), demo.route("lane-b").identity(PACK)
    source.add_inputs(lane_a, payloads=[update("c-1", 1, name="Ada"), update("c-1", 2, email="ada@example.com")])
    source.add_inputs(lane_b, payloads=[update("c-2", 3, name="Bob", stage="lead")])
    source.add_inputs(lane_a, payloads=[update("c-1", 4, name="Ada L.")])  # joins lane a's unclaimed generation
    worker = Worker(source, flow, worker_id="demo", work_types=[demo.WORK_TYPE])
    while worker.run_once():
        pass
    source.add_inputs(lane_b, payloads=[b"not json of a contact update"])
    while worker.run_once():
        pass

    assert [(a.ordinals, a.outcome) for a in source.attempts] == [
        ((1, 2, 4), WorkStatus.COMPLETED),
        ((3,), WorkStatus.COMPLETED),
        ((5,), WorkStatus.RETRY),
        ((5,), WorkStatus.FAILED),
    ]
    with engine.connect() as connection:
        contacts = {row.ContactId: row for row in queries.demo_contacts_get(connection, PACK)}
        applied = demo_tables.applied.applied(connection, PACK)
    assert (contacts["c-1"].Name, contacts["c-1"].Email, contacts["c-1"].Updates, contacts["c-1"].LastOrdinal) == (
        "Ada L.",
        "ada@example.com",
        3,
        4,
    )
    assert (contacts["c-2"].Name, contacts["c-2"].Stage, contacts["c-2"].Updates) == ("Bob", "lead", 1)
    assert applied == {1, 2, 3, 4}  # the failed input was never applied


SECRET = "s3cret-of-the-source"  # what no message about a bad input may hold


def test_the_demo_flows_error_names_the_input_and_what_is_wrong_never_the_payload(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = sa.create_engine("sqlite://", poolclass=StaticPool)
    flow = demo.contact_projection(FlowContext(pack_install_id=PACK, work_type=demo.WORK_TYPE, engine=engine))
    source = InMemoryWorkSource(max_attempts=1)
    bad = {
        "unknown fields": json.dumps({"contact_id": SECRET, "fields": {"name": SECRET, SECRET: SECRET, "ssn": "1"}}),
        "not JSON": f"{SECRET} <- not JSON",
        "a shape of its own": json.dumps([SECRET]),
        "sent_at not a number": json.dumps({"contact_id": "c", "fields": {}, "sent_at": SECRET}),
    }
    for lane, payload in enumerate(bad.values()):  # one generation per lane, so each fails alone
        source.add_inputs(demo.route(f"lane-{lane}").identity(PACK), payloads=[payload.encode()])
    worker = Worker(source, flow, worker_id="demo", work_types=[demo.WORK_TYPE])
    with caplog.at_level(logging.WARNING, logger="nexuscrm_sdk.worker"):
        while worker.run_once():
            pass

    errors = {a.ordinals: a.error for a in source.attempts if a.outcome is WorkStatus.FAILED}
    assert errors == {
        (1,): "ValueError: input 1: contact update has 2 unknown fields of 3 (known: name, email, company, stage)",
        (2,): "ValueError: input 2: payload is not a contact update: not JSON",
        (3,): "ValueError: input 3: payload is not a contact update: no contact_id string and fields object",
        (4,): "ValueError: input 4: contact update's sent_at is not a number",
    }
    logged = [record.getMessage() for record in caplog.records]
    assert len(logged) == 4 and all(SECRET not in line for line in logged)
