"""RoboCache beside lerobot-lancedb 0.3.1 and LeRobot 0.6.1 on one LeRobot-written video dataset.

How to run (one run on one machine does everything, one library after another, each in its
own interpreter; the dataset, caches and the S3 server live under ``--work``)::

    # RoboCache's environment (this interpreter) drives; the peers run in their own venv:
    #   ~/.pyenv/versions/3.12.1/bin/python -m venv /work/venvs/lerobot
    #   /work/venvs/lerobot/bin/pip install "torch<2.12" "lerobot[dataset]==0.6.1" \\
    #       lerobot-lancedb==0.3.1 "moto[server]"
    # lerobot-lancedb decodes through TorchCodec, which needs FFmpeg's shared libraries
    # (Debian: apt-get install ffmpeg).
    python3 benchmarks/side_by_side_lancedb.py --peers-python /work/venvs/lerobot/bin/python \\
        --work /tmp/sbs --json benchmarks/results/serve-lancedb-cpu-$(date +%F).json

The same file is also the worker each interpreter runs (``--role ...``, internal), and the
dataset writer (``--role write-dataset``, run by the driver in LeRobot's environment; pass
``--rewrite-dataset`` to write it again). ``HF_HUB_OFFLINE=1`` is set for every process.

The dataset is written with LeRobot 0.6.1's recorder (``LeRobotDataset.create``, ``add_frame``,
``save_episode``, ``finalize``; LeRobot's default video encoder, AV1 through libsvtav1, GOP 2,
CRF 30): 30 episodes x 300 frames at 30 fps, a 6-D ``observation.state``, a 6-D ``action``,
two RGB cameras of 240x320 (a blurred random texture per episode and camera drifting over a
gradient, plus fresh noise of +-3 levels on every frame, so the video does not compress to
nothing).

What is compared, for each library:

* **RoboCache** (the interpreter running this driver): ``robocache.LeRobotDataset(repo_id,
  root=..., delta_timestamps=..., cache=DIR)`` (its first use builds the cache: video decoded
  once, every frame stored as a JPEG q95 4:4:4 still) and ``robocache.RobotDataset(cache,
  delta_timestamps=...)`` served to a DataLoader in whole batches (a ``BatchSampler`` over a
  ``RandomSampler``, ``batch_size=None``: one ``ds[list]`` per batch). On S3 the cache is
  built with ``robocache.data.cache.build(source, "s3://bucket/robocache", rate_hz="native",
  storage_options=...)`` (built in a local staging directory, then published) and served by
  ``RobotDataset("s3://...", storage_options=...)``.
* **lerobot-lancedb** (the peers' venv): ``lerobot_lancedb.convert.convert(out, root=dataset)``
  (its one layout: frames table + the MP4 files' bytes verbatim in a blob column + meta table)
  and ``LanceDBDataset(root=..., delta_timestamps=..., storage_options=...)`` (decodes with
  TorchCodec from byte ranges). On S3 the converted folder is uploaded file by file (what its
  README says: ``aws s3 cp --recursive``; here boto3's ``upload_file`` of every file).
* **LeRobot** (the peers' venv): ``lerobot.datasets.lerobot_dataset.LeRobotDataset(repo_id,
  root=dataset, delta_timestamps=...)`` on the dataset as written (its default video backend).

The numbers (every one comes from this run; ``null`` with a reason where a library cannot do
it):

* ``cache_bytes``: bytes of the files the library adds to serve the dataset (RoboCache: its
  cache folder; its served index, written at first open, is counted apart as
  ``served_index_bytes``; lerobot-lancedb: the converted folder, which holds a copy of
  ``meta/``; LeRobot: it reads the source, and its first open writes the Hugging Face
  ``datasets`` cache of the parquet rows under ``$HF_HOME``), ``ratio_to_source``: over the source
  dataset's bytes. ``s3_bytes``: bytes of the objects under the library's S3 prefix.
* ``build_s``: wall time of the build / conversion in a fresh process (RoboCache: the first
  ``LeRobotDataset(...)`` construction, which builds the cache and opens it; lerobot-lancedb:
  ``convert``); ``build_peak_rss``: the largest sum of RSS over the building process and its
  children, sampled every 20 ms (``ru_maxrss`` of the process itself beside it).
  ``s3_build_s``: RoboCache's build straight to ``s3://``; lerobot-lancedb's upload of the
  converted folder (its conversion is local, ``build_s``).
* ``open``: a fresh process, once any cache exists (a second open): ``import_s`` and
  ``rss/pss_after_import``, ``open_s`` (the constructor) and ``rss/pss_after_open``, then
  ``first_item_s`` (``ds[0]``, or ``ds[[0]]`` for RobotDataset; lerobot-lancedb connects to
  Lance on its first item, so its open is lazy and this is where it pays) and
  ``rss/pss_after_first_item``. RSS and PSS come from ``/proc/<pid>/smaps_rollup``.
* ``loader`` runs, one fresh process each: ``DataLoader(batch_size=32, num_workers=2,
  shuffle=True, generator seeded 0)`` over items with ``delta_timestamps =
  {"observation.state": [-1/30, 0], "action": [k/30 for k in range(16)]}`` and both cameras at
  the current frame as float32 ``[C, H, W]``; the start method is named (``fork``, and
  ``forkserver`` where the library asks for it: lerobot-lancedb's ``lance_mp_context()``).
  ``first_batch_s``: from ``iter()`` to the first batch (workers starting, the cache or
  tables opened in them); ``rss_sum`` / ``pss_sum``: main process + its 2 workers after the
  first batch (``tree_rss_sum`` / ``tree_pss_sum``, the table's ``tree_pss_sum_MB`` over
  ``tree_procs`` processes: every descendant too: a forkserver, and RoboCache's reader
  processes, which a ``fork`` worker of a process that has called Lance starts to make its
  Lance calls, see ``robocache.data.reader``);
  ``samples_per_s``: 40 batches after that first one, timed together (1 280 samples; every
  library gets the same sampler order). The OS page cache is **not** dropped between runs
  (everything read locally is in memory after the build): these are warm-cache numbers.
  ``s3`` loader runs read from a moto S3 server on 127.0.0.1 through a counting reverse proxy
  (this driver): ``bytes_per_sample`` are the response bytes the store sent during the 40
  timed batches over their 1 280 samples (``open_bytes``: during the constructor and first
  batch). moto is a single Python process: S3 samples/s measure the libraries' request
  patterns against a slow local store, not a cloud bucket.
* ``fidelity``: camera frames of 300 random items (both cameras: 600 frames) against
  LeRobot's own decode of the same items (``LeRobotDataset[i]`` with its default backend),
  each as uint8 (``round(x * 255)``): PSNR min / mean in dB (99 for an identical frame) and
  the count of identical frames.

The two environments differ in one way that shows in memory: RoboCache's has torch 2.13's
CPU-only build, the peers' torch 2.11 from PyPI (LeRobot 0.6.1 needs torch < 2.12; PyTorch's
CPU-only index was not reachable from the benchmark machine), the CUDA build, whose ``import
torch`` alone holds about 550 MB RSS against about 230 MB. Every process records its memory
right after ``import torch`` (``mem_after_import_torch``, the table's ``torch_rss_MB``) so that
difference can be taken out of the RSS / PSS numbers (per process: main and each worker).

2 CPU cores and no GPU here: RoboCache decodes JPEG with simplejpeg / Pillow on the CPU
(nvJPEG is its GPU path). Numbers from a shared 2-core machine move by tens of percent
between runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO_ID = "bench/sbs_video"
FPS = 30
CAMERAS = ("observation.images.front", "observation.images.wrist")
BATCH = 32
TIMED_BATCHES = 40
NUM_WORKERS = 2
FIDELITY_ITEMS = 300
SEED = 0


def delta_timestamps() -> dict[str, list[float]]:
    return {"observation.state": [-1 / FPS, 0.0], "action": [k / FPS for k in range(16)]}


# ── process memory ──────────────────────────────────────────────────────────


def smaps(pid: int) -> dict[str, int] | None:
    """RSS and PSS (bytes) of ``pid`` from /proc/<pid>/smaps_rollup."""
    out = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                parts = line.split()
                if parts and parts[0] in ("Rss:", "Pss:"):
                    out[parts[0][:-1].lower()] = int(parts[1]) * 1024
    except OSError:
        return None
    return out


def rss_of(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    stat = f.read()
                ppid = int(stat[stat.rindex(")") + 2:].split()[1])
                children.setdefault(ppid, []).append(int(d))
            except (OSError, ValueError):
                pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        for c in children.get(p, []):
            out.append(c)
            todo.append(c)
    return out


def mem_sum(pids: list[int]) -> dict[str, int]:
    rss = pss = 0
    for p in pids:
        m = smaps(p)
        if m:
            rss += m["rss"]
            pss += m["pss"]
    return {"rss": rss, "pss": pss}


def du(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


# ── the dataset (LeRobot's environment) ─────────────────────────────────────


def role_write_dataset(spec: dict) -> dict:
    import numpy as np
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    root = Path(spec["root"])
    n_ep, n_fr, h, w = spec["episodes"], spec["frames"], spec["height"], spec["width"]
    features = {
        "observation.state": {"dtype": "float32", "shape": (6,), "names": None},
        "action": {"dtype": "float32", "shape": (6,), "names": None},
        **{cam: {"dtype": "video", "shape": (h, w, 3), "names": ["height", "width", "channels"]}
           for cam in CAMERAS},
    }
    tasks = ["pick up the red cube", "push the block left", "open the drawer"]
    t0 = time.perf_counter()
    ds = LeRobotDataset.create(REPO_ID, fps=FPS, features=features, root=root, use_videos=True)
    rng = np.random.default_rng(7)
    pad = 64
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    for e in range(n_ep):
        state = np.cumsum(rng.normal(scale=0.05, size=(n_fr + 1, 6)), 0).astype(np.float32)
        textures, velocity, grads = [], [], []
        for _ in CAMERAS:
            tex = rng.integers(0, 256, size=(h + pad, w + pad, 3)).astype(np.float32)
            # a 3x3 box blur: mid-frequency texture, not white noise
            tex = sum(np.roll(np.roll(tex, dy, 0), dx, 1) for dy in (-1, 0, 1)
                      for dx in (-1, 0, 1)) / 9
            textures.append(tex)
            velocity.append(rng.uniform(-1.5, 1.5, size=2))
            phase = rng.uniform(0, 6.28, size=3)
            grads.append(np.stack([60 * np.sin(xx / 40 + phase[k]) * np.cos(yy / 50 - phase[k])
                                   for k in range(3)], -1))
        for i in range(n_fr):
            frame = {"observation.state": state[i],
                     "action": (state[i + 1] + rng.normal(scale=0.01, size=6)).astype(np.float32),
                     "task": tasks[e % len(tasks)]}
            for c, cam in enumerate(CAMERAS):
                dy, dx = (np.abs(velocity[c] * i).astype(int) % pad)
                img = textures[c][dy:dy + h, dx:dx + w] * 0.7 + grads[c] + 38
                img = img + rng.integers(-3, 4, size=img.shape)
                frame[cam] = np.clip(img, 0, 255).astype(np.uint8)
            ds.add_frame(frame)
        ds.save_episode()
    ds.finalize()
    return {"write_s": time.perf_counter() - t0, "bytes": du(root)}


# ── opening each library's dataset ──────────────────────────────────────────


def open_dataset(spec: dict):
    lib, where = spec["lib"], spec["where"]
    if lib == "robocache-lerobot":
        from robocache import LeRobotDataset

        return LeRobotDataset(REPO_ID, root=spec["dataset"], delta_timestamps=delta_timestamps(),
                              cache=spec["rc_cache"])
    if lib == "robocache-robot":
        from robocache import RobotDataset

        if where == "s3":
            return RobotDataset(spec["rc_uri"], delta_timestamps=delta_timestamps(),
                                storage_options=spec["storage_options"])
        return RobotDataset(spec["rc_cache"], delta_timestamps=delta_timestamps())
    if lib == "lancedb":
        from lerobot_lancedb import LanceDBDataset

        if where == "s3":
            return LanceDBDataset(root=spec["lance_uri"], delta_timestamps=delta_timestamps(),
                                  storage_options=spec["storage_options"])
        return LanceDBDataset(root=spec["lance_dir"], delta_timestamps=delta_timestamps())
    if lib == "lerobot":
        from lerobot.datasets.lerobot_dataset import LeRobotDataset

        return LeRobotDataset(REPO_ID, root=spec["dataset"], delta_timestamps=delta_timestamps())
    raise ValueError(lib)


def import_lib(lib: str) -> None:
    if lib.startswith("robocache"):
        import robocache  # noqa: F401
    elif lib == "lancedb":
        import lerobot_lancedb  # noqa: F401
    else:
        import lerobot.datasets.lerobot_dataset  # noqa: F401


def proxy_stats(spec: dict) -> dict | None:
    if not spec.get("stats_url"):
        return None
    import urllib.request

    with urllib.request.urlopen(spec["stats_url"], timeout=10) as r:
        return json.loads(r.read())


def describe(batch) -> dict:
    import torch

    out = {}
    for k, v in batch.items():
        if isinstance(v, torch.Tensor):
            out[k] = [str(v.dtype).replace("torch.", ""), list(v.shape)]
        else:
            out[k] = type(v).__name__
    return out


def role_build(spec: dict) -> dict:
    """Build / convert in this process (the driver samples its RSS)."""
    import resource

    lib = spec["lib"]
    t0 = time.perf_counter()
    out: dict = {}
    if lib == "robocache":
        import_lib("robocache-lerobot")
        t1 = time.perf_counter()
        ds = open_dataset({**spec, "lib": "robocache-lerobot", "where": "local"})
        out["build_s"] = time.perf_counter() - t1
        out["len"] = len(ds)
    elif lib == "robocache-s3":
        from robocache.data.cache import build

        t1 = time.perf_counter()
        m = build(spec["dataset"], spec["rc_uri"], rate_hz="native", progress=False,
                  storage_options=spec["direct_options"], staging=spec["rc_staging"])
        out["build_s"] = time.perf_counter() - t1
        out["published"] = m.get("published")
    elif lib == "lancedb":
        from lerobot_lancedb.convert import convert

        t1 = time.perf_counter()
        convert(Path(spec["lance_dir"]), root=Path(spec["dataset"]))
        out["build_s"] = time.perf_counter() - t1
    elif lib == "lancedb-s3":
        import boto3

        o = spec["direct_options"]
        s3 = boto3.client("s3", endpoint_url=o["aws_endpoint"],
                          aws_access_key_id=o["aws_access_key_id"],
                          aws_secret_access_key=o["aws_secret_access_key"],
                          region_name=o["aws_region"])
        bucket, prefix = spec["lance_uri"][len("s3://"):].split("/", 1)
        base = Path(spec["lance_dir"])
        t1 = time.perf_counter()
        files = [f for f in sorted(base.rglob("*")) if f.is_file()]
        for f in files:
            s3.upload_file(str(f), bucket, f"{prefix}/{f.relative_to(base).as_posix()}")
        out["build_s"] = time.perf_counter() - t1
        out["files"] = len(files)
    elif lib == "lerobot":  # a first open (LeRobot's own caches of the parquet files)
        import_lib("lerobot")
        t1 = time.perf_counter()
        ds = open_dataset({**spec, "lib": "lerobot", "where": "local"})
        out["build_s"] = time.perf_counter() - t1
        out["len"] = len(ds)
    out["total_s"] = time.perf_counter() - t0
    out["ru_maxrss_self"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    out["ru_maxrss_children"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return out


def first_item(ds, lib: str):
    if lib == "robocache-robot":
        return ds[[0]]
    return ds[0]


def role_open(spec: dict) -> dict:
    lib, pid = spec["lib"], os.getpid()
    out: dict = {"mem_after_start": smaps(pid)}
    t0 = time.perf_counter()
    import torch  # noqa: F401

    out["import_torch_s"] = time.perf_counter() - t0
    out["mem_after_import_torch"] = smaps(pid)
    import_lib(lib)
    out["import_s"] = time.perf_counter() - t0
    out["mem_after_import"] = smaps(pid)
    s0 = proxy_stats(spec)
    t0 = time.perf_counter()
    ds = open_dataset(spec)
    out["open_s"] = time.perf_counter() - t0
    out["mem_after_open"] = smaps(pid)
    s1 = proxy_stats(spec)
    t0 = time.perf_counter()
    first_item(ds, lib)
    out["first_item_s"] = time.perf_counter() - t0
    out["mem_after_first_item"] = smaps(pid)
    s2 = proxy_stats(spec)
    if s0 is not None:
        out["open_bytes"] = s1["get_bytes"] - s0["get_bytes"]
        out["first_item_bytes"] = s2["get_bytes"] - s1["get_bytes"]
        out["open_requests"] = s1["requests"] - s0["requests"]
    out["len"] = len(ds)
    return out


def role_loader(spec: dict) -> dict:
    import torch
    from torch.utils.data import BatchSampler, DataLoader, RandomSampler

    lib, ctx = spec["lib"], spec["context"]
    mem_torch = smaps(os.getpid())
    import_lib(lib)
    mem_import = smaps(os.getpid())
    s0 = proxy_stats(spec)
    t0 = time.perf_counter()
    ds = open_dataset(spec)
    open_s = time.perf_counter() - t0
    g = torch.Generator().manual_seed(SEED)
    common = dict(num_workers=NUM_WORKERS, multiprocessing_context=ctx)
    if lib == "robocache-robot":  # whole batches: one ds[list] per batch
        loader = DataLoader(ds, batch_size=None, sampler=BatchSampler(
            RandomSampler(ds, generator=g), BATCH, drop_last=True), **common)
    else:
        loader = DataLoader(ds, batch_size=BATCH, shuffle=True, generator=g, **common)
    t0 = time.perf_counter()
    it = iter(loader)
    batch = next(it)
    first_batch_s = time.perf_counter() - t0
    s1 = proxy_stats(spec)
    me = os.getpid()
    workers = [w.pid for w in it._workers]
    out = {"context": ctx, "open_s": open_s, "main_after_import_torch": mem_torch,
           "main_after_import": mem_import, "first_batch_s": first_batch_s,
           "batch": describe(batch), "worker_pids": len(workers)}
    mw = mem_sum([me, *workers])
    tree = mem_sum([me, *descendants(me)])
    out.update(rss_sum=mw["rss"], pss_sum=mw["pss"], tree_rss_sum=tree["rss"],
               tree_pss_sum=tree["pss"], main=smaps(me),
               workers=[smaps(p) for p in workers],
               tree_processes=1 + len(descendants(me)))
    t0 = time.perf_counter()
    for _ in range(TIMED_BATCHES):
        batch = next(it)
    dt = time.perf_counter() - t0
    s2 = proxy_stats(spec)
    out["timed_s"] = dt
    out["samples_per_s"] = TIMED_BATCHES * BATCH / dt
    mw = mem_sum([me, *workers])
    out.update(rss_sum_end=mw["rss"], pss_sum_end=mw["pss"])
    if s0 is not None:
        out["open_bytes"] = s1["get_bytes"] - s0["get_bytes"]
        out["timed_bytes"] = s2["get_bytes"] - s1["get_bytes"]
        out["timed_requests"] = s2["requests"] - s1["requests"]
        out["bytes_per_sample"] = out["timed_bytes"] / (TIMED_BATCHES * BATCH)
    del it
    return out


def frames_for(ds, lib: str, indices: list[int]):
    """uint8 [N, C, H, W] per camera for ``indices``."""
    import torch

    out = {cam: [] for cam in CAMERAS}
    for s in range(0, len(indices), BATCH):
        chunk = indices[s:s + BATCH]
        if lib == "robocache-robot":
            b = ds[chunk]
            for cam in CAMERAS:
                out[cam].append(b[cam])
        else:
            items = ds.__getitems__(chunk) if hasattr(ds, "__getitems__") \
                else [ds[i] for i in chunk]
            for cam in CAMERAS:
                out[cam].append(torch.stack([it[cam] for it in items]))
    return {cam: (torch.cat(v).float() * 255).round().clamp(0, 255).to(torch.uint8).numpy()
            for cam, v in out.items()}


def fidelity_indices(n: int) -> list[int]:
    import random

    return sorted(random.Random(1).sample(range(n), min(FIDELITY_ITEMS, n)))


def role_reference(spec: dict) -> dict:
    """LeRobot's own decode of the fidelity items' frames, saved for the others."""
    import numpy as np
    from lerobot.datasets.lerobot_dataset import LeRobotDataset

    ds = LeRobotDataset(REPO_ID, root=spec["dataset"])
    idx = fidelity_indices(len(ds))
    frames = frames_for(ds, "lerobot", idx)
    np.savez(spec["reference"], indices=np.array(idx), **{c.replace(".", "_"): frames[c]
                                                          for c in CAMERAS})
    return {"video_backend": getattr(ds, "_video_backend", None), "items": len(idx)}


def role_fidelity(spec: dict) -> dict:
    import numpy as np

    ref = np.load(spec["reference"])
    idx = [int(i) for i in ref["indices"]]
    ds = open_dataset({**spec, "where": "local"})
    got = frames_for(ds, spec["lib"], idx)
    psnr, identical = [], 0
    for cam in CAMERAS:
        a = got[cam].astype(np.float64)
        b = ref[cam.replace(".", "_")].astype(np.float64)
        for x, y in zip(a, b, strict=True):
            mse = float(np.mean((x - y) ** 2))
            psnr.append(99.0 if mse == 0 else 10 * np.log10(255 ** 2 / mse))
            identical += mse == 0
    return {"frames": len(psnr), "psnr_min_db": float(min(psnr)),
            "psnr_mean_db": float(np.mean(psnr)), "identical_frames": int(identical)}


def role_versions(spec: dict) -> dict:
    import platform
    from importlib import metadata

    names = ["robocache", "torch", "torchvision", "torchcodec", "av", "numpy", "pyarrow",
             "pylance", "lancedb", "lerobot", "lerobot-lancedb", "datasets", "huggingface-hub",
             "moto", "boto3", "simplejpeg", "pillow", "pandas", "flask", "werkzeug"]
    out = {"python": platform.python_version(), "executable": sys.executable}
    for n in names:
        with contextlib.suppress(metadata.PackageNotFoundError):
            out[n] = metadata.version(n)
    return out


ROLES = {"write-dataset": role_write_dataset, "build": role_build, "open": role_open,
         "loader": role_loader, "reference": role_reference, "fidelity": role_fidelity,
         "versions": role_versions}


# ── the driver ──────────────────────────────────────────────────────────────


class CountingProxy:
    """A reverse proxy on 127.0.0.1 in front of the S3 server that counts the bytes it
    returns (``GET /__sbs_stats`` answers the counters as JSON).

    With ``range_cache=True`` it answers ranged GETs of an object itself, from a copy of the
    whole object fetched from the server once: moto reads (and copies) a whole object for
    every ranged GET, under a per-object lock, so a ranged read there costs the object's size,
    not the range's (objects of 100 MB make every 100 KB read a 100 MB copy). A real object
    store costs the range. The bytes counted are those sent to the client either way."""

    def __init__(self, upstream_port: int, range_cache: bool = False):
        import http.client
        import re
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        stats = {"get_bytes": 0, "put_bytes": 0, "requests": 0, "served_from_copy": 0}
        lock = threading.Lock()
        copies: dict[str, tuple[bytes, list[tuple[str, str]]]] = {}
        self.stats, self.copies = stats, copies

        def upstream(method, path, body, headers):
            conn = http.client.HTTPConnection("127.0.0.1", upstream_port, timeout=300)
            try:
                conn.request(method, path, body=body, headers=headers)
                resp = conn.getresponse()
                return resp.status, resp.reason, resp.getheaders(), resp.read()
            finally:
                conn.close()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def _body(self) -> bytes | None:
                if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
                    parts = []
                    while True:
                        n = int(self.rfile.readline().split(b";")[0].strip(), 16)
                        if n == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return b"".join(parts)
                        parts.append(self.rfile.read(n))
                        self.rfile.readline()
                n = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(n) if n else None

            def _reply(self, status, reason, headers, data, length=None):
                self.send_response(status, reason)
                for k, v in headers:
                    if k.lower() not in ("transfer-encoding", "connection", "server", "date",
                                         "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", length if self.command == "HEAD"
                                 else str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            def _from_copy(self, headers) -> bool:
                m = re.fullmatch(r"bytes=(\d*)-(\d*)", self.headers.get("Range", "").strip())
                if not m or "?" in self.path or m.group(1) == "":
                    return False
                copy = copies.get(self.path)
                if copy is None:
                    h = {k: v for k, v in headers.items() if k.lower() != "range"}
                    status, _, rh, data = upstream("GET", self.path, None, h)
                    if status != 200:
                        return False
                    copy = (data, [(k, v) for k, v in rh if k.lower() in
                                   ("etag", "last-modified", "content-type",
                                    "x-amz-version-id")])
                    with lock:
                        copies[self.path] = copy
                data, keep = copy
                first = int(m.group(1))
                last = min(int(m.group(2)) if m.group(2) else len(data) - 1, len(data) - 1)
                if first > last:
                    return False
                part = data[first:last + 1]
                self._reply(206, "Partial Content", [
                    *keep, ("Accept-Ranges", "bytes"),
                    ("Content-Range", f"bytes {first}-{last}/{len(data)}")], part)
                with lock:
                    stats["requests"] += 1
                    stats["get_bytes"] += len(part)
                    stats["served_from_copy"] += 1
                return True

            def _any(self):
                if self.path == "/__sbs_stats":
                    with lock:
                        data = json.dumps(stats).encode()
                    self._reply(200, "OK", [("Content-Type", "application/json")], data)
                    return
                body = self._body()
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in ("transfer-encoding", "connection")}
                if body is not None:
                    headers["Content-Length"] = str(len(body))
                if self.command not in ("GET", "HEAD"):
                    with lock:
                        copies.clear()
                elif range_cache and self.command == "GET" and self._from_copy(headers):
                    return
                status, reason, rh, data = upstream(self.command, self.path, body, headers)
                length = next((v for k, v in rh if k.lower() == "content-length"), "0")
                self._reply(status, reason, rh, data, length)
                with lock:
                    stats["requests"] += 1
                    if self.command == "GET":
                        stats["get_bytes"] += len(data)
                    stats["put_bytes"] += len(body or b"")

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            request_queue_size = 512

        self.server = Server(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.shutdown()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Runner:
    def __init__(self, args):
        self.args = args
        self.work = Path(args.work)
        self.logs = self.work / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1",
                    "HF_LEROBOT_HOME": str(self.work / "hf_lerobot_home"),
                    "HF_HOME": str(self.work / "hf_home"),
                    "ROBOCACHE_HOME": str(self.work / "robocache_home"),
                    "PYTHONWARNINGS": "default"}
        self.n = 0
        self.warnings: list[str] = []

    def run(self, python: str, role: str, spec: dict, name: str, timeout: int = 1200,
            sample_rss: bool = False) -> tuple[dict | None, str | None]:
        """Run ``role`` in ``python``; return (result, error)."""
        self.n += 1
        out = self.work / f"out-{self.n:02d}-{name}.json"
        log = self.logs / f"{self.n:02d}-{name}.log"
        out.unlink(missing_ok=True)
        cmd = [python, str(Path(__file__).resolve()), "--role", role, "--spec",
               json.dumps(spec), "--out", str(out)]
        print(f"[{time.strftime('%H:%M:%S')}] {name} ...", flush=True)
        t0 = time.perf_counter()
        peak = 0
        with open(log, "wb") as f:
            p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=self.env)
            error = None
            while True:
                try:
                    p.wait(0.02)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if sample_rss:
                    peak = max(peak, sum(rss_of(q) for q in [p.pid, *descendants(p.pid)]))
                if time.perf_counter() - t0 > timeout:
                    for q in [*descendants(p.pid), p.pid]:
                        with contextlib.suppress(OSError):
                            os.kill(q, 9)
                    p.wait()
                    error = f"timed out after {timeout} s (killed)"
                    break
        wall = time.perf_counter() - t0
        text = log.read_text(errors="replace")
        for line in text.splitlines():
            low = line.lower()
            if ("warn" in low or "fork" in low) and "robocache: cached" not in line:
                entry = f"{name}: {line.strip()[:300]}"
                if entry not in self.warnings:
                    self.warnings.append(entry)
        if error is None and p.returncode != 0:
            error = f"exit {p.returncode}: " + " | ".join(text.strip().splitlines()[-3:])[-600:]
        if error:
            print(f"    FAILED: {error}", flush=True)
            return None, error
        result = json.loads(out.read_text())
        result["process_wall_s"] = wall
        if sample_rss:
            result["peak_rss_tree"] = peak
        print(f"    done in {wall:.1f} s", flush=True)
        return result, None


def start_moto(work: Path, python: str) -> tuple[subprocess.Popen, int]:
    import urllib.request

    port = free_port()
    with open(work / "logs" / "moto.log", "wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen([python, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                                 str(port)], stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}", timeout=1).read()
            return proc, port
        except OSError:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("moto's S3 server did not start") from None
            time.sleep(0.1)


def s3_objects(options: dict, uri: str) -> dict:
    """Bytes, count and the largest size of the objects under ``uri``."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=options["aws_endpoint"],
                      aws_access_key_id="testing", aws_secret_access_key="testing",
                      region_name="us-east-1")
    bucket, prefix = uri[len("s3://"):].split("/", 1)
    sizes = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
        sizes += [o["Size"] for o in page.get("Contents", [])]
    return {"bytes": sum(sizes), "objects": len(sizes), "largest": max(sizes, default=0)}


