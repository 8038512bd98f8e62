"""Sections 6 and 7: seconds and peak RSS of streaming reads, each measured in a fresh subprocess.

``python -m bench.probes audit DSN PACK`` runs the Controlplane cutover audit of a pack;
``python -m bench.probes load DSN PACK`` claims the pack's one generation and streams all of
its inputs through ``Connectors.load_inputs`` as a worker does. Each prints one JSON line:
seconds and ``ru_maxrss`` (the process's peak resident set, KiB on Linux).
"""

from __future__ import annotations

import datetime as dt
import json
import resource
import subprocess
import sys
import time

from rich.progress import Progress

from bench import seed
from bench.environment import Backend, Report, scratch_database, verdict
from nexuscrm_runtime.database import create_engine
from tests.support.factories import install_pack

AUDIT_TARGET_MB = 200
LOAD_TARGET_MB = 150
LOAD_INPUTS = 100_000  # inputs of the generation LoadInputs streams
IDENTITIES = 400


def _probe(kind: str, dsn: str, pack: str) -> dict[str, float]:
    output = subprocess.run(
        [sys.executable, "-m", "bench.probes", kind, dsn, pack], check=True, capture_output=True, text=True
    ).stdout
    result: dict[str, float] = json.loads(output.strip().splitlines()[-1])
    return result


def run_audit(backend: Backend, report: Report, *, quick: bool) -> None:
    """The cutover audit over 10^6 (quick: 10^4) retained legacy Events."""
    events = 10**4 if quick else 10**6
    with scratch_database(backend) as dsn:
        engine = create_engine(dsn)
        try:
            pack = install_pack(engine, legacy_max_ordinal=None)
            with Progress(transient=True) as progress:
                task = progress.add_task(f"legacy history on {backend.name}", total=events)
                seed.load_history(
                    engine, pack, events, IDENTITIES, legacy=True, progress=lambda n: progress.update(task, completed=n)
                )
        finally:
            engine.dispose()
        result = _probe("audit", dsn, pack)
    what = f"cutover audit over {events:.0e} legacy Events"
    _add_peak(report, "6 audit", backend, what, result, f"{result['events']:.0f} Events audited", AUDIT_TARGET_MB)


def run_load_inputs(backend: Backend, report: Report, *, quick: bool) -> None:
    """LoadInputs of one 100 000-input generation in a worker process (same size in both modes)."""
    with scratch_database(backend) as dsn:
        engine = create_engine(dsn)
        try:
            pack = install_pack(engine)
            seed.load_history(engine, pack, 10**3, IDENTITIES)  # the identity has retained history too
            seed.load_generation(engine, pack, LOAD_INPUTS)
        finally:
            engine.dispose()
        result = _probe("load", dsn, pack)
    what = f"LoadInputs of one {LOAD_INPUTS:,}-input generation ({seed.PAYLOAD_BYTES} B payloads)"
    _add_peak(report, "7 LoadInputs", backend, what, result, f"{result['inputs']:.0f} inputs", LOAD_TARGET_MB)


def _add_peak(
    report: Report, section: str, backend: Backend, what: str, result: dict[str, float], counted: str, target_mb: int
) -> None:
    """One row of a probe's seconds and peak RSS against ``target_mb``; ``counted`` says what it processed."""
    peak = result["maxrss_kib"] / 1024
    report.add(
        section,
        backend.name,
        what,
        f"{result['seconds']:.1f} s, peak RSS {peak:.0f} MB ({counted})",
        f"< {target_mb} MB {verdict(peak < target_mb)}",
    )


def _audit(dsn: str, pack: str) -> dict[str, float]:
    # Imported here: each probe process loads only what its own measurement needs.
    from nexuscrm_controlplane.audit import audit_responsibility

    engine = create_engine(dsn)
    with engine.connect() as connection:
        report = audit_responsibility(connection, pack, 0)
    return {"events": report.events_audited}


def _load(dsn: str, pack: str) -> dict[str, float]:
    from nexuscrm_connectors.facade import Connectors

    connectors = Connectors(create_engine(dsn))
    (claim,) = connectors.claim("probe", pack_install_ids=[pack], lease=dt.timedelta(seconds=3600))
    inputs = sum(len(page.inputs) for page in connectors.load_inputs(claim.work.work_id, lease_token=claim.lease_token))
    return {"inputs": inputs}


def main(argv: list[str]) -> None:
    """Run one probe and print its JSON line."""
    kind, dsn, pack = argv
    started = time.perf_counter()
    result = (_audit if kind == "audit" else _load)(dsn, pack)
    result["seconds"] = time.perf_counter() - started
    result["maxrss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1:])
