"""Benchmark cameras: into the cache (encoders, fidelity, the camera path on the cores and on
the GPUs, RLDS pass-through), and out of it (JPEG frames decoded and transformed on the GPU).

    $ robocache bench cameras --json benchmarks/results/cameras.json
    $ python benchmarks/bench_cameras.py --sections cpu,gpu --json cameras-ingest.json
    $ python benchmarks/bench_cameras.py --quick        # CPU smoke run

Sections (``--sections``, all by default; docs/cameras.md has the targets):

- ``encode`` (:func:`encoder_cases`): JPEG encoders at q95 on a 480x640 frame, one thread and
  one thread per core; nvJPEG on the GPU.
- ``fidelity`` (:func:`fidelity_cases`): bytes per frame against PSNR of LeRobot's own decode,
  per chroma and quality, on the committed LeRobot fixture of sharp-edged content.
- ``cpu`` (:func:`cpu_cases`): the camera path (read, PyAV decode, JPEG 4:4:4 q95 encode) of
  480x640 H.264, HEVC and AV1 videos with 1, 2, 4, ... and all cores' worker processes.
- ``gpu`` (:func:`gpu_cases`): the same with NVDEC: nvJPEG encode with 1 and 4 processes per
  GPU, libjpeg-turbo encode on the host beside NVDEC, and NVDEC decode alone; each row sums
  its stages' seconds over the threads (``stage_s``).
- ``node`` (:func:`node_cases`): the node's camera path as a large ingest runs it with
  ``--video-decoder auto`` (a lane per GPU and CPU processes on the cores left), ``nvdec``
  (the lanes alone) and ``pyav`` (a process per core), on the same episodes in one run.
- ``rlds`` (:func:`rlds_cases`): RLDS JPEG cameras passed through, against the raw read, with
  the processes started and the source open before the clock starts.
- ``serve`` (:func:`serve_cases`): the dataset of :func:`make_dataset` (LeRobot v3.0, two 480x640
  H.264 cameras written the way LeRobot records video: PyAV, yuv420p, keyframe every 2 frames,
  CRF 30; shared with ``bench_train_vision``) ingested whole at the defaults (``ingest``, and
  ``ingest-nvdec`` with a GPU and PyNvVideoCodec), then served.

Serving cases, batch 256 samples x 2 cameras x 2 frames (history 2) = 1024 frames a batch:

- ``robocache``: ``RobotDataset(..., image_size=(224, 224), image_transforms=random crop
  (side 0.8-1.0) + colour jitter (brightness, contrast, saturation, hue))`` resident on the GPU,
  ``fetch`` end to end (index gather, one nvJPEG batch decode of both cameras' distinct
  frames, fused transform kernel) -> float32 ``[256, 2, 3, 224, 224]`` per camera; wall
  clock, one sync per batch.
- ``nvjpeg-decode``: ``torchvision.io.decode_jpeg(list, device="cuda")`` alone on the same
  batches' JPEG bytes, each camera's distinct frames in one call, as the dataset decodes them
  (a frame that overlapping windows share is decoded once): the ceiling the end-to-end case
  is held to. Both count the 1024 frames a batch serves.
- ``transform``: the fused kernel alone on 1024 decoded frames (CUDA events).
- ``cpu-loader-w<N>`` / ``robocache-b64``: batch 64. A ``DataLoader`` with N workers doing what
  LeRobot's loader does per sample (PyAV: seek the mp4 to the keyframe before the first
  timestamp, decode to the last, pick the 2 frames, float32 [0, 1]; two cameras), then
  ``.to("cuda")``; against RoboCache at the same batch size.

Peak GPU memory of one ``robocache`` batch is recorded (``peak_MB``).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from robocache.bench import harness as H
from robocache.bench.standalone import main

FAMILY = "cameras"
CAMS = ("observation.images.left", "observation.images.right")
FPS, HISTORY, OUT = 30.0, 2, (224, 224)
FULL = {"hw": (480, 640), "episodes": 16, "length": 48, "batch": 256, "batches": 20,
        "repeats": 5, "workers": (8, 15), "small_batch": 64,
        "codecs": ("h264", "hevc", "av1"), "counts": None, "per_worker": 4,
        "clip_length": 120, "gpu_episodes": 60, "gpu_streams": 8, "gpu_start_s": 15.0,
        "node_rounds": 3, "encode_frames": 50, "rlds_episodes": 512, "rlds_camera": 256}
QUICK = {"hw": (48, 64), "episodes": 3, "length": 12, "batch": 8, "batches": 2,
         "repeats": 2, "workers": (0,), "small_batch": 4,
         "codecs": ("h264",), "counts": (1, 2), "per_worker": 2, "clip_length": 12,
         "gpu_episodes": 2, "gpu_streams": 2, "gpu_start_s": 20.0, "node_rounds": 1,
         "encode_frames": 5,
         "rlds_episodes": 4, "rlds_camera": 16}
SECTIONS = ("encode", "fidelity", "cpu", "gpu", "node", "rlds", "serve")


def _frames(rng: np.random.Generator, n: int, hw: tuple[int, int], cam: int) -> np.ndarray:
    """A textured scene with a moving object: JPEG sizes like a real camera's (sensor noise
    from a bank of 8 fields, cycled: a frame's noise differs from its neighbours')."""
    h, w = hw
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack([128 + 60 * np.sin(x / 23 + cam), 128 + 60 * np.cos(y / 17),
                     100 + 50 * np.sin((x + y) / 31)], -1)
    noise = rng.normal(0, 6, (min(n, 8), h, w, 3)).astype(np.float32)
    out = np.empty((n, h, w, 3), np.uint8)
    for i in range(n):
        img = base + noise[i % len(noise)]
        cy, cx = int(h * (0.2 + 0.6 * i / n)), int(w * (0.7 - 0.5 * i / n))
        img[max(cy - h // 10, 0):cy + h // 10, max(cx - w // 10, 0):cx + w // 10] = (200, 60, 40)
        out[i] = img.clip(0, 255)
    return out


def make_dataset(root: Path, episodes: int, length: int, hw: tuple[int, int],
                 seed: int = 0) -> Path:
    """The LeRobot v3.0 dataset the camera benchmarks read: ``episodes`` episodes of
    ``length`` frames at 30 fps, 6-D ``observation.state`` and ``action``, and two cameras
    (:data:`CAMS`, ``hw`` frames, one H.264 mp4 each, written as LeRobot records video but
    without B-frames, which NVDEC ingest leaves to PyAV, so the NVDEC row decodes on NVDEC; the
    two encoded at once, each episode's frames made as they are encoded)."""
    from robocache.data.cameras import add_video_features
    from robocache.data.episode import Episode, Stream, StreamSpec
    from robocache.data.formats.lerobot import write_lerobot

    rng = np.random.default_rng(seed)
    specs = {k: StreamSpec(k, "numeric", "float32", (6,), FPS)
             for k in ("observation.state", "action")}
    t = np.arange(length) / FPS
    eps = [Episode(i, {k: Stream(s, t, rng.normal(size=(len(t), 6)).astype(np.float32))
                       for k, s in specs.items()}, {"tasks": ["bench"]})
           for i in range(episodes)]
    write_lerobot(root, eps, specs, fps=FPS, version="v3.0")
    add_video_features(root, {key: (_frames(np.random.default_rng([seed, c]), length, hw, c)
                                    for _ in range(episodes))
                              for c, key in enumerate(CAMS)}, codec="libx264",
                       options={"bf": "0"})
    return root


class PerSampleVideo(torch.utils.data.Dataset):
    """LeRobot's per-sample video decoding (PyAV backend) for two cameras, history 2."""

    def __init__(self, root: Path, length: int, episodes: int):
        self.paths = [next((root / "videos" / k).rglob("*.mp4")) for k in CAMS]
        self.length, self.n = length, length * episodes

    def __len__(self) -> int:
        return self.n

    def _decode(self, path: Path, ts: list[float]) -> torch.Tensor:
        import av

        frames, times = [], []
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            container.seek(round(min(ts) / stream.time_base) - 1, backward=True,
                           any_frame=False, stream=stream)
            for frame in container.decode(stream):
                if frame.pts is None:
                    continue
                t = float(frame.pts * stream.time_base)
                frames.append(torch.from_numpy(frame.to_ndarray(format="rgb24")))
                times.append(t)
                if t >= max(ts) - 1e-4:
                    break
        pick = [int(np.argmin([abs(t - q) for t in times])) for q in ts]
        return torch.stack([frames[i] for i in pick]).permute(0, 3, 1, 2).float() / 255.0

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ep, step = divmod(i, self.length)
        steps = np.clip([step - 1, step], 0, self.length - 1)
        ts = [(ep * self.length + s) / FPS for s in steps]
        return {k: self._decode(p, ts) for k, p in zip(CAMS, self.paths, strict=True)}


def _wall(fn, batches: int, repeats: int, device) -> H.Timing:
    """Per-batch wall ms over `batches` calls of `fn` (one sync at the end), `repeats` times."""
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    for _ in range(2):
        fn()
    samples = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(batches):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) * 1e3 / batches)
    return H.summarize(samples)


