"""PyMySQL's conversions, with DATETIME and TIMESTAMP values parsed by the standard library.

PyMySQL parses each DATETIME with a regular expression and an ``int`` per part;
``datetime.fromisoformat`` parses the text a MySQL-protocol server sends
(``YYYY-MM-DD HH:MM:SS[.fraction]``) in C, and a claim reads several per input (the figures:
docs/performance.md, "Tuning notes formerly in docs/decisions"). Whatever
``fromisoformat`` refuses (a zero date) goes to PyMySQL's own converter, so every value reads
as it did before.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from pymysql import converters
from pymysql.constants import FIELD_TYPE


def _datetime(text: Any) -> Any:
    try:
        return dt.datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return converters.convert_datetime(text)


# The ``conv`` argument of ``pymysql.connect``: PyMySQL's own table, two decoders replaced.
CONVERSIONS: dict[Any, Any] = {
    **converters.conversions,
    FIELD_TYPE.DATETIME: _datetime,
    FIELD_TYPE.TIMESTAMP: _datetime,
}
