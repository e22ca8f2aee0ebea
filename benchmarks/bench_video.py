"""Video cameras kept as video (``--camera-codec video``) against JPEG frames, in one run.

    $ robocache bench video --json benchmarks/results/video.json
    $ python benchmarks/bench_video.py --quick        # CPU, tiny frames

A LeRobot v3.0 dataset of 4 cameras (480x640, textured moving scenes, episodes of 100 frames
at 30 fps) is written with LeRobot's recording settings (PyAV, yuv420p, a keyframe every 2
frames, CRF 30), once as AV1 (SVT-AV1, LeRobot's default) and once as H.264 (libx264), and
ingested twice each: frames kept as video, and decoded into JPEG q95 4:4:4 (the default).
Reported per codec:

- **bytes**: the cache's camera bytes against the source's videos (target: <= 1.1x);
- **ingest**: seconds and MB/s of source video against the raw read rate of the same files
  (page cache dropped; the ingest of a kept video is a copy plus an index); and the kept-video
  ingest of the dataset repeated ``copies`` times (300: 3,600 episodes, 3-4 GB of video;
  the videos remuxed, not re-encoded, :func:`replicate`), against the cold read of those
  files, where start-up costs no longer count;
- **serve**: samples/s of ``RobotLoader`` batches of 32 samples, each 4 cameras x windows of
  8 frames (``history=8``) at random positions, resized to 224x224 on the serving device,
  for both caches (frames in the page cache: the decode is measured, not the disk);
- **single**: the same with one frame per camera per sample (``history=1``);
- **LeRobot 0.6.1** (where installed): its own ``LeRobotDataset`` (PyAV backend) over the
  same source with the same windows, through a shuffled ``DataLoader`` with no workers and
  with one per core (``serve-*-lerobot-w<N>``), and our fastest serve of the kept video
  over it (``ours_vs_lerobot``);
- **sequential**: the frames/s of decoding the same streams front to back on the CPU, one
  PyAV decoder per file, every file at once (the decode rate with no random access), and on
  a GPU with PyNvVideoCodec the same with one NVDEC decoder per file (``sequential-nvdec``:
  the GPU's own rate, the ceiling of the GPU serve).

On a CUDA device with PyNvVideoCodec, the video caches are served twice: GOPs decoded by NVDEC
(``serve-*-video``, H.264; AV1 is not decodable by Hopper's NVDEC, so it is decoded on CPU
threads either way) and on CPU threads (``serve-*-video-cpu``).
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from robocache.bench import harness as H
from robocache.bench.standalone import main

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve import _serve_batches, evict, jpeg_pool, tree_bytes  # noqa: E402

FAMILY = "video"
CAMS = tuple(f"observation.images.cam{i}" for i in range(4))
FULL = {"hw": (480, 640), "episodes": 12, "length": 100, "batch": 32, "history": 8,
        "batches": 20, "copies": 300, "peer_batches": 2}
QUICK = {"hw": (48, 64), "episodes": 3, "length": 12, "batch": 4, "history": 3, "batches": 2,
         "copies": 3, "peer_batches": 1}
CODECS = {"av1": "libsvtav1", "h264": "libx264"}


def source(root: Path, cfg: dict, codec: str) -> Path:
    """The LeRobot dataset: a state stream and 4 cameras encoded by ``codec``."""
    from PIL import Image

    from robocache.data.cameras import add_video_features
    from robocache.data.episode import Episode, Stream, StreamSpec
    from robocache.data.formats.lerobot import write_lerobot

    spec = StreamSpec("observation.state", "numeric", "float32", (6,), 30.0)
    n, length = cfg["episodes"], cfg["length"]
    rng = np.random.default_rng(0)
    eps = [Episode(i, {spec.name: Stream(spec, np.arange(length) / 30.0,
                                         rng.normal(size=(length, 6)).astype(np.float32))},
                   {"tasks": ["pick"]}) for i in range(n)]
    root = write_lerobot(root, eps, {spec.name: spec}, fps=30.0, version="v3.0")
    pool = jpeg_pool(length, cfg["hw"])  # decoded once: the scenes as a camera gives them
    scenes = np.stack([np.asarray(Image.open(io.BytesIO(p)).convert("RGB")) for p in pool])

    def clip(c: int):
        return (np.roll(scenes, 7 * e + 13 * c, axis=2) for e in range(n))

    add_video_features(root, {cam: clip(c) for c, cam in enumerate(CAMS)}, fps=30.0,
                       codec=CODECS[codec])
    return root


def replicate(src: Path, dest: Path, copies: int) -> Path:
    """The LeRobot v3.0 dataset ``src`` repeated ``copies`` times as one dataset at ``dest``
    (episodes renumbered after each other), its videos remuxed, not re-encoded: each camera's
    packets written ``copies`` times, shifted by the file's duration. A dataset of realistic
    size for the ingest without the encoding time."""
    import json

    import av
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    info = json.loads((src / "meta" / "info.json").read_text())
    fps = float(info["fps"])
    episodes, frames = int(info["total_episodes"]), int(info["total_frames"])
    shutil.copytree(src / "meta", dest / "meta")
    (dest / "data" / "chunk-000").mkdir(parents=True)

    def repeated(table, shifts: dict[str, float]):  # copy k: column c plus k * shifts[c]
        return pa.concat_tables([pa.table({c: pc.add(table[c], pa.scalar(
            shifts[c] * k, table[c].type)) if c in shifts else table[c]
            for c in table.column_names}) for k in range(copies)])

    data = pq.read_table(src / "data" / "chunk-000" / "file-000.parquet")
    pq.write_table(repeated(data, {"episode_index": episodes, "index": frames}),
                   dest / "data" / "chunk-000" / "file-000.parquet")
    meta = src / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
    table = pq.read_table(meta)
    shifts = {"episode_index": episodes, "dataset_from_index": frames,
              "dataset_to_index": frames}
    for key in CAMS:
        for end in ("from_timestamp", "to_timestamp"):
            shifts[f"videos/{key}/{end}"] = frames / fps
        rel = info["video_path"].format(video_key=key, chunk_index=0, file_index=0)
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        with av.open(str(src / rel)) as inp, av.open(str(dest / rel), "w") as out:
            s = inp.streams.video[0]
            o = out.add_stream_from_template(s, opaque=True)  # no codec: remuxed as is
            step = round(frames / fps / s.time_base)  # the file's duration in its ticks
            packets = [(bytes(p), p.pts, p.dts, p.is_keyframe) for p in inp.demux(s) if p.size]
            for k in range(copies):
                for data, pts, dts, key in packets:
                    p = av.Packet(data)
                    p.stream, p.time_base = o, s.time_base
                    p.pts, p.dts, p.is_keyframe = pts + k * step, dts + k * step, key
                    out.mux(p)
    pq.write_table(repeated(table, shifts), dest / "meta" / "episodes" / "chunk-000" /
                   "file-000.parquet")
    info.update(total_episodes=episodes * copies, total_frames=frames * copies,
                splits={"train": f"0:{episodes * copies}"})
    (dest / "meta" / "info.json").write_text(json.dumps(info, indent=2) + "\n")
    return dest


def _ingest(src: Path, dest: Path, camera_codec: str, profile: str | None = None) -> float:
    """Seconds to build ``dest`` from ``src`` (page cache dropped first); ``profile``: a
    folder to write the build process's cProfile to (``ingest-<source>.prof``, the workers'
    time shows as waits)."""
    import cProfile

    from robocache.data.cache import build

    evict(src)
    prof = cProfile.Profile() if profile else None
    t0 = time.perf_counter()
    if prof:
        prof.enable()
    build(src, dest, rate_hz="native", progress=False, device="cpu", camera_codec=camera_codec)
    seconds = time.perf_counter() - t0
    if prof:
        prof.disable()
        prof.dump_stats(str(Path(profile) / f"ingest-{src.name}.prof"))
    return seconds


def _serve(cache: Path, cfg: dict, history: int, device: torch.device,
           nvdec: bool = True) -> float:
    """Samples/s of random batches (frames in the page cache, read once before timing);
    ``nvdec``: video GOPs decoded by NVDEC on a CUDA device (else on CPU threads)."""
    from robocache.data import RobotDataset, nvdec_packets
    from robocache.data.loader import READ_AHEAD

    ds = RobotDataset(cache, keys=list(CAMS), history=history, image_size=(224, 224))
    nvdec_packets.ENABLED = nvdec
    try:
        got = _serve_batches(ds, cfg, device, READ_AHEAD)
    finally:
        nvdec_packets.ENABLED = True
    return got["samples"] / got["seconds"]


def _lerobot(src: Path, cfg: dict, history: int, workers: int) -> dict | None:
    """Samples/s of LeRobot's own ``LeRobotDataset`` (PyAV decoding, its backend that needs no
    FFmpeg libraries beside PyAV's) over the same dataset and windows, through a shuffled
    ``DataLoader`` of ``workers`` processes (0: in its process), timed after its first
    batches (worker start-up excluded). Frames at the source's size, no resize (less work
    than the serve above does). Run in a process of its own whose ``PYTHONPATH`` starts with
    ``$LEROBOT_PYTHONPATH`` (LeRobot 0.6.1 needs PyAV 15, older than ours); ``None`` where
    LeRobot is not installed there."""
    import json
    import subprocess

    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("LEROBOT_PYTHONPATH"),
                                                    str(Path(__file__).parent),
                                                    os.environ.get("PYTHONPATH")) if p)
    code = ("import json, sys; from pathlib import Path; from bench_video import _lerobot_rate; "
            "print(json.dumps(_lerobot_rate(Path(sys.argv[1]), json.loads(sys.argv[2]), "
            "int(sys.argv[3]), int(sys.argv[4]))))")
    got = subprocess.run([sys.executable, "-c", code, str(src), json.dumps(cfg), str(history),
                          str(workers)], env=env, capture_output=True, text=True)
    if got.returncode:
        raise RuntimeError(f"LeRobot's serve failed: {got.stderr.strip()[-600:]}")
    return json.loads(got.stdout.strip().splitlines()[-1])


def _lerobot_rate(src: Path, cfg: dict, history: int, workers: int) -> dict | None:
    """:func:`_lerobot`'s measurement, in LeRobot's process."""
    try:
        from lerobot.datasets.lerobot_dataset import LeRobotDataset
    except ImportError:
        return None
    from torch.utils.data import DataLoader

    ds = LeRobotDataset("bench/video", root=src, video_backend="pyav", delta_timestamps={
        cam: [(i - history + 1) / 30 for i in range(history)] for cam in CAMS})
    loader = DataLoader(ds, cfg["batch"], shuffle=True, num_workers=workers,
                        generator=torch.Generator().manual_seed(0))
    timed = cfg["peer_batches"] * max(1, workers)
    it = iter(loader)
    for _ in range(max(1, workers)):  # every worker's first batch: its start-up
        next(it)
    t0 = time.perf_counter()
    for _ in range(timed):
        next(it)
    seconds = time.perf_counter() - t0
    del it
    import av

    return {"samples_per_s": timed * cfg["batch"] / seconds, "workers": workers,
            "batches": timed, "pyav": av.__version__}


def _sequential(files: list[Path]) -> tuple[float, int]:
    """Frames/s decoding ``files`` front to back, one PyAV decoder (one thread) per file,
    all at once."""
    import av

    def one(path: Path) -> int:
        with av.open(str(path)) as c:
            stream = c.streams.video[0]
            stream.codec_context.thread_count = 1
            return sum(1 for _ in c.decode(stream))

    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(files)) as pool:
        frames = sum(pool.map(one, files))
    return frames / (time.perf_counter() - t0), frames


def _sequential_nvdec(files: list[Path]) -> tuple[float, int]:
    """Frames/s decoding ``files`` front to back by NVDEC, one decoder per file (its packets
    in decode order, as the GPU serve feeds them, with no flush between GOPs), every file at
    once; frames left in NVDEC's output (decode only)."""
    import av
    import PyNvVideoCodec as nvc

    from robocache.data.nvdec_packets import CODECS, annexb, annexb_header

    def units(path: Path) -> tuple[str, list[np.ndarray]]:
        with av.open(str(path)) as c:
            s = c.streams.video[0]
            codec, extra = s.codec_context.name, bytes(s.codec_context.extradata or b"")
            if codec in CODECS:
                head, size = annexb_header(codec, extra)
                return codec, [np.frombuffer((head if p.is_keyframe else b"") +
                                             annexb(bytes(p), size), np.uint8)
                               for p in c.demux(s) if p.size]
            # AV1 (which the serve decodes on the CPU): tried, for what this GPU answers
            return "AV1", [np.frombuffer((extra[4:] if p.is_keyframe else b"") + bytes(p),
                                         np.uint8) for p in c.demux(s) if p.size]

    streams = [units(p) for p in files]

    def one(k: int) -> int:
        codec, data = streams[k]
        dec = nvc.CreateDecoder(gpuid=0, codec=getattr(nvc.cudaVideoCodec,
                                                        CODECS.get(codec, codec)),
                                cudacontext=0, cudastream=0, usedevicememory=True)
        n = 0
        for i, d in enumerate(data):
            packet = nvc.PacketData()
            packet.bsl_data, packet.bsl, packet.pts = d.ctypes.data, d.size, i
            n += len(dec.Decode(packet))
        end = nvc.PacketData()
        end.bsl, end.decode_flag = 0, nvc.VideoPacketFlag.ENDOFSTREAM
        return n + len(dec.Decode(end))

    one(0)  # warm: the first decoder's session
    t0 = time.perf_counter()
    with ThreadPoolExecutor(len(files)) as pool:
        frames = sum(pool.map(one, range(len(files))))
    torch.cuda.synchronize()
    return frames / (time.perf_counter() - t0), frames


