"""``robocache audit``: check every episode of a cache and report the ones that look wrong.

    $ robocache audit /data/droid.cache
    $ robocache audit /data/droid.cache --json > audit.json
    $ robocache audit /data/droid.cache --jump 0.3 --idle-s 5 --plot worst/
    $ robocache audit data/sample/panda_multirate          # a source: ingested first

Per episode: timestamp gaps and jitter, streams without samples (padded runs) and cameras
serving stale frames, black, uniform or repeated camera frames, NaN/inf, values beyond
q01/q99 by a margin, jumps, frozen streams, idle stretches, unused grippers, short episodes,
duplicates (identical values) and near-duplicates (signatures within a distance), empty or
placeholder tasks; episodes the build quarantined. Thresholds are the options below
(defaults and units in docs/curation.md). A source dataset is ingested at its own rate into a
temporary cache (``--scratch``), audited, and the cache removed. A cache is only read, in
batches (memory bounded whatever its size); the checks run on the GPU when there is one. The
JSON report (``--json`` or ``--out``) lists every episode with its flags
(:func:`robocache.data.audit.flagged` reads the flagged ones back).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from robocache.cli._errors import (
    EXIT_OK,
    EXIT_QUARANTINED,
    VERBOSE_OPTION_HELP,
    CommandError,
    cache_argument,
    cli_errors,
    storage_option_flag,
    storage_options,
)

#: Exit code of an audit that flagged episodes (as ingest's "completed, some quarantined").
EXIT_FLAGGED = EXIT_QUARANTINED


def _keys(values: list[str] | None) -> list[str] | None:
    if not values:
        return None
    return [k.strip() for v in values for k in v.split(",") if k.strip()]


def audit(
    cache: Annotated[str, typer.Argument(help="A RoboCache cache (a directory or "
                                              "s3://BUCKET/PREFIX, gs://, az://), or a "
                                              "source dataset (ingested into a temporary "
                                              "cache first).")],
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    out: Annotated[Path, typer.Option("--out", help="Also write the JSON report to this "
                                                    "file.")] = None,
    gap_periods: Annotated[float, typer.Option(help="Gap: a step longer than this many "
                                                    "periods (grid, stream or camera).")] = 2.0,
    jitter: Annotated[float, typer.Option(help="Timestamp jitter above this rms fraction of "
                                               "the period.")] = 0.1,
    jump: Annotated[float, typer.Option(help="Jump: one step changing a dimension by more "
                                             "than this fraction of its q01..q99 range.")]
    = 0.5,
    range_margin: Annotated[float, typer.Option(help="Out of range: beyond q01/q99 by more "
                                                     "than this fraction of the range.")] = 0.5,
    frozen_s: Annotated[float, typer.Option(help="Frozen: one value repeated exactly for "
                                                 "longer than this, seconds.")] = 1.0,
    idle_s: Annotated[float, typer.Option(help="Idle: the idle streams still for longer than "
                                               "this, seconds.")] = 3.0,
    idle_tolerance: Annotated[float, typer.Option(help="Still: no dimension moves more than "
                                                       "this fraction of its range a step.")]
    = 1e-3,
    idle_keys: Annotated[list[str], typer.Option("--idle-key", help="A stream that must be "
                                                 "still to be idle (repeat; default "
                                                 "observation.state* and action*).")] = None,
    gripper_keys: Annotated[list[str], typer.Option("--gripper-key", help="A gripper stream, "
                                                    "or STREAM:DIM (repeat; default streams "
                                                    "named *gripper*).")] = None,
    gripper_span: Annotated[float, typer.Option(help="Unused gripper: spans less than this "
                                                     "fraction of its range.")] = 0.05,
    min_steps: Annotated[int, typer.Option(help="Short: fewer steps than this.")] = 16,
    near_duplicate: Annotated[float, typer.Option(help="Near-duplicates: signatures within "
                                                       "this rms distance (range units; 0: "
                                                       "off).")] = 0.01,
    signature_points: Annotated[int, typer.Option(help="Samples of a trajectory signature "
                                                       "(longer episodes: their start).")]
    = 64,
    signature_step_s: Annotated[float, typer.Option(help="Seconds between a signature's "
                                                         "samples.")] = 0.5,
    min_overlap: Annotated[float, typer.Option(help="Near-duplicates share at least this "
                                                    "fraction of the longer signature.")]
    = 0.8,
    max_shift_s: Annotated[float, typer.Option(help="Near-duplicates: a copy cut at its start "
                                                    "by up to this many seconds is found "
                                                    "(0: no shift).")] = 2.0,
    known_tasks: Annotated[Path, typer.Option(help="A file of the known tasks, one a line "
                                                   "(default: any task that is not empty or a "
                                                   "placeholder).")] = None,
    cameras: Annotated[bool, typer.Option("--cameras/--no-cameras", help="Decode every "
                                          "camera frame for the pixel checks (black, "
                                          "uniform, repeated frames).")] = True,
    black_level: Annotated[float, typer.Option(help="Black frame: mean at most this fraction "
                                                    "of full scale.")] = 0.03,
    constant_std: Annotated[float, typer.Option(help="Uniform frame: standard deviation at "
                                                     "most this fraction of full scale.")]
    = 0.01,
    camera_fraction: Annotated[float, typer.Option(help="Flag a camera with more than this "
                                                        "fraction of black (uniform) "
                                                        "frames.")] = 0.1,
    plot: Annotated[Path, typer.Option("--plot", help="Draw the worst flagged episodes' "
                                                      "streams into this folder (PNG).")]
    = None,
    plot_count: Annotated[int, typer.Option(help="--plot: how many episodes.")] = 4,
    fps: Annotated[float, typer.Option(help="A source without timestamps (zarr, HDF5, "
                                            "RLDS): its rate.")] = None,
    split: Annotated[str, typer.Option(help="An RLDS source: the split (train, val, "
                                            "train[:95%]...).")] = None,
    scratch: Annotated[Path, typer.Option(help="A source: where its temporary cache goes "
                                               "(default: the system's temporary folder; "
                                               "removed afterwards).")] = None,
    device: Annotated[str, typer.Option(help="Where the checks run: cuda, cpu (default: "
                                             "cuda when available).")] = None,
    progress: Annotated[bool, typer.Option(help="Show a progress bar (on a terminal).")]
    = True,
    rows: Annotated[int, typer.Option(help="Flagged episodes listed in the table (the "
                                           "worst first; the JSON lists all).")] = 20,
    storage_option: list[str] = storage_option_flag(),
    verbose: Annotated[bool, typer.Option("--verbose", help=VERBOSE_OPTION_HELP)] = False,
):
    """Check every episode of a cache: timing, gaps, NaN/inf, range, jumps, frozen and idle
    stretches, grippers, camera frames, length, duplicates, tasks. The cache is never written.

    Exit codes: 0 no episode flagged; 3 some episodes flagged (the table or report lists
    them); 2 bad usage or input (one line on stderr: the problem and the fix); 1 internal
    error (--verbose shows the traceback); 130 interrupted, 143 terminated.
    """
    from robocache.data.audit import AuditConfig
    from robocache.data.audit import audit as run

    with cli_errors(verbose):
        where = cache_argument(cache)
        source = _is_source(where)
        if not source and (fps is not None or split is not None or scratch is not None):
            raise CommandError("--fps, --split and --scratch are for a source, and "
                               f"{cache} is a cache", "leave them out")
        tasks = None
        if known_tasks is not None:
            tasks = [t.strip() for t in known_tasks.read_text().splitlines() if t.strip()]
        if plot is not None and isinstance(where, Path) and \
                plot.resolve().is_relative_to(where.resolve()):
            raise CommandError(f"--plot {plot} lies inside {where}, which is never written",
                               "draw the pictures elsewhere")
        if plot_count < 1 or rows < 0:
            raise CommandError("--plot-count must be >= 1 and --rows >= 0",
                               "pass e.g. --plot-count 4 --rows 20")
        config = AuditConfig(gap_periods=gap_periods, jitter=jitter, jump=jump,
                             range_margin=range_margin, frozen_s=frozen_s, idle_s=idle_s,
                             idle_tolerance=idle_tolerance, idle_keys=_keys(idle_keys),
                             gripper_keys=_keys(gripper_keys), gripper_span=gripper_span,
                             min_steps=min_steps, near_duplicate=near_duplicate,
                             signature_points=signature_points,
                             signature_step_s=signature_step_s, min_overlap=min_overlap,
                             max_shift_s=max_shift_s,
                             known_tasks=tasks,
                             cameras=cameras, black_level=black_level,
                             constant_std=constant_std, camera_fraction=camera_fraction)
        if device not in (None, "cpu", "cuda") and not str(device).startswith("cuda:"):
            raise CommandError(f"--device must be cpu or cuda; got {device!r}",
                               "pass --device cpu or --device cuda")
        from robocache._console import progress_bar

        with progress_bar(progress, "audit", "steps") as tick:
            if source:
                from robocache.cli.ingest import source_options
                from robocache.data.audit import audit_source

                report = audit_source(where, config, scratch=scratch, device=device,
                                      options=source_options(fps=fps, split=split),
                                      progress=tick)
            else:
                report = run(where, config, storage_options=storage_options(storage_option),
                             device=device, progress=tick)
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(report) + "\n")
        if plot is not None and source:
            raise CommandError("--plot draws a cache's episodes", "ingest the source, then "
                               "audit the cache with --plot")
        if plot is not None:
            report["plots"] = _plot(where, report, plot, plot_count,
                                    storage_options(storage_option))
    if as_json:
        typer.echo(json.dumps(report, indent=1))
    else:
        _print(report, rows)
    raise typer.Exit(EXIT_FLAGGED if report["flagged"] else EXIT_OK)


def _is_source(where) -> bool:
    """Whether ``where`` is a source dataset (a local path that is not a cache)."""
    from robocache.data.cache import is_cache

    return isinstance(where, Path) and where.exists() and not is_cache(where)


def _print(report: dict, rows: int) -> None:
    from rich.table import Table

    from robocache._console import console as make_console
    from robocache._console import print_table
    from robocache.data.audit import score

    console = make_console()
    n, flagged = report["episodes_checked"], report["flagged"]
    what = report["cache"] or f"{report['source']} (ingested for the audit)"
    console.print(f"[bold]{what}[/] (version {report['version']}, "
                  f"{report['rate_hz']:g} Hz): {n} episodes checked on {report['device']}, "
                  f"{flagged} flagged")
    counts = {k: v for k, v in report["counts"].items() if v}
    if counts:
        console.print("flags: " + ", ".join(f"{k} {v}" for k, v in counts.items()))
    bad = sorted((r for r in report["episodes"] if r["flags"]), key=score, reverse=True)
    if not bad or rows == 0:
        return
    table = Table(title=f"flagged episodes (the worst {min(rows, len(bad))} of {len(bad)})")
    for col in ("episode", "steps", "task", "flags", "why"):
        table.add_column(col, justify="right" if col in ("episode", "steps") else "left")
    for r in bad[:rows]:
        table.add_row(str(r["index"]), str(r["rows"]), str(r["task"])[:40],
                      ", ".join(r["flags"]), "; ".join(r["why"].values()))
    print_table(table, console)
    for p in report.get("plots", []):
        console.print(f"plot: {p}")


def _plot(where, report: dict, folder: Path, count: int, options) -> list[str]:
    """Draw the ``count`` worst flagged episodes (their numeric streams against time) into
    ``folder``; return the files written."""
    from robocache._optional import require
    from robocache.data.audit import score
    from robocache.data.location import LANCE, Location

    require("matplotlib", "bench", "audit --plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    bad = sorted((r for r in report["episodes"] if r["flags"] and r["rows"]), key=score,
                 reverse=True)[:count]  # (a quarantined episode has no rows to draw)
    if not bad:
        return []
    location = Location(where, options)
    manifest = location.manifest()
    streams = {n: s for n, s in manifest["streams"].items() if s["kind"] == "numeric"}
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    with LANCE.call():
        table = location.lance("data.lance", report["version"])
        for r in bad:
            cols = [s["column"] for s in streams.values()]
            rows = table.to_table(columns=["step", "timestamp", *cols],
                                  filter=f"episode_index = {int(r['index'])}").to_pydict()
            order = np.argsort(rows["step"])
            t = np.asarray(rows["timestamp"])[order]
            t = t - t[0] if len(t) else t
            fig, axes = plt.subplots(len(streams), 1, figsize=(10, 2.2 * len(streams) + 0.8),
                                     sharex=True, squeeze=False)
            for ax, (name, s) in zip(axes[:, 0], streams.items(), strict=True):
                values = np.asarray([v if v is not None else [np.nan] * s["dim"]
                                     for v in rows[s["column"]]], dtype=np.float64)[order]
                ax.plot(t, values.reshape(len(t), -1), linewidth=1)
                ax.set_ylabel(name, fontsize=8)
                ax.grid(alpha=0.3)
            axes[-1, 0].set_xlabel("seconds")
            why = "\n".join(f"{k}: {v}" for k, v in r["why"].items())
            fig.suptitle(f"episode {r['index']} ({r['rows']} steps): {', '.join(r['flags'])}"
                         f"\n{why}", fontsize=8, x=0.01, ha="left")
            fig.tight_layout()
            path = folder / f"episode-{r['index']}.png"
            fig.savefig(path, dpi=90)
            plt.close(fig)
            written.append(str(path))
    return written
