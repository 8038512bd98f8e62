"""Section "peer": ours end to end against the procrastinate equivalent, side by side in one run.

Both sides get the same walking workload (``bench.lanesum``; 20 000 inputs, quick 3 000) as fast
as they admit it while 4 workers fold per-lane sums: ours through the real services over gRPC
on the run's backend (``bench.endtoend``), the peer on this machine's PostgreSQL
(``bench.peer``), sent by 1, 8 and 32 concurrent clients (quick: 1 and 8), each client of ours
with the SDK's pipelined ingest and its default batches in flight, each of the peer's sending
its batches one after the other. For each client count: alternations run the two sides one
after the other, the order swapped each time (3 alternations, quick 1), and each alternation
gives its own ratio ours / peer; the section reports every ratio and their median, and the
ingest transactions per second and their mean size (ours: admission transactions, read from
Connectors' metrics; the peer: its batches). Then goal 5: each side once more with the ingest
paced to half of its median maximum rate, reporting end-to-end lag p50 / p99 (delivery sent to
its input folded).

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
from nexuscrm_sdk.pipeline import DEFAULT_MAX_IN_FLIGHT

INPUTS = 20_000  # fresh deliveries per run (duplicates come on top)
QUICK_INPUTS = 3_000
ALTERNATIONS = 3
QUICK_ALTERNATIONS = 1
CLIENTS = (1, 8, 32)  # concurrent ingest clients (issue 38: one, 8 and 32)
QUICK_CLIENTS = (1, 8)
LAG_SHARE = 0.5  # of the median maximum rate, for the lag runs
# x the peer's inputs/s: one client (issue 38 goal 1) per backend, several clients (goal 2).
RATE_TARGETS = {("mysql", 1): 1.2, ("sqlite", 1): 2.0}
RATE_TARGET = 2.0
SECTION = "peer"


def _describe(outcome: Outcome) -> str:
    cpu = outcome.cpu_ms_per_input
    return (
        f"{outcome.rate:,.0f} inputs/s ({outcome.inputs} inputs in {outcome.seconds:.1f} s, "
        f"ingest done at {outcome.ingest_seconds:.1f} s), "
        f"{outcome.transactions_per_second:,.0f} ingest transactions/s of {outcome.deliveries_per_transaction:,.0f} "
        f"deliveries, {outcome.executions_per_input:.3f} executions/input, "
        f"{'n/a' if cpu is None else f'{cpu:.2f}'} machine CPU-ms/input; {outcome.correctness()}"
    )


def run(backend: Backend, report: Report, *, quick: bool) -> None:
    """For each client count, alternate peer and ours on ``backend``; report rates, ratios, transactions, lag."""
    server = os.environ.get("NEXUSCRM_BENCH_PG_DSN", peer.DEFAULT_PG_DSN)
    try:
        settings = peer.server_settings(server)
    except psycopg.OperationalError as error:  # no PostgreSQL here: the other sections still run
        report.add(SECTION, backend.name, "skipped", f"PostgreSQL not reachable (NEXUSCRM_BENCH_PG_DSN): {error}")
        return
    note = f"peer database: {settings}"
    if note not in report.notes:
        report.notes.append(note)
    for clients in QUICK_CLIENTS if quick else CLIENTS:
        _compare(backend, report, server, clients=clients, quick=quick)


def _compare(backend: Backend, report: Report, server: str, *, clients: int, quick: bool) -> None:
    inputs = QUICK_INPUTS if quick else INPUTS
    target = RATE_TARGETS.get((backend.name, clients), RATE_TARGET)
    peer_name = f"peer (procrastinate {importlib.metadata.version('procrastinate')}, PostgreSQL)"
    sides: dict[str, Callable[[float], Outcome]] = {
        "peer": lambda rate: peer.run(server, inputs=inputs, rate=rate, clients=clients),
        "ours": lambda rate: endtoend.run(backend, inputs=inputs, rate=rate, clients=clients),
    }
    host = "Integration host, own Connectors" if endtoend.WORKER_CONNECTORS[backend.name] else "Integration host"
    names = {
        "peer": peer_name,
        "ours": f"ours (gRPC, {DEFAULT_MAX_IN_FLIGHT} batches in flight per client, {host}, {backend.name})",
    }
    label = f"{clients} client{'s' if clients > 1 else ''}"
    runs: dict[str, list[Outcome]] = {"peer": [], "ours": []}
    ratios = []
    for alternation in range(1, (QUICK_ALTERNATIONS if quick else ALTERNATIONS) + 1):
        order = ("peer", "ours") if alternation % 2 else ("ours", "peer")
        for side in order:
            outcome = sides[side](0.0)
            runs[side].append(outcome)
            report.add(SECTION, backend.name, f"{label}, alternation {alternation}: {names[side]}", _describe(outcome))
        ratio = runs["ours"][-1].rate / runs["peer"][-1].rate if runs["peer"][-1].rate else 0.0
        ratios.append(ratio)
        report.add(
            SECTION,
            backend.name,
            f"{label}, alternation {alternation} ({' then '.join(order)}): inputs/s ours / peer",
            f"{ratio:.2f}",
            f">= {target} {verdict(ratio >= target)}",
        )
    report.add(
        SECTION,
        backend.name,
        f"{label}: median inputs/s ours / peer ({len(ratios)} alternations)",
        f"**{median(ratios):.2f}** (ours {median(o.rate for o in runs['ours']):,.0f}, "
        f"peer {median(o.rate for o in runs['peer']):,.0f} inputs/s)",
        f">= {target} {verdict(median(ratios) >= target)}",
    )
    report.add(
        SECTION,
        backend.name,
        f"{label}: ingest transactions/s and mean deliveries each, median: ours (admission groups) / peer (batches)",
        " / ".join(
            f"{median(o.transactions_per_second for o in runs[side]):,.0f} of "
            f"{median(o.deliveries_per_transaction for o in runs[side]):,.0f}"
            for side in ("ours", "peer")
        ),
    )
    ours_executions = median(o.executions_per_input for o in runs["ours"])
    peer_executions = median(o.executions_per_input for o in runs["peer"])
    report.add(
        SECTION,
        backend.name,
        f"{label}: executions per input, median: ours Flow executions / peer jobs",
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
            f"{label}: machine CPU-ms per input, median: ours / peer (every process: database, services, client)",
            f"{ours_cpu:.2f} / {peer_cpu:.2f} (ours / peer {ours_cpu / peer_cpu:.2f})",
        )
    every = runs["ours"] + runs["peer"]
    failed = [outcome for outcome in every if outcome.problems]
    report.add(
        SECTION,
        backend.name,
        f"{label}: correctness, every run ({len(every)})",
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
            f"{label}: lag at {LAG_SHARE:.0%} of max: {names[side]}, paced at {LAG_SHARE * delivery_rate:,.0f} "
            "deliveries/s",
            f"{paced.lag()}; reached {paced.rate:,.0f} inputs/s, {paced.executions_per_input:.3f} executions/input; "
            + ("exact" if not paced.problems else paced.correctness()),
        )
