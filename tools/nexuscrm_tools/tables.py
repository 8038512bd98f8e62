"""Tables for people that never cut a value: ids must survive a narrow terminal and a pipe.

Rich fits a table into the console's width (80 columns when piped) by truncating cells with
an ellipsis, which makes a fence or WorkId unusable. Here every column is ``no_wrap`` and the
table is printed at its natural width, wider than the terminal when it must be (the terminal
wraps the line; a pipe gets it whole).
"""

from __future__ import annotations

from collections.abc import Sequence

from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

UNBOUNDED = 1_000_000  # columns: measure a table as if the terminal had no edge


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> Table:
    """A table whose cells never wrap nor shrink (``None`` shows as empty)."""
    result = Table(title=title)
    for column in columns:
        result.add_column(column, no_wrap=True)
    for row in rows:
        result.add_row(*("" if value is None else str(value) for value in row))
    return result


def print_whole(console: Console, renderable: Table) -> None:
    """Print ``renderable`` at its natural width, never narrower than the console."""
    natural = Measurement.get(console, console.options.update_width(UNBOUNDED), renderable).maximum
    wide = Console(
        width=max(console.width, natural),
        height=console.height,  # with a width alone, a dumb terminal (TERM=dumb) falls back to 80x25
        file=console.file,
        force_terminal=console.is_terminal,
        color_system=console.color_system,  # type: ignore[arg-type]
    )
    wide.print(renderable)
