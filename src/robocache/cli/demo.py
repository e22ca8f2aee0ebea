"""``robocache demo``: the whole data path on the bundled sample, in one command.

    $ robocache demo                      # CUDA when available, CPU otherwise
    $ robocache demo --batches 200 --json

Ingests the Franka Panda sample (LeRobot v3.0 layout, streams at 125/100/30 Hz + sparse
language events + an AV1 camera video) into a 50 Hz Lance cache (the video kept as its
packets, the raw camera as JPEG: ``camera_codec="auto"``), serves batches of (history 2, horizon
16) windows, normalized on the device, with camera frames decoded per batch (the video's GOPs on
CPU threads, JPEG by nvJPEG on a GPU) as float32 ``[B, 2, 3, H, W]``, and
prints what it built and the throughput (samples/s and camera frames/s).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import warnings
from pathlib import Path

import typer

from robocache.observability.exporter import (
    LOG_FORMAT_OPTION,
    METRICS_PORT_OPTION,
    PUSHGATEWAY_OPTION,
)


def _serve(loader, batches: int, warm: int = 3) -> tuple[float, int, dict]:
    """Time ``batches`` batches after ``warm`` warm-up ones: (seconds, bytes, last batch)."""
    import torch

    dev = loader.device

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)

    served, nbytes, start, batch = 0, 0, None, {}
    while served < batches + warm:
        before = served
        with warnings.catch_warnings():  # an epoch without a batch is refused below
            warnings.filterwarnings("ignore", "RobotLoader: this epoch has no batch")
            epoch = iter(loader)
        for batch in epoch:
            if served == warm:
                sync()
                start = time.perf_counter()
            if served >= warm:
                nbytes += sum(v.numel() * v.element_size() for v in batch.values())
            served += 1
            if served >= batches + warm:
                break
        if served == before:  # an epoch without a batch: every later one is too
            from robocache.errors import DataError

            raise DataError(f"`batch_size` (--batch-size) {loader.sampler.batch_size} is more "
                            f"than the {loader.sampler.num_samples} samples of the cache: no "
                            "batch fills; pass a smaller --batch-size, e.g. 256.")
    sync()
    return time.perf_counter() - start, nbytes, batch


# the demo's rate (Hz)
RATE = 50.0


def samples_at_most(source: Path, rate: float = RATE) -> int | None:
    """About how many samples (one per aligned step) the demo's cache of the LeRobot
    ``source`` holds at ``rate``: each episode's span of row timestamps x ``rate`` + 1 (the
    grid's end may fall a step short). ``None`` when the source is not at hand."""
    import numpy as np

    from robocache._optional import require

    pq = require("pyarrow.parquet", "data", "Parquet files")
    files = sorted((source / "data").glob("*/*.parquet"))
    if not files:
        return None
    table = pq.read_table(files, columns=["episode_index", "timestamp"])
    episodes = table.column("episode_index").to_numpy()
    t = table.column("timestamp").to_numpy().astype(np.float64)
    order = np.argsort(episodes, kind="stable")
    episodes, t = episodes[order], t[order]
    starts = np.flatnonzero(np.r_[True, episodes[1:] != episodes[:-1]])
    span = np.maximum.reduceat(t, starts) - np.minimum.reduceat(t, starts)
    return int(np.sum(np.floor(span * rate + 1e-6) + 1))


def run_demo(dest: Path, *, batches: int = 100, batch_size: int = 256, device: str | None = None,
             workers: int = 0, rate: float = RATE, progress: bool = True,
             camera_batches: int = 10) -> dict:
    """Ingest the sample, serve ``batches`` batches of its numeric streams and
    ``camera_batches`` batches of its cameras, return the summary."""
    from robocache.data import RobotDataset, RobotLoader
    from robocache.data.cache import build
    from robocache.data.sample import sample_path, write_sample

    source = sample_path()
    if not (source / "meta" / "info.json").exists():  # an installed package: regenerate it
        source = write_sample(dest / "sample")
    manifest = build(source, dest / "cache", rate_hz=rate, device=device, progress=progress)
    if progress:
        from robocache.cli.ingest import print_summary

        print_summary(manifest)
    kinds = {k: s["kind"] for k, s in manifest["streams"].items()}
    cameras = [k for k, kind in kinds.items() if kind in ("image", "video")]
    dataset = RobotDataset(dest / "cache", history=2, horizon=16,
                           keys=[k for k, kind in kinds.items() if kind == "numeric"])
    loader = RobotLoader(dataset, batch_size, device=device, num_workers=workers)
    seconds, nbytes, batch = _serve(loader, batches)
    shapes = {k: list(v.shape) for k, v in batch.items()}
    frames_per_s = 0.0
    if cameras and camera_batches:  # camera frames: video or JPEG, decoded per batch
        views = RobotDataset(dest / "cache", history=2, keys=cameras)
        cam_loader = RobotLoader(views, batch_size, device=device, num_workers=workers,
                                 normalize=None)
        cam_seconds, _, cam_batch = _serve(cam_loader, camera_batches)
        shapes.update({k: list(v.shape) for k, v in cam_batch.items() if k in cameras
                       or k.removesuffix("_is_pad") in cameras})
        frames_per_s = camera_batches * batch_size * 2 * len(cameras) / cam_seconds
    stored = sorted({manifest["streams"][k]["codec"] for k in cameras})
    return {"manifest": manifest, "dataset": dataset.describe(), "device": str(loader.device),
            "camera_codecs": stored,
            "mode": "resident" if loader.resident else f"workers={workers}",
            "batches": batches, "batch_size": batch_size, "shapes": shapes,
            "samples_per_s": batches * batch_size / seconds,
            "camera_frames_per_s": frames_per_s, "camera_batches": camera_batches,
            "MB_per_s": nbytes / seconds / 1e6, "seconds": seconds}