def machine_facts() -> dict:
    import platform

    mem = {}
    with open("/proc/meminfo") as f:
        for line in f:
            k, v = line.split(":", 1)
            if k in ("MemTotal", "MemAvailable"):
                mem[k] = int(v.split()[0]) * 1024
    model = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {"cores": os.cpu_count(), "cpu": model, "mem_total": mem.get("MemTotal"),
            "mem_available_at_start": mem.get("MemAvailable"), "kernel": platform.release(),
            "gpu": None}


def main_driver(args) -> dict:
    import shutil

    r = Runner(args)
    work = r.work
    rc_py, peer_py = args.robocache_python, args.peers_python
    dataset = work / "dataset"
    base = {"dataset": str(dataset), "rc_cache": str(work / "rc_cache"),
            "lance_dir": str(work / "lance"), "rc_staging": str(work / "rc_staging"),
            "reference": str(work / "reference.npz")}
    res: dict = {"date": time.strftime("%Y-%m-%d"), "machine": machine_facts(),
                 "settings": {"batch_size": BATCH, "num_workers": NUM_WORKERS,
                              "timed_batches": TIMED_BATCHES, "warmup_batches": 1,
                              "delta_timestamps": "observation.state [-1/30, 0]; action "
                              "[k/30 for k in range(16)]; both cameras at the current frame, "
                              "float32 [C,H,W]",
                              "shuffle": f"RandomSampler, torch.Generator seeded {SEED} "
                              "(the same order for every library)",
                              "page_cache": "not dropped (warm): the source, caches and "
                              "converted tables were just written or read",
                              "fidelity_items": FIDELITY_ITEMS},
                 "not_measured": [], "errors": {}}
    try:
        res["git_commit"] = subprocess.run(["git", "-C", str(Path(__file__).resolve().parents[1]),
                                            "rev-parse", "HEAD"], capture_output=True, text=True,
                                           check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        res["git_commit"] = None
    v1, _ = r.run(rc_py, "versions", {}, "versions-robocache")
    v2, _ = r.run(peer_py, "versions", {}, "versions-peers")
    res["versions"] = {"robocache_env": v1, "peers_env": v2}

    # 1. the dataset
    if args.rewrite_dataset and dataset.exists():
        shutil.rmtree(dataset)
    written = None
    if not (dataset / "meta" / "info.json").exists():
        spec = {"root": str(dataset), "episodes": args.episodes, "frames": args.frames,
                "height": args.height, "width": args.width}
        written, err = r.run(peer_py, "write-dataset", spec, "write-dataset", timeout=3600)
        if err:
            raise SystemExit(f"could not write the dataset: {err}")
    info = json.loads((dataset / "meta" / "info.json").read_text())
    src_bytes = du(dataset)
    res["dataset"] = {
        "root": str(dataset), "writer": "LeRobot 0.6.1 LeRobotDataset.create/add_frame/"
        "save_episode/finalize, default video encoder",
        "episodes": info["total_episodes"], "frames": info["total_frames"], "fps": info["fps"],
        "cameras": {k: {"shape": v["shape"], "codec": (v.get("info") or {}).get("video.codec"),
                        "pix_fmt": (v.get("info") or {}).get("video.pix_fmt")}
                    for k, v in info["features"].items() if v["dtype"] == "video"},
        "bytes": src_bytes, "videos_bytes": du(dataset / "videos"),
        "data_bytes": du(dataset / "data"), "meta_bytes": du(dataset / "meta"),
        "write_s": written["write_s"] if written else None,
        "written_this_run": written is not None}
    frames_total = info["total_frames"]
    ref, err = r.run(peer_py, "reference", base, "lerobot-reference")
    res["dataset"]["lerobot_video_backend"] = ref and ref.get("video_backend")

    # fresh caches each run
    for d in ("rc_cache", "lance", "rc_staging", "robocache_home", "hf_lerobot_home",
              "hf_home"):
        shutil.rmtree(work / d, ignore_errors=True)

    libs = {"robocache": {}, "lerobot_lancedb": {}, "lerobot": {}}
    res["libraries"] = libs

    # 2. builds
    b, err = r.run(rc_py, "build", {**base, "lib": "robocache"}, "build-robocache",
                   sample_rss=True)
    libs["robocache"]["build"] = b or {"error": err}
    b, err = r.run(peer_py, "build", {**base, "lib": "lancedb"}, "build-lancedb",
                   sample_rss=True)
    libs["lerobot_lancedb"]["build"] = b or {"error": err}
    b, err = r.run(peer_py, "build", {**base, "lib": "lerobot"}, "first-open-lerobot",
                   sample_rss=True)
    libs["lerobot"]["build"] = {"build_s": None, "reason": "LeRobot reads the dataset as "
                                "written: nothing to build", "first_open": b or {"error": err}}
    served = work / "robocache_home" / "serve"
    libs["robocache"]["cache"] = {
        "cache_bytes": du(work / "rc_cache"), "served_index_bytes": du(served)
        if served.exists() else 0, "ratio_to_source": du(work / "rc_cache") / src_bytes,
        "frames_bytes": {p.stem: du(p) for p in sorted((work / "rc_cache" / "frames").iterdir())}
        if (work / "rc_cache" / "frames").exists() else None}
    if (work / "lance").exists():
        lb = du(work / "lance")
        libs["lerobot_lancedb"]["cache"] = {
            "cache_bytes": lb, "ratio_to_source": lb / src_bytes,
            "parts": {p.name: du(p) if p.is_dir() else p.stat().st_size
                      for p in sorted((work / "lance").iterdir())}}
    hf = du(work / "hf_home") if (work / "hf_home").exists() else 0
    libs["lerobot"]["cache"] = {"cache_bytes": hf, "ratio_to_source": hf / src_bytes,
                                "reason": "reads the source as written; the bytes are the "
                                "Hugging Face datasets cache its first open writes under "
                                "$HF_HOME (the parquet rows as Arrow)"}

    # 3. second opens (local)
    for lib, key, py in (("robocache-lerobot", "robocache", rc_py),
                         ("robocache-robot", "robocache", rc_py),
                         ("lancedb", "lerobot_lancedb", peer_py),
                         ("lerobot", "lerobot", peer_py)):
        o, err = r.run(py, "open", {**base, "lib": lib, "where": "local"}, f"open-{lib}")
        libs[key].setdefault("open", {})[lib] = o or {"error": err}

    # 4. loaders, local
    runs = [("robocache-lerobot", "robocache", rc_py, "fork"),
            ("robocache-lerobot", "robocache", rc_py, "forkserver"),
            ("robocache-robot", "robocache", rc_py, "fork"),
            ("lancedb", "lerobot_lancedb", peer_py, "forkserver"),
            ("lancedb", "lerobot_lancedb", peer_py, "fork"),
            ("lerobot", "lerobot", peer_py, "fork")]
    for lib, key, py, ctx in runs:
        o, err = r.run(py, "loader", {**base, "lib": lib, "where": "local", "context": ctx},
                       f"loader-{lib}-{ctx}-local")
        libs[key].setdefault("loader_local", {})[f"{lib}/{ctx}"] = o or {"error": err}

    # 5. fidelity
    for lib, key, py in (("robocache-lerobot", "robocache", rc_py),
                         ("robocache-robot", "robocache", rc_py),
                         ("lancedb", "lerobot_lancedb", peer_py)):
        if ref is None:
            libs[key].setdefault("fidelity", {})[lib] = {"error": "no LeRobot reference"}
            continue
        o, err = r.run(py, "fidelity", {**base, "lib": lib}, f"fidelity-{lib}")
        libs[key].setdefault("fidelity", {})[lib] = o or {"error": err}
    libs["lerobot"]["fidelity"] = {"lerobot": {"reference": True, "video_backend":
                                               ref and ref.get("video_backend")}}

    # 6. S3 (moto on 127.0.0.1, a counting proxy in front)
    if not args.skip_s3:
        moto, port = start_moto(work, args.moto_python or rc_py)
        proxy = CountingProxy(port)
        fast = CountingProxy(port, range_cache=True)
        try:
            import boto3

            bucket = f"sbs-{int(time.time())}"
            boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}",
                         aws_access_key_id="testing", aws_secret_access_key="testing",
                         region_name="us-east-1").create_bucket(Bucket=bucket)

            def opts(p):
                return {"aws_endpoint": f"http://127.0.0.1:{p}", "allow_http": "true",
                        "aws_access_key_id": "testing", "aws_secret_access_key": "testing",
                        "aws_region": "us-east-1"}

            s3 = {**base, "rc_uri": f"s3://{bucket}/robocache", "lance_uri":
                  f"s3://{bucket}/lance", "direct_options": opts(port),
                  "storage_options": opts(proxy.port),
                  "stats_url": f"http://127.0.0.1:{proxy.port}/__sbs_stats"}
            s3c = {**s3, "storage_options": opts(fast.port),
                   "stats_url": f"http://127.0.0.1:{fast.port}/__sbs_stats"}
            moto_version = (res["versions"]["robocache_env"] or {}).get("moto")
            res["s3"] = {"server": f"moto {moto_version} (server mode) on 127.0.0.1; reads "
                         "through a counting reverse proxy in the driver",
                         "range_copy": "the *_copy runs read through a second proxy that "
                         "answers ranged GETs from a copy of the whole object fetched once "
                         "(moto copies a whole object for every ranged GET; see "
                         "CountingProxy)", "bucket": bucket}
            b, err = r.run(rc_py, "build", {**s3, "lib": "robocache-s3"}, "build-robocache-s3",
                           sample_rss=True)
            libs["robocache"]["s3_build"] = b or {"error": err}
            b, err = r.run(peer_py, "build", {**s3, "lib": "lancedb-s3"}, "upload-lancedb-s3",
                           sample_rss=True)
            libs["lerobot_lancedb"]["s3_build"] = b or {"error": err}
            libs["robocache"]["s3_objects"] = s3_objects(s3["direct_options"], s3["rc_uri"])
            libs["lerobot_lancedb"]["s3_objects"] = s3_objects(s3["direct_options"],
                                                               s3["lance_uri"])
            s3runs = [("robocache-robot", "robocache", rc_py, "fork"),
                      ("lancedb", "lerobot_lancedb", peer_py, "forkserver")]
            for lib, key, py, ctx in s3runs:
                o, err = r.run(py, "loader", {**s3, "lib": lib, "where": "s3", "context": ctx},
                               f"loader-{lib}-{ctx}-s3")
                libs[key].setdefault("loader_s3", {})[f"{lib}/{ctx}"] = o or {"error": err}
                o, err = r.run(py, "open", {**s3, "lib": lib, "where": "s3"}, f"open-{lib}-s3")
                libs[key].setdefault("open_s3", {})[lib] = o or {"error": err}
                o, err = r.run(py, "loader", {**s3c, "lib": lib, "where": "s3", "context": ctx},
                               f"loader-{lib}-{ctx}-s3-copy")
                libs[key].setdefault("loader_s3_copy", {})[f"{lib}/{ctx}"] = o or {"error": err}
                fast.copies.clear()
            res["s3"]["proxy_totals"] = dict(proxy.stats)
            res["s3"]["copy_proxy_totals"] = dict(fast.stats)
        finally:
            proxy.stop()
            fast.stop()
            moto.terminate()
            moto.wait(30)
    res["not_measured"] += [
        {"what": "LeRobot on S3", "why": "LeRobot 0.6.1 reads a local root or the Hugging Face "
         "Hub (StreamingLeRobotDataset streams hf:// repos); it has no S3 / object-store "
         "reader"},
        {"what": "RoboCache LeRobotDataset on S3", "why": "robocache.LeRobotDataset takes the "
         "LeRobot source's root and a local cache folder; a cache in an object store is served "
         "by RobotDataset (measured)"},
        {"what": "LeRobot build / cache bytes / fidelity", "why": "LeRobot serves the dataset "
         "as written (no cache); its decode is the fidelity reference"},
        {"what": "bytes fetched per sample from local disk", "why": "local reads go through "
         "the page cache (warm); only the S3 runs count bytes"},
    ]
    res["warnings_seen"] = r.warnings
    res["table"] = table(res, src_bytes, frames_total)
    return res


