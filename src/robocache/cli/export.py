"""``robocache export``: a cache written out as a dataset of another library.

    $ robocache export /tmp/bags.cache /tmp/bags_lerobot --format lerobot
    $ robocache export /tmp/bags.cache /tmp/bags_lerobot --cameras image \\
          --rename joint_states.position=observation.state --rename cmd.data=action
    $ robocache export s3://robot-data/bags.cache /tmp/bags_lerobot \\
          --storage-option aws_region=us-west-2

The cache may be in an object store (``s3://``, ``gs://``, ``az://``; credentials from the
standard environment variables or ``--storage-option``); the dataset is written locally.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from robocache.cli._errors import (
    VERBOSE_OPTION_HELP,
    CommandError,
    cache_argument,
    cli_errors,
    storage_option_flag,
    storage_options,
)

FORMATS = ("lerobot",)


def export(
    cache: Annotated[str, typer.Argument(help="The RoboCache cache to export: a directory "
                                              "or s3://BUCKET/PREFIX (gs://, az://).")],
    out: Annotated[Path, typer.Argument(help="The dataset directory to create (new or "
                                             "empty).")],
    format: Annotated[str, typer.Option("--format", help="lerobot: a LeRobot v3.0 "
                                                         "dataset.")] = "lerobot",
    cameras: Annotated[str, typer.Option(help="RGB cameras as video (mp4 through PyAV) or "
                                              "image (PNG in the parquet).")] = "video",
    rename: Annotated[list[str], typer.Option(
        "--rename", help="STREAM=KEY: the LeRobot key of a stream (repeat; default the "
                         "stream names).")] = None,
    vcodec: Annotated[str, typer.Option(help="Video codec: libsvtav1 (AV1, LeRobot's "
                                             "default), libx264, libx265.")] = "libsvtav1",
    robot_type: Annotated[str, typer.Option(help="info.json's robot_type.")] = None,
    storage_option: list[str] = storage_option_flag(),
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")]
    = False,
    verbose: Annotated[bool, typer.Option("--verbose", help=VERBOSE_OPTION_HELP)] = False,
):
    """Write a cache, at its rate, as a dataset another library loads.

    Quarantined episodes of the cache are not exported (the summary says how many and which);
    the partial folder a killed export to OUT left (.OUT.partial-PID) is removed first.

    Exit codes: 0 written; 2 bad usage or input (one line on stderr: the problem and the fix;
    nothing is written); 1 internal error (--verbose shows the traceback).
    """
    with cli_errors(verbose):
        if format not in FORMATS:
            raise CommandError(f"--format {format!r} is not supported",
                               f"pass one of {', '.join(FORMATS)}")
        pairs = {}
        for item in rename or []:
            old, sep, new = item.partition("=")
            if not (sep and old and new):
                raise CommandError(f"--rename {item!r} is not STREAM=KEY",
                                   "pass e.g. --rename joint_states.position=observation.state")
            pairs[old] = new
        from robocache.data.export import export_lerobot

        summary = export_lerobot(cache_argument(cache), out, cameras=cameras, rename=pairs,
                                 vcodec=vcodec, robot_type=robot_type,
                                 storage_options=storage_options(storage_option))
    for path in summary["cleaned"]:
        typer.echo(f"note: removed {path}, left by an export to {out} that was killed", err=True)
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    typer.echo(f"wrote {summary['out']}: LeRobot v3.0, {summary['episodes']} episodes, "
               f"{summary['frames']} frames at {summary['fps']} Hz; features: "
               f"{', '.join(summary['features'])}")
    for name, q in summary["video_quality"].items():
        typer.echo(f"video {name}: CRF {q['crf']}, every frame >= {q['min_psnr_db']:.1f} dB "
                   "against the cached frame in yuv420p and nearest its own step")
    for name, why in summary["not_exported"].items():
        typer.echo(f"not exported: {name} ({why})")
    if summary["quarantined"]:
        q = summary["quarantined"]
        shown = ", ".join(map(str, q[:20])) + (f" and {len(q) - 20} more" if len(q) > 20 else "")
        typer.echo(f"not exported: {len(q)} quarantined episode{'s' * (len(q) != 1)} of the "
                   f"cache ({shown}; a quarantined episode has no rows, `robocache inspect "
                   "CACHE` says why)")
