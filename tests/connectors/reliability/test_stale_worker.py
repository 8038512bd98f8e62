"""A worker stopped past its lease (SIGSTOP) cannot complete after another attempt took over."""

from __future__ import annotations

import datetime as dt
import signal
import subprocess
import sys
import textwrap

import pytest
import sqlalchemy as sa

from nexuscrm_connectors.facade import Connectors
from nexuscrm_runtime.clock import utcnow
from nexuscrm_schema.tables import WorkItem
from tests.support.factories import delivery, install_pack
from tests.support.invariants import assert_invariants
from tests.support.waiting import wait_until
from workqueue import WorkStatus

pytestmark = [pytest.mark.database, pytest.mark.acceptance]

STALE_WORKER = textwrap.dedent(
    """
    import datetime as dt
    import sys
    from nexuscrm_connectors.facade import Connectors
    from nexuscrm_runtime.database import create_engine
    connectors = Connectors(create_engine(sys.argv[1]))
    claim = connectors.claim("stale", pack_install_ids=[sys.argv[2]], lease=dt.timedelta(seconds=1))[0]
    print(claim.work.work_id, flush=True)
    sys.stdin.readline()  # the test stops this process here, past its lease
    try:
        connectors.complete(claim.work.work_id, lease_token=claim.lease_token)
        print("completed", flush=True)
    except Exception as error:
        print(f"refused: {error}", flush=True)
    """
)


def test_sigstopped_worker_past_its_lease_is_refused(engine: sa.Engine, dsn: str) -> None:
    pack = install_pack(engine)
    connectors = Connectors(engine)
    connectors.ingest(pack, items=[delivery(), delivery()])
    with subprocess.Popen(
        [sys.executable, "-c", STALE_WORKER, dsn, pack], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdout is not None and child.stdin is not None
        work_id = child.stdout.readline().strip()
        child.send_signal(signal.SIGSTOP)

        def lease_expired() -> bool:
            with engine.connect() as connection:
                expires = connection.execute(
                    sa.select(WorkItem.c.LeaseExpiresAt).where(WorkItem.c.WorkId == work_id)
                ).scalar_one()
            return bool(expires < utcnow() - dt.timedelta(milliseconds=50))

        wait_until(lease_expired, "the stopped worker's lease to expire")
        takeover = connectors.claim("fresh", pack_install_ids=[pack], lease=dt.timedelta(seconds=60))
        assert [c.work.work_id for c in takeover] == [work_id] and takeover[0].work.attempt == 1
        child.send_signal(signal.SIGCONT)
        child.stdin.write("go\n")
        child.stdin.flush()
        verdict = child.stdout.readline().strip()
        assert verdict.startswith("refused: lease token is stale"), verdict
        assert child.wait(timeout=30) == 0
    done = connectors.complete(work_id, lease_token=takeover[0].lease_token)
    assert done.status is WorkStatus.COMPLETED and done.lease_owner == "fresh"
    assert_invariants(engine)
