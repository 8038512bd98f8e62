"""``nexuscrm-run``: the whole system on one machine, stopped cleanly with Ctrl-C.

Environment: NEXUSCRM_DSN (default: embedded SQLite at var/nexuscrm.db; set it to a
``mysql://`` URL to run against MariaDB, MySQL or TiDB).
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path

from rich.console import Console
from rich.table import Table

from nexuscrm_integration.launcher import ALL_SERVICES, LaunchError, health_status, start_services, stop_services
from nexuscrm_runtime.config import DEFAULT_DSN, dsn_backend, env_str


def main(argv: list[str] | None = None) -> int:
    """Start the four services, show where they listen, and stop them on Ctrl-C or SIGTERM."""
    parser = argparse.ArgumentParser(prog="nexuscrm-run", description=__doc__)
    parser.add_argument("--workdir", type=Path, default=Path("var/run"), help="logs and port files (default: var/run)")
    args = parser.parse_args(argv)
    console = Console()
    dsn = env_str("NEXUSCRM_DSN", DEFAULT_DSN)
    console.print(f"starting the NexusCRM services on the {dsn_backend(dsn)} database ...")
    try:
        services = start_services(ALL_SERVICES, env={"NEXUSCRM_DSN": dsn}, workdir=args.workdir)
    except LaunchError as error:
        console.print(f"[red]startup failed:[/red] {error}")
        return 1
    table = Table(title="NexusCRM services")
    for column in ("service", "pid", "address", "health", "log"):
        table.add_column(column)
    for service in services:
        status = health_status(service.address, service.spec.service_name)
        table.add_row(service.spec.name, str(service.process.pid), service.address, status, str(service.log_path))
    console.print(table)
    console.print("press Ctrl-C to stop")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    codes = stop_services(services)
    console.print("stopped: " + ", ".join(f"{name} exit {code}" for name, code in codes.items()))
    return 0 if all(code == 0 for code in codes.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
