"""``robocache ingest``: build a training cache (aligned to one rate, Lance, stats, manifest).

    $ robocache ingest data/sample/panda_multirate /tmp/panda.cache --rate 50
    $ robocache ingest pusht.zarr /tmp/pusht.cache --rate 10 --fps 10 --json
    $ robocache ingest SRC /shared/part-3 --shard 3/8     # one of 8 independent jobs

Re-running resumes: episodes already in the cache are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from robocache.cli._errors import VERBOSE_OPTION_HELP, cli_errors, exit_code

# Arguments shared by the commands that build a cache (`ingest`, `preprocess`, `merge`).
SourceArg = Annotated[Path, typer.Argument(help="Dataset: LeRobot dir, zarr ReplayBuffer, HDF5, "
                                                "RLDS/TFDS folder.")]
DestArg = Annotated[Path, typer.Argument(help="Cache directory (created or resumed).")]
RateOpt = Annotated[float, typer.Option("--rate", help="Target rate in Hz.")]
KeysOpt = Annotated[list[str], typer.Option("--key", help="Stream to cache (repeat; default all).")]
FpsOpt = Annotated[float, typer.Option(help="Rate of sources without timestamps (zarr, HDF5, "
                                             "RLDS).")]
SplitOpt = Annotated[str, typer.Option(help="RLDS split: train, val, train[:95%], "
                                            "train[:10]+val.")]
ToleranceOpt = Annotated[float, typer.Option(help="Pad steps farther than this (s) from a sample.")]
ShardOpt = Annotated[str, typer.Option(help="Cache only shard i/n of the episodes (e.g. 0/4); "
                                            "`robocache merge` joins the shards.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the manifest as JSON.")]
ProgressOpt = Annotated[bool, typer.Option(help="Show a progress bar.")]
OverwriteOpt = Annotated[bool, typer.Option(
    help="Delete the RoboCache cache at DEST first (says what it removes; a directory that is "
         "not a cache is never deleted).")]
RetryOpt = Annotated[bool, typer.Option(
    "--retry-quarantined", help="Read again the episodes an earlier run quarantined.")]
WaitOpt = Annotated[bool, typer.Option(
    "--wait", help="If another process is writing DEST, wait for it to finish.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", help=VERBOSE_OPTION_HELP)]


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


def run(job: Callable[..., dict], *, as_json: bool, progress: bool, verbose: bool,
        **kwargs) -> None:
    """Run a cache job; print its manifest (``--json``) or summary; exit with the shared codes
    (bad input: one line on stderr)."""
    with cli_errors(verbose):
        manifest = job(progress=progress and not as_json, **kwargs)
    if as_json:
        typer.echo(json.dumps(manifest, indent=2))
    else:
        print_summary(manifest)
    raise typer.Exit(exit_code(manifest["counts"]))


def source_options(**options) -> dict:
    """The reader options given on the command line (unset ones left to the reader)."""
    return {k: v for k, v in options.items() if v is not None}


def config_kwargs(rate, keys, fps, split, tolerance, shard, overwrite, retry_quarantined,
                  wait) -> dict:
    """The keyword arguments of ``build`` (and ``preprocess``) the shared flags set."""
    return {"rate_hz": rate, "keys": keys or None, "tolerance_s": tolerance,
            "source_options": source_options(fps=fps, split=split), "overwrite": overwrite,
            "retry_quarantined": retry_quarantined, "wait": wait, "shard": shard,
            "log": lambda msg: typer.echo(msg, err=True)}


def ingest(
    source: SourceArg,
    dest: DestArg,
    rate: RateOpt = 50.0,
    device: Annotated[str, typer.Option(help="cuda or cpu (default: cuda when available).")]
    = None,
    keys: KeysOpt = None,
    fps: FpsOpt = None,
    split: SplitOpt = None,
    tolerance: ToleranceOpt = None,
    shard: ShardOpt = None,
    as_json: JsonOpt = False,
    progress: ProgressOpt = True,
    overwrite: OverwriteOpt = False,
    retry_quarantined: RetryOpt = False,
    wait: WaitOpt = False,
    verbose: VerboseOpt = False,
):
    """Align every episode to one rate and write a Lance training cache.

    Exit codes: 0 all cached; 3 completed with quarantined episodes; 4 nothing cached;
    2 bad usage or input (one line on stderr: the problem and the fix);
    1 internal error (--verbose shows the traceback).
    """
    from robocache.data.cache import build

    run(build, as_json=as_json, progress=progress, verbose=verbose, source=source, dest=dest,
        device=device, **config_kwargs(rate, keys, fps, split, tolerance, shard, overwrite,
                                       retry_quarantined, wait))
