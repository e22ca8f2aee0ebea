"""``robocache report``: render a benchmark results file as a report card.

    $ robocache bench --json results.json && robocache report results.json --out report/

Writes report.md, PNG plots (roofline against the run's measured ceilings, batch-size scaling,
speedup over each alternative) and the numbers behind them as CSV. Needs no GPU.
"""

from __future__ import annotations

from pathlib import Path

import typer


def report(
    results: Path = typer.Argument(..., exists=True, dir_okay=False,
                                   help="A results JSON from `robocache bench --json`."),
    out: Path = typer.Option(None, "--out", help="Output folder (default: <results>-report/)."),
):
    """Render RESULTS.json as Markdown + PNG plots + CSV."""
    from robocache.bench import report as card
    from robocache.bench.compare import load_results

    out = out or results.with_name(results.stem + "-report")
    from robocache.errors import DataError

    try:
        doc = load_results(results)
    except DataError as exc:
        raise typer.BadParameter(str(exc), param_hint="RESULTS") from exc
    written = card.render(doc, out)
    for name, path in written.items():
        typer.echo(f"wrote {path}" if name == "report.md" else f"      {path}")
