"""What this Connectors release is and which canonical schema versions it serves (decision 144).

Minimum 15: admission and claims read the Flow version tracks (FlowVersionTrack and
WorkItem.FlowVersion, InputKey and BuildRun, v15; decision 185); before that claims hold a
generation behind the replay that runs before it (WorkItem.RunsBeforeWorkId, v14; decision 174)
and write the lease's start (ClaimedAt), and a failure reads its work type's retry policy
(WorkTypeRetryPolicy) and records the attempt (WorkAttempt; decision 175); before that they
read the order policy of each candidate's work type (WorkTypeOrderPolicy, v13; decision 165),
the operator's pauses (ClaimPause, v12; decision 158) and admission and replay write each
generation's admitted member count (WorkItem.AdmittedMemberCount and AdmittedThroughOrdinal,
v11; decision 149), and admission and retention read RetentionPolicy's duplicate-window columns
(v9) and every payload write follows the payload contract (v10). The forward window of one
version lets a database migrated by the next release keep this one serving during a rolling
upgrade.
"""

from __future__ import annotations

from nexuscrm_runtime.release import Release, SchemaSupport

RELEASE = Release(
    owner="connectors",
    distribution="nexuscrm-connectors",
    schema=SchemaSupport(minimum=15, newest=15, forward_window=1),
)
