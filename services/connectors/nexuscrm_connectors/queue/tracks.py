"""Where an admitted input goes when its work type has Flow versions: one generation per receiving track.

A work type without versions has one implicit track, its inputs' own key, and admission never
reads this module's rows. Once a version is built, each track (``queries.flow_versions.Track``)
that receives inputs gets its own generation of every admitted input: the inputs' own key for
the track of their delivered companion version, else the same identity with the track's version
as its companion version, whose members are the inputs' key (``WorkItem.InputKey``) (decision 185).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

from nexuscrm_connectors.queries.flow_versions import Track
from nexuscrm_connectors.queries.rows import GenerationRow
from nexuscrm_connectors.queries.work_items import WorkRow
from workqueue.identity import decode_projection_key, with_companion_version


@dataclasses.dataclass(frozen=True)
class Target:
    """The generation key one track gives an input, with what its generations record."""

    key: str
    flow_version: str | None  # None: the inputs' own key
    input_key: str | None
    build_run: bool
    live: bool

    @classmethod
    def of_generation(cls, work: WorkRow) -> Target:
        """The target ``work`` was created for: its key, version and members' key, live or a build as it ran."""
        build_run = bool(work.BuildRun)
        return cls(work.ProjectionKey, work.FlowVersion, work.InputKey, build_run=build_run, live=not build_run)


# Admission decodes the key of every input of a pack with versions: remembered, as its keys repeat.
_identity = functools.lru_cache(maxsize=4096)(decode_projection_key)


def target_of(track: Track, projection_key: str) -> Target:
    """The generation key ``track`` gives the inputs of ``projection_key`` (one of its source version)."""
    if track.own:
        return Target(projection_key, None, None, build_run=not track.live, live=track.live)
    key = with_companion_version(projection_key, track.version)
    return Target(key, track.version, projection_key, build_run=not track.live, live=track.live)


def refusal(tracks: Sequence[Track], projection_key: str) -> str | None:
    """Why an input may not be admitted with this key: it names a Flow version's track as its companion version."""
    identity = _identity(projection_key)
    for track in tracks:
        if track.work_type == identity.work_type and not track.own and track.version == identity.companion_version:
            return (
                f"companion_version {track.version!r} is a Flow version built over work type {track.work_type!r}'s "
                f"inputs delivered with {track.source_version!r}: deliver them with {track.source_version!r}"
            )
    return None


def targets(tracks: Sequence[Track], projection_key: str) -> list[Target] | None:
    """The generations an input of ``projection_key`` joins: one per receiving track; None without versions."""
    identity = _identity(projection_key)
    mine = [
        track
        for track in tracks
        if track.work_type == identity.work_type and track.source_version == identity.companion_version
    ]
    if not mine:
        return None
    return [target_of(track, projection_key) for track in mine if track.receiving]


def track_row(row: GenerationRow, target: Target) -> GenerationRow:
    """``row`` as a generation of ``target``'s track: its version, its members' key and how it runs."""
    return {**row, "FlowVersion": target.flow_version, "InputKey": target.input_key, "BuildRun": target.build_run}


def live_key(tracks: Sequence[Track], projection_key: str) -> str:
    """The generation key of the live version of ``projection_key``'s work type (its own key without versions)."""
    identity = _identity(projection_key)
    for track in tracks:
        if track.live and track.work_type == identity.work_type and track.source_version == identity.companion_version:
            return target_of(track, projection_key).key
    return projection_key


def member_window(tracks: Sequence[Track], projection_key: str, cutoff: int) -> tuple[str, int, int | None]:
    """The inputs a generation key covers: their key, and the ordinals above and through which (None: open).

    Without versions of its work type: its own inputs above the pack's legacy cutoff. A track's
    key (its own version's or another's) covers its source identity's inputs from its
    CoverFromOrdinal through its CoverThroughOrdinal.
    """
    identity = _identity(projection_key)
    for track in tracks:
        if track.work_type == identity.work_type and track.version == identity.companion_version:
            source = with_companion_version(projection_key, track.source_version)
            return source, max(cutoff, track.cover_from_ordinal - 1), track.cover_through_ordinal
    return projection_key, cutoff, None
