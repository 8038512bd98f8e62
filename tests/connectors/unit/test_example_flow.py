"""The example Flow (``examples/contact_stages.py``), tested as its author would: with the SDK's testing module.

Its read model lives in a SQLite file of its own, named by the pool setting ``database``; the
host's engine is never touched. A generation that runs again (its first attempt committed,
then failed) changes nothing: the SDK's ledger skips the inputs it applied.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa

from examples import contact_stages
from nexuscrm_sdk import Flow, FlowContext, Generation, InMemoryWorkSource, Worker
from workqueue import ProjectionIdentity, WorkStatus

INVARIANTS_NOT_CHECKED = "the example Flow's own SQLite read model, not the canonical database"

PACK = "pk-example"
WORK_TYPE = "project-contacts"


def identity(lane: str) -> ProjectionIdentity:
    return ProjectionIdentity(
        pack_install_id=PACK,
        event_kind="contact.upsert",
        route_version="1",
        companion_version="example-1",
        work_type=WORK_TYPE,
        source_lane=lane,
    )


def update(contact: str, **fields: str) -> bytes:
    return json.dumps({"contact_id": contact, "fields": fields, "sent_at": 0}).encode()


def stages(database: str) -> dict[str, tuple[str, int]]:
    engine = sa.create_engine(database)
    with engine.connect() as connection:
        rows = connection.execute(
            sa.select(contact_stages.ContactStage).where(contact_stages.ContactStage.c.PackInstallId == PACK)
        )
        found = {row.ContactId: (row.Stage, row.Updates) for row in rows}
    engine.dispose()
    return found


def make_flow(tmp_path: Path) -> tuple[Flow, str]:
    database = f"sqlite:///{tmp_path / 'read-model' / 'stages.db'}"
    host_engine = sa.create_engine(f"sqlite:///{tmp_path / 'host.db'}")  # the host's: the Flow must not use it
    context = FlowContext(
        pack_install_id=PACK, work_type=WORK_TYPE, engine=host_engine, settings={"database": database}
    )
    flow = contact_stages.contact_stages(context)
    assert sa.inspect(host_engine).get_table_names() == []
    return flow, database


def test_the_example_folds_stages_into_its_own_sqlite_file(tmp_path: Path) -> None:
    flow, database = make_flow(tmp_path)
    source = InMemoryWorkSource()
    source.add_inputs(identity("lane-a"), payloads=[update("c-1", stage="lead"), update("c-1", name="Ada")])
    source.add_inputs(identity("lane-b"), payloads=[update("c-2", stage="lead"), update("c-2", stage="won")])
    source.add_inputs(identity("lane-a"), payloads=[update("c-1", stage="qualified")])
    worker = Worker(source, flow, worker_id="example", work_types=[WORK_TYPE])
    while worker.run_once():
        pass

    assert [(a.ordinals, a.outcome) for a in source.attempts] == [
        ((1, 2, 5), WorkStatus.COMPLETED),
        ((3, 4), WorkStatus.COMPLETED),
    ]
    assert stages(database) == {"c-1": ("qualified", 2), "c-2": ("won", 2)}
    assert (tmp_path / "read-model" / "stages.db").exists()


def test_a_generation_that_runs_again_changes_nothing(tmp_path: Path) -> None:
    flow, database = make_flow(tmp_path)
    lost: list[str] = []

    def commits_then_loses_its_lease(generation: Generation) -> None:
        flow(generation)
        if not lost:  # the first attempt committed, then failed: Connectors runs the generation again
            lost.append(generation.work.work_id)
            raise RuntimeError("lease lost after the commit")

    source = InMemoryWorkSource()
    source.add_inputs(identity("lane-a"), payloads=[update("c-1", stage="lead"), update("c-1", stage="won")])
    worker = Worker(source, commits_then_loses_its_lease, worker_id="example", work_types=[WORK_TYPE])
    while worker.run_once():
        pass

    assert [a.outcome for a in source.attempts] == [WorkStatus.RETRY, WorkStatus.COMPLETED]
    assert stages(database) == {"c-1": ("won", 2)}  # not 4 updates: the second run applied nothing
    engine = sa.create_engine(database)
    with engine.connect() as connection:
        assert contact_stages.applied.applied(connection, PACK) == {1, 2}
    engine.dispose()


def test_a_payload_that_is_no_contact_update_fails_the_attempt_and_writes_nothing(tmp_path: Path) -> None:
    flow, database = make_flow(tmp_path)
    source = InMemoryWorkSource(max_attempts=1)
    source.add_inputs(identity("lane-a"), payloads=[update("c-1", stage="lead"), b"not json"])
    worker = Worker(source, flow, worker_id="example", work_types=[WORK_TYPE])
    while worker.run_once():
        pass

    [attempt] = source.attempts
    assert attempt.outcome is WorkStatus.FAILED
    assert attempt.error is not None and "input 2 is not a contact update" in attempt.error
    assert stages(database) == {}  # the whole generation rolled back, the valid input too


@pytest.mark.parametrize("payload", [b"{}", b'{"contact_id": "c", "fields": []}', b"[1]"])
def test_stage_updates_refuses_malformed_updates(payload: bytes) -> None:
    from workqueue.values import InputRow

    row = InputRow(enqueue_ordinal=7, receipt_key="r", payload=payload, source_time=None, is_replay=False)
    with pytest.raises(ValueError, match="input 7 is not a contact update"):
        contact_stages.stage_updates([row])


def test_a_fixed_release_replays_the_failed_generation_and_applies_it_once(tmp_path: Path) -> None:
    flow, database = make_flow(tmp_path)
    broken = True

    def release(generation: Generation) -> None:
        if broken:
            list(generation.inputs)
            raise RuntimeError("bad release")
        flow(generation)

    source = InMemoryWorkSource(max_attempts=1)
    source.add_inputs(identity("lane-a"), payloads=[update("c-1", stage="lead"), update("c-1", stage="won")])
    worker = Worker(source, release, worker_id="example", work_types=[WORK_TYPE])
    while worker.run_once():
        pass
    (failed,) = source.generations()
    assert stages(database) == {}
    broken = False
    source.replay(failed.work_id)
    source.add_inputs(identity("lane-a"), payloads=[update("c-1", stage="churned")])  # absorbed by the replay
    while worker.run_once():
        pass

    assert [(a.ordinals, a.outcome) for a in source.attempts] == [
        ((1, 2), WorkStatus.FAILED),
        ((3, 4), WorkStatus.COMPLETED),  # its own members: the replay Event, then the input it absorbed
    ]
    assert stages(database) == {"c-1": ("churned", 3)}  # 1 and 2 applied by the replay, then 4
    engine = sa.create_engine(database)
    with engine.connect() as connection:
        assert contact_stages.applied.applied(connection, PACK) == {1, 2, 3, 4}  # 3: the replay Event, no stage
    engine.dispose()
