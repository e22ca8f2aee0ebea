"""``robocache ingest``: build a training cache (aligned to one rate, Lance, stats, manifest).

    $ robocache ingest data/sample/panda_multirate /tmp/panda.cache            # native rate
    $ robocache ingest data/sample/panda_multirate /tmp/panda50.cache --rate 50
    $ robocache ingest pusht.zarr /tmp/pusht.cache --rate 10 --fps 10 --json

Re-running resumes: episodes already in the cache are skipped.
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from robocache.cli._errors import VERBOSE_OPTION_HELP, CommandError, cli_errors, exit_code
from robocache.observability.exporter import (
    LOG_FORMAT_OPTION,
    METRICS_PORT_OPTION,
    PUSHGATEWAY_OPTION,
)


def print_summary(manifest: dict) -> None:
    """The ingest summary table (counts reconcile: read = cached + quarantined)."""
    from rich.console import Console
    from rich.table import Table

    c = manifest["counts"]
    table = Table(title=f"{manifest['source']['path']} ({manifest['source']['format']}) → "
                        f"{manifest['rate_hz']} Hz on {manifest['device']}")
    for col in ("read", "cached", "(new)", "(already cached)", "quarantined", "steps",
                "seconds"):
        table.add_column(col, justify="right")
    table.add_row(str(c["read"]), str(c["cached"]), str(c["new"]), str(c["skipped"]),
                  str(c["quarantined"]), str(c["rows"]), f"{manifest['seconds']:.2f}")
    console = Console()
    console.print(table)
    if manifest.get("timing"):
        console.print(f"timing: {manifest['timing']}")
    for q in manifest["quarantined"]:
        console.print(f"[yellow]quarantined[/] episode {q['index']}: {q['reason']}")


def source_options(**options) -> dict:
    """The reader options given on the command line (unset ones left to the reader)."""
    return {k: v for k, v in options.items() if v is not None}


def ingest(
    source: Path = typer.Argument(..., help="Dataset: LeRobot dir, zarr ReplayBuffer, HDF5, "
                                  "RLDS/TFDS folder."),
    dest: Path = typer.Argument(..., help="Cache directory (created or resumed)."),
    rate: str = typer.Option("native", "--rate",
                             help="Target rate in Hz, or 'native': the source's fps, every "
                                  "frame stored exactly."),
    grid_tolerance: float = typer.Option(1e-4, help="Seconds within which a timestamp is on "
                                                    "the 1/rate grid (LeRobot's tolerance_s)."),
    device: str = typer.Option(None, help="cuda or cpu (default: cuda when available)."),
    keys: list[str] = typer.Option(None, "--key", help="Stream to cache (repeat; default all)."),
    fps: float = typer.Option(None, help="Rate of sources without timestamps (zarr, HDF5, "
                              "RLDS)."),
    split: str = typer.Option(None, help="RLDS split: train, val, train[:95%], train[:10]+val."),
    tolerance: float = typer.Option(None, help="Pad steps farther than this (s) from a sample."),
    as_json: bool = typer.Option(False, "--json", help="Print the manifest as JSON."),
    progress: bool = typer.Option(True, help="Show a progress bar."),
    overwrite: bool = typer.Option(
        False, help="Delete the RoboCache cache at DEST first (says what it removes; a directory "
                    "that is not a cache is never deleted)."),
    retry_quarantined: bool = typer.Option(
        False, "--retry-quarantined", help="Read again the episodes an earlier run quarantined."),
    wait: bool = typer.Option(False, "--wait",
                              help="If another process is writing DEST, wait for it to finish."),
    verbose: bool = typer.Option(False, "--verbose", help=VERBOSE_OPTION_HELP),
    metrics_port: int = METRICS_PORT_OPTION,
    pushgateway: str = PUSHGATEWAY_OPTION,
    log_format: str = LOG_FORMAT_OPTION,
):
    """Align every episode to one rate and write a Lance training cache.

    Exit codes: 0 all cached; 3 completed with quarantined episodes; 4 nothing cached;
    2 bad usage or input (one line on stderr: the problem and the fix);
    1 internal error (--verbose shows the traceback).
    """
    from robocache.data.cache import build
    from robocache.observability import observe

    with cli_errors(verbose), observe("robocache_ingest", metrics_port=metrics_port,
                                      pushgateway=pushgateway, log_format=log_format):
        manifest = build(source, dest, rate_hz=_rate(rate), grid_tolerance_s=grid_tolerance,
                         device=device, keys=keys or None,
                         tolerance_s=tolerance, source_options=source_options(fps=fps, split=split),
                         overwrite=overwrite, retry_quarantined=retry_quarantined, wait=wait,
                         progress=progress and not as_json,
                         log=lambda msg: typer.echo(msg, err=True))
    if as_json:
        typer.echo(json.dumps(manifest, indent=2))
    else:
        print_summary(manifest)
    raise typer.Exit(exit_code(manifest["counts"]))


def _rate(rate: str) -> float | str:
    """``--rate``: ``native`` or a number of Hz."""
    if rate == "native":
        return rate
    try:
        return float(rate)
    except ValueError:
        raise CommandError(f"--rate must be a number of Hz or 'native'; got {rate!r}",
                           "pass e.g. --rate 50, or leave it out for the source's own fps"
                           ) from None
