"""The coverage proof: whether an identity's generations tile every input it was admitted (decision 161).

For one identity, its ranges are its generations with a range ([InputStartOrdinal,
LaneOrdinal], native and replay alike) and retention's records of its pruned generations. Its
admitted inputs are its retained Events above the pack's legacy cutoff. The ranges tile the
inputs when no two ranges share an ordinal (else an overlap) and every admitted input lies in
a range (else a gap: a run of the identity's inputs, consecutive among its own ordinals, that
no range holds). A replay is a generation of its own over its replay Event's new ordinal (and
any input it absorbed), never over the failed range it replays, so it is never an overlap;
the failed range is reported replayed, by the replay's WorkId. A skipped failure (decision
160) keeps its range: it is reported skipped. Pruned ranges are retention's PrunedWork
records (gone once the duplicate window expired them: what they covered is then neither
reported nor missing, since its Events are gone too).

Reads never change a row. A page examines ``page_size`` identities in projection-key order
from its token on; each costs a seek per table for its key and one index range each for its
generations, pruned records and inputs (``queries.coverage``).
"""

from __future__ import annotations

import dataclasses
import enum
import itertools
from collections.abc import Sequence

from sqlalchemy.engine import Connection

from nexuscrm_connectors import metrics, page_tokens
from nexuscrm_connectors.context import Context
from nexuscrm_connectors.errors import ProtocolMissing, UnknownPack
from nexuscrm_connectors.queries import DbRow
from nexuscrm_connectors.queries import coverage as coverage_sql
from nexuscrm_connectors.queries import flow_versions as flow_versions_sql
from nexuscrm_connectors.queries import operator_reads as operator_reads_sql
from nexuscrm_connectors.queries import packs as packs_sql
from nexuscrm_connectors.queries.dead_letters import Filter
from nexuscrm_connectors.queries.flow_versions import Track
from nexuscrm_connectors.queue import tracks as version_tracks
from nexuscrm_runtime.causal import causal_read
from workqueue import WorkStatus
from workqueue.identity import decode_projection_key
from workqueue.values import Route

EXCEPTIONS_LISTED = 10  # exceptions an identity lists; the count says how many there are


class RangeState(enum.StrEnum):
    """What became of a range's inputs."""

    COMPLETED = "completed"
    IN_FLIGHT = "in_flight"  # processing
    QUEUED = "queued"  # pending, blocked or retry
    FAILED = "failed"  # a dead letter
    REPLAYED = "replayed"  # failed, and replayed by ``replayed_by``
    SKIPPED = "skipped"  # failed, and skipped by an operator
    PRUNED = "pruned"


class ExceptionKind(enum.StrEnum):
    """How a range breaks the tiling."""

    GAP = "gap"  # admitted inputs no range holds
    OVERLAP = "overlap"  # two ranges share ordinals


@dataclasses.dataclass(frozen=True, kw_only=True)
class CoveredRange:
    """One range (a generation or a pruned record), inclusive bounds."""

    start_ordinal: int
    end_ordinal: int
    state: RangeState
    work_id: str
    replayed_by: str = ""


@dataclasses.dataclass(frozen=True, kw_only=True)
class CoverageException:
    """A gap (the first and last input of the run) or an overlap (the shared ordinals and both WorkIds)."""

    kind: ExceptionKind
    start_ordinal: int
    end_ordinal: int
    work_ids: tuple[str, ...]


@dataclasses.dataclass(frozen=True, kw_only=True)
class IdentityCoverage:
    """One identity's proof: ``tiled`` when it has no exception; the first ``EXCEPTIONS_LISTED`` are listed."""

    route: Route
    high_water_ordinal: int  # the highest ordinal admitted to the identity that is retained or recorded
    tiled: bool
    ranges: tuple[CoveredRange, ...]  # by end ordinal
    exceptions: tuple[CoverageException, ...]
    exception_count: int
    inputs: int  # retained inputs checked


@dataclasses.dataclass(frozen=True, kw_only=True)
class CoveragePage:
    """One page of identities by projection key; ``next_page_token`` is "" after the last."""

    identities: tuple[IdentityCoverage, ...]
    next_page_token: str
    examined: int  # identities this page examined (a work type filter keeps fewer)


_STATES = {
    WorkStatus.COMPLETED: RangeState.COMPLETED,
    WorkStatus.PROCESSING: RangeState.IN_FLIGHT,
    WorkStatus.PENDING: RangeState.QUEUED,
    WorkStatus.BLOCKED: RangeState.QUEUED,
    WorkStatus.RETRY: RangeState.QUEUED,
}


def _generation_range(row: DbRow) -> CoveredRange:
    state = _STATES.get(WorkStatus(row.Status), RangeState.FAILED)
    if state is RangeState.FAILED and row.ReplayedBy is not None:
        state = RangeState.REPLAYED
    elif state is RangeState.FAILED and row.Skipped:
        state = RangeState.SKIPPED
    return CoveredRange(
        start_ordinal=int(row.InputStartOrdinal),
        end_ordinal=int(row.LaneOrdinal),
        state=state,
        work_id=row.WorkId,
        replayed_by=row.ReplayedBy or "",
    )


