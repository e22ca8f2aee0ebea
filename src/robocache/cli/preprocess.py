"""``robocache preprocess``: the cache of ``robocache ingest``, built by Ray Data.

    $ robocache preprocess data/sample/panda_multirate /tmp/panda.cache --rate 50
    $ robocache preprocess /data/droid /shared/droid.cache --address auto --num-gpus 8

Needs the ``ray`` extra (``pip install 'robocache[ray]'``). Without ``--address`` a local Ray
starts on this machine. Re-running resumes, as ``ingest`` does; the exit codes are ingest's.
"""

from __future__ import annotations

from typing import Annotated

import typer

from robocache.cli.ingest import (
    CameraChromaOpt,
    CameraQualityOpt,
    DestArg,
    RateOpt,
    SourceArg,
    cache_command,
    run,
)


@cache_command
def preprocess(
    source: SourceArg,
    dest: DestArg,
    rate: RateOpt = "native",
    address: Annotated[str, typer.Option(help="Ray cluster: auto, host:port or "
                                              "ray://host:10001 (default: a local Ray).")] = None,
    num_gpus: Annotated[int, typer.Option(help="GPUs aligning episodes (default: every GPU of "
                                               "the cluster; 0: CPU actors).")] = None,
    workers: Annotated[int, typer.Option(help="CPU actors when --num-gpus is 0, each reading, "
                                              "aligning and writing (default and most: one "
                                              "per CPU of the cluster).")] = None,
    actors_per_gpu: Annotated[int, typer.Option(help="Actors sharing each GPU, one CPU each "
                                                     "(default 1).")] = None,
    camera_quality: CameraQualityOpt = 95,
    camera_chroma: CameraChromaOpt = "444",
    **options,
):
    """Build the ingest cache with a Ray Data pipeline (local, on a cluster, in a RayJob).

    Exit codes: 0 all cached; 3 completed with quarantined episodes; 4 nothing cached;
    2 bad usage or input (no Ray, no cluster at --address, more GPUs or --workers than the
    cluster has GPUs or CPUs, a bad --shard...: one line on stderr, refused before DEST is
    created); 1 internal error (--verbose shows the traceback);
    130 interrupted (Ctrl-C), 143 terminated (SIGTERM): re-running resumes.
    """
    from robocache.distributed.preprocess import preprocess as job

    run(job, "robocache_preprocess", source=source, dest=dest, rate=rate, address=address,
        num_gpus=num_gpus, workers=workers, actors_per_gpu=actors_per_gpu,
        camera_quality=camera_quality, camera_chroma=camera_chroma, **options)
