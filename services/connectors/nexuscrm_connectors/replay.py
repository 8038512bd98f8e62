"""Explicit replay of terminal work: a new replay Event and a generation that starts with it.

Replay runs under the same PackInstall lock as admission, so the two never interleave. The
replay generation [o, o] (o = the replay Event's new ordinal) carries ReplayOfWorkId and,
while unclaimed, absorbs later fresh inputs like any attempt-zero generation.
"""

from __future__ import annotations

import uuid

from sqlalchemy.engine import Connection, Engine

from nexuscrm_connectors import payloads, retention
from nexuscrm_connectors.deliveries import event_row, generation_row, payload_hash
from nexuscrm_connectors.errors import ProtocolMissing, ReplayRefused
from nexuscrm_connectors.queries import packs as packs_sql
from nexuscrm_connectors.queries import work_items as work_items_sql
from nexuscrm_connectors.settings import Settings
from nexuscrm_runtime.clock import DatabaseClock
from nexuscrm_runtime.database import run_transaction
from workqueue import WorkStatus
from workqueue.errors import InvalidArgument
from workqueue.statuses import TERMINAL_WORK_STATUSES
from workqueue.values import ReplayResult, replay_event_payload


def replay(engine: Engine, settings: Settings, clock: DatabaseClock, work_id: str) -> ReplayResult:
    """Queue a replay of terminal ``work_id``; return the new generation and its Event's ordinal.

    Refuses unknown work (``WorkNotFound``), pruned work or work that replays pruned work
    (``WorkPruned``: the replay could not hand its Flow those inputs again), nonterminal work,
    work whose earlier replay is not terminal yet, and failed work replayed before
    (``ReplayRefused``: one dead letter is replayed at most once, whoever asks; its replay is
    what to replay next), and old-protocol work (``ProtocolMissing``). The check runs under
    the pack's row lock, which every replay of the pack writes, so concurrent replays (bulk or
    single, any replica or primary) see each other's.
    """
    if not work_id:
        raise InvalidArgument("work_id is required", field="work_id")

    def run(connection: Connection) -> ReplayResult:
        found = work_items_sql.work_item_get(connection, work_id)
        if found is None:
            retention.refuse_if_pruned(connection, work_id)
        pack = packs_sql.pack_lock(connection, found.PackInstallId, clock)
        target = work_items_sql.work_item_get(connection, work_id, lock=True)
        if target is None:  # WorkItems are never deleted
            raise RuntimeError(f"work {work_id} vanished between its read and its row lock")
        if target.InputStartOrdinal is None or packs_sql.protocol_get(connection, target.PackInstallId) is None:
            raise ProtocolMissing(f"work {work_id} is old-protocol work; replay needs native range work")
        if WorkStatus(target.Status) not in TERMINAL_WORK_STATUSES:
            raise ReplayRefused(f"work {work_id} is {target.Status}; only terminal work can be replayed")
        earlier = work_items_sql.work_item_replay_newest(connection, work_id)
        if earlier is not None and WorkStatus(earlier.Status) not in TERMINAL_WORK_STATUSES:
            raise ReplayRefused(f"work {work_id} already has a live replay {earlier.WorkId} ({earlier.Status})")
        if earlier is not None and target.Status == WorkStatus.FAILED:  # decision 173: a dead letter once
            raise ReplayRefused(
                f"work {work_id} failed and was replayed already by {earlier.WorkId} ({earlier.Status}): "
                f"it is no longer a dead letter; replay {earlier.WorkId} to run its inputs again"
            )
        payloads.replayed_chain(connection, work_id)  # every replayed generation still stored
        now = pack.now
        (ordinal,) = packs_sql.ordinals_allocate(connection, pack, 1)
        payload = replay_event_payload(work_items_sql.work_item_value(target))
        packs_sql.events_insert(
            connection,
            pack.pack_install_id,
            [
                event_row(
                    pack.pack_install_id,
                    ordinal=ordinal,
                    projection_key=target.ProjectionKey,
                    receipt_key=None,
                    payload=payload,
                    digest=payload_hash(payload),
                    source_time=None,
                    is_replay=True,
                    now=now,
                )
            ],
        )
        newest = work_items_sql.work_items_newest(
            connection, pack.pack_install_id, range(ordinal, ordinal + 1), [target.ProjectionKey]
        )[target.ProjectionKey]
        new_id = str(uuid.uuid4())
        blocked = WorkStatus(newest.Status) not in TERMINAL_WORK_STATUSES
        work_items_sql.work_items_insert(
            connection,
            [
                generation_row(
                    work_id=new_id,
                    pack_install_id=pack.pack_install_id,
                    projection_key=target.ProjectionKey,
                    start=ordinal,
                    end=ordinal,
                    members=1,
                    blocked=blocked,
                    now=now,
                    max_attempts=settings.max_attempts,
                    replay_of_work_id=work_id,
                )
            ],
        )
        if blocked and work_items_sql.work_items_link_successors(connection, {newest.WorkId: new_id}) != 1:
            raise RuntimeError("the newest generation changed under its row lock")  # decision 106
        created = work_items_sql.work_item_get(connection, new_id)
        if created is None:
            raise RuntimeError(f"replay {new_id} vanished inside the transaction that inserted it")
        return ReplayResult(work=work_items_sql.work_item_value(created), replay_event_ordinal=ordinal)

    return run_transaction(engine, run, name="replay", unique_keys_conflict=True)  # an ordinal another primary took
