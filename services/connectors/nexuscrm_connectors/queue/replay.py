"""Explicit replay of terminal work: a new replay Event and a generation that starts with it.

Replay runs under the same PackInstall lock as admission, so the two never interleave. The
replay generation [o, o] (o = the replay Event's new ordinal) carries ReplayOfWorkId and,
while unclaimed, absorbs later fresh inputs like any attempt-zero generation. Under "block",
the replay of a dead letter that holds a generation runs before it instead (decision 174):
claimable at once, it absorbs nothing, and fresh inputs queue behind the held generation.
In a work type with Flow versions, a replay runs in its generation's track, live or as a build
as that generation ran, while no other track receives the inputs (decision 185).
"""

from __future__ import annotations

import uuid

from sqlalchemy.engine import Connection

from nexuscrm_connectors import pruned
from nexuscrm_connectors.context import Context
from nexuscrm_connectors.errors import ProtocolMissing, ReplayRefused
from nexuscrm_connectors.queries import DbRow
from nexuscrm_connectors.queries import flow_versions as flow_versions_sql
from nexuscrm_connectors.queries import order_policy as order_policy_sql
from nexuscrm_connectors.queries import packs as packs_sql
from nexuscrm_connectors.queries import work_items as work_items_sql
from nexuscrm_connectors.queries.work_items import WorkRow
from nexuscrm_connectors.queue import payloads, tracks
from nexuscrm_connectors.queue.deliveries import event_row, generation_row, payload_hash
from nexuscrm_runtime.database import run_transaction
from workqueue import WorkStatus, decode_projection_key
from workqueue.errors import InvalidArgument
from workqueue.statuses import TERMINAL_WORK_STATUSES
from workqueue.values import ReplayResult, replay_event_payload

HELD_STATUSES = (WorkStatus.PENDING, WorkStatus.RETRY)  # what "block" holds: not running, not terminal


def replay(context: Context, work_id: str) -> ReplayResult:
    """Queue a replay of terminal ``work_id``; return the new generation and its Event's ordinal.

    Refuses unknown work (``WorkNotFound``), pruned work or work that replays pruned work
    (``WorkPruned``: the replay could not hand its Flow those inputs again), nonterminal work,
    work whose earlier replay is not terminal yet, failed work replayed before
    (``ReplayRefused``: one dead letter is replayed at most once, whoever asks; its replay is
    what to replay next) or skipped (``ReplayRefused``: replayed once or skipped once, never
    both), and old-protocol work (``ProtocolMissing``). The check runs under
    the pack's row lock, which every replay of the pack writes, so concurrent replays (bulk or
    single, any replica or primary) see each other's; a skip takes the same lock.
    """
    engine, settings, clock = context.engine, context.settings, context.clock
    if not work_id:
        raise InvalidArgument("work_id is required", field="work_id")

    def run(connection: Connection) -> ReplayResult:
        found = work_items_sql.work_item_get(connection, work_id)
        if found is None:
            pruned.refuse_if_pruned(connection, work_id)
        pack = packs_sql.pack_lock(connection, found.PackInstallId, clock)
        target = work_items_sql.work_item_get(connection, work_id, lock=True)
        if target is None:  # WorkItems are never deleted
            raise RuntimeError(f"work {work_id} vanished between its read and its row lock")
        if target.InputStartOrdinal is None or packs_sql.protocol_get(connection, target.PackInstallId) is None:
            raise ProtocolMissing(f"work {work_id} is old-protocol work; replay needs native range work")
        _refuse_beside_a_version(connection, target)
        if WorkStatus(target.Status) not in TERMINAL_WORK_STATUSES:
            raise ReplayRefused(f"work {work_id} is {target.Status}; only terminal work can be replayed")
        earlier = work_items_sql.work_item_replay_newest(connection, work_id)
        if earlier is not None and WorkStatus(earlier.Status) not in TERMINAL_WORK_STATUSES:
            raise ReplayRefused(f"work {work_id} already has a live replay {earlier.WorkId} ({earlier.Status})")
        if earlier is not None and target.Status == WorkStatus.FAILED:  # a dead letter is replayed once
            raise ReplayRefused(
                f"work {work_id} failed and was replayed already by {earlier.WorkId} ({earlier.Status}): "
                f"it is no longer a dead letter; replay {earlier.WorkId} to run its inputs again"
            )
        skipped = order_policy_sql.skipped_work_get(connection, work_id) if target.Status == WorkStatus.FAILED else None
        if skipped is not None:
            raise ReplayRefused(
                f"work {work_id} failed and was skipped at {skipped.SkippedAt.isoformat()}Z by {skipped.SkippedBy}"
                f" ({skipped.Reason}): it is no longer a dead letter"
            )
        payloads.replayed_chain(connection, work_id)  # every replayed generation still stored
        now = pack.now
        (ordinal,) = packs_sql.ordinals_allocate(connection, pack, 1)
        payload = replay_event_payload(work_items_sql.work_item_value(target))
        packs_sql.allocated_events_insert(
            connection,
            pack.pack_install_id,
            [
                event_row(
                    pack.pack_install_id,
                    ordinal=ordinal,
                    projection_key=target.member_key,  # a Flow version's generations hold the inputs' key
                    receipt_key=None,
                    payload=payload,
                    digest=payload_hash(payload),
                    source_time=None,
                    is_replay=True,
                    now=now,
                )
            ],
        )
        new_id = str(uuid.uuid4())
        runs_before = _held_by(connection, target)
        newest = None if runs_before else _tail(connection, target, ordinal)
        blocked = newest is not None and WorkStatus(newest.Status) not in TERMINAL_WORK_STATUSES
        row = generation_row(
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
            runs_before_work_id=runs_before,
        )
        if target.FlowVersion is not None or target.BuildRun:  # in its track, live or a build as it ran
            row = tracks.track_row(row, tracks.Target.of_generation(target))
        work_items_sql.work_items_insert(connection, [row])
        if blocked and newest and work_items_sql.work_items_link_successors(connection, {newest.WorkId: new_id}) != 1:
            raise RuntimeError("the newest generation changed under its row lock")  # multi-primary: decision 106
        created = work_items_sql.work_item_get(connection, new_id)
        if created is None:
            raise RuntimeError(f"replay {new_id} vanished inside the transaction that inserted it")
        return ReplayResult(work=work_items_sql.work_item_value(created), replay_event_ordinal=ordinal)

    return run_transaction(engine, run, name="replay", unique_keys_conflict=True)  # an ordinal another primary took