def _mb(x):
    return None if x is None else round(x / 1e6, 1)


def table(res: dict, src_bytes: int, frames: int) -> list[dict]:
    """One row per library path: the headline numbers."""
    libs = res["libraries"]
    rows = []

    def loader(key, section, name):
        return (libs[key].get(section) or {}).get(name) or {}

    def row(label, key, lib, loc_name, s3_name=None, fid=None):
        lib_ = libs[key]
        b = lib_.get("build") or {}
        o = (lib_.get("open") or {}).get(lib) or {}
        lo = loader(key, "loader_local", loc_name)
        s3 = loader(key, "loader_s3", s3_name) if s3_name else {}
        s3c = loader(key, "loader_s3_copy", s3_name) if s3_name else {}
        f = (lib_.get("fidelity") or {}).get(fid or lib) or {}
        c = lib_.get("cache") or {}
        rows.append({
            "path": label,
            "cache_MB": _mb(c.get("cache_bytes")),
            "x_source": None if c.get("ratio_to_source") is None else round(
                c["ratio_to_source"], 2),
            "build_s": None if b.get("build_s") is None else round(b["build_s"], 1),
            "build_peak_rss_MB": _mb(b.get("peak_rss_tree")),
            "open_s": None if o.get("open_s") is None else round(o["open_s"], 3),
            "first_item_s": None if o.get("first_item_s") is None else round(
                o["first_item_s"], 3),
            "torch_rss_MB": _mb((o.get("mem_after_import_torch") or {}).get("rss")),
            "open_rss_MB": _mb((o.get("mem_after_first_item") or {}).get("rss")),
            "open_pss_MB": _mb((o.get("mem_after_first_item") or {}).get("pss")),
            "loader": loc_name.split("/")[-1],
            "loader_rss_sum_MB": _mb(lo.get("rss_sum")),
            "loader_pss_sum_MB": _mb(lo.get("pss_sum")),
            "tree_procs": lo.get("tree_processes"),
            "tree_pss_sum_MB": _mb(lo.get("tree_pss_sum")),
            "local_samples_s": None if lo.get("samples_per_s") is None else round(
                lo["samples_per_s"], 1),
            "s3_samples_s": None if s3.get("samples_per_s") is None else round(
                s3["samples_per_s"], 1),
            "s3_copy_samples_s": None if s3c.get("samples_per_s") is None else round(
                s3c["samples_per_s"], 1),
            "s3_KB_per_sample": None if s3.get("bytes_per_sample") is None else round(
                s3["bytes_per_sample"] / 1e3, 1),
            "psnr_min_mean": None if f.get("psnr_min_db") is None else
            f"{f['psnr_min_db']:.1f} / {f['psnr_mean_db']:.1f}",
        })

    row("RoboCache LeRobotDataset (fork)", "robocache", "robocache-lerobot",
        "robocache-lerobot/fork")
    row("RoboCache LeRobotDataset (forkserver)", "robocache", "robocache-lerobot",
        "robocache-lerobot/forkserver")
    row("RoboCache RobotDataset batches (fork)", "robocache", "robocache-robot",
        "robocache-robot/fork", "robocache-robot/fork")
    row("lerobot-lancedb LanceDBDataset (forkserver)", "lerobot_lancedb", "lancedb",
        "lancedb/forkserver", "lancedb/forkserver")
    row("lerobot-lancedb LanceDBDataset (fork)", "lerobot_lancedb", "lancedb", "lancedb/fork")
    row("LeRobot LeRobotDataset (fork)", "lerobot", "lerobot", "lerobot/fork")
    return rows


