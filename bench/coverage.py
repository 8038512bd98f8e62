"""Section ``coverage``: the time of one GetCoverage page as the retained history grows (decision 161).

Completed one-input generations and their Events are bulk-inserted (``seed.load_history``),
ten per identity, so the history grows by adding identities while each identity's retained
rows stay the same: a page's time should stay flat. One page of ``PAGE`` identities is read
through the in-process facade (``Connectors.get_coverage``: the RPC without its transport),
the first page and one from the middle of the key order; median of ``READS`` reads after
one warm-up.
"""

from __future__ import annotations

import statistics
import time

from bench import seed
from bench.environment import Backend, Report, scratch_database
from nexuscrm_connectors import page_tokens
from nexuscrm_connectors.facade import Connectors
from nexuscrm_connectors.operating.dead_letters import filter_of
from nexuscrm_runtime.database import create_engine
from tests.support.factories import install_pack, route

PER_IDENTITY = 10  # generations per identity
SIZES = (1_000, 1_000_000)  # quick: 1 000 and 100 000 retained generations
PAGE = 40  # identities per page (the smallest history has 100 identities)
READS = 5


def _page_ms(connectors: Connectors, pack: str, token: str) -> tuple[float, str]:
    """Median milliseconds of one page from ``token`` on, and the next token."""
    wanted = filter_of(pack)
    connectors.get_coverage(pack, wanted, page_size=PAGE, page_token=token)  # warm-up
    times = []
    for _ in range(READS):
        started = time.perf_counter()
        page = connectors.get_coverage(pack, wanted, page_size=PAGE, page_token=token)
        times.append((time.perf_counter() - started) * 1e3)
    assert all(i.tiled for i in page.identities) and len(page.identities) == PAGE
    return statistics.median(times), page.next_page_token


def run(backend: Backend, report: Report, *, quick: bool) -> None:
    """One pack per size: load, then time the first page and a page from the middle of the key order."""
    for size in (SIZES[0], SIZES[1] // 10) if quick else SIZES:
        with scratch_database(backend) as dsn:
            engine = create_engine(dsn)
            try:
                pack = install_pack(engine)
                seed.load_history(engine, pack, size, size // PER_IDENTITY)
                connectors = Connectors(engine)
                first, token = _page_ms(connectors, pack, "")
                middle_key = route(seed.lane(size // PER_IDENTITY // 2)).identity(pack).key
                middle, _ = _page_ms(connectors, pack, page_tokens.encode_token((middle_key,)))
                report.add(
                    "coverage",
                    backend.name,
                    f"one page of {PAGE} identities, {size} retained generations ({PER_IDENTITY} per identity)",
                    f"first page {first:.0f} ms, a middle page {middle:.0f} ms ({middle / PAGE:.2f} ms per identity)",
                )
                assert token
            finally:
                engine.dispose()
