"""What this Integration host release is and which canonical schema versions it serves (decision 144).

The host never reads canonical tables itself: its activation gate asks the schema catalog for
the database's version and checks it against this range (``activation``), beside the
complete schema that native projection needs (v11 since the admitted member count of
decision 149: on a v10 database the catalog names the missing columns). The forward window
of one version lets a database migrated by the next release keep this one serving during a
rolling upgrade.
"""

from __future__ import annotations

from nexuscrm_runtime.release import Release, SchemaSupport

RELEASE = Release(
    owner="integration",
    distribution="nexuscrm-integration",
    schema=SchemaSupport(minimum=10, newest=15, forward_window=1),
)
