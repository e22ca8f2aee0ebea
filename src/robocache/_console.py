"""Where the command line prints tables: a terminal gets rich's boxed tables at its own width; a
pipe or a log file (CI) gets Markdown tables that never wrap, one row per line."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

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


@contextmanager
def progress_bar(enabled: bool, label: str, unit: str
                 ) -> Iterator[Callable[[int, int], None] | None]:
    """A rich progress bar on stderr (a terminal only) as a callback ``(done, total)``, counted
    in ``unit``; None when off or not on a terminal."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

    err = Console(stderr=True)
    if not (enabled and err.is_terminal):
        yield None
        return
    with Progress(TextColumn(label), BarColumn(), TextColumn("{task.completed:,} of "
                  f"{{task.total:,}} {unit}"), TimeRemainingColumn(), console=err,
                  transient=True) as bar:
        task = bar.add_task(label, total=0)
        yield lambda done, total: bar.update(task, completed=done, total=total)
