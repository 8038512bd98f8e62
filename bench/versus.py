"""Section "peer": ours end to end against the procrastinate equivalent, side by side in one run.

Both sides get the same walking workload (``bench.lanesum``; 20 000 inputs, quick 3 000) as fast
as they admit it while 4 workers fold per-lane sums: ours through the real services over gRPC
on the run's backend (``bench.endtoend``), the peer on this machine's PostgreSQL
(``bench.peer``). Alternations run the two sides one after the other, the order swapped each
time (3 alternations, quick 1), and each alternation gives its own ratio ours / peer; the
section reports every ratio and their median. Then goal 5: each side once more with the ingest
paced to half of its median maximum rate, reporting end-to-end lag p50 / p99 (delivery sent
to its input folded).

PostgreSQL is ``NEXUSCRM_BENCH_PG_DSN`` (default ``postgresql://postgres@127.0.0.1:5432/postgres``);
each peer run creates and drops its own database there.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Callable

import psycopg

from bench import endtoend, peer
from bench.environment import Backend, Report, verdict
from bench.lanesum import Outcome, median

INPUTS = 20_000  # fresh deliveries per run (duplicates come on top)
QUICK_INPUTS = 3_000
ALTERNATIONS = 3
QUICK_ALTERNATIONS = 1
LAG_SHARE = 0.5  # of the median maximum rate, for the lag runs
RATE_TARGET = 2.0  # x the peer's inputs/s (issue 12, goal 1)
SECTION = "peer"


def _describe(outcome: Outcome) -> str:
    cpu = outcome.cpu_ms_per_input
    return (
        f"{outcome.rate:,.0f} inputs/s ({outcome.inputs} inputs in {outcome.seconds:.1f} s, "
        f"ingest done at {outcome.ingest_seconds:.1f} s), "
        f"{outcome.executions_per_input:.3f} executions/input, "
        f"{'n/a' if cpu is None else f'{cpu:.2f}'} machine CPU-ms/input; {outcome.correctness()}"
    )


def run(backend: Backend, report: Report, *, quick: bool) -> None:
    """Alternate peer and ours on ``backend``, report inputs/s, ratios, executions, correctness and lag."""
    inputs = QUICK_INPUTS if quick else INPUTS
    server = os.environ.get("NEXUSCRM_BENCH_PG_DSN", peer.DEFAULT_PG_DSN)
    peer_name = f"peer (procrastinate {importlib.metadata.version('procrastinate')}, PostgreSQL)"
    try:
        settings = peer.server_settings(server)
    except psycopg.OperationalError as error:  # no PostgreSQL here: the other sections still run
        report.add(SECTION, backend.name, "skipped", f"PostgreSQL not reachable (NEXUSCRM_BENCH_PG_DSN): {error}")
        return
    note = f"peer database: {settings}"
    if note not in report.notes:
        report.notes.append(note)
    sides: dict[str, Callable[[float], Outcome]] = {
        "peer": lambda rate: peer.run(server, inputs=inputs, rate=rate),
        "ours": lambda rate: endtoend.run(backend, inputs=inputs, rate=rate),
    }
    host = "Integration host, own Connectors" if endtoend.WORKER_CONNECTORS[backend.name] else "Integration host"
    names = {"peer": peer_name, "ours": f"ours (gRPC, {host}, {backend.name})"}
    runs: dict[str, list[Outcome]] = {"peer": [], "ours": []}
    ratios = []
    for alternation in range(1, (QUICK_ALTERNATIONS if quick else ALTERNATIONS) + 1):
        order = ("peer", "ours") if alternation % 2 else ("ours", "peer")
        for side in order:
            outcome = sides[side](0.0)
            runs[side].append(outcome)
            report.add(SECTION, backend.name, f"alternation {alternation}: {names[side]}", _describe(outcome))
        ratio = runs["ours"][-1].rate / runs["peer"][-1].rate if runs["peer"][-1].rate else 0.0
        ratios.append(ratio)
        report.add(
            SECTION,
            backend.name,
            f"alternation {alternation} ({' then '.join(order)}): inputs/s ours / peer",
            f"{ratio:.2f}",
            f">= {RATE_TARGET} {verdict(ratio >= RATE_TARGET)}",
        )
    report.add(
        SECTION,
        backend.name,
        f"median inputs/s ours / peer ({len(ratios)} alternations)",
        f"**{median(ratios):.2f}** (ours {median(o.rate for o in runs['ours']):,.0f}, "
        f"peer {median(o.rate for o in runs['peer']):,.0f} inputs/s)",
        f">= {RATE_TARGET} {verdict(median(ratios) >= RATE_TARGET)}",
    )
    ours_executions = median(o.executions_per_input for o in runs["ours"])
    peer_executions = median(o.executions_per_input for o in runs["peer"])
    report.add(
        SECTION,
        backend.name,
        "executions per input, median: ours Flow executions / peer jobs",
        f"{ours_executions:.3f} / {peer_executions:.3f} (ours {peer_executions / ours_executions:.1f}x fewer)"
        if ours_executions
        else f"{ours_executions:.3f} / {peer_executions:.3f}",
        f"fewer {verdict(ours_executions < peer_executions)}",
    )
    cpu = {side: [o.cpu_ms_per_input for o in runs[side] if o.cpu_ms_per_input is not None] for side in runs}
    if cpu["ours"] and cpu["peer"]:
        ours_cpu, peer_cpu = median(cpu["ours"]), median(cpu["peer"])
        report.add(
            SECTION,
            backend.name,
            "machine CPU-ms per input, median: ours / peer (every process: database, services, client)",
            f"{ours_cpu:.2f} / {peer_cpu:.2f} (ours / peer {ours_cpu / peer_cpu:.2f})",
        )
    every = runs["ours"] + runs["peer"]
    failed = [outcome for outcome in every if outcome.problems]
    report.add(
        SECTION,
        backend.name,
        f"correctness, every run ({len(every)})",
        "; ".join(f"{o.side}: {o.correctness()}" for o in failed)
        or "exact projection, every delivery admitted once (both sides), invariant checker clean (ours)",
        f"exact {verdict(not failed)}",
    )
    for side in ("ours", "peer"):
        outcomes = runs[side]
        delivery_rate = median(o.deliveries / o.seconds for o in outcomes if o.seconds > 0)
        paced = sides[side](LAG_SHARE * delivery_rate)
        report.add(
            SECTION,
            backend.name,
            f"lag at {LAG_SHARE:.0%} of max: {names[side]}, paced at {LAG_SHARE * delivery_rate:,.0f} deliveries/s",
            f"{paced.lag()}; reached {paced.rate:,.0f} inputs/s, {paced.executions_per_input:.3f} executions/input; "
            + ("exact" if not paced.problems else paced.correctness()),
        )
