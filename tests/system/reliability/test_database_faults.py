"""Database faults under a running Connectors process: killed connections, resets, blackholes, outages.

Each operation (ingest, claim, complete) is held mid-transaction on a row lock taken by an
admin connection, the fault strikes the service's blocked connection, then the lock is
released. The caller must get a retryable status (UNAVAILABLE or ABORTED), the work must not
be done, and retrying the very same request (same receipt, same lease token) must do it:
without restarting the service. An outage (every connection reset, new ones refused, as
during a database restart) ends the same way.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest
import sqlalchemy as sa

from nexuscrm_schema.tables import Event, PackInstall, WorkItem
from nexuscrm_sdk.client import ConnectorsClient
from tests.connectors.reliability.history import RETRYABLE_CODES
from tests.support.factories import delivery, install_pack
from tests.support.invariants import assert_invariants
from tests.support.waiting import wait_until
from tests.system.reliability.conftest import CALL_TIMEOUT, ProxiedConnectors, StartProxied, record_figures
from workqueue import WorkStatus
from workqueue.values import Outcome

pytestmark = [
    pytest.mark.database,
    pytest.mark.acceptance,
    pytest.mark.parametrize("empty_dsn", ["mysql"], indirect=True),
]

QUIET = {"NEXUSCRM_MATERIALIZE_INTERVAL_SECONDS": "0"}  # no background writer racing the checks


@dataclasses.dataclass(kw_only=True)
class Target:
    """An operation to interrupt: the row it blocks on, the call, and whether its work is done."""

    name: str
    locked: sa.Select[Any]
    call: Callable[[ConnectorsClient], Any]
    done: Callable[[sa.Connection], bool]


def targets(cluster: ProxiedConnectors, pack: str) -> list[Target]:
    """Ingest (blocks on the pack row), then claim and complete of its generation (on the WorkItem row)."""
    item = delivery(lane="lane-f")
    holder: dict[str, str] = {}

    def work_id(connection: sa.Connection) -> str:
        return str(
            connection.execute(sa.select(WorkItem.c.WorkId).where(WorkItem.c.PackInstallId == pack)).scalar_one()
        )

    def status(connection: sa.Connection) -> str:
        return str(
            connection.execute(sa.select(WorkItem.c.Status).where(WorkItem.c.PackInstallId == pack)).scalar_one()
        )

    def claim(client: ConnectorsClient) -> None:
        (claimed,) = client.claim("w", pack_install_ids=[pack], lease=dt.timedelta(seconds=300))
        holder["token"] = claimed.lease_token

    def complete(client: ConnectorsClient) -> None:
        with cluster.admin.connect() as connection:
            client.complete(work_id(connection), lease_token=holder["token"])

    work = sa.select(WorkItem).where(WorkItem.c.PackInstallId == pack).with_for_update()
    return [
        Target(
            name="ingest",
            locked=sa.select(PackInstall).where(PackInstall.c.PackInstallId == pack).with_for_update(),
            call=lambda client: client.ingest(pack, items=[item]),
            done=lambda connection: (
                connection.execute(
                    sa.select(sa.func.count()).select_from(Event).where(Event.c.ReceiptKey == item.receipt_key)
                ).scalar_one()
                == 1
            ),
        ),
        Target(name="claim", locked=work, call=claim, done=lambda c: status(c) == WorkStatus.PROCESSING),
        Target(name="complete", locked=work, call=complete, done=lambda c: status(c) == WorkStatus.COMPLETED),
    ]


def interrupt(cluster: ProxiedConnectors, target: Target, fault: str, statuses: Counter[str]) -> None:
    """Run ``target`` held on its row lock, strike its connection with ``fault``, then retry it."""
    with ThreadPoolExecutor(max_workers=1) as pool, cluster.admin.connect() as holder:
        transaction = holder.begin()
        holder.execute(target.locked)

        def call() -> Any:
            with cluster.client() as client:
                return target.call(client)

        pending = pool.submit(call)
        (blocked,) = wait_until(lambda: cluster.service_connection_ids(busy=True), f"{target.name} to block")
        if fault == "kill":
            assert cluster.kill_connection(blocked)
        elif fault == "reset":
            assert cluster.proxy.reset() >= 1
        else:
            cluster.proxy.blackhole(True)
        transaction.rollback()
        error = pending.exception(timeout=CALL_TIMEOUT)
    assert isinstance(error, grpc.RpcError), f"{target.name} under {fault} answered {error!r}, not a retryable status"
    statuses[error.code().name] += 1
    assert error.code() in RETRYABLE_CODES, f"{target.name} under {fault}: {error.code()} {error.details()}"
    cluster.proxy.blackhole(False)  # heal before checking: a blackholed transaction holds its locks
    with cluster.admin.connect() as connection:
        assert not target.done(connection), f"{target.name} under {fault} reported failure but was done"
    with cluster.client() as client:
        target.call(client)  # the same request again: no restart needed
    with cluster.admin.connect() as connection:
        assert target.done(connection), f"the retried {target.name} did not do its work"


@pytest.mark.parametrize("fault", ["kill", "reset", "blackhole"])
def test_a_connection_lost_mid_transaction_is_retryable_and_the_retry_does_the_work(
    start_proxied: StartProxied, fault: str
) -> None:
    cluster = start_proxied(QUIET)
    pack = install_pack(cluster.admin)
    statuses: Counter[str] = Counter()
    pid = cluster.connectors.process.pid
    for target in targets(cluster, pack):
        interrupt(cluster, target, fault, statuses)
    assert cluster.connectors.process.poll() is None and cluster.connectors.process.pid == pid
    record_figures(
        f"database_faults[{fault}]",
        {"operations": 6, "faults": {f"{fault}_mid_transaction": 3}, "statuses": statuses, "violations": 0},
    )
    assert_invariants(cluster.admin)


def test_an_outage_is_unavailable_and_the_service_recovers_without_a_restart(start_proxied: StartProxied) -> None:
    cluster = start_proxied(QUIET)
    pack = install_pack(cluster.admin)
    first, second, third = delivery(lane="a"), delivery(lane="a"), delivery(lane="b")
    with cluster.client() as client:
        assert client.ingest(pack, items=[first])[0].outcome is Outcome.ADMITTED
        cluster.proxy.refuse(True)  # the server is down or restarting: open connections die, new ones fail
        reset = cluster.proxy.reset()
        with pytest.raises(grpc.RpcError) as refused:
            client.ingest(pack, items=[second])
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE, refused.value.details()
        with pytest.raises(grpc.RpcError) as claim_refused:
            client.claim("w", pack_install_ids=[pack])
        assert claim_refused.value.code() is grpc.StatusCode.UNAVAILABLE, claim_refused.value.details()
        cluster.proxy.refuse(False)
        assert client.ingest(pack, items=[second])[0].outcome is Outcome.ADMITTED  # not done before: admitted now
        killed = [cluster.kill_connection(i) for i in cluster.service_connection_ids()]
        # Idle connections killed behind the pool's back are replaced by its pre-ping: no error at all.
        assert client.ingest(pack, items=[third, first])[1].outcome is Outcome.DUPLICATE_COVERED
        assert len(client.claim("w", pack_install_ids=[pack], max_items=2)) == 2
    record_figures(
        "database_faults[outage]",
        {
            "operations": 6,
            "faults": {"outage_connections_reset": reset, "idle_connections_killed": sum(killed)},
            "statuses": {"UNAVAILABLE": 2},
            "violations": 0,
        },
    )
    assert_invariants(cluster.admin)
