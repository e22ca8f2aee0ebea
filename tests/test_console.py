"""CLI tables stay readable when piped or logged: Markdown, one row per line, never wrapped."""

from __future__ import annotations

import io

from rich.console import Console
from rich.table import Table

from robocache import _console


def _table() -> Table:
    table = Table(title="gate")
    for col in ("family", "case", "status"):
        table.add_column(col)
    table.add_row("resample", "B1024-S1000-T2000-D32-bfloat16-t32-" + "x" * 80, "[red]regressed[/]")
    return table


def test_piped_table_is_markdown_and_unwrapped():
    buf = io.StringIO()
    _console.print_table(_table(), Console(file=buf, width=_console.PIPE_WIDTH))
    rows = [line.rstrip() for line in buf.getvalue().splitlines() if line.startswith("|")]
    assert [c.strip() for c in rows[0].split("|")[1:4]] == ["family", "case", "status"]
    assert rows[1].startswith("|---")
    assert rows[2].endswith("| regressed |") and "x" * 80 in rows[2]


def test_terminal_keeps_boxes():
    buf = io.StringIO()
    _console.print_table(_table(), Console(file=buf, width=60, force_terminal=True))
    assert "┃" in buf.getvalue() or "│" in buf.getvalue()


def test_console_is_wide_when_not_a_terminal():
    assert _console.console().width == _console.PIPE_WIDTH  # pytest captures stdout