def ingest_cases(root: Path, tmp: Path, name: str, frames: int) -> list[dict]:
    """Ingest ``root`` (``frames`` video frames) into ``tmp/cache`` (the cache the serving
    cases read) with the defaults (PyAV, ``decode_workers`` = the cores), and into
    ``tmp/cache-nvdec`` with NVDEC (only with a CUDA GPU and PyNvVideoCodec), each once, wall
    clock: the whole build (read, decode, encode, align, write, commit)."""
    from robocache.data.cache import build
    from robocache.data.cameras import nvdec_available

    cores = os.cpu_count() or 1
    mp4 = sum(p.stat().st_size for p in (root / "videos").rglob("*.mp4"))
    runs = [("ingest", "cache", "pyav")]
    if nvdec_available():
        runs.append(("ingest-nvdec", "cache-nvdec", "nvdec"))
    build(root, tmp / "warmup", rate_hz=FPS, progress=False, episodes=[0])  # imports, first calls
    records = []
    for impl, dest, decoder in runs:
        t0 = time.perf_counter()
        manifest = build(root, tmp / dest, rate_hz=FPS, progress=False, video_decoder=decoder)
        seconds = time.perf_counter() - t0
        cache_bytes = sum(p.stat().st_size for p in (tmp / dest / "frames").rglob("*")
                          if p.is_file())
        records.append(H.case(FAMILY, name, impl, H.summarize([seconds * 1e3]), frames=frames,
                              frames_per_s=frames / seconds,
                              frames_per_s_per_core=frames / seconds / cores, cores=cores,
                              decode_workers=manifest["decode"]["workers"],
                              video_decoder=decoder,
                              decoded_by=manifest["decode"]["video_frames"],
                              cache_bytes_per_frame=cache_bytes / frames,
                              mp4_bytes_per_frame=mp4 / frames,
                              rows=manifest["counts"]["rows"],
                              note=f"{frames / seconds:,.0f} frames/s, "
                                   f"{frames / seconds / cores:,.1f} per core"))
    return records


# --- the camera path alone: read, decode, encode (what ingest does before aligning) ---------