def demo(
    dest: Path = typer.Option(None, help="Where the cache goes (default: a temp directory)."),
    batches: int = typer.Option(100, help="Batches to serve after 3 warm-up batches."),
    camera_batches: int = typer.Option(10, help="Camera batches to serve (0: none)."),
    batch_size: int = typer.Option(256, help="Samples per batch (at most the sample's "
                                   "samples, about 2,300 at 50 Hz)."),
    device: str = typer.Option(None, help="cuda or cpu (default: cuda when available)."),
    workers: int = typer.Option(0, help="DataLoader workers (0 on CUDA: GPU-resident cache)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    metrics_port: int = METRICS_PORT_OPTION,
    pushgateway: str = PUSHGATEWAY_OPTION,
    log_format: str = LOG_FORMAT_OPTION,
):
    """Ingest the bundled sample, build the cache, serve batches, print the throughput.

    Exit codes: 0 success; 2 bad usage or input (one line on stderr: the problem and the fix);
    1 internal error; 130 interrupted (Ctrl-C), 143 terminated (SIGTERM). Without --dest
    nothing is left behind, whatever the outcome.
    """
    from rich.table import Table

    from robocache._console import console as make_console
    from robocache._console import print_table
    from robocache.cli._errors import CommandError, cli_errors
    from robocache.observability import observe

    with cli_errors():
        for flag, value, least, default in (("--batches", batches, 1, 100),
                                            ("--batch-size", batch_size, 1, 256),
                                            ("--camera-batches", camera_batches, 0, 10),
                                            ("--workers", workers, 0, 0)):
            if value < least:  # before the ingest: refused at once, nothing written
                raise CommandError(f"{flag} must be >= {least}; got {value}",
                                   f"pass e.g. {flag} {default}")
        from robocache.data.sample import sample_path

        most = samples_at_most(sample_path())  # None: regenerated, checked as batches come
        if most is not None and batch_size > most:  # no batch would ever fill
            raise CommandError(f"--batch-size {batch_size} is more than the {most} samples of "
                               f"the bundled sample at {RATE:g} Hz",
                               f"pass at most --batch-size {most}, e.g. --batch-size 256")
    temporary = dest is None
    dest = dest or Path(tempfile.mkdtemp(prefix="robocache-demo-"))
    try:
        with cli_errors(), observe("robocache_demo", metrics_port=metrics_port,
                                   pushgateway=pushgateway, log_format=log_format):
            result = run_demo(dest, batches=batches, batch_size=batch_size, device=device,
                              workers=workers, progress=not as_json,
                              camera_batches=camera_batches)
    finally:
        if temporary:  # the cache served its batches; a demo leaves nothing behind
            shutil.rmtree(dest, ignore_errors=True)
    where = "in a temporary directory, now removed (--dest keeps it)" if temporary else \
        f"at {dest / 'cache'}"
    if as_json:
        typer.echo(json.dumps(result, indent=2, default=str))
        return
    console = make_console()
    d = result["dataset"]
    table = Table(title=f"batches on {result['device']} ({result['mode']}): {d['samples']} "
                        f"samples from {d['episodes']} episodes at {d['rate_hz']} Hz")
    table.add_column("key")
    table.add_column("shape", justify="right")
    for k, shape in result["shapes"].items():
        table.add_row(k, str(tuple(shape)))
    print_table(table, console)
    console.print(f"[bold]{result['samples_per_s']:,.0f} samples/s[/], "
                  f"{result['MB_per_s']:,.0f} MB/s over {result['batches']} batches of "
                  f"{result['batch_size']} (history 2, horizon 16, normalized) — cache "
                  f"{where}")
    if result["camera_frames_per_s"]:
        console.print(f"[bold]{result['camera_frames_per_s']:,.0f} camera frames/s[/] decoded "
                      f"and served over {result['camera_batches']} batches of "
                      f"{result['batch_size']} x 2 frames per camera "
                      f"({' and '.join(result['camera_codecs'])} in the cache)")
