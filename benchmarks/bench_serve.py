"""Serving out of core: open time, memory, and speed from local disk and from an object store,
against the in-RAM path in the same run.

    $ robocache bench serve --json benchmarks/results/serve.json
    $ python benchmarks/bench_serve.py --quick            # CPU smoke run (small caches)
    $ python benchmarks/bench_serve.py --parts open,camera --json out.json

Caches are made here, synthetically but in the real layout (:func:`synthetic_cache`: a tiny
cache built by ``robocache.data.cache.build`` gives the schema, manifest and stats; its tables
are then rewritten with ``episodes`` x ``steps`` rows, 6-D state and action, and camera frames
cycled from a pool of textured 480x640 JPEGs, q95 4:4:4, ~100 KB each, as the build stores
them). Parts (``--parts``, comma-separated; default all):

- ``open``: ``RobotDataset(cache)`` in a fresh interpreter: the first open on the machine (it
  makes the served index) and a later one (it maps it), for caches of 1k, 10k and 100k
  episodes, and two caches with the same steps and 2 KB against 64 KB frames (the open must
  not depend on frame bytes).
- ``camera``: ``RobotLoader`` batches of 256 samples (two cameras, one frame each: 512
  480x640 JPEG frames, served at 224x224 float32, nvJPEG on the GPU; the CPU otherwise),
  resident, over ``batches`` batches after two warm-up batches: ``in-ram`` (``in_memory=True``),
  ``disk-cold`` (out of core, the cache's files evicted from the page cache with
  ``posix_fadvise(DONTNEED)`` first: every frame read comes from the disk), ``disk-warm`` (out
  of core, page cache kept) and ``s3`` (the same cache published to moto's S3 server on
  127.0.0.1); each records samples/s, frames/s and the bytes read from the store per byte of
  frames served (Lance's I/O counters).
- ``numeric``: windows (history 2, horizon 16, 24-D state, 16-D action, batch 256) by 8
  DataLoader workers on the CPU (``RobotLoader(num_workers=8)``): ``in-ram`` against the served
  index mapped with its pages evicted first (``mapped-cold``).
- ``memory``: a ``DataLoader`` of 8 workers (fork) serving camera batches decoded on the CPU,
  main and workers in one cgroup whose ``memory.max`` is a quarter of the frames' bytes
  (when this machine lets a cgroup be made; otherwise no limit, said so): peak memory of the
  group, the processes' PSS, and whether any was killed. Then the same cache served by 1 and
  by 8 processes (each its own interpreter, as DDP ranks): the sum of their PSS growth against
  one's.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from robocache.bench import harness as H
from robocache.bench.standalone import main

FAMILY = "serve"
CAMS = ("observation.images.left", "observation.images.right")
FULL = {"hw": (480, 640), "pool": 64, "open_sizes": (1_000, 10_000, 100_000), "open_steps": 20,
        "bytes_episodes": 10_000, "bytes_steps": 10, "bytes_frames": (2_000, 64_000),
        "cam_episodes": 300, "cam_steps": 40, "s3_episodes": 12, "s3_batches": 6,
        "mem_episodes": 600,
        "batch": 256, "batches": 30, "num_episodes": 2_000, "num_steps": 500, "workers": 8,
        "ranks": 8, "rank_episodes": 4_000, "rank_steps": 5_000}
QUICK = {"hw": (48, 64), "pool": 4, "open_sizes": (50,), "open_steps": 10,
         "bytes_episodes": 40, "bytes_steps": 5, "bytes_frames": (200, 4_000),
         "cam_episodes": 12, "cam_steps": 10, "s3_episodes": 6, "s3_batches": 2,
         "mem_episodes": 12,
         "batch": 8, "batches": 3, "num_episodes": 20, "num_steps": 50, "workers": 2,
         "ranks": 2, "rank_episodes": 20, "rank_steps": 50}
PARTS = ("open", "camera", "s3", "numeric", "memory", "ranks")


# ── synthetic caches ─────────────────────────────────────────────────

def jpeg_pool(n: int, hw: tuple[int, int], seed: int = 0) -> list[bytes]:
    """``n`` textured frames (a gradient scene, sensor noise, a moving box), JPEG q95 4:4:4."""
    from robocache.data.cameras import encode

    rng = np.random.default_rng(seed)
    h, w = hw
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack([128 + 60 * np.sin(x / 23), 128 + 60 * np.cos(y / 17),
                     100 + 50 * np.sin((x + y) / 31)], -1)
    out = []
    for i in range(n):
        img = base + rng.normal(0, 2, (h, w, 3)).astype(np.float32)
        cy, cx = int(h * (0.2 + 0.6 * i / n)), int(w * (0.7 - 0.5 * i / n))
        img[max(cy - h // 10, 0):cy + h // 10, max(cx - w // 10, 0):cx + w // 10] = (200, 60, 40)
        out.append(encode(img.clip(0, 255).astype(np.uint8), "jpeg", 95, "444"))
    return out


def _template(tmp: Path, hw: tuple[int, int], cameras: bool) -> Path:
    """A real two-episode cache (LeRobot source, ``build``) with the streams of the synthetic
    ones: its schemas, manifest and stats (made once per frame size)."""
    from robocache.data.cache import build
    from robocache.data.episode import Episode, Stream, StreamSpec
    from robocache.data.formats.lerobot import write_lerobot

    specs = {k: StreamSpec(k, "numeric", "float32", (6,), 30.0)
             for k in ("observation.state", "action")}
    if cameras:
        specs.update({k: StreamSpec(k, "image", "uint8", (*hw, 3), 30.0) for k in CAMS})
    root = tmp / (f"template-{hw[0]}x{hw[1]}" if cameras else "template-numeric")
    if (root / "template" / "manifest.json").exists():
        return root / "template"
    rng = np.random.default_rng(0)
    t = np.arange(4) / 30.0
    eps = [Episode(i, {k: Stream(s, t, rng.integers(0, 255, (4, *s.shape), np.uint8)
                                 if s.kind == "image" else
                                 rng.normal(size=(4, *s.shape)).astype(np.float32))
                       for k, s in specs.items()}, {"tasks": ["bench"]}) for i in range(2)]
    write_lerobot(root / "src", eps, specs, fps=30.0, version="v3.0")
    build(root / "src", root / "template", rate_hz="native", progress=False, device="cpu")
    return root / "template"


def synthetic_cache(dest: Path, template: Path, episodes: int, steps: int,
                    pool: list[bytes] | None, chunk: int = 1 << 20) -> Path:
    """A cache like ``template`` with ``episodes`` x ``steps`` rows (random state and action)
    and, when ``pool`` is given, every camera's frames cycled from it (one frame a step)."""
    import lance
    import pyarrow as pa

    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    manifest = json.loads((template / "manifest.json").read_text())
    shutil.copy(template / manifest["stats_path"], dest / manifest["stats_path"])
    schema = lance.dataset(str(template / "data.lance")).schema
    rows = episodes * steps
    rng = np.random.default_rng(1)

    def data_batches():
        for a in range(0, rows, chunk):
            n = min(chunk, rows - a)
            g = np.arange(a, a + n)
            cols = {"episode_index": g // steps, "step": g % steps,
                    "timestamp": (g % steps) / 30.0, "task": pa.array(["bench"] * n)}
            for f in schema:
                if f.name in cols:
                    continue
                if f.name.endswith("_is_pad"):
                    cols[f.name] = np.zeros(n, bool)
                elif f.name.endswith("/frame"):
                    cols[f.name] = g % steps
                elif f.name.endswith("/offset"):
                    cols[f.name] = np.zeros(n, np.float32)
                else:
                    dim = f.type.list_size
                    cols[f.name] = pa.FixedSizeListArray.from_arrays(
                        pa.array(rng.normal(size=n * dim).astype(np.float32)), dim)
            yield pa.record_batch([cols[f.name] for f in schema], schema=schema)

    lance.write_dataset(pa.RecordBatchReader.from_batches(schema, data_batches()),
                        str(dest / "data.lance"), max_rows_per_file=1 << 26)
    if pool is not None:
        for c, cam in enumerate(CAMS):
            fschema = lance.dataset(str(template / "frames" / f"{cam}.lance")).schema
            lance.write_dataset(pa.RecordBatchReader.from_batches(
                fschema, _frame_batches(fschema, pool, rows, steps, c)),
                str(dest / "frames" / f"{cam}.lance"), max_rows_per_file=1 << 26)
    else:
        manifest["streams"] = {k: v for k, v in manifest["streams"].items()
                               if v["kind"] not in ("image", "video")}
    manifest.pop("source_files", None)
    manifest.pop("episode_files", None)
    manifest.pop("episode_digests", None)
    manifest["episodes"] = [{"index": i, "rows": steps, "start_s": 0.0,
                             "duration_s": (steps - 1) / 30.0, "task": "bench"}
                            for i in range(episodes)]
    manifest["counts"] = {**manifest["counts"], "read": episodes, "cached": episodes,
                          "new": episodes, "rows": rows}
    manifest["created"] = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()) + \
        f"#{episodes}x{steps}"
    (dest / "manifest.json").write_text(json.dumps(manifest))
    return dest