def _held_by(connection: Connection, target: WorkRow) -> str | None:
    """The generation a replay of ``target`` runs before, under "block"; None: it queues last.

    A dead letter under "block" holds the generation above it: its replay runs first, in its
    place, and that generation stays held until the replay completes (``relations``). A
    replay of such a replay that failed for good in turn runs before the same generation.
    """
    if target.Status != WorkStatus.FAILED or not order_policy_sql.blocks(
        connection, target.PackInstallId, target.WorkType
    ):
        return None
    if target.RunsBeforeWorkId:
        held: WorkRow | DbRow | None = work_items_sql.work_item_get(connection, target.RunsBeforeWorkId, lock=True)
    else:
        held = work_items_sql.work_item_above(connection, target)
    return held.WorkId if held is not None and held.Status in HELD_STATUSES else None


def _tail(connection: Connection, target: WorkRow, ordinal: int) -> work_items_sql.NewestGeneration:
    """The generation a replay queues behind: its identity's newest, replays run first aside (locked).

    A Flow version's key is carried by no Event, so its tail is read by its generations.
    """
    key = target.ProjectionKey
    if target.FlowVersion is None:
        ordinals = range(ordinal, ordinal + 1)
        newest = work_items_sql.work_items_newest(connection, target.PackInstallId, ordinals, [key])[key]
        if not newest.RunsBeforeWorkId:
            return newest
    return work_items_sql.work_items_tail(connection, target.PackInstallId, [key])[key]


def _refuse_beside_a_version(connection: Connection, target: WorkRow) -> None:
    """Refuse a replay where another Flow version receives the inputs, or of a retired version (decision 185).

    A replay runs in its generation's track, live or as a build as that generation ran. Its
    Event carries the inputs' key: another track that receives them would take it into its
    next generation, extended over it by admission, as a member its admission never counted
    (invariants M and P). A retired version has no pool left to run it.
    """
    version = decode_projection_key(target.ProjectionKey).companion_version  # its track's version
    tracks = flow_versions_sql.tracks_of(connection, target.PackInstallId, target.WorkType)
    if any(track.version == version and track.retired_at is not None for track in tracks):
        raise ReplayRefused(
            f"work {target.WorkId} is a generation of Flow version {version!r}, which is retired: no pool runs it; "
            "skip the dead letter"
        )
    receiving = [track for track in tracks if track.version != version and track.receiving]
    if receiving:
        other = receiving[0]
        advice = "skip the dead letter" if other.live else "skip the dead letter, or retire that version first"
        raise ReplayRefused(
            f"work {target.WorkId}: Flow version {other.version!r} of work type {target.WorkType!r} receives its "
            f"inputs, and a replay's Event would join that version's generations; {advice}"
        )
