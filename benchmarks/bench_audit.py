"""Benchmark ``robocache audit``: the checks over packed episodes, and a whole audit of a
synthetic cache of DROID's shape (76,000 episodes of about 300 steps at 15 Hz, an 8-D state
and a 7-D action), with planted near-duplicates to score the near-duplicate search.

    $ robocache bench audit --json benchmarks/results/audit.json
    $ python benchmarks/bench_audit.py --quick

Cases:

- ``checks``: :func:`robocache.ops.audit.stream_checks` of one ``[N, D]`` float32 stream,
  :func:`~robocache.ops.audit.longest_runs`, :func:`~robocache.ops.audit.timing_checks` and
  :func:`~robocache.ops.audit.sample_every` over E packed episodes, on the GPU (``robocache``)
  and on the CPU (``robocache_cpu``); minimum bytes: the values, pads and timestamps read once.
- ``cache``: :func:`robocache.data.audit.audit` of the synthetic cache, written straight as a
  Lance table beside a manifest and statistics (no camera): wall time (the scan of
  ``data.lance`` included) for the target of 60 s on one node with a GPU. Its planted
  near-duplicates (copies of other episodes with noise of 0.2 % of the range; copies cut
  at their start by 5 steps, a third of a second; copies cut at their end by 10 %) give
  the search's recall per kind of copy and its precision (pairs found that were not planted
  count against it).
- ``edit``: :func:`robocache.data.edit.edit` deleting 1,000 episodes of that cache (``--quick``:
  10) — Lance deletions and the statistics computed again — for the target of 10 s; then
  windows (history 2, horizon 16, batches of 256 at random) read from the edited and from an
  unedited copy, samples/s each (the best of three, alternated): deletions should cost
  nothing when reading.
- ``cameras``: the audit's camera checks against serving's decode of the same frames, for
  the target of 50 %. bench video's LeRobot dataset (4 cameras of textured moving scenes,
  480x640, 6 episodes of 100 frames at 30 fps, LeRobot's recording settings) as AV1 and H.264,
  ingested with the frames kept as video, and the H.264 one decoded into JPEG q95 (the
  default). Per cache, after one audit (the frames into the page cache): frames/s of the
  camera checks alone (:func:`camera_checks`: every frame read, decoded and checked as the
  audit does; the timing is theirs, 3 runs, the rate from the best) and of a whole
  :func:`~robocache.data.audit.audit` (the numeric checks, the scans and the report
  included; ``audit_ms``: 3 runs, the rate from the best), and of ``RobotLoader`` batches
  of single frames of the 4 cameras (``history=1``, uint8, no resize) over one epoch,
  every frame once, in random order (training's) and in order (the best a video GOP can
  do), on the same device; ``vs_serve``: the camera checks' rate over the faster of the two
  (``audit_vs_serve``: the whole audit's). Each also records the process's CPU time a frame
  (every thread's) of the camera checks and of serving, which a shared machine's load
  changes less than the rates.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from robocache.bench import harness as H
from robocache.bench.standalone import main

FAMILY = "audit"
FULL = {"episodes": 76_000, "steps": 300, "copies": 300}
QUICK = {"episodes": 600, "steps": 60, "copies": 20}
CAMERAS_FULL = {"hw": (480, 640), "episodes": 6, "length": 100, "batch": 64}
CAMERAS_QUICK = {"hw": (48, 64), "episodes": 3, "length": 12, "batch": 4}
PARTS = ("checks", "cache", "cameras")
RATE = 15.0


def _packed(episodes: int, steps: int, dim: int, device: str, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(steps // 2, steps * 3 // 2, (episodes,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    n = int(offsets[-1])
    values = torch.randn(n, dim, generator=g).cumsum(0) * 0.01
    pad = torch.rand(n, generator=g) < 0.001
    times = torch.arange(n, dtype=torch.float64) / RATE
    return values.to(device), offsets.to(device), pad.to(device), times.to(device)


def run_checks(episodes: int, steps: int, device: str, copy_gbps) -> list[dict]:
    from robocache.ops.audit import longest_runs, sample_every, stream_checks, timing_checks

    dim = 8
    values, offsets, pad, times = _packed(episodes, steps, dim, device)
    b = {k: torch.full((dim,), v) for k, v in (("lo", -5.0), ("hi", 5.0), ("jump", 0.5),
                                                ("still", 1e-3))}

    def all_checks():
        c = stream_checks(values, offsets, pad, **b)
        longest_runs(c.still, offsets)
        timing_checks(times, offsets, 1 / RATE)
        return sample_every(values, offsets, RATE * 0.5, 64)

    n = values.shape[0]
    nbytes = n * (dim * 4 + 1 + 8)
    name = f"E{episodes}-N{n}-D{dim}-fp32"
    timing = H.gpu_time(all_checks) if device == "cuda" else H.cpu_time(all_checks, repeats=3)
    impl = "robocache" if device == "cuda" else "robocache_cpu"
    return [H.case(FAMILY, name, impl, timing, nbytes=nbytes, copy_gbps=copy_gbps)]


def write_cache(root: Path, episodes: int, steps: int, copies: int, seed: int = 0
                ) -> dict[str, list[tuple[int, int]]]:
    """The synthetic cache at ``root`` (see the module docstring); returns the planted
    near-duplicate pairs by kind."""
    import lance
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    lengths = rng.integers(steps * 2 // 3, steps * 4 // 3, episodes)
    kinds = ("noise", "shift", "truncate")
    planted: dict[str, list[tuple[int, int]]] = {k: [] for k in kinds}
    copy_of = {}
    for j, e in enumerate(rng.choice(np.arange(episodes // 2), copies, replace=False)):
        target = episodes // 2 + j
        copy_of[target] = (int(e), kinds[j % 3])
        lengths[target] = {"noise": lengths[e], "shift": lengths[e] - 5,
                           "truncate": lengths[e] * 9 // 10}[kinds[j % 3]]
        planted[kinds[j % 3]].append((int(e), int(target)))
    schema = pa.schema([("episode_index", pa.int64()), ("step", pa.int64()),
                        ("timestamp", pa.float64()), ("task", pa.string()),
                        ("observation/state", pa.list_(pa.float32(), 8)),
                        ("observation/state_is_pad", pa.bool_()),
                        ("action", pa.list_(pa.float32(), 7)), ("action_is_pad", pa.bool_())])
    trajectories: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def episode(e: int):
        n = int(lengths[e])
        if e in copy_of:
            src, kind = copy_of[e]
            s, a = trajectories[src]
            if kind == "noise":
                s = s + rng.normal(0, 0.002 * 2, s.shape).astype(np.float32)
                a = a + rng.normal(0, 0.002 * 2, a.shape).astype(np.float32)
            elif kind == "shift":  # cut at its start: the same motion, 5 steps earlier
                s, a = s[5:], a[5:]
            else:
                s, a = s[:n], a[:n]
            return s, a
        t = np.arange(n)[:, None] / RATE
        phase, freq = rng.uniform(0, 6, (1, 15)), rng.uniform(0.05, 0.4, (1, 15))
        x = np.sin(2 * np.pi * freq * t + phase).astype(np.float32)
        return x[:, :8], x[:, 8:]

    def batches():
        start = 0
        while start < episodes:
            stop = min(episodes, start + 2000)
            cols = {k: [] for k in ("episode_index", "step", "timestamp", "state", "action")}
            for e in range(start, stop):
                s, a = episode(e)
                if e < episodes // 2:
                    trajectories[e] = (s, a)
                n = len(s)
                cols["episode_index"].append(np.full(n, e))
                cols["step"].append(np.arange(n))
                cols["timestamp"].append(np.arange(n) / RATE)
                cols["state"].append(s)
                cols["action"].append(a)
            c = {k: np.concatenate(v) for k, v in cols.items()}
            rows = len(c["step"])
            yield pa.record_batch([
                pa.array(c["episode_index"]), pa.array(c["step"]), pa.array(c["timestamp"]),
                pa.array(["pick up the object"] * rows),
                pa.FixedSizeListArray.from_arrays(pa.array(c["state"].reshape(-1)), 8),
                pa.array(np.zeros(rows, bool)),
                pa.FixedSizeListArray.from_arrays(pa.array(c["action"].reshape(-1)), 7),
                pa.array(np.zeros(rows, bool))], schema=schema)
            start = stop

    root.mkdir(parents=True, exist_ok=True)
    lance.write_dataset(pa.RecordBatchReader.from_batches(schema, batches()),
                        str(root / "data.lance"))
    from robocache.data.build.stats import _compute_stats
    from robocache.data.episode import StreamSpec

    specs = {name: StreamSpec(name, "numeric", "float32", (d,))
             for name, d in (("observation.state", 8), ("action", 7))}
    (root / "stats.json").write_text(json.dumps(_compute_stats(root / "data.lance", specs)))
    streams = {name: {"column": col, "kind": "numeric", "dtype": "float32", "shape": [d],
                      "dim": d, "source_rate_hz": RATE, "method": "linear"}
               for name, col, d in (("observation.state", "observation/state", 8),
                                    ("action", "action", 7))}
    manifest = {"format": "robocache-cache/1", "source": {"path": "synthetic", "format": "none"},
                "rate_hz": RATE, "native": True, "streams": streams, "status": "complete",
                "created": "synthetic", "counts": {"cached": episodes,
                                                   "rows": int(lengths.sum())},
                "episodes": [{"index": e, "rows": int(lengths[e]), "task": "pick up the object"}
                             for e in range(episodes)],
                "quarantined": [], "stats_path": "stats.json"}
    (root / "manifest.json").write_text(json.dumps(manifest))
    return planted


def _read_rate(cache: Path, batches: int = 50) -> float:
    from robocache.data import RobotDataset

    ds = RobotDataset(cache, history=2, horizon=16)
    g = torch.Generator().manual_seed(0)
    idx = [torch.randint(0, len(ds), (256,), generator=g) for _ in range(batches + 3)]
    for i in idx[:3]:
        ds[i]
    t0 = time.perf_counter()
    for i in idx[3:]:
        ds[i]
    return 256 * batches / (time.perf_counter() - t0)


def run_edit(root: Path, deleted: int, name: str, device: str) -> dict:
    import shutil

    from robocache.data.edit import Edit, edit

    plain = root.parent / "unedited"
    shutil.copytree(root, plain)
    t0 = time.perf_counter()
    edit(root, Edit(delete=list(range(0, deleted * 2, 2))))
    seconds = time.perf_counter() - t0
    rec = H.case(FAMILY, f"{name}-delete{deleted}", "edit", H.summarize([seconds * 1e3]))
    rates: dict[str, list[float]] = {"edited": [], "unedited": []}
    for _ in range(3):  # alternated, the best of each (a shared machine's noise is one-sided)
        rates["edited"].append(_read_rate(root))
        rates["unedited"].append(_read_rate(plain))
    rec.update({"edit_s": seconds,
                "read_samples_per_s": {k: max(v) for k, v in rates.items()}})
    return rec


def run_cache(episodes: int, steps: int, copies: int, device: str) -> list[dict]:
    from robocache.data.audit import audit

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "cache"
        t0 = time.perf_counter()
        planted = write_cache(root, episodes, steps, copies)
        written = time.perf_counter() - t0
        t0 = time.perf_counter()
        report = audit(root, device=device)
        seconds = time.perf_counter() - t0
        edited = run_edit(root, 1000 if episodes >= 10_000 else 10,
                          f"E{episodes}-steps{steps}-state8-action7", device)
    found = {(min(e, n), max(e, n)) for r in report["episodes"]
             for e in [r["index"]] for n in r["metrics"].get("near", [])}
    want = {p for pairs in planted.values() for p in pairs}
    recall = {k: sum(p in found for p in pairs) / max(len(pairs), 1)
              for k, pairs in planted.items()}
    precision = len(found & want) / max(len(found), 1)
    timing = H.summarize([seconds * 1e3])
    name = f"E{episodes}-steps{steps}-state8-action7"
    rec = H.case(FAMILY, name, "robocache" if device == "cuda" else "robocache_cpu", timing)
    rec.update({"rows": report and sum(r["rows"] for r in report["episodes"]),
                "write_s": written, "audit_s": seconds,
                "episodes_per_s": episodes / seconds,
                "near_duplicates": {"recall": recall, "precision": precision,
                                    "found_pairs": len(found), "planted_pairs": len(want)}})
    return [rec, edited]


def _cpu_s() -> float:
    """This process's CPU seconds so far (every thread's, user and system)."""
    import resource

    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _serve_frames(cache: Path, keys: list[str], cfg: dict, device: str, shuffle: bool
                  ) -> tuple[float, float]:
    """Frames/s of one epoch of ``RobotLoader`` single-frame batches of ``keys`` (every
    frame once), after two batches (the frames are in the page cache: the audit read them),
    and the CPU ms a frame it took."""
    from robocache.data import RobotDataset, RobotLoader

    ds = RobotDataset(cache, keys=keys, history=1, image_dtype=torch.uint8)
    loader = RobotLoader(ds, cfg["batch"], device=device, shuffle=shuffle, drop_last=False,
                         normalize=None, seed=0)
    warm = iter(loader)
    next(warm)
    next(warm)
    del warm
    cpu, t0 = _cpu_s(), time.perf_counter()
    for _ in loader:
        pass
    if device == "cuda":
        torch.cuda.synchronize()
    frames = len(ds) * len(keys)
    return frames / (time.perf_counter() - t0), 1e3 * (_cpu_s() - cpu) / frames


def camera_checks(cache: Path, device: str) -> dict:
    """The audit's camera checks alone (:func:`robocache.data.audit._pixels`, every frame of
    every camera read, decoded and checked as :func:`~robocache.data.audit.audit` does), on
    the cache's servable version: what the audit adds to the numeric checks' pass."""
    import robocache.data.audit as A
    from robocache.data import snapshot
    from robocache.data.location import LANCE, Location

    location = Location(cache)
    manifest = snapshot.servable(location, location.manifest())
    cameras = {k: s for k, s in manifest["streams"].items() if s["kind"] in ("image", "video")}
    with LANCE.call():
        return A._pixels(location, manifest, cameras, A._episode_rows(manifest),
                         A.AuditConfig(), A._pick_device(device))


def _timed(fn, runs: int = 3) -> tuple[list[float], float]:
    """Seconds of each of ``runs`` calls of ``fn`` and the CPU seconds of all of them."""
    seconds, cpu = [], _cpu_s()
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - t0)
    return seconds, _cpu_s() - cpu


def run_cameras(cfg: dict, device: str, report) -> None:
    import functools
    import shutil
    import sys

    import lance

    from robocache.data.audit import audit
    from robocache.data.cache import build

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_video import CAMS, source

    name = f"{len(CAMS)}cams-{cfg['hw'][0]}x{cfg['hw'][1]}-E{cfg['episodes']}x{cfg['length']}"
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        # JPEG first: the case furthest from its target, kept by a run cut at its time limit
        for codec, stored in (("h264", "jpeg"), ("h264", "video"), ("av1", "video")):
            src = tmp / f"src-{codec}"
            if not src.exists():
                source(src, cfg, codec)
            cache = tmp / f"cache-{codec}-{stored}"
            build(src, cache, rate_hz="native", progress=False, device=device,
                  camera_codec=stored)
            audit(cache, device=device)  # its frames into the page cache
            whole, _ = _timed(functools.partial(audit, cache, device=device))
            checks, cpu = _timed(functools.partial(camera_checks, cache, device))
            frames = sum(lance.dataset(str(p)).count_rows()
                         for p in (cache / "frames").glob("*.lance"))
            audit_rate, camera_rate = frames / min(whole), frames / min(checks)
            got = {order: _serve_frames(cache, list(CAMS), cfg, device, order == "random")
                   for order in ("random", "in_order")}
            serve = {order: rate for order, (rate, _) in got.items()}
            best = max(serve.values())
            report(H.case(FAMILY, f"{codec}-{stored}-{name}", "cameras",
                          H.summarize([s * 1e3 for s in checks]), frames=frames,
                          device=device, camera_frames_per_s=camera_rate,
                          camera_median_frames_per_s=frames / float(np.median(checks)),
                          audit_ms=[s * 1e3 for s in whole], audit_frames_per_s=audit_rate,
                          camera_cpu_ms_per_frame=1e3 * cpu / (len(checks) * frames),
                          serve_cpu_ms_per_frame={o: c for o, (_, c) in got.items()},
                          serve_frames_per_s=serve, vs_serve=camera_rate / best,
                          audit_vs_serve=audit_rate / best,
                          note=f"camera checks {camera_rate:,.0f} frames/s (whole audit "
                               f"{audit_rate:,.0f}), serving {serve['random']:,.0f} (random) "
                               f"/ {serve['in_order']:,.0f} (in order): "
                               f"{camera_rate / best:.0%} ({audit_rate / best:.0%})"))
            shutil.rmtree(cache)


def run(quick: bool = False, copy_gbps: float | None = None, report=None,
        parts: str | None = None) -> list[dict]:
    cuda = torch.cuda.is_available() and not quick
    size = QUICK if quick or not cuda else FULL
    device = "cuda" if cuda else "cpu"
    chosen = (parts or ",".join(PARTS)).split(",")
    if set(chosen) - set(PARTS):
        raise SystemExit(f"--parts: choose among {', '.join(PARTS)}; got {parts!r}.")
    out: list[dict] = []
    report = report or out.append
    if "checks" in chosen:
        for rec in run_checks(size["episodes"], size["steps"], device, copy_gbps):
            report(rec)
        if cuda:
            for rec in run_checks(min(size["episodes"], 2000), size["steps"], "cpu",
                                  copy_gbps):
                report(rec)
    if "cache" in chosen:
        for rec in run_cache(size["episodes"], size["steps"], size["copies"], device):
            report(rec)
    if "cameras" in chosen:
        run_cameras(CAMERAS_QUICK if quick else CAMERAS_FULL, device, report)
    return out


if __name__ == "__main__":
    main(run, __doc__, {"parts": (str, "comma-separated parts of checks,cache,cameras "
                                       "(default: all)")})
