"""Where the command line prints tables: a terminal gets rich's boxed tables at its own width; a
pipe or a log file (CI) gets Markdown tables that never wrap, one row per line."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

# Characters per line when stdout is not a terminal: wide enough that no table wraps.
PIPE_WIDTH = 10_000


def console() -> Console:
    """A console for stdout: the terminal's, or a wide plain one when stdout is not a terminal."""
    c = Console()
    return c if c.is_terminal else Console(width=PIPE_WIDTH, highlight=False)


def print_table(table: Table, out: Console | None = None) -> None:
    """Print `table` on `out` (default: `console()`), as Markdown when that is not a terminal."""
    out = out or console()
    if not out.is_terminal:
        table.box = box.MARKDOWN
        table.caption_justify = "left"
        if table.title:  # its own line: a title is wrapped to the table's width otherwise
            out.print(table.title)
            table.title = None
    out.print(table)
