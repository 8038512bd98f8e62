"""Flow versions of a work type: built from history beside the live one, verified, switched, rolled back, retired.

A version is a track of generations over the same Events (``queue.tracks``, decision 185). A
build creates, under the pack lock that orders admission, the new track's catch-up: each
identity's retained inputs up to the pack's counter in generations of at most
``CATCH_UP_INPUTS`` members, chained in order; from the same commit on, admission gives every
new input a generation in each receiving track. Catch-up and the inputs admitted while a
version is not live run as builds (``WorkItem.BuildRun``): their inputs ran live in the live
version, so the Flow writes its read model only. A switch makes another version live and
stops the old one receiving; a rollback catches the old one up on what it missed and makes
it live again; a retire ends a track that has nothing left to run. Every step is recorded
(``FlowVersionChange``) with who, why and the pack counter. Each step writes the pack row
(``packs.pack_control_version_bump``), so on a multi-primary engine two steps taken at once
through two nodes conflict and the later one runs again on the earlier one's result.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import uuid
from collections.abc import Sequence

from sqlalchemy.engine import Connection

from nexuscrm_connectors.context import Context
from nexuscrm_connectors.errors import ConnectorsError, ProtocolMissing
from nexuscrm_connectors.operating.claim_pauses import OPERATOR_MAX_LENGTH, check_recorded
from nexuscrm_connectors.operating.order_policy import UnknownWorkType
from nexuscrm_connectors.queries import flow_versions as flow_versions_sql
from nexuscrm_connectors.queries import packs as packs_sql
from nexuscrm_connectors.queries import retention as retention_sql
from nexuscrm_connectors.queries import work_items as work_items_sql
from nexuscrm_connectors.queries.flow_versions import Progress, Track
from nexuscrm_connectors.queries.rows import GenerationRow
from nexuscrm_connectors.queue.deliveries import generation_row
from nexuscrm_connectors.queue.tracks import target_of, track_row
from nexuscrm_runtime.database import run_transaction
from workqueue import WorkStatus, decode_projection_key
from workqueue.errors import ErrorKind, InvalidArgument
from workqueue.identity import FIELD_MAX_LENGTHS, validate_text
from workqueue.statuses import TERMINAL_WORK_STATUSES

CATCH_UP_INPUTS = 500  # members per catch-up generation: a claim's load stays a few pages

BUILD, VERIFY, SWITCH, ROLLBACK, RETIRE = "build", "verify", "switch", "rollback", "retire"
VERDICTS = ("equal", "coverage_only", "different")
STATES = ("building", "standby", "live", "stopped", "retired")  # VersionView.state


class VersionExists(ConnectorsError):
    """A build of a version the work type already has (or had)."""

    kind = ErrorKind.ALREADY_EXISTS


class VersionRefused(ConnectorsError):
    """A version step the work type's state does not allow: a second build, a switch to a version behind, ..."""

    kind = ErrorKind.FAILED_PRECONDITION


class VersionNotFound(ConnectorsError):
    """A step naming a version the work type has no track of."""

    kind = ErrorKind.NOT_FOUND


@dataclasses.dataclass(frozen=True, kw_only=True)
class VersionView:
    """A track with its progress, the pack's counter and its work type's recorded steps."""

    track: Track
    progress: Progress
    high_water_ordinal: int
    changes: tuple[flow_versions_sql.Change, ...]

    @property
    def state(self) -> str:
        """One of ``STATES``."""
        track = self.track
        if track.retired_at is not None:
            return "retired"
        if track.live:
            return "live"
        if not track.receiving:
            return "stopped"
        return "building" if self.progress.behind else "standby"

    @property
    def inputs_per_second(self) -> float:
        """Inputs completed per second over the last minute."""
        return self.progress.inputs_last_minute / 60

    @property
    def seconds_left(self) -> int:
        """The inputs not done yet at ``inputs_per_second``; 0 with nothing left or no rate."""
        rate, left = self.inputs_per_second, self.progress.inputs_total - self.progress.inputs_done
        return round(left / rate) if rate and left > 0 else 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class CatchUp:
    """What a build or a rollback created: generations and their inputs."""

    generations: int = 0
    inputs: int = 0


def _work_type(work_type: str) -> None:
    if not work_type:
        raise InvalidArgument("work_type is required: a Flow version is one work type's", field="work_type")
    validate_text("work_type", work_type, FIELD_MAX_LENGTHS["work_type"])


