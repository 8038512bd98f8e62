"""When a generation's admitted member count can be trusted (schema v11, decision 149).

Admission records, in the statements that create and extend a generation, how many members
it gave the generation (``WorkItem.AdmittedMemberCount``) and the pack ordinal that number
counts through (``WorkItem.AdmittedThroughOrdinal``: the generation's LaneOrdinal when it was
created, the extending batch's last ordinal after an extension). Ordinals are allocated in
commit order under the pack lock, so any later extension raises LaneOrdinal above it. A
release that knows only schema v10 extends generations without touching either column: the
count is exact only while LaneOrdinal is at or below its through-ordinal; otherwise it is
unknown and the first claim's count (``ClaimedMemberCount``, decision 110) guards the range. The Connectors runtime
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
    through = work.AdmittedThroughOrdinal
    if work.AdmittedMemberCount is None or through is None or work.LaneOrdinal > through:
        return None
    return int(work.AdmittedMemberCount)
