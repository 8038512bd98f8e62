"""The TiDB compatibility profile: on a MySQL-protocol server, what TiDB refuses for its size is refused here.

TiDB's limits are 6 MiB per entry and 100 MiB per transaction; the profile takes them as
parameters, so these tests use a few KiB instead of sending 100 MiB to the shared server.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import sqlalchemy as sa

from nexuscrm_runtime.database import create_engine, run_transaction
from nexuscrm_runtime.status import STATUS_CODES
from nexuscrm_runtime.tidb_profile import ProfileLimitExceeded, TidbProfile
from workqueue.errors import ErrorKind

INVARIANTS_NOT_CHECKED = "what the TiDB profile refuses for its size, on scratch rows: no projection scenario"

KIB = 1024
PROBE = sa.Table(
    "ProfileProbe",
    sa.MetaData(),
    sa.Column("x", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("data", sa.LargeBinary),
)


@pytest.fixture
def engine(empty_dsn: str) -> Iterator[sa.Engine]:
    engine = create_engine(empty_dsn, tidb_profile=TidbProfile(entry_bytes=4 * KIB, transaction_bytes=10 * KIB))
    PROBE.create(engine)
    yield engine
    engine.dispose()


def stored(engine: sa.Engine) -> list[int]:
    with engine.connect() as connection:
        return sorted(connection.execute(sa.select(PROBE.c.x)).scalars())


def insert(*sizes: int) -> Callable[[sa.Connection], None]:
    def work(connection: sa.Connection) -> None:
        for x, size in enumerate(sizes):
            connection.execute(sa.insert(PROBE).values(x=x, data=b"d" * size))

    return work


def test_an_entry_above_tidb_s_limit_is_refused_before_it_is_sent(engine: sa.Engine) -> None:
    if engine.dialect.name == "sqlite":
        run_transaction(engine, insert(5 * KIB), name="big")  # the profile is for MySQL-protocol servers only
        assert stored(engine) == [0]
        return
    with pytest.raises(
        ProfileLimitExceeded, match=r"a value of 5120 bytes: a row exceeded TiDB's txn-entry-size-limit"
    ):
        run_transaction(engine, insert(1 * KIB, 5 * KIB), name="big")
    assert stored(engine) == []


def test_a_transaction_above_tidb_s_limit_is_refused_and_nothing_commits(engine: sa.Engine) -> None:
    if engine.dialect.name == "sqlite":
        run_transaction(engine, insert(4 * KIB, 4 * KIB, 4 * KIB), name="large")  # MySQL-protocol servers only
        assert stored(engine) == [0, 1, 2]
        return
    with pytest.raises(
        ProfileLimitExceeded, match="in one transaction: the transaction exceeded TiDB's txn-total-size-limit"
    ) as caught:
        run_transaction(engine, insert(4 * KIB, 4 * KIB, 4 * KIB), name="large")
    assert STATUS_CODES[caught.value.kind] == STATUS_CODES[ErrorKind.RESOURCE_EXHAUSTED]
    assert stored(engine) == []
    # Each transaction counts from zero: the same bytes split in two commit.
    run_transaction(engine, insert(4 * KIB, 4 * KIB), name="first")
    run_transaction(engine, lambda c: c.execute(sa.insert(PROBE).values(x=9, data=b"d" * 4 * KIB)), name="second")
    assert stored(engine) == [0, 1, 9]