def _version(field: str, version: str) -> None:
    if not version:
        raise InvalidArgument(f"{field} is required", field=field)
    validate_text(field, version, FIELD_MAX_LENGTHS["companion_version"])


def build(
    context: Context,
    pack_install_id: str,
    work_type: str,
    version: str,
    *,
    from_retained: bool,
    max_inputs_per_second: int,
    started_by: str,
    reason: str,
) -> tuple[VersionView, CatchUp]:
    """Start ``version`` of ``work_type``: its track, its catch-up from history, and inputs from now on.

    Refuses, nothing written: a missing or malformed field (INVALID_ARGUMENT); an unknown pack
    or work type (NOT_FOUND); a pack without a protocol row, a work type whose identities carry
    several companion versions, a build already running, or history that retention pruned
    without ``from_retained`` (FAILED_PRECONDITION, naming the ordinal a build could start
    from); a version the work type has or had (ALREADY_EXISTS).
    """
    _work_type(work_type)
    _version("version", version)
    check_recorded("started_by", started_by, reason)
    if max_inputs_per_second < 0:
        raise InvalidArgument(
            f"max_inputs_per_second must be 0 (unbounded) or positive, got {max_inputs_per_second}",
            field="max_inputs_per_second",
        )

    def run(connection: Connection) -> tuple[VersionView, CatchUp]:
        pack = packs_sql.pack_lock(connection, pack_install_id, context.clock)
        protocol = packs_sql.admission_guard(connection, pack).protocol
        if protocol is None:
            raise ProtocolMissing(
                f"pack {pack_install_id} has no projection protocol row: activate it (greenfield) or run the cutover "
                "before building a Flow version",
                field="pack_install_id",
            )
        packs_sql.pack_control_version_bump(connection, pack_install_id)  # on Galera too, one step at a time
        # A pruning transaction locks the policy row first: one in flight finishes before the
        # catch-up counts the retained inputs, and none starts until the track is committed.
        retention_sql.policy_get(connection, pack_install_id, lock=True)
        tracks = flow_versions_sql.tracks_of(connection, pack_install_id, work_type)
        if any(track.version == version for track in tracks):
            raise VersionExists(f"work type {work_type!r} already has Flow version {version!r}", field="version")
        building = [t.version for t in tracks if t.receiving and not t.live]
        if building:
            raise VersionRefused(
                f"work type {work_type!r} is already building Flow version {building[0]!r}: switch to it or retire "
                "it before building another",
                field="version",
            )
        keys = flow_versions_sql.input_identities(connection, pack_install_id, work_type)
        source = _source_version(pack_install_id, work_type, keys, tracks)
        if source == version:
            raise VersionExists(
                f"{version!r} is the version work type {work_type!r} is delivered with", field="version"
            )
        keys = [key for key in keys if decode_projection_key(key).companion_version == source]
        pruned = flow_versions_sql.pruned_through(connection, pack_install_id, keys)
        if pruned and not from_retained:
            raise VersionRefused(
                f"retention pruned inputs of work type {work_type!r} through ordinal {pruned}: a build can start from "
                f"ordinal {pruned + 1}, the oldest retained input; build with from_retained to cover only what is "
                "retained (the coverage proof then shows the pruned range)",
                field="from_retained",
            )
        cover_from = max(protocol.legacy_max_ordinal, pruned) + 1
        now = pack.now
        if not any(track.own for track in tracks):
            flow_versions_sql.track_insert(
                connection,
                Track.new(
                    pack_install_id,
                    work_type,
                    source,
                    source,
                    live=True,
                    cover_from=protocol.legacy_max_ordinal + 1,
                    now=now,
                ),
            )
        track = dataclasses.replace(
            Track.new(pack_install_id, work_type, version, source, live=False, cover_from=cover_from, now=now),
            catch_up_through_ordinal=pack.last_ordinal,
            max_inputs_per_second=max_inputs_per_second or None,
        )
        flow_versions_sql.track_insert(connection, track)
        made = _catch_up(connection, context, track, keys, cover_from - 1, pack.last_ordinal, now)
        return _recorded_step(connection, pack, track, (BUILD, started_by, reason))[version], made

    return run_transaction(context.engine, run, name="build Flow version")