def print_table(rows: list[dict]) -> None:
    cols = list(rows[0])
    width = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    print(" | ".join(c.ljust(width[c]) for c in cols))
    print("-+-".join("-" * width[c] for c in cols))
    for r in rows:
        print(" | ".join(str(r[c]).ljust(width[c]) for c in cols))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--work", default="/tmp/sbs", help="dataset, caches, logs (default /tmp/sbs)")
    p.add_argument("--peers-python", default="/work/venvs/lerobot/bin/python",
                   help="the interpreter with lerobot 0.6.1 and lerobot-lancedb 0.3.1")
    p.add_argument("--robocache-python", default=sys.executable,
                   help="the interpreter with robocache (default: this one)")
    p.add_argument("--moto-python", default=None,
                   help="the interpreter to run moto's server (default: RoboCache's)")
    p.add_argument("--episodes", type=int, default=30)
    p.add_argument("--frames", type=int, default=300)
    p.add_argument("--height", type=int, default=240)
    p.add_argument("--width", type=int, default=320)
    p.add_argument("--rewrite-dataset", action="store_true",
                   help="write the dataset again even if --work holds one")
    p.add_argument("--skip-s3", action="store_true")
    p.add_argument("--json", type=Path, help="write the results here")
    a = p.parse_args(argv)
    if a.role:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        result = ROLES[a.role](json.loads(a.spec))
        Path(a.out).write_text(json.dumps(result, default=str))
        return
    res = main_driver(a)
    print_table(res["table"])
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(res, indent=1, default=str) + "\n")
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