def _overlaps(ranges: list[CoveredRange]) -> list[CoverageException]:
    """Every pair of ranges sharing ordinals; ``ranges`` by end ordinal."""
    found = []
    for i, later in enumerate(ranges):
        for earlier in reversed(ranges[:i]):
            if earlier.end_ordinal < later.start_ordinal:
                break  # earlier ranges end lower still, unless one overlaps this one: listed from it
            found.append(
                CoverageException(
                    kind=ExceptionKind.OVERLAP,
                    start_ordinal=max(earlier.start_ordinal, later.start_ordinal),
                    end_ordinal=min(earlier.end_ordinal, later.end_ordinal),
                    work_ids=(earlier.work_id, later.work_id),
                )
            )
    return found


def _gaps(ranges: list[CoveredRange], inputs: list[int]) -> list[CoverageException]:
    """The runs of ``inputs`` (ascending) that no range holds; ``ranges`` by end ordinal."""
    uncovered = []
    ends = iter(sorted(ranges, key=lambda r: r.start_ordinal))
    current = next(ends, None)
    for ordinal in inputs:
        while current is not None and current.end_ordinal < ordinal:
            current = next(ends, None)
        if current is None or ordinal < current.start_ordinal:
            uncovered.append(ordinal)
    runs: list[CoverageException] = []
    held = set(uncovered)
    for _, run in itertools.groupby(inputs, key=lambda o: o in held):
        ordinals = list(run)
        if ordinals[0] in held:
            runs.append(
                CoverageException(
                    kind=ExceptionKind.GAP, start_ordinal=ordinals[0], end_ordinal=ordinals[-1], work_ids=()
                )
            )
    return runs


def identity_coverage(
    connection: Connection,
    pack_install_id: str,
    projection_key: str,
    legacy_max_ordinal: int,
    tracks: Sequence[Track] = (),
) -> IdentityCoverage:
    """One identity's proof, from its generations, pruned records and retained inputs.

    A Flow version's identity (``tracks``) is proven over the inputs its track covers.
    """
    generations = coverage_sql.identity_generations(connection, pack_install_id, projection_key)
    pruned = coverage_sql.identity_pruned(connection, pack_install_id, projection_key)
    member_key, above, through = version_tracks.member_window(tracks, projection_key, legacy_max_ordinal)
    inputs = coverage_sql.identity_inputs(connection, pack_install_id, member_key, above)
    if through is not None:
        inputs = [ordinal for ordinal in inputs if ordinal <= through]
    ranges = sorted(
        [_generation_range(row) for row in generations]
        + [
            CoveredRange(
                start_ordinal=int(row.InputStartOrdinal),
                end_ordinal=int(row.LaneOrdinal),
                state=RangeState.PRUNED,
                work_id=row.WorkId,
            )
            for row in pruned
        ],
        key=lambda r: (r.end_ordinal, r.start_ordinal),
    )
    exceptions = sorted(_gaps(ranges, inputs) + _overlaps(ranges), key=lambda e: (e.start_ordinal, e.kind))
    for kind in {e.kind for e in exceptions}:
        metrics.COVERAGE_EXCEPTIONS.labels(kind).inc()
    return IdentityCoverage(
        route=Route.of(decode_projection_key(projection_key)),
        high_water_ordinal=max([r.end_ordinal for r in ranges] + inputs[-1:] + [0]),
        tiled=not exceptions,
        ranges=tuple(ranges),
        exceptions=tuple(exceptions[:EXCEPTIONS_LISTED]),
        exception_count=len(exceptions),
        inputs=len(inputs),
    )


def _position(values: list[object]) -> str:
    """The position a coverage page token carries: the last projection key examined."""
    (key,) = values
    return page_tokens.string(key)


def get_coverage(
    context: Context, pack_install_id: str, wanted: Filter, page_size: int = 0, page_token: str = ""
) -> CoveragePage:
    """One page of the pack's identities that ``wanted`` keeps (its ``projection_key`` and ``work_type``), each proven.

    ``wanted`` comes from ``dead_letters.filter_of`` (its time and text bounds are not used).
    Raises ``UnknownPack``, ``ProtocolMissing`` for a pack without a protocol row, and
    ``InvalidArgument`` for a page size out of range or a token that is not one of this read's.
    """
    engine, settings = context.engine, context.settings
    size = settings.page_size(page_size)
    after = page_tokens.decode_token(page_token, "GetCoverage", _position)
    with engine.connect() as connection:
        causal_read(connection)  # a proof: it covers every acknowledged write
        if operator_reads_sql.pack_namespace(connection, pack_install_id) is None:
            raise UnknownPack(f"pack_install_id {pack_install_id!r} is not installed", field="pack_install_id")
        protocol = packs_sql.protocol_get(connection, pack_install_id)
        if protocol is None:  # old-protocol work records no ranges: there is nothing to prove
            raise ProtocolMissing(f"pack {pack_install_id!r} has no projection protocol row", field="pack_install_id")
        cutoff = protocol.legacy_max_ordinal
        if wanted.projection_key is not None:
            keys = [] if after is not None else [wanted.projection_key]
        else:
            keys = []
            key = coverage_sql.identity_next(connection, pack_install_id, after)
            while key is not None:
                keys.append(key)
                if len(keys) == size:
                    break
                key = coverage_sql.identity_next(connection, pack_install_id, key)
        tracks = flow_versions_sql.tracks_of(connection, pack_install_id)
        kept = [
            identity_coverage(connection, pack_install_id, key, cutoff, tracks)
            for key in keys
            if not wanted.work_type or Route.of(decode_projection_key(key)).work_type == wanted.work_type
        ]
    token = page_tokens.encode_token((keys[-1],)) if wanted.projection_key is None and len(keys) == size else ""
    return CoveragePage(identities=tuple(kept), next_page_token=token, examined=len(keys))