def _source_version(pack_install_id: str, work_type: str, keys: Sequence[str], tracks: Sequence[Track]) -> str:
    """The companion version the work type's inputs are delivered with (its tracks', or its identities' one)."""
    if tracks:
        return tracks[0].source_version
    versions = sorted({decode_projection_key(key).companion_version for key in keys})
    if not versions:
        raise UnknownWorkType(
            f"work type {work_type!r} of pack {pack_install_id}: the pack has no generation of it", field="work_type"
        )
    if len(versions) > 1:
        raise VersionRefused(
            f"work type {work_type!r} is delivered with companion versions {', '.join(versions)}: a Flow version "
            "builds over the inputs of one",
            field="work_type",
        )
    return versions[0]


def _catch_up(
    connection: Connection,
    context: Context,
    track: Track,
    keys: Sequence[str],
    after: int,
    through: int,
    now: dt.datetime,
) -> CatchUp:
    """Generations of ``track`` over each identity's inputs in (``after``, ``through``], as builds.

    At most ``CATCH_UP_INPUTS`` members each, chained in ordinal order behind the identity's
    newest generation of the track: each one blocked behind the one before it while that is
    not terminal, and linked from it (``SuccessorWorkId``), as admission links.
    """
    rows: list[GenerationRow] = []
    linked: dict[str, str] = {}
    build_target = dataclasses.replace(track, live=False)
    targets = {key: target_of(build_target, key) for key in keys}
    tails = work_items_sql.work_items_tail(connection, track.pack_install_id, [t.key for t in targets.values()])
    for key, target in targets.items():
        ordinals = flow_versions_sql.member_ordinals(connection, track.pack_install_id, key, after, through)
        if not ordinals:
            continue
        newest = tails.get(target.key)
        running = newest is not None and WorkStatus(newest.Status) not in TERMINAL_WORK_STATUSES
        previous = newest.WorkId if newest is not None and running else None
        for start in range(0, len(ordinals), CATCH_UP_INPUTS):
            chunk = ordinals[start : start + CATCH_UP_INPUTS]
            work_id = str(uuid.uuid4())
            if previous is not None:
                linked[previous] = work_id
            row = generation_row(
                work_id=work_id,
                pack_install_id=track.pack_install_id,
                projection_key=target.key,
                start=chunk[0],
                end=chunk[-1],
                members=len(chunk),
                blocked=previous is not None,
                now=now,
                max_attempts=context.settings.max_attempts,
            )
            rows.append(track_row(row, target))
            previous = work_id
    work_items_sql.work_items_insert(connection, rows)
    if work_items_sql.work_items_link_successors(connection, linked) != len(linked):
        raise RuntimeError("a generation the catch-up links behind changed under the pack lock")
    return CatchUp(generations=len(rows), inputs=sum(row["AdmittedMemberCount"] for row in rows))


def _views(connection: Connection, pack: packs_sql.LockedPack, work_type: str | None) -> list[VersionView]:
    """The pack's versions (of ``work_type``) as stored now, each with its progress and recorded steps."""
    views: list[VersionView] = []
    changes: dict[str, list[flow_versions_sql.Change]] = {}
    for track in flow_versions_sql.tracks_of(connection, pack.pack_install_id, work_type):
        if track.work_type not in changes:  # one read of a work type's steps for all its versions
            changes[track.work_type] = flow_versions_sql.changes_of(connection, pack.pack_install_id, track.work_type)
        views.append(
            VersionView(
                track=track,
                progress=flow_versions_sql.progress(connection, track, pack.now),
                high_water_ordinal=pack.last_ordinal,
                changes=tuple(c for c in changes[track.work_type] if c.version == track.version),
            )
        )
    return views


def _recorded_step(
    connection: Connection,
    pack: packs_sql.LockedPack,
    track: Track,
    step: tuple[str, str, str],
    *,
    forced: bool = False,
) -> dict[str, VersionView]:
    """Record ``step`` (action, who, why) on ``track``; its work type's versions as they now stand, by version."""
    action, actor, reason = step
    flow_versions_sql.change_insert(
        connection,
        track,
        action=action,
        actor=actor,
        reason=reason,
        at_ordinal=pack.last_ordinal,
        now=pack.now,
        forced=forced,
    )
    return {view.track.version: view for view in _views(connection, pack, track.work_type)}


