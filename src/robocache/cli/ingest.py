"""``robocache ingest``: build a training cache (aligned to one rate, Lance, stats, manifest).

    $ robocache ingest data/sample/panda_multirate /tmp/panda.cache            # native rate
    $ robocache ingest data/sample/panda_multirate /tmp/panda50.cache --rate 50
    $ robocache ingest pusht.zarr /tmp/pusht.cache --rate 10 --fps 10 --json
    $ robocache ingest SRC /shared/part-3 --shard 3/8     # one of 8 independent jobs
    $ robocache ingest lerobot/aloha /tmp/aloha.cache --decode-workers 8 --video-decoder pyav
    $ robocache ingest bags/ /tmp/bags.cache --rate 50 --task-topic /task --exclude-topic /tf

Re-running resumes: episodes already in the cache are skipped; episodes whose source data
changed since they were cached are refused (naming them) or, with --rebuild-changed, rebuilt.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from robocache.cli._errors import (
    VERBOSE_OPTION_HELP,
    CommandError,
    cache_argument,
    cli_errors,
    exit_code,
    storage_option_flag,
    storage_options,
)
from robocache.observability.exporter import (
    LOG_FORMAT_OPTION,
    METRICS_PORT_OPTION,
    PUSHGATEWAY_OPTION,
)

# Arguments shared by the commands that build a cache (`ingest`, `preprocess`, `merge`).
SourceArg = Annotated[Path, typer.Argument(help="Dataset: LeRobot dir, zarr ReplayBuffer, HDF5, "
                                                "RLDS/TFDS folder, folder of ROS bags.")]
DestArg = Annotated[str, typer.Argument(
    help="Cache directory (created or resumed), or an object-store URI (s3://bucket/prefix, "
         "gs://, az://): built in --staging, then published there.")]
StagingOpt = Annotated[Path, typer.Option(
    help="DEST is a URI: the local directory the cache is built in before it is published "
         "(default: $ROBOCACHE_HOME/staging/NAME-DIGEST; kept, so a re-run resumes or "
         "extends it).")]
RateOpt = Annotated[str, typer.Option("--rate", help="Target rate in Hz, or 'native': the "
                                                   "source's fps, every frame stored exactly.")]
GridToleranceOpt = Annotated[float, typer.Option(
    help="Seconds within which a timestamp is on the 1/rate grid (LeRobot's tolerance_s; > 0 "
         "and below half the grid's period).")]
KeysOpt = Annotated[list[str], typer.Option("--key", help="Stream to cache (repeat; default all).")]
FpsOpt = Annotated[float, typer.Option(help="Rate of sources without timestamps (zarr, HDF5, "
                                             "RLDS), in [0.001, 100000] Hz.")]
SplitOpt = Annotated[str, typer.Option(help="RLDS split: train, val, train[:95%], "
                                            "train[:10]+val.")]
TopicOpt = Annotated[list[str], typer.Option(
    "--topic", help="ROS bags: read only this topic (repeat; default every mapped topic).")]
ExcludeTopicOpt = Annotated[list[str], typer.Option(
    "--exclude-topic", help="ROS bags: never read this topic (repeat).")]
TaskTopicOpt = Annotated[str, typer.Option(
    help="ROS bags: the std_msgs/String topic that holds each episode's task.")]
LogTimeOpt = Annotated[bool, typer.Option(
    "--log-time", help="ROS bags: time every message by its log time, not header.stamp.")]
AllowTruncatedOpt = Annotated[bool, typer.Option(
    "--allow-truncated", help="MCAP bags: keep a truncated bag's messages up to its last "
                              "complete chunk instead of quarantining it.")]
TfChainOpt = Annotated[list[str], typer.Option(
    "--tf-chain", help="ROS bags: also compose the TF pose of TARGET in SOURCE's frame over "
                       "time, as stream tf.SOURCE.TARGET.* (SOURCE:TARGET, e.g. "
                       "base_link:tool0; repeat).")]
ToleranceOpt = Annotated[float, typer.Option(help="Camera (frame-index) streams: pad steps "
                                                 "farther than this (s, >= 0) from every frame "
                                                 "(default: never). Part of the cache's "
                                                 "identity: a resume must pass the same.")]
ShardOpt = Annotated[str, typer.Option(help="Cache only shard i/n of the episodes (e.g. 0/4); "
                                            "`robocache merge` joins the shards.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the manifest as JSON.")]
ProgressOpt = Annotated[bool, typer.Option(help="Show a progress bar.")]
OverwriteOpt = Annotated[bool, typer.Option(
    help="Delete the RoboCache cache at DEST first: only the files and tables its manifest "
         "says it owns (says what it removes; other files stay; a directory that is not a "
         "cache is never touched).")]
RetryOpt = Annotated[bool, typer.Option(
    "--retry-quarantined", help="Read again the episodes an earlier run quarantined.")]
RebuildOpt = Annotated[bool, typer.Option(
    "--rebuild-changed", help="Cache again the cached episodes whose source data changed since "
                              "(by default a re-run refuses, naming them).")]
WaitOpt = Annotated[bool, typer.Option(
    "--wait", help="If another process is writing DEST, wait for it to finish.")]
VerboseOpt = Annotated[bool, typer.Option("--verbose", help=VERBOSE_OPTION_HELP)]
CameraQualityOpt = Annotated[int, typer.Option(
    help="JPEG quality of camera frames (1-100).")]
CameraChromaOpt = Annotated[str, typer.Option(
    help="JPEG chroma subsampling of camera frames: 444 (none; >= 40 dB PSNR of the source's "
         "decode on sharp edges at quality 95), 422 or 420 (smaller, blurs colour edges).")]


def print_summary(manifest: dict) -> None:
    """The ingest summary table (counts reconcile: read = cached + quarantined)."""
    from rich.table import Table

    from robocache._console import console as make_console
    from robocache._console import print_table

    c = manifest["counts"]
    table = Table(title=f"{manifest['source']['path']} ({manifest['source']['format']}) → "
                        f"{manifest['rate_hz']} Hz on {manifest['device']}")
    for col in ("read", "cached", "(new)", "(already cached)", "quarantined", "steps",
                "seconds"):
        table.add_column(col, justify="right")
    table.add_row(str(c["read"]), str(c["cached"]), str(c["new"]), str(c["skipped"]),
                  str(c["quarantined"]), str(c["rows"]), f"{manifest['seconds']:.2f}")
    console = make_console()
    print_table(table, console)
    if manifest.get("timing"):
        console.print(f"timing: {manifest['timing']}")
    for q in manifest["quarantined"]:
        console.print(f"[yellow]quarantined[/] episode {q['index']}: {q['reason']}")


# The flags every cache-building command shares, appended to its own (see `cache_command`).
SHARED = {"keys": (KeysOpt, None), "fps": (FpsOpt, None), "split": (SplitOpt, None),
          "topic": (TopicOpt, None), "exclude_topic": (ExcludeTopicOpt, None),
          "task_topic": (TaskTopicOpt, None), "log_time": (LogTimeOpt, False),
          "allow_truncated": (AllowTruncatedOpt, False), "tf_chain": (TfChainOpt, None),
          "tolerance": (ToleranceOpt, None), "grid_tolerance": (GridToleranceOpt, 1e-4),
          "shard": (ShardOpt, None), "as_json": (JsonOpt, False), "progress": (ProgressOpt, True),
          "overwrite": (OverwriteOpt, False), "retry_quarantined": (RetryOpt, False),
          "rebuild_changed": (RebuildOpt, False),
          "wait": (WaitOpt, False), "verbose": (VerboseOpt, False),
          "staging": (StagingOpt, None), "storage_option": (list[str], storage_option_flag()),
          "metrics_port": (int, METRICS_PORT_OPTION), "pushgateway": (str, PUSHGATEWAY_OPTION),
          "log_format": (str, LOG_FORMAT_OPTION)}


def cache_command(fn: Callable) -> Callable:
    """Give a command (``source, dest, rate`` and its own options, then ``**options``) the
    shared flags of :data:`SHARED`: typer reads them from the signature set here."""
    import inspect
    import typing

    hints = typing.get_type_hints(fn, include_extras=True)
    sig = inspect.signature(fn)
    own = [p.replace(annotation=hints[p.name]) for p in sig.parameters.values()
           if p.kind is not p.VAR_KEYWORD]
    shared = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                annotation=annotation)
              for name, (annotation, default) in SHARED.items()]
    fn.__signature__ = sig.replace(parameters=[*own, *shared])
    fn.__annotations__ = {p.name: p.annotation for p in fn.__signature__.parameters.values()}
    return fn


def source_options(topic=None, exclude_topic=None, task_topic=None, log_time=False,
                   allow_truncated=False, tf_chain=None, **options) -> dict:
    """The reader options given on the command line (unset ones left to the reader); the
    ROS 2 bag flags as :class:`~robocache.data.formats.rosbag.RosbagSource` options.

    Raises:
        DataError: ``--fps`` outside [0.001, 100000] Hz
            (:func:`~robocache.data.build.config.check_fps`).
    """
    if options.get("fps") is not None:  # inspect and view read sources with it too
        from robocache.data.build.config import check_fps

        check_fps(options["fps"])
    options.update(topics=topic or None, exclude_topics=exclude_topic or None,
                   task_topic=task_topic, time_source="log" if log_time else None,
                   allow_truncated=allow_truncated or None, tf_chains=tf_chain or None)
    return {k: v for k, v in options.items() if v is not None}


def run(job: Callable[..., dict], name: str, *, rate, keys, fps, split, topic, exclude_topic,
        task_topic, log_time, allow_truncated, tf_chain, tolerance, grid_tolerance, shard,
        as_json, progress, overwrite, retry_quarantined, wait, verbose, metrics_port, pushgateway,
        log_format, dest, staging, storage_option, **kwargs) -> None:
    """Run a cache job with the shared flags, observed as ``name`` (metrics, pushgateway,
    logs); print its manifest (``--json``) or summary; exit with the shared codes (bad input:
    one line on stderr)."""
    from robocache.observability import observe

    with cli_errors(verbose), observe(name, metrics_port=metrics_port,
                                      pushgateway=pushgateway, log_format=log_format):
        manifest = job(dest=cache_argument(dest), staging=staging,
                       storage_options=storage_options(storage_option),
                       rate_hz=_rate(rate), grid_tolerance_s=grid_tolerance,
                       keys=keys or None, tolerance_s=tolerance,
                       source_options=source_options(
                           fps=fps, split=split, topic=topic, exclude_topic=exclude_topic,
                           task_topic=task_topic, log_time=log_time,
                           allow_truncated=allow_truncated, tf_chain=tf_chain), shard=shard,
                       overwrite=overwrite, retry_quarantined=retry_quarantined, wait=wait,
                       progress=progress and not as_json,
                       log=lambda msg: typer.echo(msg, err=True), **kwargs)
    report(manifest, as_json)


def report(manifest: dict, as_json: bool) -> None:
    """Print the manifest (``--json``) or the summary, and exit with the shared code."""
    if as_json:
        typer.echo(json.dumps(manifest, indent=2))
    else:
        print_summary(manifest)
    raise typer.Exit(exit_code(manifest["counts"]))


@cache_command
def ingest(
    source: SourceArg,
    dest: DestArg,
    rate: RateOpt = "native",
    device: Annotated[str, typer.Option(help="cuda or cpu (default: cuda when available).")]
    = None,
    camera_codec: Annotated[str, typer.Option(
        help="How camera frames are stored. auto (default): a video camera's packets kept as "
             "they are (about the source's bytes, frames exactly its decode), decoded per "
             "batch (NVDEC for H.264/HEVC on a GPU, CPU threads for AV1 or without one; "
             "slower to serve than JPEG); a source's own JPEG/PNG kept; raw frames as JPEG "
             "(--camera-quality). jpeg: every camera decoded once to JPEG, the fastest to "
             "serve (nvJPEG) at many times the bytes. png: lossless. video: as auto, and raw "
             "RGB frames encoded once to H.264. Depth is always png.")]
    = "auto",
    camera_quality: CameraQualityOpt = 95,
    camera_chroma: CameraChromaOpt = "444",
    camera_size: Annotated[str, typer.Option(
        help="Store RGB camera frames resized to HEIGHTxWIDTH (e.g. 224x224; each side at "
             "most 8192; default: the source's size). Each batch then decodes that many "
             "fewer pixels; the frames are no longer the source's (video cameras are then "
             "decoded and stored as JPEG; refused with --camera-codec video).")] = None,
    decode_workers: Annotated[int, typer.Option(
        help="Episodes read, video-decoded and JPEG-encoded at once (default: the machine's "
             "cores): read on threads, videos decoded and encoded in as many worker "
             "processes; from 256 episodes (PyAV), whole episodes in as many processes. At "
             "most 4 per core. The cache is the same whatever the number.")] = None,
    video_decoder: Annotated[str, typer.Option(
        help="Who decodes camera videos: pyav (CPU, as LeRobot's reader), auto (NVDEC for "
             "H.264/HEVC when a CUDA GPU and PyNvVideoCodec are present, else PyAV; from 256 "
             "episodes, every GPU's NVDEC beside the CPU workers, each stream to whichever "
             "is free) or nvdec (every GPU's NVDEC; AV1 and videos NVDEC fails on still go to "
             "PyAV).")] = "pyav",
    **options,
):
    """Align every episode to one rate and write a Lance training cache.

    Exit codes: 0 all cached; 3 completed with quarantined episodes; 4 nothing cached;
    2 bad usage or input (one line on stderr: the problem and the fix);
    1 internal error (--verbose shows the traceback); 130 interrupted (Ctrl-C), 143
    terminated (SIGTERM): re-running resumes.
    """
    from robocache._forkserver import max_workers, start_worker_server

    if decode_workers is None or 1 < decode_workers <= max_workers():
        # the build's worker processes (and, with NVDEC, its GPU lanes) come from a fork
        # server: started before this process imports torch and the readers, its own import
        # of them runs beside that one (a --decode-workers out of range starts nothing: the
        # build refuses it before any work)
        start_worker_server()
    from robocache.data.cache import build

    run(build, "robocache_ingest", source=source, dest=dest, rate=rate, device=device,
        camera_codec=camera_codec, camera_quality=camera_quality,
        camera_chroma=camera_chroma, camera_size=camera_size, decode_workers=decode_workers,
        video_decoder=video_decoder, **options)


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
