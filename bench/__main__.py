"""Run the benchmark suite: ``python -m bench [--quick] [--sections 1,2,...,peer] [--backends mysql,sqlite]``.

Writes the run (machine, database settings, every figure and ratio) as Markdown to
``var/bench/<timestamp>.md`` and prints it. The MySQL-protocol server is
``NEXUSCRM_BENCH_DSN`` (default ``mysql://root@127.0.0.1:3306/``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench import admission, coverage, galera, history, probes, retention, retention_load, versions, versus, workers
from bench.environment import DEFAULT_MYSQL_DSN, Backend, Report, database_settings, machine

Section = Callable[[Backend, Report], None]


def sections(quick: bool) -> dict[str, Section]:
    """Every section by number, and "peer", "galera" (1 writer node vs 3), "retention", "coverage" and "versions".

    Each is bound to the mode.
    """
    return {
        "1": lambda backend, report: admission.run(backend, report, quick=quick),
        "2": lambda backend, report: history.run(backend, report, quick=quick),
        "4": lambda backend, report: workers.run_workload(backend, report, quick=quick),
        "5": lambda backend, report: workers.run_claims(backend, report, quick=quick),
        "6": lambda backend, report: probes.run_audit(backend, report, quick=quick),
        "7": lambda backend, report: probes.run_load_inputs(backend, report, quick=quick),
        "peer": lambda backend, report: versus.run(backend, report, quick=quick),
        "galera": lambda backend, report: galera.run(backend, report, quick=quick),
        "retention": lambda backend, report: retention.run(backend, report, quick=quick),
        "retention-load": lambda backend, report: retention_load.run(backend, report, quick=quick),
        "coverage": lambda backend, report: coverage.run(backend, report, quick=quick),
        "versions": lambda backend, report: versions.run(backend, report, quick=quick),
    }


def main(argv: list[str] | None = None) -> int:
    """Parse arguments, run the chosen sections on the chosen backends, write the report."""
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="smaller sizes (history up to 10^5): under 5 minutes")
    parser.add_argument(
        "--sections",
        default="1,2,4,5,6,7,peer,galera,retention",
        help="comma-separated section numbers (and peer, galera, retention, coverage, versions)",
    )
    parser.add_argument("--backends", help="mysql and/or sqlite (default: both; --quick: mysql)")
    parser.add_argument("--output", type=Path, default=Path("var/bench"), help="folder for the Markdown report")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    chosen = sections(args.quick)
    backends = [
        Backend(name=name, server_dsn=os.environ.get("NEXUSCRM_BENCH_DSN", DEFAULT_MYSQL_DSN))
        for name in (args.backends or ("mysql" if args.quick else "mysql,sqlite")).split(",")
    ]
    report = Report()
    header = {"command": "python -m bench " + " ".join(sys.argv[1:] if argv is None else argv), **machine()}
    started = time.monotonic()
    for backend in backends:
        header[f"{backend.name} settings"] = ", ".join(f"{k}={v}" for k, v in database_settings(backend).items())
        for number in args.sections.split(","):
            print(f"== section {number} on {backend.name}", flush=True)
            chosen[number](backend, report)
    header["wall time"] = f"{time.monotonic() - started:.0f} s"
    text = report.markdown(header)
    args.output.mkdir(parents=True, exist_ok=True)
    path = args.output / f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%SZ}{'-quick' if args.quick else ''}.md"
    path.write_text(text)
    print(text)
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