def list_versions(context: Context, pack_install_id: str, work_type: str = "") -> list[VersionView]:
    """The pack's Flow versions (of ``work_type``), each with its progress; UnknownPack for no pack."""
    if work_type:
        validate_text("work_type", work_type, FIELD_MAX_LENGTHS["work_type"])

    def run(connection: Connection) -> list[VersionView]:
        pack = packs_sql.pack_lock(connection, pack_install_id, context.clock, lock=False)
        return _views(connection, pack, work_type or None)

    return run_transaction(context.engine, run, name="list Flow versions")


def _locked(
    connection: Connection, context: Context, pack_install_id: str, work_type: str
) -> tuple[packs_sql.LockedPack, list[Track]]:
    pack = packs_sql.pack_lock(connection, pack_install_id, context.clock)
    packs_sql.pack_control_version_bump(connection, pack_install_id)  # on Galera too, one step at a time
    tracks = flow_versions_sql.tracks_of(connection, pack_install_id, work_type)
    if not tracks:
        raise VersionNotFound(
            f"work type {work_type!r} of pack {pack_install_id} has no Flow versions", field="work_type"
        )
    return pack, tracks


def _named(tracks: Sequence[Track], version: str) -> Track:
    for track in tracks:
        if track.version == version:
            return track
    names = ", ".join(track.version for track in tracks)
    raise VersionNotFound(
        f"work type {tracks[0].work_type!r} has no Flow version {version!r} (it has {names})", field="version"
    )


def switch(
    context: Context,
    pack_install_id: str,
    work_type: str,
    version: str,
    *,
    switched_by: str,
    reason: str,
    force: bool = False,
) -> tuple[VersionView, VersionView]:
    """Make ``version`` live; the live one stops receiving. Answers (new live, previous live).

    Refused (FAILED_PRECONDITION, nothing changed) for a retired or stopped version, one still
    behind (generations at or below its catch-up's counter not completed), or one whose last
    verification found a difference, unless ``force``.
    """
    _work_type(work_type)
    _version("version", version)
    check_recorded("switched_by", switched_by, reason)

    def run(connection: Connection) -> tuple[VersionView, VersionView]:
        pack, tracks = _locked(connection, context, pack_install_id, work_type)
        track = _named(tracks, version)
        if track.live:
            raise VersionRefused(f"Flow version {version!r} of {work_type!r} is live already", field="version")
        if not track.receiving:
            raise VersionRefused(
                f"Flow version {version!r} of {work_type!r} is {'retired' if track.retired_at else 'stopped'}: it "
                "no longer receives inputs; roll back to return to the version live before the last switch",
                field="version",
            )
        behind = flow_versions_sql.progress(connection, track, pack.now).behind
        if behind and not force:
            raise VersionRefused(
                f"Flow version {version!r} of {work_type!r} is behind: {behind} of its generations at or below "
                f"ordinal {track.catch_up_through_ordinal} are not completed (failed ones included); wait, or force "
                "with a reason",
                field="version",
            )
        if track.verify_outcome == "different" and not force:
            raise VersionRefused(
                f"Flow version {version!r} of {work_type!r} differed from {track.verified_against!r} when verified "
                f"through ordinal {track.verified_through_ordinal}; verify again, or force with a reason",
                field="version",
            )
        (live,) = [t for t in tracks if t.live]
        flow_versions_sql.track_update(connection, live, Live=False, CoverThroughOrdinal=pack.last_ordinal)
        flow_versions_sql.track_update(connection, track, Live=True)
        views = _recorded_step(connection, pack, track, (SWITCH, switched_by, reason), forced=force)
        return views[version], views[live.version]

    return run_transaction(context.engine, run, name="switch Flow version")


