"""Reference pages rendered from the tables the code itself uses.

- exit codes: ``nexuscrm_runtime.exit_codes`` (``ExitCode``, ``DESCRIPTIONS``) and which
  command returns which (each command's own tuple, the one its ``--help`` prints);
- metrics: every metric object the services register (``prometheus_client``'s registry after
  importing their metrics modules) and the families their scrape-time collectors yield;
- Connectors' settings: the fields of ``nexuscrm_connectors.settings.Settings``, their
  defaults and the docstring entry naming each one's variable.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator

import sqlalchemy as sa
from prometheus_client import Metric
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

import nexuscrm_connectors.metrics
import nexuscrm_runtime.database
import nexuscrm_runtime.metrics
from nexuscrm_connectors.context import Context
from nexuscrm_connectors.operating.flow_version_gauges import FlowVersionCollector
from nexuscrm_connectors.settings import Settings
from nexuscrm_controlplane.dashboard.collector import QueueCollector
from nexuscrm_controlplane.runbook import COMMAND_EXIT_CODES as RUNBOOK_EXIT_CODES
from nexuscrm_integration.host import HostStatus
from nexuscrm_integration.metrics import WorkerClockCollector
from nexuscrm_runtime.exit_codes import DESCRIPTIONS, ExitCode
from nexuscrm_schema.tables import metadata
from nexuscrm_schema_catalog.command import EXIT_CODES as SCHEMA_EXIT_CODES
from nexuscrm_schema_catalog.command import PROG as SCHEMA_PROG
from nexuscrm_tools.exits import COMMAND_EXIT_CODES as TOOLS_EXIT_CODES

# Where each metric is defined: the modules whose objects the registry holds, and the collectors.
METRIC_MODULES = {
    "every service": nexuscrm_runtime.metrics,
    "every service (retried transactions)": nexuscrm_runtime.database,
    "Connectors": nexuscrm_connectors.metrics,
}


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def command_exit_codes() -> dict[str, tuple[ExitCode, ...]]:
    """Every operator command and the codes it returns."""
    return {**TOOLS_EXIT_CODES, SCHEMA_PROG: tuple(SCHEMA_EXIT_CODES), **RUNBOOK_EXIT_CODES}


def render_exit_codes() -> str:
    """The exit-code page: one row per code, with the commands that return it."""
    commands = command_exit_codes()
    lines = [
        "# Exit codes",
        "",
        "Every operator command takes its exit codes from one table, `nexuscrm_runtime/exit_codes.py`",
        "(decisions 102 and 145); each command's `--help` lists the codes it returns. Generated at build",
        "time from that table (`docs/hooks/tables_reference.py`).",
        "",
        "| code | name | meaning | returned by |",
        "|---|---|---|---|",
    ]
    for code in ExitCode:
        by = ", ".join(f"`{name}`" for name, codes in commands.items() if code in codes)
        lines.append(f"| {code.value} | `{code.name}` | {_cell(DESCRIPTIONS[code])} | {by} |")
    return "\n".join(lines) + "\n"


@dataclasses.dataclass(frozen=True)
class MetricRow:
    """One metric as a scrape shows it: name, type, label names and help text."""

    name: str
    type: str
    labels: tuple[str, ...]
    documentation: str


def _row(metric: Metric, labels: Iterable[str]) -> MetricRow:
    name = f"{metric.name}_total" if metric.type == "counter" else metric.name
    return MetricRow(name, metric.type, tuple(labels), metric.documentation)


def _module_metrics(module: object) -> list[MetricRow]:
    rows = [
        _row(metric, value._labelnames)
        for value in vars(module).values()
        if isinstance(value, MetricWrapperBase)
        for metric in value.describe()
    ]
    return sorted(rows, key=lambda row: row.name)


def _collector_metrics(collector: Collector) -> list[MetricRow]:
    rows = [_row(metric, getattr(metric, "_labelnames", ())) for metric in collector.collect()]
    return sorted(rows, key=lambda row: row.name)


def _empty_database() -> sa.Engine:
    engine = sa.create_engine("sqlite://")
    metadata.create_all(engine)
    return engine


def metric_sections() -> Iterator[tuple[str, list[MetricRow]]]:
    """(where, metrics) for every metric the services expose."""
    for where, module in METRIC_MODULES.items():
        yield f"{where} (`{module.__name__}`)", _module_metrics(module)
    yield (
        "Connectors, each Flow version read from the database at scrape time "
        "(`nexuscrm_connectors.operating.flow_version_gauges`)",
        _collector_metrics(FlowVersionCollector(Context.of(_empty_database()))),
    )
    yield (
        "Controlplane, read from the database at scrape time (`nexuscrm_controlplane.dashboard.collector`)",
        _collector_metrics(QueueCollector(_empty_database())),
    )
    yield (
        "the Integration host, read from its workers at scrape time (`nexuscrm_integration.metrics`)",
        _collector_metrics(WorkerClockCollector(HostStatus(()))),
    )


def render_metrics() -> str:
    """The metrics page: each metric's name, type, labels and help text, as the code declares them."""
    lines = [
        "# Metrics",
        "",
        "Every Prometheus metric the services expose, generated at build time from the metric",
        "objects and collectors the code registers (`docs/hooks/tables_reference.py`). Label values",
        "are bounded: never a WorkId or a ReceiptKey.",
        "How to serve and read them, alert rules, traces and logs: [Observability](../observability.md).",
        "",
    ]
    for where, metrics in metric_sections():
        lines += [f"## {where[0].upper()}{where[1:]}", "", "| metric | type | labels | meaning |", "|---|---|---|---|"]
        for row in metrics:
            labels = ", ".join(f"`{label}`" for label in row.labels)
            lines.append(f"| `{row.name}` | {row.type} | {labels} | {_cell(row.documentation)} |")
        lines.append("")
    return "\n".join(lines) + "\n"


def settings_entries() -> dict[str, str]:
    """Each ``Settings`` field's entry of the class docstring (``max_attempts`` -> its sentence)."""
    entries: dict[str, str] = {}
    text = " ".join((Settings.__doc__ or "").split())
    for match in re.finditer(r"((?:``\w+``(?: / )?)+): (.*?)(?= ``\w+``(?: / ``\w+``)*: |$)", text):
        for name in re.findall(r"``(\w+)``", match.group(1)):
            entries[name] = match.group(2).strip()
    return entries


def render_settings_table() -> str:
    """Connectors' settings: variable, meaning (the docstring's entry) and default (the field's)."""
    entries = settings_entries()
    defaults = Settings()
    lines = ["| variable | meaning | default |", "|---|---|---|"]
    for field in dataclasses.fields(Settings):
        meaning = entries.get(field.name, "")
        lines.append(f"| `NEXUSCRM_{field.name.upper()}` | {_cell(meaning)} | `{getattr(defaults, field.name)}` |")
    return "\n".join(lines)