# encoder options per codec: no B-frames, so NVDEC decodes the H.264 and HEVC streams
# (NVDEC ingest leaves streams with B-frames to PyAV)
CODECS = {"h264": ("libx264", {"bf": "0"}), "hevc": ("libx265", {"x265-params": "bframes=0"}),
          "av1": ("libsvtav1", None)}


def libraries() -> dict[str, str | None]:
    """Versions of the camera path's libraries (``None``: not installed)."""
    from importlib import metadata

    out = {}
    for name in ("av", "simplejpeg", "PyTurboJPEG", "pillow", "torchvision", "PyNvVideoCodec",
                 "pylance"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def make_clips(root: Path, episodes: int, length: int, hw: tuple[int, int], codec: str) -> Path:
    """A LeRobot v2.1 dataset of ``episodes`` episodes of ``length`` steps (state, action) and
    the two cameras of :data:`CAMS` in ``codec`` (:data:`CODECS`), one mp4 per episode and
    camera as v2.1 stores them; every episode's file is a hard link to one clip per camera
    (writing hundreds of 480x640 videos would take longer than decoding them). Each episode
    still opens, demuxes and decodes its own file."""
    import json

    from robocache.data.cameras import write_video
    from robocache.data.episode import Episode, Stream, StreamSpec
    from robocache.data.formats.lerobot import write_lerobot

    rng = np.random.default_rng(0)
    specs = {k: StreamSpec(k, "numeric", "float32", (6,), FPS)
             for k in ("observation.state", "action")}
    t = np.arange(length) / FPS
    eps = [Episode(i, {k: Stream(s, t, rng.normal(size=(length, 6)).astype(np.float32))
                       for k, s in specs.items()}, {"tasks": ["bench"]})
           for i in range(episodes)]
    write_lerobot(root, eps, specs, fps=FPS, version="v2.1")
    info = json.loads((root / "meta" / "info.json").read_text())
    encoder, options = CODECS[codec]
    for c, key in enumerate(CAMS):
        info["features"][key] = {"dtype": "video", "shape": [*hw, 3],
                                 "names": ["height", "width", "channels"],
                                 "info": {"video.fps": FPS, "video.codec": codec}}
        clip = root / f"clip-{c}.mp4"
        write_video(clip, _frames(np.random.default_rng([1, c]), length, hw, c), FPS, encoder,
                    options)
        for i in range(episodes):
            path = root / info["video_path"].format(episode_chunk=i // info["chunks_size"],
                                                    video_key=key, episode_index=i)
            path.parent.mkdir(parents=True, exist_ok=True)
            os.link(clip, path)
    (root / "meta" / "info.json").write_text(json.dumps(info))
    return root


def prepare(root: Path, indices: list[int], workers: int, decoder: str = "pyav",
            gpu: int = 0, size: tuple[int, int] | None = None, lanes: bool = False
            ) -> tuple[int, float, dict[str, int]]:
    """Read ``indices`` and decode and encode their cameras at the defaults (JPEG q95 4:4:4;
    resized to ``size`` as ``--camera-size`` does, when given), ``workers`` episodes at once,
    as ingest prepares episodes (threads that read; videos decoded and encoded in ``workers``
    processes with one FFmpeg thread each, as ingest does with a process per core; or by
    NVDEC on the threads; or, with ``lanes``, as a large ingest with ``decoder`` splits a
    node: :func:`robocache.data.cameras.node_workers`' lanes and processes): (frames,
    seconds, frames by decoder)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from robocache.data.cameras import CameraWorkers, FrameFormat, camera_tables, node_workers
    from robocache.data.formats import open_source

    src = open_source(root)
    lock = threading.Lock()
    pool = None
    if lanes:
        processes, gpus = node_workers(workers, decoder)
        pool = CameraWorkers(processes, threads=1, gpus=gpus).start()
    elif decoder == "pyav":
        pool = CameraWorkers(workers, threads=1).start()

    def one(index: int) -> dict[str, int]:
        with lock:
            episode = src.read(index)
        tables = camera_tables(episode, src.specs, FrameFormat(), dict.fromkeys(CAMS, size),
                               decoder=decoder, gpu=gpu, workers=pool)
        used, by = episode.meta["video_decoder"], {}
        for k, t in tables.items():  # every camera's frames, summed per decoder
            by[used[k]] = by.get(used[k], 0) + len(t)
        return by

    try:
        one(indices[0])  # warm: the workers' first frames, NVDEC's decoder
        by: dict[str, int] = {}
        t0 = time.perf_counter()
        if pool is not None:  # as ingest: with lanes, an episode for each stream slot
            workers = pool.episodes_at_once(workers)
        with ThreadPoolExecutor(workers) as threads:
            for counts in threads.map(one, indices):
                for k, v in counts.items():
                    by[k] = by.get(k, 0) + v
        return sum(by.values()), time.perf_counter() - t0, by
    finally:
        if pool is not None:
            pool.close()


def worker_counts(cores: int) -> list[int]:
    """1, 2, 4, ... up to the cores, the cores last."""
    counts = [1]
    while counts[-1] * 2 < cores:
        counts.append(counts[-1] * 2)
    return counts + [cores] if cores > 1 else counts


def cpu_cases(roots: dict[str, Path], cfg: dict):
    """The camera path on the CPU (PyAV, libjpeg-turbo) with 1, 2, 4, ... worker processes,
    ``per_worker`` episodes each (the work grows with the workers, so each run lasts about as
    long): frames/s, per worker (per core), and the scaling efficiency against one worker;
    then the same with one worker and with all cores' frames stored at 224x224
    (``--camera-size``, ``cpu-w<N>-to224``). Yields each case as it is measured."""
    cores = os.cpu_count() or 1
    for codec, root in roots.items():
        base = {}
        counts = cfg["counts"] or worker_counts(cores)
        for n, size in [(n, None) for n in counts] + [(n, (224, 224))
                                                      for n in sorted({1, counts[-1]})]:
            frames, seconds, by = prepare(root, list(range(cfg["per_worker"] * n)), n,
                                          size=size)
            rate = frames / seconds
            one = base.setdefault(size, rate)
            yield H.case(
                FAMILY, f"{cfg['hw'][0]}x{cfg['hw'][1]}-{codec}-prepare",
                f"cpu-w{n}" + ("-to224" if size else ""),
                H.summarize([seconds * 1e3]), frames=frames, frames_per_s=rate,
                frames_per_s_per_core=rate / n, workers=n, cores=cores, stored_size=size,
                scaling_efficiency=rate / (n * one), decoded_by=by, libraries=libraries(),
                note=f"{rate:,.0f} frames/s, {rate / n:,.0f} per core, "
                     f"{100 * rate / (n * one):.0f}% of linear")


def _nvdec_roots(roots: dict[str, Path]):
    """The (codec, dataset) pairs NVDEC ingest decodes (it leaves AV1 to PyAV)."""
    return [(codec, root) for codec, root in roots.items() if CODECS[codec][0] != "libsvtav1"]


# the GPU path's settings the ``gpu`` section runs: (processes per GPU, JPEG encoder);
# "nvjpeg": torchvision's nvJPEG (one encode at a time per process: torchvision holds a lock
# around its encoder), "cpu": NVDEC frames copied to the host, libjpeg-turbo on the threads
GPU_SETTINGS = ((1, "nvjpeg"), (4, "nvjpeg"), (1, "cpu"))


def gpu_cases(roots: dict[str, Path], cfg: dict):
    """The camera path with NVDEC (H.264, HEVC; AV1 stays with PyAV): for each of
    :data:`GPU_SETTINGS`, ``procs`` processes per GPU, ``cfg["gpu_episodes"]`` episodes per
    GPU split between them, each process ``cfg["gpu_streams"]`` streams at once (with the CPU
    encoder, at least its share of the cores), all started together; frames/s of the node over
    the slowest process's wall clock, and each stage's time summed over the threads
    (``stage_s``: the demux scan, NVDEC decoder set-up and decode, the JPEG encode), which
    says what the streams waited on. Then ``nvdec-decode-only``: one process per GPU decoding
    the same episodes without encoding, the decode's own ceiling. Yields each case as it is
    measured."""
    gpus = torch.cuda.device_count()
    cores = os.cpu_count() or 1
    for codec, root in _nvdec_roots(roots):
        case = f"{cfg['hw'][0]}x{cfg['hw'][1]}-{codec}-prepare"
        for procs, encoder in (*GPU_SETTINGS, (1, "none")):
            streams = cfg["gpu_streams"] if encoder != "cpu" else \
                max(cfg["gpu_streams"], cores // (gpus * procs))
            impl = "nvdec-decode-only" if encoder == "none" else \
                f"gpu-x{gpus}-p{procs}-{encoder}"
            got = _gpu_processes(root, cfg, gpus, procs, streams, encoder)
            if isinstance(got, str):
                yield H.case(FAMILY, case, impl, H.summarize([0.0]), error=got)
                continue
            frames, seconds, by, stages = got
            rate = frames / seconds
            yield H.case(
                FAMILY, case, impl, H.summarize([seconds * 1e3]), frames=frames,
                frames_per_s=rate, gpus=gpus, cores=cores, frames_per_s_per_gpu=rate / gpus,
                processes_per_gpu=procs, streams_per_process=streams, encoder=encoder,
                decoded_by=by, stage_s=stages, libraries=libraries(),
                note=f"{rate:,.0f} frames/s on {gpus} GPUs ({rate / gpus:,.0f} each), "
                     f"{procs} process(es) a GPU, {encoder} encode")


# the node's camera paths the ``node`` section compares, as a large ingest runs them:
# (case, video_decoder)
NODE_SETTINGS = (("node-auto", "auto"), ("node-nvdec", "nvdec"), ("node-cpu", "pyav"))


def node_cases(roots: dict[str, Path], cfg: dict):
    """The node's camera path as a large ingest runs it (:func:`prepare` with ``lanes``: one
    reading thread per core), each of :data:`NODE_SETTINGS` on the same episodes (the
    dataset's, ``cfg["node_rounds"]`` times over) in one run: ``auto``, a lane per GPU (NVDEC,
    nvJPEG) and the CPU processes on the cores left, each stream to whichever has room;
    ``nvdec``, the lanes alone; ``pyav``, a process per core. Yields each case as it is
    measured."""
    from robocache.data.cameras import LANE_CORES, node_workers
    from robocache.data.formats import open_source

    gpus = torch.cuda.device_count()
    cores = os.cpu_count() or 1
    for codec, root in _nvdec_roots(roots):
        indices = list(open_source(root).episode_indices()) * cfg["node_rounds"]
        for impl, decoder in NODE_SETTINGS:
            processes, lanes = node_workers(cores, decoder)
            frames, seconds, by = prepare(root, indices, cores, decoder, lanes=True)
            rate = frames / seconds
            yield H.case(
                FAMILY, f"{cfg['hw'][0]}x{cfg['hw'][1]}-{codec}-prepare", impl,
                H.summarize([seconds * 1e3]), frames=frames, frames_per_s=rate, gpus=gpus,
                cores=cores, lanes=len(lanes), cpu_processes=processes,
                lane_cores=LANE_CORES, streams_per_lane=cfg["gpu_streams"], decoded_by=by,
                libraries=libraries(),
                note=f"{rate:,.0f} frames/s: {len(lanes)} GPU lane(s), {processes} CPU "
                     f"process(es); frames by decoder {by}")


def _gpu_processes(root: Path, cfg: dict, gpus: int, procs: int, streams: int,
                   encoder: str) -> tuple | str:
    """:func:`gpu_worker` in ``procs`` processes per GPU, started together: (frames, seconds
    from the common start to the last end, frames by decoder, stage seconds summed), or the
    error."""
    import json
    import subprocess
    import sys

    per = cfg["gpu_episodes"]
    start = time.time() + cfg["gpu_start_s"]
    jobs = [(g, share) for g in range(gpus) for p in range(procs)
            if (share := list(range(g * per, (g + 1) * per))[p::procs])]
    running = [subprocess.Popen(
        [sys.executable, __file__, "gpu-worker", json.dumps({
            "root": str(root), "indices": indices, "gpu": g, "streams": streams,
            "start": start, "encoder": encoder})],
        stdout=subprocess.PIPE, text=True) for g, indices in jobs]
    outs = [p.communicate()[0].strip().splitlines() for p in running]
    failed = [i for i, (p, o) in enumerate(zip(running, outs, strict=True))
              if p.returncode != 0 or not o]
    if failed:  # its traceback went to stderr
        return f"the processes {failed} (GPU, share) failed"
    outs = [json.loads(o[-1]) for o in outs]
    by: dict[str, int] = {}
    stages: dict[str, float] = {}
    for o in outs:
        for k, v in o["decoded_by"].items():
            by[k] = by.get(k, 0) + v
        for k, v in o["stage_s"].items():
            stages[k] = stages.get(k, 0.0) + v
    return (sum(o["frames"] for o in outs), max(o["end"] for o in outs) - start, by,
            {k: round(v, 3) for k, v in stages.items()})


def _timed_stages(encoder: str) -> dict[str, float]:
    """Wrap the GPU path's stages (the demux scan, NVDEC decoder creation and file switches,
    NVDEC decode, the JPEG encode) so that each call's seconds add to the returned dict
    (summed over threads); ``encoder`` ``"cpu"`` makes NVDEC frames JPEG-encoded on the host
    (as a chroma other than 4:4:4 does), ``"none"`` skips encoding (the decoded frames are
    dropped on the GPU)."""
    import threading

    import PyNvVideoCodec as nvc

    from robocache.data import cameras, jpeg

    stages: dict[str, float] = {}
    lock = threading.Lock()

    def timed(name, fn):
        def run(*args, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kw)
            finally:
                with lock:
                    stages[name] = stages.get(name, 0.0) + time.perf_counter() - t0
        return run

    class Decoder(nvc.SimpleDecoder):
        __init__ = timed("nvdec-create", nvc.SimpleDecoder.__init__)
        reconfigure_decoder = timed("nvdec-reconfigure", nvc.SimpleDecoder.reconfigure_decoder)
        get_batch_frames_by_index = timed("nvdec-decode",
                                          nvc.SimpleDecoder.get_batch_frames_by_index)

    nvc.SimpleDecoder = Decoder
    cameras._scan = timed("demux-scan", cameras._scan)
    if encoder == "none":
        cameras._nvdec_stream = lambda *task: cameras._nvdec_attempt(
            *task[:4], task[-2], task[-1], lambda batch: [b""] * len(batch))
    elif encoder == "cpu":
        jpeg.gpu_available = lambda: False
        cameras.FrameFormat.encode = timed("jpeg-cpu", cameras.FrameFormat.encode)
    else:
        jpeg.encode_cuda = timed("nvjpeg", jpeg.encode_cuda)
    return stages


def gpu_worker(args: dict) -> dict:
    """One process of :func:`gpu_cases`: warm up, wait for the common start, prepare its
    episodes with NVDEC on its GPU."""
    torch.cuda.set_device(args["gpu"])
    stages = _timed_stages(args["encoder"])
    prepare(Path(args["root"]), args["indices"][:1], 1, "nvdec", args["gpu"])
    stages.clear()
    time.sleep(max(0.0, args["start"] - time.time()))
    frames, _, by = prepare(Path(args["root"]), args["indices"], args["streams"], "nvdec",
                            args["gpu"])
    return {"frames": frames, "end": time.time(), "decoded_by": by, "stage_s": stages}


def encoder_cases(hw: tuple[int, int], frames: int) -> list[dict]:
    """JPEG encoders on one textured ``hw`` frame at quality 95: ms per frame on one thread,
    and frames/s with one thread per core in one process (an encoder that holds the GIL does
    not scale with threads); nvJPEG (batches of 64 frames on the GPU) where there is one."""
    import io
    from concurrent.futures import ThreadPoolExecutor

    from PIL import Image

    from robocache.data import jpeg

    cores = os.cpu_count() or 1
    image = _frames(np.random.default_rng(0), 1, hw, 0)[0]

    def pillow(f):
        buf = io.BytesIO()
        Image.fromarray(f).save(buf, "JPEG", quality=95)  # Pillow's default 4:2:0
        return buf.getvalue()

    encoders = {"pillow-420": pillow, "simplejpeg-444": lambda f: jpeg.encode(f, 95, "444")}
    try:
        from turbojpeg import TJSAMP_444, TurboJPEG

        tj = TurboJPEG()
        encoders["turbojpeg-444"] = lambda f: tj.encode(f, 95, 0, TJSAMP_444)  # 0: RGB
    except (ImportError, RuntimeError, OSError):  # not installed, or no libturbojpeg
        pass
    records = []
    for impl, fn in encoders.items():
        fn(image)
        t0 = time.perf_counter()
        size = sum(len(fn(image)) for _ in range(frames))
        one = (time.perf_counter() - t0) / frames
        def run_frames(n: int, fn=fn) -> None:
            for _ in range(n):
                fn(image)

        with ThreadPoolExecutor(cores) as pool:  # each thread encodes `frames` frames
            list(pool.map(run_frames, [1] * cores))
            t0 = time.perf_counter()
            list(pool.map(run_frames, [frames] * cores))
            threaded = frames * cores / (time.perf_counter() - t0)
        records.append(H.case(
            FAMILY, f"{hw[0]}x{hw[1]}-jpeg-q95", impl, H.summarize([one * 1e3]),
            bytes_per_frame=size / frames, frames_per_s=1 / one, threads=cores,
            threaded_frames_per_s=threaded, thread_scaling=threaded / (cores / one),
            note=f"{one * 1e3:.2f} ms/frame, {threaded:,.0f} frames/s on {cores} threads "
                 f"({100 * threaded * one / cores:.0f}% of linear)"))
    if jpeg.gpu_available():
        batch = torch.from_numpy(np.stack([image] * 64)).cuda()
        jpeg.encode_cuda(batch)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        size = sum(len(b) for _ in range(max(frames // 64, 1)) for b in jpeg.encode_cuda(batch))
        n = 64 * max(frames // 64, 1)
        one = (time.perf_counter() - t0) / n
        records.append(H.case(FAMILY, f"{hw[0]}x{hw[1]}-jpeg-q95", "nvjpeg-444",
                              H.summarize([one * 1e3]), bytes_per_frame=size / n,
                              frames_per_s=1 / one,
                              note=f"{1 / one:,.0f} frames/s, batches of 64"))
    return records


FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "cameras"


def fidelity_cases() -> list[dict]:
    """Bytes per frame against PSNR of the source's own decode, per chroma and quality, on
    the committed LeRobot fixture of sharp-edged content (``lerobot_sharp_av1``: AV1 written
    by LeRobot 0.6.1; LeRobot's decode in ``sharp_frames.npz``): the frames ingest decodes
    (PyAV), encoded, decoded again (Pillow), against LeRobot's decode of the same frames."""
    import io

    from PIL import Image

    from robocache.data.cameras import decode_video, encode

    if not (FIXTURES / "sharp_frames.npz").exists():  # an install without the tests
        return []
    want = np.load(FIXTURES / "sharp_frames.npz")["lerobot"].astype(np.float64)
    video = next((FIXTURES / "lerobot_sharp_av1" / "videos").rglob("*.mp4"))
    decoded = decode_video(video, 0.0, (len(want) - 1) / 10)[0]

    def psnr(a, b):
        return 10 * np.log10(255.0 ** 2 / np.mean((a.astype(np.float64) - b) ** 2, axis=(1, 2, 3)))

    diff = int(np.abs(decoded - want).max())
    records = [H.case(FAMILY, "sharp-64x96-av1-fidelity", "pyav-decode", H.summarize([0.0]),
                      max_abs_diff=diff,
                      psnr_min_dB=float(psnr(decoded, want).min()) if diff else None,
                      note="ingest's decode against LeRobot's: " +
                           ("identical" if diff == 0 else f"up to {diff} levels apart"))]
    from robocache.data import jpeg

    encoders = {f"jpeg-{c}": (c, lambda q, c=c: [encode(f, "jpeg", q, c) for f in decoded])
                for c in ("444", "422", "420")}
    if jpeg.gpu_available():  # nvJPEG, 4:4:4 only
        encoders["nvjpeg-444"] = ("444", lambda q: jpeg.encode_cuda(
            torch.from_numpy(decoded).cuda(), q))
    for name, (chroma, encode_all) in encoders.items():
        for quality in (85, 90, 95, 100):
            data = encode_all(quality)
            back = np.stack([np.asarray(Image.open(io.BytesIO(d)).convert("RGB"))
                             for d in data])
            p = psnr(back, want)
            records.append(H.case(
                FAMILY, "sharp-64x96-av1-fidelity", f"{name}-q{quality}",
                H.summarize([0.0]), chroma=chroma, quality=quality,
                bytes_per_frame=float(np.mean([len(d) for d in data])),
                psnr_mean_dB=float(p.mean()), psnr_min_dB=float(p.min()),
                note=f"{np.mean([len(d) for d in data]):,.0f} B/frame, {p.mean():.1f} dB mean, "
                     f"{p.min():.1f} worst"))
    return records


def rlds_cases(tmp: Path, cfg: dict) -> list[dict]:
    """RLDS with JPEG cameras (``bench_rlds``'s dataset at ``cfg["rlds_camera"]`` pixels a
    side, each camera's JPEGs a bank of 16 cycled so that a dataset of gigabytes is written in
    seconds): the shards' raw read rate (every core, through the page cache and with
    ``O_DIRECT``: :func:`robocache.bench.harness.raw_reads`) against the camera path (read,
    parse, episodes, the cameras' own JPEG bytes kept) on one process and on one per core.
    The processes are started, open the source and read a first episode
    before the clock starts (an ingest pays that once, not per episode); the rate is the
    dataset's bytes over the time from the common start to the last process's end."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    import bench_rlds as R

    root = R.write_dataset(tmp / "rlds", cfg["rlds_episodes"], 100, cfg["rlds_camera"], 8,
                           distinct=16)
    shards = sorted(root.glob("*-train.tfrecord-*"))
    nbytes = sum(p.stat().st_size for p in shards)

    name = f"rlds-{cfg['rlds_episodes']}ep-{cfg['rlds_camera']}px-{nbytes / 1e6:.0f}MB"
    records: list[dict] = []
    raw, against = H.raw_reads(FAMILY, name, shards, records.append)
    cores = os.cpu_count() or 1
    indices = list(range(cfg["rlds_episodes"]))
    _rlds_pass_through(str(root), indices[:1])  # imports (the forked workers inherit them)
    for n in sorted({1, cores}):
        frames, seconds = _forked_from_start(str(root), [indices[i::n] for i in range(n)])
        rate = nbytes / seconds / 1e6
        records.append(H.case(
            FAMILY, name, f"pass-through-w{n}", H.summarize([seconds * 1e3]), nbytes=nbytes,
            frames=frames, frames_per_s=frames / seconds, MB_per_s=rate, workers=n,
            pct_of_raw_read=100 * rate * 1e6 / raw,
            note=f"{rate:,.0f} MB/s, {100 * rate * 1e6 / raw:.0f}% of {against}"))
    return records


def _forked_from_start(root: str, shares: list[list[int]]) -> tuple[int, float]:
    """:func:`_rlds_pass_through` of each share of episodes in its own forked process (forked:
    this module, loaded from its file, cannot be imported by name), each with its source open
    and a first episode read before a common start: (frames, seconds from the start to the
    last process's end)."""
    import multiprocessing

    from robocache.data.formats.rlds import RldsSource

    ctx = multiprocessing.get_context("fork")
    queue, ready, go = ctx.Queue(), ctx.Semaphore(0), ctx.Event()

    def child(share: list[int]) -> None:
        src = RldsSource(Path(root), split="train", fps=FPS)
        _rlds_pass_through(src, share[:1])
        ready.release()
        go.wait()
        frames = _rlds_pass_through(src, share)
        queue.put((frames, time.perf_counter()))

    procs = [ctx.Process(target=child, args=(share,)) for share in shares]
    for p in procs:
        p.start()
    for _ in procs:
        ready.acquire()
    start = time.perf_counter()
    go.set()
    results = [queue.get() for _ in procs]
    for p in procs:
        p.join()
    return sum(f for f, _ in results), max(end for _, end in results) - start


def _rlds_pass_through(root, indices: list[int]) -> int:
    """The camera frames of ``indices`` of the RLDS dataset at ``root`` (a path, or an open
    :class:`~robocache.data.formats.rlds.RldsSource`), read and passed through."""
    from robocache.data.cameras import FrameFormat, camera_tables
    from robocache.data.formats.rlds import RldsSource

    src = root if isinstance(root, RldsSource) else RldsSource(Path(root), split="train",
                                                                 fps=FPS)
    return sum(len(t) for i in indices
               for t in camera_tables(src.read(i), src.specs, FrameFormat()).values())


def run(quick: bool = False, copy_gbps: float | None = None,
        sections: str = ",".join(SECTIONS), codecs: str | None = None,
        report=None) -> list[dict]:
    """The sections' cases (see the module docstring); ``codecs``: the videos of the ``cpu``
    and ``gpu`` sections (default h264, hevc, av1); ``report``: called with each case as soon
    as it is done."""
    wanted = [x.strip() for x in sections.split(",") if x.strip()]
    unknown = sorted(set(wanted) - set(SECTIONS))
    if unknown:
        raise SystemExit(f"--sections: unknown {unknown}; choose from {', '.join(SECTIONS)}")
    cfg = QUICK if quick else FULL
    if codecs is not None:
        asked = tuple(c.strip() for c in codecs.split(",") if c.strip())
        if not asked or set(asked) - set(CODECS):
            raise SystemExit(f"--codecs: choose from {', '.join(CODECS)}; got {codecs!r}")
        cfg = {**cfg, "codecs": asked}
    records = []

    def done(cases) -> None:
        for rec in cases:
            records.append(rec)
            if report is not None:
                report(rec)

    if "encode" in wanted:
        done(encoder_cases(cfg["hw"], cfg["encode_frames"]))
    if "fidelity" in wanted:
        done(fidelity_cases())
    with tempfile.TemporaryDirectory() as tmp:
        if {"cpu", "gpu", "node"} & set(wanted):
            cores = os.cpu_count() or 1
            episodes = max(cfg["per_worker"] * max(cfg["counts"] or (cores,)),
                           cfg["gpu_episodes"] * max(torch.cuda.device_count(), 1))
            roots = {c: make_clips(Path(tmp) / c, episodes, cfg["clip_length"], cfg["hw"], c)
                     for c in cfg["codecs"]}
            if "cpu" in wanted:
                done(cpu_cases(roots, cfg))
            if {"gpu", "node"} & set(wanted) and torch.cuda.is_available():
                from robocache.data.cameras import nvdec_available

                if nvdec_available():
                    if "gpu" in wanted:
                        done(gpu_cases(roots, cfg))
                    if "node" in wanted:
                        done(node_cases(roots, cfg))
                else:
                    done([H.case(FAMILY, "gpu", "gpu-skipped", H.summarize([0.0]),
                                 error="NVDEC needs PyNvVideoCodec: `pip install "
                                       "PyNvVideoCodec`")])
        if "rlds" in wanted:
            done(rlds_cases(Path(tmp), cfg))
    if "serve" in wanted:
        done(serve_cases(cfg))
    return records


def serve_cases(cfg: dict) -> list[dict]:
    """Ingest the two-camera dataset (:func:`ingest_cases`) and serve batches from it."""
    from robocache import ImageTransformsConfig, image_transform, sample_image_transforms
    from robocache.data import RobotDataset

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    hw, batch = cfg["hw"], cfg["batch"]
    name = f"{hw[0]}x{hw[1]}-b{batch}-cams2-t{HISTORY}-to{OUT[0]}"
    jitter = ImageTransformsConfig(max_num_transforms=4, crop_scale=(0.8, 1.0), weights={
        "brightness": 1.0, "contrast": 1.0, "saturation": 1.0, "hue": 1.0})
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        root = make_dataset(Path(tmp) / "lerobot", cfg["episodes"], cfg["length"], hw)
        records += ingest_cases(root, Path(tmp), f"{hw[0]}x{hw[1]}-ingest",
                                2 * cfg["episodes"] * cfg["length"])

        ds = RobotDataset(Path(tmp) / "cache", keys=list(CAMS), history=HISTORY,
                          image_size=OUT, image_transforms=jitter).to(device)
        gen = torch.Generator().manual_seed(0)

        def indices(b: int) -> torch.Tensor:
            return torch.randint(0, len(ds), (b,), generator=gen).to(device)

        def record(impl: str, timing: H.Timing, n_frames: int, case: str = name, **extra):
            fps_ = n_frames / (timing.median_ms * 1e-3)
            records.append(H.case(FAMILY, case, impl, timing, frames_per_s=fps_,
                                  samples_per_s=fps_ / (2 * HISTORY), **extra))

        per_batch = batch * 2 * HISTORY
        peak = None
        if device.type == "cuda":
            torch.cuda.synchronize()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            ds.fetch(indices(batch))
            torch.cuda.synchronize()
            peak = (torch.cuda.max_memory_allocated() - base) / 1e6
        record("robocache", _wall(lambda: ds.fetch(indices(batch)), cfg["batches"],
                                  cfg["repeats"], device), per_batch, peak_MB=peak)

        from robocache.data.cameras import decode

        sets = []  # each step's frame rows, as the packed word matrix holds them
        for _ in range(cfg["batches"]):
            raw = ds.data[torch.randint(0, len(ds), (batch, HISTORY), generator=gen)]
            sets.append({k: ds.layout[k].values(raw[..., ds.layout[k].col:][..., :2])[..., 0]
                         .cpu() for k in CAMS})
        decode_jpeg = None
        if device.type == "cuda":
            from torchvision.io import decode_jpeg
        it = iter(range(1 << 30))

        def decode_only():
            s = sets[next(it) % len(sets)]
            if decode_jpeg is not None:
                decode_jpeg([p for k in CAMS for p in ds.frames[k].slices(s[k].unique())],
                            device=device)
                return
            for k in CAMS:
                decode(ds.frames[k], s[k], device)
        record("nvjpeg-decode" if decode_jpeg else "cpu-decode",
               _wall(decode_only, cfg["batches"], cfg["repeats"], device), per_batch)

        decoded = torch.randint(0, 256, (per_batch, 3, *hw), dtype=torch.uint8, device=device)
        params = sample_image_transforms(per_batch, hw, jitter, seed=0).to(device)
        fn = lambda: image_transform(decoded, OUT, params)
        timing = H.gpu_time(fn) if device.type == "cuda" else H.cpu_time(fn, repeats=3)
        record("transform", timing, per_batch,
               nbytes=per_batch * (hw[0] * hw[1] * 3 + 3 * OUT[0] * OUT[1] * 4))

        small = cfg["small_batch"]
        small_name = f"{hw[0]}x{hw[1]}-b{small}-cams2-t{HISTORY}"
        record("robocache-b64", _wall(lambda: ds.fetch(indices(small)), cfg["batches"],
                                      cfg["repeats"], device), small * 2 * HISTORY, small_name)
        plain = PerSampleVideo(root, cfg["length"], cfg["episodes"])
        for workers in cfg["workers"]:
            loader = torch.utils.data.DataLoader(
                plain, batch_size=small, shuffle=True, drop_last=True, num_workers=workers,
                pin_memory=device.type == "cuda", persistent_workers=workers > 0,
                prefetch_factor=4 if workers else None)
            batches = iter(())

            def cpu_batch(loader=loader):
                nonlocal batches
                b = next(batches, None)
                if b is None:
                    batches = iter(loader)
                    b = next(batches)
                return {k: v.to(device, non_blocking=True) for k, v in b.items()}
            record(f"cpu-loader-w{workers}", _wall(cpu_batch, max(cfg["batches"] // 2, 1),
                                                   cfg["repeats"], device),
                   small * 2 * HISTORY, small_name, workers=workers)
            del loader, batches
    by = {r["impl"]: r for r in records}
    e2e, dec = by["robocache"], by.get("nvjpeg-decode") or by["cpu-decode"]
    e2e["pct_of_decode"] = 100.0 * e2e["frames_per_s"] / dec["frames_per_s"]
    best_cpu = max(r["samples_per_s"] for r in records if r["impl"].startswith("cpu-loader"))
    by["robocache-b64"]["speedup_vs_best_cpu_loader"] = \
        by["robocache-b64"]["samples_per_s"] / best_cpu
    for r in records:
        if "frames_per_s" in r and not r["impl"].startswith("ingest"):
            r["note"] = f"{r['frames_per_s']:,.0f} frames/s"
    e2e["note"] += f", {e2e['pct_of_decode']:.0f}% of decode alone"
    return records


if __name__ == "__main__":
    import json
    import sys

    if sys.argv[1:2] == ["gpu-worker"]:  # one GPU's process of gpu_cases
        print(json.dumps(gpu_worker(json.loads(sys.argv[2]))))
    else:
        main(run, __doc__, {"sections": (str, f"comma-separated, of {', '.join(SECTIONS)} "
                                                "(default: all)"),
                            "codecs": (str, "videos of the cpu and gpu sections, comma-"
                                            f"separated, of {', '.join(CODECS)} (default: "
                                            "all)")})