def rollback(
    context: Context, pack_install_id: str, work_type: str, *, rolled_back_by: str, reason: str
) -> tuple[VersionView, VersionView, CatchUp]:
    """Make live again the version the last switch stopped, caught up on what it missed; (live, previous, catch-up).

    The version live until now keeps receiving, not live (a switch back needs no catch-up).
    FAILED_PRECONDITION when no stopped version is left (it was retired).
    """
    _work_type(work_type)
    check_recorded("rolled_back_by", rolled_back_by, reason)

    def run(connection: Connection) -> tuple[VersionView, VersionView, CatchUp]:
        pack, tracks = _locked(connection, context, pack_install_id, work_type)
        stopped = [t for t in tracks if t.retired_at is None and t.cover_through_ordinal is not None]
        if not stopped:
            raise VersionRefused(
                f"work type {work_type!r} has no version to roll back to: the one live before the last switch is "
                "retired, or no switch happened",
                field="work_type",
            )
        back = max(stopped, key=lambda t: t.cover_through_ordinal or 0)
        (live,) = [t for t in tracks if t.live]
        keys = [
            key
            for key in flow_versions_sql.input_identities(connection, pack_install_id, work_type)
            if decode_projection_key(key).companion_version == back.source_version
        ]
        missed_from = back.cover_through_ordinal or 0
        made = _catch_up(connection, context, back, keys, missed_from, pack.last_ordinal, pack.now)
        flow_versions_sql.track_update(
            connection, back, Live=True, CoverThroughOrdinal=None, CatchUpThroughOrdinal=pack.last_ordinal
        )
        flow_versions_sql.track_update(connection, live, Live=False)
        views = _recorded_step(connection, pack, back, (ROLLBACK, rolled_back_by, reason))
        return views[back.version], views[live.version], made

    return run_transaction(context.engine, run, name="roll back Flow version")


def retire(
    context: Context, pack_install_id: str, work_type: str, version: str, *, retired_by: str, reason: str
) -> VersionView:
    """End a version that is not live and has no generation left to run; its history is kept.

    FAILED_PRECONDITION for the live version, a retired one, or one with generations not
    terminal (they may be the only live run of their inputs).
    """
    _work_type(work_type)
    _version("version", version)
    check_recorded("retired_by", retired_by, reason)

    def run(connection: Connection) -> VersionView:
        pack, tracks = _locked(connection, context, pack_install_id, work_type)
        track = _named(tracks, version)
        if track.live:
            raise VersionRefused(f"Flow version {version!r} of {work_type!r} is live: switch first", field="version")
        if track.retired_at is not None:
            raise VersionRefused(f"Flow version {version!r} of {work_type!r} is retired already", field="version")
        left = flow_versions_sql.nonterminal_count(connection, track)
        if left:
            raise VersionRefused(
                f"Flow version {version!r} of {work_type!r} has {left} generations not terminal yet: let its pool "
                "finish them first",
                field="version",
            )
        through = track.cover_through_ordinal if track.cover_through_ordinal is not None else pack.last_ordinal
        flow_versions_sql.track_update(connection, track, RetiredAt=pack.now, CoverThroughOrdinal=through)
        return _recorded_step(connection, pack, track, (RETIRE, retired_by, reason))[version]

    return run_transaction(context.engine, run, name="retire Flow version")


def record_verification(
    context: Context,
    pack_install_id: str,
    work_type: str,
    version: str,
    *,
    against: str,
    through_ordinal: int,
    verdict: str,
    differing: Sequence[str],
    verified_by: str,
) -> VersionView:
    """Record how ``version`` compared with ``against`` through ``through_ordinal`` (the CLI computes it)."""
    _work_type(work_type)
    _version("version", version)
    _version("against_version", against)
    validate_text("verified_by", verified_by, OPERATOR_MAX_LENGTH)
    if verdict not in VERDICTS:
        raise InvalidArgument(f"verdict must be one of {', '.join(VERDICTS)}, got {verdict!r}", field="verdict")
    if through_ordinal < 1:
        raise InvalidArgument(f"through_ordinal must be positive, got {through_ordinal}", field="through_ordinal")
    reason = f"{verdict} against {against} through ordinal {through_ordinal}"
    if differing:
        shown = ", ".join(differing[:100])
        reason += f"; {len(differing)} identities differ: {shown}"

    def run(connection: Connection) -> VersionView:
        pack, tracks = _locked(connection, context, pack_install_id, work_type)
        track = _named(tracks, version)
        _named(tracks, against)
        flow_versions_sql.track_update(
            connection,
            track,
            VerifiedAgainst=against,
            VerifiedThroughOrdinal=through_ordinal,
            VerifyOutcome=verdict,
            VerifiedAt=pack.now,
        )
        return _recorded_step(connection, pack, track, (VERIFY, verified_by, reason))[version]

    return run_transaction(context.engine, run, name="record Flow version verification")
