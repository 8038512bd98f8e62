"""What this Controlplane release is and which canonical schema versions it serves (decision 144).

Minimum 6: every fence bumps NamespaceControl (v6) and PackInstall.ControlVersion (v4), and
the protocol receipts live in _System_ConnectorProjectionProtocol (v2); nothing it reads or
writes is newer. Below v10 the cutover still refuses with the missing pieces it names
(``cutover``: the complete schema for native projection). The forward window of one version
lets a database migrated by the next release keep this one serving during a rolling upgrade.
"""

from __future__ import annotations

from nexuscrm_runtime.release import Release, SchemaSupport

RELEASE = Release(
    owner="controlplane",
    distribution="nexuscrm-controlplane",
    schema=SchemaSupport(minimum=6, newest=15, forward_window=1),
)