def run(quick: bool = False, copy_gbps: float | None = None, report=None,
        codecs: str | None = None, workdir: str | None = None,
        profile: str | None = None) -> list[dict]:
    cfg = QUICK if quick else FULL
    out: list[dict] = []
    report = report or out.append
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    from robocache.data.cameras import nvdec_available

    nvdec = nvdec_available()
    name_of = f"{len(CAMS)}cams-{cfg['hw'][0]}x{cfg['hw'][1]}-b{cfg['batch']}"
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        tmp = Path(tmp)
        for codec in (codecs or ",".join(CODECS)).split(","):
            src = source(tmp / f"src-{codec}", cfg, codec)
            videos = sorted((src / "videos").rglob("*.mp4"))
            video_bytes = sum(p.stat().st_size for p in videos)
            evict(src)
            raw_s, raw_n = H.raw_read_s(videos)
            name = f"{codec}-{name_of}"
            caches = {}
            for stored in ("video", "jpeg"):
                caches[stored] = tmp / f"cache-{codec}-{stored}"
                seconds = _ingest(src, caches[stored], stored)
                frame_bytes = tree_bytes(caches[stored], "frames")
                report(H.case(FAMILY, name, f"ingest-{stored}", H.summarize([seconds * 1e3]),
                              source_bytes=video_bytes, frame_bytes=frame_bytes,
                              vs_source=frame_bytes / video_bytes,
                              source_MB_per_s=video_bytes / seconds / 1e6,
                              raw_read_MB_per_s=raw_n / raw_s / 1e6,
                              note=f"{seconds:.1f} s; camera bytes {frame_bytes / video_bytes:.2f}x"
                                   f" the source's videos"))
            big = replicate(src, tmp / f"big-{codec}", cfg["copies"])
            big_videos = sorted((big / "videos").rglob("*.mp4"))
            big_bytes = sum(p.stat().st_size for p in big_videos)
            evict(big)
            raw_s, raw_n = H.raw_read_s(big_videos)
            seconds = _ingest(big, tmp / "cache-big", "video", profile=profile)
            rate, raw = big_bytes / seconds / 1e6, raw_n / raw_s / 1e6
            report(H.case(FAMILY, f"{codec}-{name_of}-x{cfg['copies']}", "ingest-video",
                          H.summarize([seconds * 1e3]), source_bytes=big_bytes,
                          source_MB_per_s=rate, raw_read_MB_per_s=raw, vs_raw_read=rate / raw,
                          episodes=cfg["episodes"] * cfg["copies"],
                          note=f"{big_bytes / 1e6:,.0f} MB of video in {seconds:.1f} s: "
                               f"{rate:,.0f} MB/s, {rate / raw:.0%} of the cold read's "
                               f"{raw:,.0f} MB/s"))
            shutil.rmtree(big)
            shutil.rmtree(tmp / "cache-big")
            ceiling = None
            if nvdec:
                try:
                    ceiling, frames = _sequential_nvdec(videos)
                    report(H.case(FAMILY, name, "sequential-nvdec",
                                  H.summarize([1e3 * frames / ceiling]), frames_per_s=ceiling,
                                  decoders=len(videos),
                                  note=f"{ceiling:,.0f} frames/s, one NVDEC decoder per file"))
                except Exception as e:  # noqa: BLE001 - a codec this GPU's NVDEC lacks
                    report(H.case(FAMILY, name, "sequential-nvdec",
                                  H.summarize([float("nan")]),
                                  note=f"not decodable: {' '.join(str(e).split())[:120]}"))
            # AV1 is decoded on CPU threads either way (Hopper's NVDEC lacks it)
            served = [("video", True), ("jpeg", True)] + \
                ([("video", False)] if ceiling else [])
            best_video = {}  # our fastest serve of the kept video, per kind
            for history, kind in ((cfg["history"], "window"), (1, "single")):
                for stored, on_gpu in served:
                    rate = _serve(caches[stored], cfg, history, device, on_gpu)
                    if stored == "video":
                        best_video[kind] = max(best_video.get(kind, 0.0), rate)
                    frames = rate * len(CAMS) * history
                    tag = stored if on_gpu else f"{stored}-cpu"
                    of = f", {frames / ceiling:.0%} of NVDEC's sequential rate" \
                        if ceiling and stored == "video" and on_gpu else ""
                    report(H.case(FAMILY, name, f"serve-{kind}-{tag}",
                                  H.summarize([1e3 * cfg["batch"] / rate]),
                                  samples_per_s=rate, frames_per_s=frames,
                                  history=history, device=str(device),
                                  vs_nvdec_sequential=frames / ceiling if ceiling else None,
                                  note=f"{rate:,.0f} samples/s, {frames:,.0f} frames/s{of}"))
                for workers in (0, os.cpu_count() or 1):
                    peer = _lerobot(src, cfg, history, workers)
                    if peer is None:
                        break
                    ours = best_video[kind]
                    speedup = ours / peer["samples_per_s"]
                    report(H.case(FAMILY, name, f"serve-{kind}-lerobot-w{workers}",
                                  H.summarize([1e3 * cfg["batch"] / peer["samples_per_s"]]),
                                  **peer, history=history, ours_vs_lerobot=speedup,
                                  note=f"LeRobot 0.6.1: {peer['samples_per_s']:,.1f} samples/s "
                                       f"({workers} workers); ours {speedup:.1f}x"))
            rate, frames = _sequential(videos)
            report(H.case(FAMILY, name, "sequential-cpu", H.summarize([1e3 * frames / rate]),
                          frames_per_s=rate, threads=len(videos),
                          note=f"{rate:,.0f} frames/s, one decoder per file"))
            shutil.rmtree(src)
            for cache in caches.values():
                shutil.rmtree(cache)
    return out


if __name__ == "__main__":
    os.environ.setdefault("SVT_LOG", "1")
    main(run, __doc__, {"codecs": (str, "comma-separated codecs of av1,h264"),
                        "workdir": (str, "folder for the datasets (default: the system's temp)"),
                        "profile": (str, "folder for a cProfile of the repeated dataset's ingest")})
