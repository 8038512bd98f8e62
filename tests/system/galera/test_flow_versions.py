"""A Flow version built, switched, rolled back, switched again and retired on two Galera nodes (issue 52, decision 185).

Ingest goes through node 1 and node 2 at once (with duplicates) while V2 catches up; each
version step is taken on a node other than the last writer's, so every step reads what the
other node committed (admission's fan-out reads the tracks under the pack lock, which Galera
certifies across nodes). Every input must run live exactly once, in the version live when it
was admitted, and V2 must have run every input; the invariants (M per track) hold at the end.
"""

from __future__ import annotations

import threading
from collections import Counter

import sqlalchemy as sa

from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.operating import flow_versions
from tests.connectors.integration.test_flow_versions import V1, V2, Runs, _drain, _items
from tests.support.factories import install_pack
from tests.support.invariants import assert_invariants
from tests.system.galera.test_control_decisions import engines, synced
from workqueue.values import Outcome

__all__ = ["engines"]  # the fixture, shared with the control decisions

RETAINED = 600
BATCH, BATCHES = 20, 8  # per node while the build catches up


def _ingest(connectors: Connectors, pack: str, start: int, outcomes: Counter[Outcome]) -> None:
    """BATCHES batches of new inputs from ``start``, each with one retained receipt again."""
    for n in range(start, start + BATCH * BATCHES, BATCH):
        results = connectors.ingest(pack, items=[*_items(n, BATCH), _items(n - start + 1, 1)[0]])
        outcomes.update(r.outcome for r in results)


def test_a_version_is_built_while_two_nodes_ingest_then_switched_rolled_back_switched_and_retired(
    engines: list[sa.Engine],
) -> None:
    node1, node2 = Connectors(engines[0]), Connectors(engines[1])
    pack = install_pack(engines[0])
    runs = Runs()
    node1.ingest(pack, items=_items(1, RETAINED // 2))
    synced(engines[1])
    node2.ingest(pack, items=_items(RETAINED // 2 + 1, RETAINED // 2))
    _drain(node1, pack, runs)
    synced(engines[1])
    _, made = flow_versions.build(
        node2.context,
        pack,
        "project",
        V2,
        from_retained=False,
        max_inputs_per_second=0,
        started_by="ops",
        reason="galera",
    )
    assert made.inputs == RETAINED
    synced(engines[0])

    # Node 1 and node 2 ingest at once while V2 catches up on node 2 and V1 runs live on node 1.
    outcomes: Counter[Outcome] = Counter()
    second = RETAINED + 1 + BATCH * BATCHES
    other = threading.Thread(target=_ingest, args=(node2, pack, second, outcomes))
    other.start()
    _ingest(node1, pack, RETAINED + 1, outcomes)
    _drain(node2, pack, runs, [V2])
    other.join()
    admitted = RETAINED + 2 * BATCH * BATCHES
    assert outcomes[Outcome.ADMITTED] == 2 * BATCH * BATCHES
    assert outcomes[Outcome.DUPLICATE_COVERED] == 2 * BATCHES
    synced(engines[0])
    _drain(node1, pack, runs)
    synced(engines[1])
    _drain(node2, pack, runs, [V2], limit=5000)
    assert runs.of(V1, build=False) == runs.of(V2, build=True) == list(range(1, admitted + 1))

    synced(engines[0])
    flow_versions.switch(node1.context, pack, "project", V2, switched_by="ops", reason="ship")
    synced(engines[1])
    node2.ingest(pack, items=_items(admitted + 1, 5))
    _drain(node2, pack, runs, [V2])
    synced(engines[0])
    back, _, missed = flow_versions.rollback(node1.context, pack, "project", rolled_back_by="ops", reason="bad")
    assert (back.track.version, missed.inputs) == (V1, 5)
    synced(engines[1])
    node2.ingest(pack, items=_items(admitted + 6, 5))
    _drain(node2, pack, runs)
    _drain(node2, pack, runs, [V2])
    synced(engines[0])
    flow_versions.switch(node1.context, pack, "project", V2, switched_by="ops", reason="fixed")
    synced(engines[1])
    flow_versions.retire(node2.context, pack, "project", V1, retired_by="ops", reason="done")
    synced(engines[0])
    node1.ingest(pack, items=_items(admitted + 11, 5))
    _drain(node1, pack, runs, [V2])

    total = admitted + 15
    assert Counter(runs.of(V1, build=False) + runs.of(V2, build=False)) == Counter(range(1, total + 1))
    assert runs.of(V1, build=True) == list(range(admitted + 1, admitted + 6))  # what the rollback caught up
    assert runs.of(V2, build=True) == [*range(1, admitted + 1), *range(admitted + 6, admitted + 11)]
    states = {v.track.version: v.state for v in flow_versions.list_versions(node2.context, pack, "project")}
    assert states == {V1: "retired", V2: "live"}
    synced(engines[0])
    assert_invariants(engines[0])
