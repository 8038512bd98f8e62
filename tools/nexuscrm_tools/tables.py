"""Tables for people that never cut a value: ids must survive a narrow terminal and a pipe.

Rich fits a table into the console's width (80 columns when piped) by truncating cells with
an ellipsis, which makes a fence or WorkId unusable. Here every column is ``no_wrap`` and the
table is printed at its natural width, wider than the terminal when it must be (the terminal
wraps the line; a pipe gets it whole). The title is printed on its own line above the table,
whole: Rich would wrap it to the table's width, mid-phrase. An empty listing is one line,
``"<title>: none"`` (``listing``), and counts agree with their noun (``plural``).
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

UNBOUNDED = 1_000_000  # columns: measure a table as if the terminal had no edge


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> Table:
    """A table whose cells never wrap nor shrink (``None`` shows as empty; a ``Text`` as it is, never as markup)."""
    result = Table(title=title)
    for column in columns:
        result.add_column(column, no_wrap=True)
    for row in rows:
        result.add_row(*(value if isinstance(value, Text) else "" if value is None else str(value) for value in row))
    return result


def plural(count: int, noun: str, nouns: str = "") -> str:
    """``"1 problem"``, ``"2 problems"``, ``"0 problems"`` (``nouns`` when the plural is not noun + s)."""
    return f"{count} {noun if count == 1 else nouns or noun + 's'}"


def listing(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> Table | str:
    """A table of ``rows``, or the line ``"<title>: none"`` when there are none."""
    return table(title, columns, rows) if rows else f"{title}: none"


def print_whole(console: Console, renderable: Table) -> None:
    """Print ``renderable``'s title on a line of its own, then the table at its natural width.

    Neither is ever narrower than the console; both are printed whole.
    """
    title = str(renderable.title or "")
    renderable.title = None
    natural = Measurement.get(console, console.options.update_width(UNBOUNDED), renderable).maximum
    wide = Console(
        width=max(console.width, natural, len(title)),
        height=console.height,  # with a width alone, a dumb terminal (TERM=dumb) falls back to 80x25
        file=console.file,
        force_terminal=console.is_terminal,
        color_system=console.color_system,  # type: ignore[arg-type]
    )
    if title:
        wide.print(Text(title, style="italic"), no_wrap=True, crop=False)
    wide.print(renderable)
