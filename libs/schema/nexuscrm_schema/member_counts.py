"""When a generation's admitted member count can be trusted (schema v11, decision 149).

Admission records, in the statements that create and extend a generation, how many members
it gave the generation (``WorkItem.AdmittedMemberCount``) and the LaneOrdinal that number
counts through (``WorkItem.AdmittedThroughOrdinal``). A release that knows only schema v10
extends generations without touching either column, so the count is exact only while its
through-ordinal is the generation's LaneOrdinal; otherwise it is unknown and the first claim's
count (``ClaimedMemberCount``, decision 110) is what guards the range. The Connectors runtime
(claim, LoadInputs) and the invariant checker (P) read it through this one rule.
"""

from __future__ import annotations

from typing import Protocol


class CountedGeneration(Protocol):
    """A WorkItem row with the v11 columns (any row object with these attributes)."""

    @property
    def AdmittedMemberCount(self) -> int | None: ...

    @property
    def AdmittedThroughOrdinal(self) -> int | None: ...

    @property
    def LaneOrdinal(self) -> int: ...


def admitted_count(work: CountedGeneration) -> int | None:
    """``work``'s admitted member count if it counts through its LaneOrdinal; None when unknown."""
    if work.AdmittedMemberCount is None or work.AdmittedThroughOrdinal != work.LaneOrdinal:
        return None
    return int(work.AdmittedMemberCount)
