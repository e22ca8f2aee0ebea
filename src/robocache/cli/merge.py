"""``robocache merge``: join shard caches (``--shard i/n`` of ingest or preprocess) into one.

    $ robocache merge /shared/part-0 /shared/part-1 /shared/robot.cache

Statistics are merged from the shards (count, mean, std, min, max exactly). Exit codes are
ingest's (2: a missing or unfinished shard, shards of different builds, an episode twice).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from robocache.cli._errors import (
    CommandError,
    cache_argument,
    cli_errors,
    storage_option_flag,
    storage_options,
)
from robocache.cli.ingest import (
    JsonOpt,
    OverwriteOpt,
    ProgressOpt,
    StagingOpt,
    VerboseOpt,
    WaitOpt,
    report,
)


def merge(
    paths: Annotated[list[str], typer.Argument(
        help="Shard caches, then the merged cache (a directory, or an object-store URI "
             "s3://bucket/prefix: merged in --staging, then published).")],
    as_json: JsonOpt = False,
    progress: ProgressOpt = True,
    overwrite: OverwriteOpt = False,
    wait: WaitOpt = False,
    verbose: VerboseOpt = False,
    staging: StagingOpt = None,
    storage_option: list[str] = storage_option_flag(),
):
    """Join shard caches into one cache with exactly merged statistics."""
    from robocache.distributed.merge import merge as job

    with cli_errors(verbose):
        if len(paths) < 2:
            raise CommandError("merge needs shard caches and a destination",
                               "pass robocache merge SHARD... DEST")
        manifest = job([Path(p) for p in paths[:-1]], cache_argument(paths[-1]),
                       overwrite=overwrite, wait=wait, progress=progress and not as_json,
                       log=lambda msg: typer.echo(msg, err=True), staging=staging,
                       storage_options=storage_options(storage_option))
    report(manifest, as_json)