def unique(frame: bytes, i: int) -> bytes:
    """JPEG ``frame`` with a comment segment holding ``i`` after its start marker: the same
    pixels, bytes of its own (a table of a few distinct frames repeated would be stored as a
    dictionary of them: Lance encodes low-cardinality columns so, and nothing would be read
    from the disk)."""
    return frame[:2] + b"\xff\xfe\x00\x0a" + int(i).to_bytes(8, "little") + frame[2:]


def _frame_batches(schema, pool: list[bytes], rows: int, steps: int, cam: int):
    """A synthetic frame table's record batches (~256 MB each): camera ``cam``'s frame of
    every step, cycled from ``pool``."""
    import pyarrow as pa

    per = max(1, (256 << 20) // max(len(p) for p in pool))
    for a in range(0, rows, per):
        g = np.arange(a, min(a + per, rows))
        cols = {"episode_index": g // steps, "frame": g % steps, "source_frame": g % steps,
                "timestamp": (g % steps) / 30.0,
                "encoded": pa.array([unique(pool[(i * 7 + cam) % len(pool)], i) for i in g],
                                    pa.binary())}
        yield pa.record_batch([cols[f.name] for f in schema], schema=schema)


def evict(*roots: Path) -> int:
    """Drop the files under ``roots`` from the page cache (``posix_fadvise(DONTNEED)``, which
    needs no privileges); the bytes evicted."""
    n = 0
    os.sync()
    for root in roots:
        for p in [root] if root.is_file() else root.rglob("*"):
            if p.is_file():
                fd = os.open(p, os.O_RDONLY)
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
                n += p.stat().st_size
    return n


def tree_bytes(root: Path, sub: str = "") -> int:
    return sum(p.stat().st_size for p in (root / sub).rglob("*") if p.is_file())


def _env(serve: Path) -> dict[str, str]:
    return {**os.environ, "ROBOCACHE_SERVE_DIR": str(serve),
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}


# ── open ─────────────────────────────────────────────────────────────

OPEN = """
import json, sys, time
t0 = time.perf_counter()
from robocache.data import RobotDataset
import lance, torch  # noqa: F401
t1 = time.perf_counter()
ds = RobotDataset(sys.argv[1])
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "open_s": t2 - t1, "samples": len(ds)}))
"""


def _open_once(cache: Path, serve: Path) -> dict:
    r = subprocess.run([sys.executable, "-c", OPEN, str(cache)], env=_env(serve),
                       capture_output=True, text=True, timeout=600)
    if r.returncode:
        raise RuntimeError(r.stderr[-2000:])
    return json.loads(r.stdout.strip().splitlines()[-1])


def open_cases(tmp: Path, cfg: dict, report) -> None:
    template = _template(tmp, cfg["hw"], cameras=False)
    cam_template = _template(tmp, (16, 16), cameras=True)
    caches = [(f"{e}-episodes-x{cfg['open_steps']}", template, e, cfg["open_steps"], None)
              for e in cfg["open_sizes"]]
    caches += [(f"{cfg['bytes_episodes']}-episodes-x{cfg['bytes_steps']}-frames-{b}B",
                cam_template, cfg["bytes_episodes"], cfg["bytes_steps"],
                [bytes([k]) * b for k in range(8)]) for b in cfg["bytes_frames"]]
    for name, tpl, e, s, pool in caches:
        cache = synthetic_cache(tmp / "open" / name, tpl, e, s, pool)
        serve = tmp / "serve-open" / name
        first, again = _open_once(cache, serve), _open_once(cache, serve)
        for impl, got in (("first-open", first), ("open", again)):
            report(H.case(FAMILY, name, impl, H.summarize([got["open_s"] * 1e3]),
                          episodes=e, steps=e * s, cache_bytes=tree_bytes(cache),
                          frame_bytes=tree_bytes(cache, "frames") if pool else 0,
                          served_index_bytes=tree_bytes(serve),
                          note=f"{got['open_s']:.3f} s ("
                               + ("makes" if impl == "first-open" else "maps")
                               + " the served index)"))
        shutil.rmtree(cache)


# ── camera batches ───────────────────────────────────────────────────

def _stores_io(ds) -> int:
    """Bytes Lance read for the dataset's frame tables since the last call."""
    total = 0
    for f in ds.frames.values():
        t = getattr(f, "_table", None)
        if t is not None:
            total += t.io_stats_incremental().read_bytes
    return total


def _serve_batches(ds, cfg: dict, device: torch.device, read_ahead: int = 4) -> dict:
    """Samples/s of a resident RobotLoader over ``ds``, and the frame bytes served."""
    from robocache.data import RobotLoader

    loader = RobotLoader(ds, cfg["batch"], device=device, normalize=None, seed=0,
                         read_ahead=read_ahead)

    def epochs():
        while True:
            yield from loader

    it = epochs()
    for _ in range(2):
        next(it)
    if device.type == "cuda":
        torch.cuda.synchronize()
    _stores_io(ds)
    t0 = time.perf_counter()
    for _ in range(cfg["batches"]):
        next(it)
    if device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    del it
    return {"seconds": seconds, "samples": cfg["batches"] * cfg["batch"],
            "frames": cfg["batches"] * cfg["batch"] * len(ds.image_keys),
            "read": _stores_io(ds)}


def _camera_setup(tmp: Path, cfg: dict):
    pool = jpeg_pool(cfg["pool"], cfg["hw"])
    frame_kb = float(np.mean([len(p) for p in pool])) / 1e3
    template = _template(tmp, cfg["hw"], cameras=True)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def record(report, name, impl, got, cache, extra=None):
        frames_bytes = got["frames"] * frame_kb * 1e3
        rec = H.case(FAMILY, name, impl, H.summarize([got["seconds"] * 1e3 / cfg["batches"]]),
                     samples_per_s=got["samples"] / got["seconds"],
                     frames_per_s=got["frames"] / got["seconds"], frame_kB=frame_kb,
                     read_per_frame_byte=got["read"] / frames_bytes if got["read"] else None,
                     frame_bytes=tree_bytes(cache, "frames"), batch=cfg["batch"],
                     **(extra or {}))
        rec["note"] = f"{rec['samples_per_s']:,.0f} samples/s, {rec['frames_per_s']:,.0f} frames/s"
        report(rec)
        return rec

    name = f"{cfg['hw'][0]}x{cfg['hw'][1]}-2cams-b{cfg['batch']}-to224"
    return pool, template, device, record, name


def camera_cases(tmp: Path, cfg: dict, report) -> None:
    from robocache.data import RobotDataset

    pool, template, device, record, name = _camera_setup(tmp, cfg)
    kw = dict(keys=list(CAMS), image_size=(224, 224))
    big = synthetic_cache(tmp / "cam", template, cfg["cam_episodes"], cfg["cam_steps"], pool)
    ram = RobotDataset(big, in_memory=True, **kw)
    base = record(report, name, "in-ram", _serve_batches(ram, cfg, device), big)
    del ram
    ooc = RobotDataset(big, **kw)
    for read_ahead in (4, 16):
        evict(big, ooc.served.path)
        got = _serve_batches(ooc, cfg, device, read_ahead)
        record(report, name, "disk-cold" if read_ahead == 4 else f"disk-cold-ra{read_ahead}",
               got, big, {"vs_in_ram": got["samples"] / got["seconds"] /
                          base["samples_per_s"], "read_ahead": read_ahead})
    record(report, name, "disk-warm", _serve_batches(ooc, cfg, device), big)
    # the storage's own rate: the frame files read whole, every core, past the page cache
    evict(big)
    H.raw_reads(FAMILY, name, sorted(p for p in (big / "frames").rglob("*.lance")
                                     if p.is_file()), report)
    shutil.rmtree(big)


def s3_cases(tmp: Path, cfg: dict, report, s3) -> None:
    from robocache.data import RobotDataset
    from robocache.data.location import Location
    from robocache.data.publish import publish

    pool, template, device, record, name = _camera_setup(tmp, cfg)
    kw = dict(keys=list(CAMS), image_size=(224, 224))
    small = synthetic_cache(tmp / "cam-s3", template, cfg["s3_episodes"], cfg["cam_steps"],
                            pool)
    uri = f"s3://{s3.bucket()}/cam"
    t0 = time.perf_counter()
    publish(small, Location(uri, s3.options()))
    up = time.perf_counter() - t0
    name = f"{name}-{cfg['s3_episodes']}ep"
    few = {**cfg, "batches": cfg["s3_batches"]}
    local = RobotDataset(small, **kw)
    evict(small, local.served.path)
    disk = record(report, name, "disk-cold", _serve_batches(local, few, device), small)
    remote = RobotDataset(uri, storage_options=s3.options(), **kw)
    got = _serve_batches(remote, few, device)
    record(report, name, "s3", got, small, {
        "publish_s": up, "vs_disk": got["samples"] / got["seconds"] / disk["samples_per_s"]})
    report(H.case(FAMILY, name, "s3-raw-get", H.summarize([0.0]), **_raw_s3(s3, uri)))
    shutil.rmtree(small)


def _raw_s3(s3, uri: str) -> dict:
    """The S3 server's own rate: the frame table's data files read whole, 16 at once, over
    the same connection settings (the ceiling of what a reader can get from this server)."""
    from concurrent.futures import ThreadPoolExecutor

    from robocache.data.location import Location

    loc = Location(uri, s3.options())
    fs = loc._filesystem()
    files = [loc._key(f) for f in loc.sizes(f"frames/{CAMS[0]}.lance/data")]

    def read(key: str) -> int:
        with fs.open_input_file(key) as f:
            return len(f.read())

    t0 = time.perf_counter()
    with ThreadPoolExecutor(16) as pool:
        total = sum(pool.map(read, files))
    seconds = time.perf_counter() - t0
    return {"MB_per_s": total / seconds / 1e6, "bytes": total,
            "note": f"{total / seconds / 1e6:,.0f} MB/s: the server's whole-file GET rate"}


# ── numeric windows ──────────────────────────────────────────────────

def numeric_cases(tmp: Path, cfg: dict, report) -> None:
    from robocache.data import RobotDataset, RobotLoader

    template = _template(tmp, cfg["hw"], cameras=False)
    cache = synthetic_cache(tmp / "num", template, cfg["num_episodes"], cfg["num_steps"], None)
    name = f"{cfg['num_episodes']}x{cfg['num_steps']}-h2-H16-b{cfg['batch']}-w{cfg['workers']}"
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rates = {}
    for impl, in_memory in (("in-ram", True), ("mapped-cold", False)):
        ds = RobotDataset(cache, history=2, horizon=16, in_memory=in_memory)
        if not in_memory:
            evict(ds.served.path)
        loader = RobotLoader(ds, cfg["batch"], device=device, num_workers=cfg["workers"],
                             seed=0)
        it = iter(loader)
        next(it)
        t0 = time.perf_counter()
        n = 0
        for _ in range(cfg["batches"] * 4):
            n += next(it)["index"].shape[0]
        if device.type == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        rates[impl] = n / seconds
        del it, loader
        report(H.case(FAMILY, name, impl, H.summarize([seconds * 1e3 / (cfg["batches"] * 4)]),
                      samples_per_s=rates[impl], vs_in_ram=rates[impl] / rates["in-ram"],
                      note=f"{rates[impl]:,.0f} samples/s"))
    shutil.rmtree(cache)


# ── memory ───────────────────────────────────────────────────────────

def _rollup(pid: int, *fields: str) -> int:
    """The sum of ``fields`` of ``/proc/<pid>/smaps_rollup``, in bytes."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        return sum(int(line.split()[1]) * 1024 for line in f if line.startswith(fields))


def _pss(pid: int) -> int:
    return _rollup(pid, "Pss:")


def _uss(pid: int) -> int:
    """Bytes only this process maps (its private pages)."""
    return _rollup(pid, "Private_Clean:", "Private_Dirty:")


def _cgroup(limit: int) -> Path | None:
    """A cgroup v2 group with ``memory.max = limit`` this process can move children into, or
    None where the machine does not allow it."""
    root = Path("/sys/fs/cgroup")
    try:
        if "memory" not in (root / "cgroup.controllers").read_text().split():
            return None
        group = root / f"robocache-bench-{os.getpid()}"
        group.mkdir(exist_ok=True)
        (group / "memory.max").write_text(str(limit))
        return group
    except OSError:
        return None


LOADER = """
import json, os, sys, time
import torch
from robocache.data import RobotDataset
cache, workers, batches = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
ds = RobotDataset(cache, keys=sys.argv[4].split(","), image_size=(224, 224))
loader = torch.utils.data.DataLoader(ds, batch_size=32, shuffle=True, num_workers=workers,
                                     persistent_workers=True, prefetch_factor=2)
it = iter(loader)
next(it)
pids = [w.pid for w in it._workers]
t0 = time.perf_counter()
for _ in range(batches):
    next(it)
def pss(pid):
    for line in open(f"/proc/{pid}/smaps_rollup"):
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
print(json.dumps({"seconds": time.perf_counter() - t0, "pss": [pss(p) for p in
                  [os.getpid(), *pids]], "samples": batches * 32}), flush=True)
"""

RANK = """
import json, os, sys, time
import torch
from robocache.data import RobotDataset
def pss():
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
base = pss()
ds = RobotDataset(sys.argv[1], history=2, horizon=16)
for t in (ds.data, ds.episode_index, ds.step, ds.timestamp, ds.task_id):
    t.sum()  # every page read once, as an epoch of windows over the whole dataset reads them
g = torch.Generator().manual_seed(int(sys.argv[2]))
for _ in range(int(sys.argv[3])):
    ds[torch.randint(len(ds), (256,), generator=g)]
print(json.dumps({"before": base, "after": pss()}), flush=True)
time.sleep(float(sys.argv[4]))  # alive while the others measure: their shared pages split
"""


def memory_cases(tmp: Path, cfg: dict, report) -> None:
    pool = jpeg_pool(cfg["pool"], cfg["hw"])
    template = _template(tmp, cfg["hw"], cameras=True)
    cache = synthetic_cache(tmp / "mem", template, cfg["mem_episodes"], cfg["cam_steps"], pool)
    frames = tree_bytes(cache, "frames")
    serve = tmp / "serve-mem"
    _open_once(cache, serve)  # the served index, made before the limited run
    limit = frames // 4
    group = _cgroup(limit)
    cmd = [sys.executable, "-c", LOADER, str(cache), str(cfg["workers"]),
           str(cfg["batches"]), ",".join(CAMS)]
    evict(cache)
    proc = subprocess.Popen(cmd, env=_env(serve), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=(lambda: (group / "cgroup.procs").write_text("0"))
                            if group else None)
    out, err = proc.communicate(timeout=900)
    peak = int((group / "memory.peak").read_text()) if group and \
        (group / "memory.peak").exists() else None
    killed = proc.returncode != 0
    got = json.loads(out.strip().splitlines()[-1]) if not killed else {}
    name = f"{cfg['workers']}-workers-frames-{frames / 1e9:.1f}GB"
    report(H.case(FAMILY, name, "dataloader-fork", H.summarize([got.get("seconds", 0) * 1e3]),
                  limit_bytes=limit if group else None, peak_bytes=peak, killed=killed,
                  frame_bytes=frames, pss_bytes=got.get("pss"),
                  pss_total=sum(got.get("pss", [])),
                  samples_per_s=got["samples"] / got["seconds"] if got else None,
                  how="cgroup v2 memory.max" if group else "no limit (no cgroup here); "
                  "page cache evicted before the run",
                  error=err[-500:] if killed else None,
                  note=(f"limit {limit / 1e9:.2f} GB, peak {peak / 1e9:.2f} GB" if peak else
                        "no cgroup") + (", killed" if killed else "")))
    if group:
        group.rmdir()
    shutil.rmtree(cache)


def ranks_cases(tmp: Path, cfg: dict, report) -> None:
    """1, then N processes (DDP ranks: each its own interpreter) serving one cache: each maps
    the served index, reads all of it once (what an epoch of windows spread over the whole
    dataset comes to) and serves random batches; the sum of their PSS growth against one's."""
    serve = tmp / "serve-ranks"
    num = synthetic_cache(tmp / "ranks", _template(tmp, cfg["hw"], cameras=False),
                          cfg["rank_episodes"], cfg["rank_steps"], None)
    _open_once(num, serve)
    growth, private = {}, {}
    for n in (1, cfg["ranks"]):
        procs = [subprocess.Popen([sys.executable, "-c", RANK, str(num), str(r), "40",
                                   str(4 + n)], env=_env(serve), stdout=subprocess.PIPE,
                                  text=True) for r in range(n)]
        lines = [p.stdout.readline() for p in procs]
        time.sleep(2)  # every rank has read the index: its shared pages are split now
        pss_now = [_pss(p.pid) for p in procs]
        uss = [_uss(p.pid) for p in procs]
        for p in procs:
            p.wait(timeout=300)
        before = [json.loads(line)["before"] for line in lines]
        growth[n] = sum(a - b for a, b in zip(pss_now, before, strict=True))
        private[n] = sum(uss) / n
    ratio = growth[cfg["ranks"]] / max(growth[1], 1)
    index = tree_bytes(serve)
    report(H.case(FAMILY, f"ranks-{cfg['rank_episodes']}x{cfg['rank_steps']}", "pss-growth",
                  H.summarize([0.0]), index_bytes=index, one_bytes=growth[1],
                  many_bytes=growth[cfg["ranks"]], ranks=cfg["ranks"], ratio=ratio,
                  per_rank_private_bytes=(growth[cfg["ranks"]] - index) / cfg["ranks"],
                  mean_uss_bytes=private[cfg["ranks"]],
                  note=f"{cfg['ranks']} processes hold {ratio:.2f}x one's PSS growth "
                       f"(index {index / 1e9:.2f} GB)"))
    shutil.rmtree(num)


# ── entry point ──────────────────────────────────────────────────────

def _s3():
    """moto's S3 server on 127.0.0.1, or None where moto is not installed."""
    try:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        from s3server import S3Server
    except ImportError:
        return None
    try:
        return S3Server(Path(tempfile.mkdtemp()) / "moto.log")
    except Exception:  # pytest.skip's exception where moto is absent
        return None


def run(quick: bool = False, copy_gbps: float | None = None, report=None,
        parts: str | None = None, workdir: str | None = None) -> list[dict]:
    cfg = QUICK if quick else FULL
    chosen = [p for p in (parts or ",".join(PARTS)).split(",") if p]
    out: list[dict] = []
    report = report or out.append
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        tmp = Path(tmp)
        if "open" in chosen:
            open_cases(tmp, cfg, report)
        if "camera" in chosen:
            camera_cases(tmp, cfg, report)
        if "s3" in chosen:
            s3 = _s3()
            if s3 is None:
                report(H.case(FAMILY, "s3", "skipped", H.summarize([0.0]),
                              note="no S3 server: moto is not installed"))
            else:
                try:
                    s3_cases(tmp, cfg, report, s3)
                finally:
                    s3.stop()
        if "numeric" in chosen:
            numeric_cases(tmp, cfg, report)
        if "memory" in chosen:
            memory_cases(tmp, cfg, report)
        if "ranks" in chosen:
            ranks_cases(tmp, cfg, report)
    return out


if __name__ == "__main__":
    main(run, __doc__, {"parts": (str, f"comma-separated parts of {PARTS}"),
                        "workdir": (str, "folder for the caches (default: the system's temp)")})
