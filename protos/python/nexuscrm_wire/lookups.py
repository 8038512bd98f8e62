"""What a lookup of a WorkId or a receipt key says when the text is not what it looked for.

Operators paste ids where they find them: the dashboard's search takes either and
ExplainReceipt (``nexuscrm why``) takes a receipt key. Both say it in these words, so that the
dashboard, Connectors and the command line cannot drift apart (decision 177).
"""

from __future__ import annotations


def nothing_found(text: str, where: str) -> str:
    """The answer when ``text`` is neither a WorkId nor a receipt key in ``where`` ("pack pk-...")."""
    return f"no WorkId or receipt key {text!r} in {where}"


def work_id_not_receipt(work_id: str) -> str:
    """The answer when a receipt key was asked for and ``work_id`` is a WorkId: where to look instead."""
    return (
        f"{work_id!r} is a WorkId, not a receipt key: GetWork describes its generation "
        f"(`nexuscrm work show {work_id}`, or the dashboard's search)"
    )
