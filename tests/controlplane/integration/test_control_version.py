"""Every Controlplane change an admission decides from writes the pack rows it covers (decision 107).

Arming and disarming a fence, adding and removing an override and writing a protocol row bump
``PackInstall.ControlVersion`` of exactly the packs they cover: the row every admission that
allocates ordinals writes too, so on a multi-primary engine the two conflict at commit
(tests/system/galera/test_control_decisions.py runs those races). Installing a pack and arming or
disarming a namespace fence also write the namespace's NamespaceControl row, so the two
conflict in turn. Here: which rows each change writes.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from nexuscrm_controlplane import fences, lifecycle
from nexuscrm_schema.tables import NamespaceControl, PackInstall
from tests.controlplane.integration.history import NAMESPACE, FakeClock, cut, install
from tests.support.invariants import assert_invariants

pytestmark = pytest.mark.database


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def versions(engine: sa.Engine) -> dict[str, int | None]:
    with engine.connect() as connection:
        rows = connection.execute(sa.select(PackInstall.c.PackInstallId, PackInstall.c.ControlVersion))
        return {row.PackInstallId: row.ControlVersion for row in rows}


def namespace_versions(engine: sa.Engine) -> dict[str, int]:
    with engine.connect() as connection:
        rows = connection.execute(sa.select(NamespaceControl.c.Namespace, NamespaceControl.c.ControlVersion))
        return {row.Namespace: row.ControlVersion for row in rows}


def test_installs_and_namespace_fences_write_their_namespace_row(engine: sa.Engine, clock: FakeClock) -> None:
    assert namespace_versions(engine) == {}
    first = lifecycle.install_pack(engine, NAMESPACE, "crm", "1", clock).pack_install_id
    assert namespace_versions(engine) == {NAMESPACE: 1}
    lifecycle.install_pack(engine, "other", "crm", "1", clock)
    assert namespace_versions(engine) == {NAMESPACE: 1, "other": 1}
    namespace_fence = fences.arm_fence(engine, NAMESPACE, clock=clock).fence_id
    assert namespace_versions(engine) == {NAMESPACE: 2, "other": 1}
    pack_fence = fences.arm_fence(engine, NAMESPACE, first, clock=clock).fence_id  # covers one known pack
    fences.add_override(engine, namespace_fence, first, clock=clock)
    fences.remove_override(engine, namespace_fence, first)
    fences.disarm_fence(engine, pack_fence)
    assert namespace_versions(engine) == {NAMESPACE: 2, "other": 1}
    fences.disarm_fence(engine, namespace_fence)
    assert namespace_versions(engine) == {NAMESPACE: 3, "other": 1}
    fences.arm_fence(engine, "empty", clock=clock)  # a namespace without packs gets its row too
    assert namespace_versions(engine) == {NAMESPACE: 3, "other": 1, "empty": 1}
    assert_invariants(engine)


def test_fence_changes_bump_exactly_the_packs_they_cover(engine: sa.Engine, clock: FakeClock) -> None:
    first = lifecycle.install_pack(engine, NAMESPACE, "crm", "1", clock).pack_install_id
    second = lifecycle.install_pack(engine, NAMESPACE, "crm", "1", clock).pack_install_id
    elsewhere = lifecycle.install_pack(engine, "other", "crm", "1", clock).pack_install_id
    assert versions(engine) == {first: None, second: None, elsewhere: None}

    namespace_fence = fences.arm_fence(engine, NAMESPACE, clock=clock).fence_id
    assert versions(engine) == {first: 1, second: 1, elsewhere: None}
    fences.add_override(engine, namespace_fence, first, clock=clock)
    assert versions(engine) == {first: 2, second: 1, elsewhere: None}
    fences.remove_override(engine, namespace_fence, first)
    assert versions(engine) == {first: 3, second: 1, elsewhere: None}
    pack_fence = fences.arm_fence(engine, NAMESPACE, second, clock=clock).fence_id
    assert versions(engine) == {first: 3, second: 2, elsewhere: None}
    fences.disarm_fence(engine, pack_fence)
    assert versions(engine) == {first: 3, second: 3, elsewhere: None}
    fences.disarm_fence(engine, namespace_fence)
    assert versions(engine) == {first: 4, second: 4, elsewhere: None}
    assert_invariants(engine)


def test_writing_a_protocol_row_bumps_its_pack_once(engine: sa.Engine, clock: FakeClock) -> None:
    greenfield = lifecycle.install_pack(engine, NAMESPACE, "crm", "1", clock).pack_install_id
    lifecycle.activate_pack(engine, greenfield, clock)
    assert versions(engine)[greenfield] == 1
    lifecycle.activate_pack(engine, greenfield, clock)  # already active: nothing written
    assert versions(engine)[greenfield] == 1

    old = install(engine, clock)  # handoff recorded, no history
    fence = fences.arm_fence(engine, NAMESPACE, clock=clock).fence_id
    before = versions(engine)[old]
    assert cut(engine, old, clock).protocol is not None
    assert versions(engine)[old] == (before or 0) + 1
    cut(engine, old, clock)  # already written: nothing written
    assert versions(engine)[old] == (before or 0) + 1
    fences.disarm_fence(engine, fence)
    assert_invariants(engine)
