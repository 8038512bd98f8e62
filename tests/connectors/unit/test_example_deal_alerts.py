"""The example Flow with a side effect (``examples/deal_alerts.py``), over the SDK's in-memory work source.

Live, a won deal asks for one e-mail (an outbox row); a version built beside it from history
runs the same inputs in a build and writes its read model only. The digests of two versions
that project alike are equal identity by identity at every ordinal; a version that derives
the amounts differently differs, and only where a derivation changed.
"""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import sqlalchemy as sa

from examples import deal_alerts
from nexuscrm_sdk import DigestingFlow, Flow, FlowContext, Generation, InMemoryWorkSource, Worker
from nexuscrm_sdk.flows import flow_digest
from workqueue import ProjectionIdentity
from workqueue.values import InputRow

INVARIANTS_NOT_CHECKED = "the example Flow's own SQLite read models, not the canonical database"

PACK = "pk-0123456789ab"  # a pack id as the CLI takes it (tests/system/integration/test_versions_command.py)
WORK_TYPE = "deal-alerts"


def identity(lane: str) -> ProjectionIdentity:
    return ProjectionIdentity(
        pack_install_id=PACK,
        event_kind="deal.update",
        route_version="1",
        companion_version="1",
        work_type=WORK_TYPE,
        source_lane=lane,
    )


def update(deal: str, stage: str, amount: str) -> bytes:
    return json.dumps({"deal_id": deal, "stage": stage, "amount": amount}).encode()


class RoundedAmounts(deal_alerts.DealAlerts):
    """A deliberately different version: amounts rounded to whole units."""

    def derive(self, row: InputRow) -> tuple[str, str, Decimal]:
        deal, stage, amount = super().derive(row)
        return deal, stage, amount.quantize(Decimal(1))


def flow_of(tmp_path: Path, name: str) -> deal_alerts.DealAlerts:
    context = FlowContext(
        pack_install_id=PACK,
        work_type=WORK_TYPE,
        engine=sa.create_engine("sqlite://"),  # the host's: not used, the read model has its own
        settings={"database": f"sqlite:///{tmp_path / name}.db"},
        flow_version=name,
    )
    return deal_alerts.deal_alerts(context)


def run(source: InMemoryWorkSource, flow: Flow, versions: list[str]) -> None:
    worker = Worker(source, flow, worker_id=f"test-{versions}", work_types=[WORK_TYPE], flow_versions=versions)
    while worker.run_once():
        pass


def outbox(flow: deal_alerts.DealAlerts) -> list[tuple[int, str]]:
    with flow.engine.connect() as connection:
        rows = connection.execute(
            sa.select(deal_alerts.DealAlertOutbox.c.EnqueueOrdinal, deal_alerts.DealAlertOutbox.c.Message)
        )
        return sorted((row[0], row[1]) for row in rows)


def test_live_sends_each_won_deal_once_a_build_sends_nothing_and_digests_compare_versions(tmp_path: Path) -> None:
    source = InMemoryWorkSource()
    source.add_inputs(identity("a"), payloads=[update("d1", "open", "10.40"), update("d1", "won", "10.40")])
    source.add_inputs(identity("b"), payloads=[update("d2", "open", "7"), update("d2", "lost", "7")])
    live = flow_of(tmp_path, "1")
    run(source, live, [])
    assert outbox(live) == [(2, "deal d1 won: 10.40")]

    same, different = flow_of(tmp_path, "2"), RoundedAmounts(deal_alerts.open_database(f"sqlite:///{tmp_path}/3.db"))
    seen: list[tuple[str, bool]] = []
    for version, flow in (("2", same), ("3", different)):
        built = source.build_version(PACK, work_type=WORK_TYPE, version=version)
        assert len(built) == 2 and all(work.build_run for work in built)

        def observed(generation: Generation, flow: deal_alerts.DealAlerts = flow) -> None:
            seen.append((generation.flow_version, generation.live))
            flow(generation)

        run(source, observed, [version])
        assert outbox(flow) == []  # a build causes no side effect
    assert sorted(seen) == [("2", False)] * 2 + [("3", False)] * 2

    keys = {lane: identity(lane).key for lane in ("a", "b")}  # the inputs' identities, as verify passes them
    for through in (1, 2, 3, 4):
        assert {lane: live.digest(key, through) for lane, key in keys.items()} == {
            lane: same.digest(key, through) for lane, key in keys.items()
        }
    differs = {lane for lane, key in keys.items() if different.digest(key, 4) != live.digest(key, 4)}
    assert differs == {"a"}  # 10.40 rounds to 10; lane b's 7 is whole
    assert different.digest(keys["a"], 0) == live.digest(keys["a"], 0)  # nothing at or below ordinal 0


def test_a_flow_offers_a_digest_only_when_it_has_one(tmp_path: Path) -> None:
    def plain(generation: Generation) -> None:
        for _ in generation.inputs:
            pass

    example = flow_of(tmp_path, "1")
    assert isinstance(example, DigestingFlow) and flow_digest(example) == example.digest
    assert flow_digest(plain) is None
