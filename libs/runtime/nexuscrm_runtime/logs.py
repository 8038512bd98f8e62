"""Service logs: plain lines by default, one JSON object per line with ``NEXUSCRM_LOG_FORMAT=json``.

Every record carries the pack and WorkId of the RPC it belongs to (bound by
``workqueue.logcontext.log_context``, which the shared server interceptor calls from the request's
``pack_install_id`` and ``work_id`` fields) and, while tracing is on, the current trace and
span ids. Records never carry a DSN or a payload: the formatter emits only the fields named
here and the formatted message, and no code of ours logs either (``config.dsn_backend`` is
all of a DSN that may reach a log line).
"""

from __future__ import annotations

import datetime as dt
import json
import logging

from opentelemetry import trace

from nexuscrm_runtime.config import ConfigError, env_str
from workqueue.logcontext import bound_context

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
CONTEXT_FIELDS = ("pack", "work_id")


class ContextFilter(logging.Filter):
    """Copies the bound context and the current trace ids onto each record (never drops one)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """Add ``pack``, ``work_id``, ``trace_id`` and ``span_id`` (empty when unknown)."""
        context = bound_context()
        for name in CONTEXT_FIELDS:
            if not getattr(record, name, ""):
                setattr(record, name, context.get(name, ""))
        span = trace.get_current_span().get_span_context()
        record.trace_id = format(span.trace_id, "032x") if span.is_valid else ""
        record.span_id = format(span.span_id, "016x") if span.is_valid else ""
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, context ids and any exception."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as a single JSON line; empty context fields are left out."""
        entry: dict[str, str] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in (*CONTEXT_FIELDS, "trace_id", "span_id"):
            value = getattr(record, name, "")
            if value:
                entry[name] = str(value)
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def configure_logging() -> None:
    """Logs of the services' entry points on stderr, at INFO, in ``NEXUSCRM_LOG_FORMAT`` (text or json)."""
    log_format = env_str("NEXUSCRM_LOG_FORMAT", "text")
    if log_format not in LOG_FORMATS:
        raise ConfigError(f"NEXUSCRM_LOG_FORMAT must be one of {', '.join(LOG_FORMATS)}, got {log_format!r}")
    handler = logging.StreamHandler()
    handler.addFilter(ContextFilter())
    handler.setFormatter(JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
