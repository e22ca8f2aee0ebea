"""Preprocess benchmark: what building the cache costs per episode, on one core and on the node.

    $ python benchmarks/bench_preprocess.py --json $OUT/preprocess.json --gpus 1,2 --budget-s 540
    $ robocache bench preprocess --json benchmarks/results/preprocess.json
    $ python benchmarks/bench_preprocess.py --quick          # CPU, a small dataset

Each case is printed and written to the JSON as soon as it is done (``meta.partial`` until
the last), so a run killed at its time limit keeps the cases it finished.

The dataset is generated on the machine, vectorized and in parallel (one process per data
file, each drawing its random values once; see ``preprocess_data``): a multi-rate LeRobot
v3.0 dataset, episodes of 12 s with a 100 Hz 24-D state, a 50 Hz 16-D action, a jittered
30 Hz 7-D pose and two language events (``--camera``: also a 15 Hz 48x64 RGB camera stored
inline, which the build JPEG-encodes), 500 episodes per data file. Cases (all rates at
50 Hz, ``rate_hz=50``), in the order they run:

- ``cpu <stage>``: CPU time (``time.process_time``) per episode of each build stage in one
  process set up as a build's worker process (``robocache.data.build.read.single_core``:
  one torch and one Arrow thread, the garbage collector's view frozen), over the episodes of
  one whole data file (so the file's read is shared as in a real build), three runs (median
  and quartiles): read (+check), encode (camera frames, ``--camera``), align, tables, stats
  (the written rows' statistics and episode summary, which a build's workers compute as they
  write: see ``robocache.data.build.stats.Tally``), write (Arrow + Lance) and commit (per
  batch, divided by its episodes); ``cpu total`` is their sum (target: <= 2 ms for the
  numeric kind).
- ``generate``: seconds to write the node-scale dataset (not a result; the run's setup cost).
- ``raw-read``: every source file read once with no decoding, one thread per core, through
  the page cache (the dataset was just written: memory bandwidth more than the disk's); and
  ``raw-read-direct``: the same with ``O_DIRECT``, past the page cache: the storage's own
  rate, the disk speed the build is held to. The builds' % of raw read are of the direct
  read where the file system allows ``O_DIRECT`` (not tmpfs), else of the page-cache read;
  each note says which.
- ``ingest node``: ``robocache ingest`` (``build``, alignment on the CPU in one worker process
  per core): wall time, episodes/s, source MB/s and % of the raw read (target >= 50 % over a
  run of 30 s or more: the note gives the run's length; ``--episodes`` sets it), peak
  disk during the build over the final cache (target <= 1.5), Lance fragments.
- ``growth``: the cost of adding an episode (batch write + commit, CPU time) when the cache
  holds ~1k episodes and ~100k (small 20-row episodes written straight to the cache, batches
  of 2^14 rows): ``ratio`` = at 100k / at 1k (target <= 1.5), fragments, peak disk / final.
- ``preprocess <g> GPU``: ``robocache preprocess`` on a local Ray with ``g`` GPU actors and
  ``g / G`` of the cores (``--gpus 1,2,4``; default every power of two up to the visible GPUs),
  the Ray processes pinned to those cores (CPU affinity); without GPUs, ``g`` CPU actors
  stand in (the plumbing, not a GPU result): episodes/s, MB/s, % of the raw read and the
  speedup over the first count (targets >= 1.9x on 2 and >= 3.6x on 4); and, from the
  run's progress, when its first group of episodes was done (``start_s``: Ray's workers
  starting, importing and reading their first files) and the rate after it
  (``steady_episodes_per_s``, ``steady_speedup``), which a longer run approaches. Each count builds
  enough episodes for ~30 s at the rate a probe on the first count measured; a count whose
  run would end past ``--budget-s`` is recorded as skipped.

Sizes: ``--episodes`` (default: what the node ingests in ~30 s, as far as the free disk holds
the source and its cache twice over; the ``ingest node`` case says when the disk cut it
short). The node's rate is measured, not assumed: a probe (``ingest node probe``) ingests what
the cores would do in ~5 s at the one-core cost if the build scaled linearly, and the dataset
is sized from the probe's episodes/s. ``ROBOCACHE_BENCH_DIR`` for the scratch directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

from robocache._forkserver import worker_context
from robocache.bench import harness as H
from robocache.bench.standalone import main

sys.path.insert(0, str(Path(__file__).resolve().parent))  # also for the generator processes
from preprocess_data import PER_FILE, SECONDS, make_dataset  # noqa: E402

FAMILY = "preprocess"
RATE = 50.0
TARGET_S = 30.0  # each node-scale run lasts about this long
PROBE_S = 5.0  # the node probe's work, at the one-core cost on every core
MAX_EPISODES = 2_000_000
REPEATS = 3  # runs of the one-core stages
OPTIONS = {"episodes": (int, "episodes in the dataset (default: ~30 s of the node's ingest)"),
           "gpus": (str, "GPU counts for the preprocess scaling runs, e.g. 1,2,4"),
           "camera": (int, "1: add the inline 48x64 camera (JPEG-encoded by the build)"),
           "budget_s": (float, "skip the preprocess runs that would end past this many "
                                "seconds of the whole benchmark (default 420)")}


# --- measurements ----------------------------------------------------------------------------

def source_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def disk_usage(path: Path) -> int:
    """Bytes ``path`` occupies on disk (allocated blocks of every file under it)."""
    total = 0
    for d, _, names in os.walk(path):
        for name in names:
            # a file removed while walking (an old version cleaned) counts for nothing
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(d, name)).st_blocks * 512
    return total


class PeakDisk:
    """The most disk the block added to the file system holding ``path`` (its used bytes,
    sampled every 20 ms, over those before it): what the build wrote, wherever it wrote it.
    One ``statvfs`` a sample, not a walk of the tree, which in this process would take the
    GIL from the build it measures."""

    def __init__(self, path: Path):
        self.path, self.peak, self._stop = path, 0, threading.Event()

    def _used(self) -> int:
        return shutil.disk_usage(self.path).used - self._base

    def _watch(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._used())

    def __enter__(self):
        self.path.mkdir(parents=True, exist_ok=True)
        self._base = shutil.disk_usage(self.path).used
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._used())
        return False


def fragments(dest: Path) -> int:
    import lance

    return len(lance.dataset(str(dest / "data.lance")).get_fragments())


@contextlib.contextmanager
def as_worker():
    """This process set up as a build's worker process for the block
    (:func:`robocache.data.build.read.single_core`, and its heap kept as a worker keeps it,
    :func:`~robocache.data.build.read.retain_heap`, which stays after), as it was after."""
    import gc

    import pyarrow as pa

    from robocache.data.build.read import retain_heap, single_core

    threads, arrow = torch.get_num_threads(), pa.cpu_count()
    retain_heap()
    single_core()
    try:
        yield
    finally:
        gc.unfreeze()
        torch.set_num_threads(threads)
        pa.set_cpu_count(arrow)


def stage_cpu(root: Path, dest: Path, episodes: list[int]) -> dict[str, float]:
    """CPU ms per episode of each build stage, in this process set up as a build's worker
    process (:func:`as_worker`), the source opened first as a worker opens it."""
    from robocache.data.build.align import align_batch
    from robocache.data.build.commit import Committer
    from robocache.data.build.config import CacheConfig
    from robocache.data.build.encode import stored_size
    from robocache.data.build.read import load_episode, open_specs
    from robocache.data.build.run import ALIGN_EPISODES
    from robocache.data.build.stats import Tally
    from robocache.data.build.write import Batch, episode_tables
    from robocache.data.cameras import frames_table

    config = CacheConfig(rate_hz=RATE)
    src, specs = open_specs(root, config)
    dest.mkdir(parents=True)
    batch = Batch(config.batch_rows, config.batch_bytes)
    committer = Committer(dest, config.batch_rows, config.batch_bytes)
    cams = [n for n, s in specs.items() if s.kind in ("image", "video")]
    spent = dict.fromkeys(("read", "encode", "align", "tables", "stats", "write", "commit"), 0.0)

    def timed(stage, fn, *args):
        t0 = time.process_time()
        out = fn(*args)
        spent[stage] += time.process_time() - t0
        return out

    def flush():
        if not batch:
            return
        indices = list(batch.indices)
        timed("stats", Tally.of_rows, batch.tables.get("data.lance", []), specs)
        written = timed("write", batch.write, dest)
        timed("commit", committer, indices, written)

    def settle(group):
        aligned = timed("align", align_batch, [e for e, _ in group], specs, config, "cpu")
        for (episode, frames), cols in zip(group, aligned, strict=True):
            batch.add(episode.index, timed("tables", episode_tables, episode, cols, specs,
                                           config, frames))
            if batch.full():
                flush()
        group.clear()

    group: list = []
    with as_worker():
        for index in episodes:
            episode = timed("read", load_episode, src, index, specs)
            frames = timed("encode", lambda e=episode: {n: frames_table(
                e, n, specs[n], config.camera_codec, config.camera_quality, 1,
                size=stored_size(specs[n], config)) for n in cams})
            group.append((episode, frames))
            if len(group) == ALIGN_EPISODES:
                settle(group)
        settle(group)
        flush()
    return {k: v * 1e3 / len(episodes) for k, v in spent.items()}


def growth(dest: Path, episodes: int, rows: int = 20,
           batch_rows: int = 1 << 14) -> dict[str, float]:
    """CPU ms per episode of adding small episodes (batch write + commit) at ~1k cached
    episodes and at the end, the fragments, and the peak disk over the final size."""
    import pyarrow as pa

    from robocache.data.build.commit import Committer
    from robocache.data.build.write import Batch

    rng = np.random.default_rng(0)
    template = pa.table({
        "episode_index": np.zeros(rows, np.int64), "step": np.arange(rows, dtype=np.int64),
        "timestamp": np.arange(rows) / RATE,
        "state": pa.FixedSizeListArray.from_arrays(
            pa.array(rng.standard_normal(rows * 24, np.float32)), 24),
        "state_is_pad": np.zeros(rows, bool)})
    dest.mkdir(parents=True)
    batch = Batch(batch_rows, 64 << 20)
    committer = Committer(dest, batch_rows, 64 << 20)
    per_batch: list[tuple[int, float]] = []  # (episodes cached after it, ms per episode)
    with PeakDisk(dest) as disk:
        t0 = time.process_time()
        for i in range(episodes):
            batch.add(i, [("data.lance", template.set_column(
                0, "episode_index", pa.array(np.full(rows, i, np.int64))))])
            if batch.full() or i == episodes - 1:
                indices = list(batch.indices)
                committer(indices, batch.write(dest))
                t1 = time.process_time()
                per_batch.append((i + 1, (t1 - t0) * 1e3 / len(indices)))
                t0 = t1
        committer.close()
    early = [ms for n, ms in per_batch if n <= max(2000, per_batch[0][0])]
    late = [ms for n, ms in per_batch[-3:]]
    return {"ms_at_1k": float(np.median(early)), "ms_at_end": float(np.median(late)),
            "ratio": float(np.median(late) / np.median(early)), "fragments": fragments(dest),
            "peak_over_final": disk.peak / max(disk_usage(dest), 1),
            "batches": len(per_batch)}


def gpu_counts(available: int, asked: str | None) -> list[int]:
    if asked:
        return [int(g) for g in str(asked).split(",")]
    counts, g = [], 1
    while g < available:
        counts.append(g)
        g *= 2
    return [*counts, available] if available else [0]


def ray_run(root: Path, dest: Path, gpus: int, cpus: int,
            episodes: list[int]) -> tuple[float, list[tuple[float, int]]]:
    """``(seconds, marks)``: the seconds ``robocache preprocess`` takes for ``episodes`` on a
    fresh local Ray given the first ``cpus`` cores of this machine (its processes pinned to
    them: they inherit this process's CPU affinity) and ``gpus`` GPU actors (``gpus`` CPU
    actors stand in when fewer GPUs are visible; ``gpus`` 0: the library's default, one per
    core), and its progress marks, ``(seconds since the start, episodes)`` as groups of
    episodes finish (:func:`steady`)."""
    import ray

    from robocache.distributed import preprocess

    on_gpu = gpus and torch.cuda.device_count() >= gpus
    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, sorted(mask)[:cpus])
    try:
        ray.init(num_cpus=cpus, num_gpus=gpus if on_gpu else 0, include_dashboard=False,
                 logging_level="ERROR", log_to_driver=False)
        try:
            marks: list[tuple[float, int]] = []
            t0 = time.perf_counter()
            preprocess(root, dest, rate_hz=RATE, num_gpus=gpus if on_gpu else 0,
                       episodes=episodes, workers=None if on_gpu else gpus or None,
                       progress=lambda _desc, n: marks.append((time.perf_counter() - t0, n)))
            return time.perf_counter() - t0, marks
        finally:
            ray.shutdown()
    finally:
        os.sched_setaffinity(0, mask)
        shutil.rmtree(dest, ignore_errors=True)


def run(quick: bool = False, copy_gbps: float | None = None, episodes: int | None = None,
        gpus: str | None = None, camera: int | None = None, budget_s: float = 420.0,
        report=None) -> list[dict]:
    """The cases (see the module docstring); ``report``: called with each case as soon as
    it is done."""
    start = time.perf_counter()
    cores = len(os.sched_getaffinity(0))
    camera = bool(camera)
    kind = f"{SECONDS:g}s-{'numeric+cam48x64' if camera else 'numeric'}"
    records: list[dict] = []

    def done(rec: dict) -> None:
        records.append(rec)
        if report is not None:
            report(rec)

    # the generator's processes come from this process's fork server too: started here as
    # a build starts it (preloading the build's modules), not by the generator without them
    worker_context()
    with tempfile.TemporaryDirectory(dir=os.environ.get("ROBOCACHE_BENCH_DIR")) as tmp:
        tmp = Path(tmp)
        # the one-core cost first, on one data file: it sizes the node-scale dataset
        n = 24 if quick else PER_FILE
        probe, _ = make_dataset(tmp / "probe", n, camera=camera)
        runs = [stage_cpu(probe, tmp / f"stages{r}", list(range(n))) for r in range(REPEATS)]
        totals = [sum(r.values()) for r in runs]
        for stage in [*runs[0], "total"]:
            ms = totals if stage == "total" else [r[stage] for r in runs]
            done(H.case(FAMILY, kind, f"cpu {stage}", H.summarize(ms), per="episode", cores=1,
                        note="target <= 2 ms" if stage == "total" else ""))
        per_episode = (source_bytes(probe) + 1.5 * disk_usage(tmp / "stages0")) / n
        shutil.rmtree(probe)
        for r in range(REPEATS):
            shutil.rmtree(tmp / f"stages{r}")
        fits = int(0.8 * shutil.disk_usage(tmp).free / per_episode)
        if episodes is None and quick:
            episodes = 48
        elif episodes is None:
            linear = cores / (np.median(totals) * 1e-3)  # episodes/s if every core did one
            n = max(PER_FILE, min(int(linear * PROBE_S), fits, MAX_EPISODES))
            root, samples = make_dataset(tmp / "node-probe", n, camera=camera)
            read_s, nbytes = H.raw_read_s([p for p in root.rglob("*") if p.is_file()])
            rec = _node(root, tmp / "node-probe-ingest", f"{n}ep-{kind}", n, samples, nbytes,
                        nbytes / read_s, disk_bound=False, impl="ingest node probe",
                        against="the page-cache read")
            done(rec)
            shutil.rmtree(root)
            wanted = int(TARGET_S * rec["episodes_per_s"])
            episodes = max(PER_FILE, min(wanted, fits, MAX_EPISODES))
        t0 = time.perf_counter()
        root, samples = make_dataset(tmp / "src", episodes, camera=camera)
        made = time.perf_counter() - t0
        name = f"{episodes}ep-{kind}"
        done(H.case(FAMILY, name, "generate", H.summarize([made * 1e3]), episodes=episodes,
                    note=f"{episodes / made:,.0f} episodes/s"))
        raw, against = H.raw_reads(FAMILY, name, [p for p in root.rglob("*") if p.is_file()],
                                   done)
        done(_node(root, tmp / "ingest", name, episodes, samples, source_bytes(root), raw,
                   disk_bound=episodes == fits, against=against))
        g = growth(tmp / "growth", 3000 if quick else 100_000)
        done(H.case(FAMILY, "20-row episodes", "growth", H.summarize([g["ms_at_end"]]),
                    per="episode", note=f"x{g['ratio']:.2f} from ~1k to the end (target <= "
                    f"1.5); {g['fragments']} fragments; peak disk {g['peak_over_final']:.2f}x "
                    "final", **g))
        shutil.rmtree(tmp / "growth")
        _scaling(root, tmp, name, episodes, source_bytes(root), raw, against, cores, gpus, quick,
                 start + budget_s, done)
    return records


def _node(root: Path, dest: Path, name: str, episodes: int, samples: int, nbytes: int,
          raw: float, disk_bound: bool, impl: str = "ingest node",
          against: str = "raw read") -> dict:
    from robocache.data.cache import build

    with PeakDisk(dest.parent) as disk:
        t0 = time.perf_counter()
        m = build(root, dest, rate_hz=RATE, device="cpu", progress=False)
        wall = time.perf_counter() - t0
    final = disk_usage(dest)
    peak = disk.peak
    short = f"; {wall:.0f} s: the free disk held {episodes} episodes" if disk_bound else ""
    rec = H.case(FAMILY, name, impl, H.summarize([wall * 1e3]), nbytes=nbytes,
                 episodes_per_s=m["counts"]["cached"] / wall, samples_per_s=samples / wall,
                 MBps=nbytes / wall / 1e6, pct_raw_read=100 * nbytes / wall / raw,
                 peak_over_final=peak / max(final, 1), fragments=fragments(dest),
                 cached=m["counts"]["cached"], workers=m["decode"]["workers"],
                 seconds=wall, disk_bound=disk_bound,
                 note=f"{m['counts']['cached'] / wall:.0f} ep/s, {nbytes / wall / 1e6:.0f} MB/s"
                      f" = {100 * nbytes / wall / raw:.1f}% of {against} (target >= 50 %, over "
                      f"a run of >= {TARGET_S:.0f} s: {wall:.1f} s); peak disk "
                      f"{peak / max(final, 1):.2f}x final{short}")
    shutil.rmtree(dest)
    return rec


def steady(marks: list[tuple[float, int]]) -> tuple[float | None, float | None]:
    """``(start_s, episodes_per_s)`` of a run's progress marks: when the first group of
    episodes finished (the workers' start-up, imports and first batch included), and the rate
    from then to the last mark (None with fewer than two marks)."""
    if not marks:
        return None, None
    (first, _), (last, _) = marks[0], marks[-1]
    after = sum(n for _, n in marks[1:])
    return first, (after / (last - first) if len(marks) > 1 and last > first else None)


def _scaling(root: Path, tmp: Path, name: str, episodes: int, nbytes: int, raw: float,
             against: str, cores: int, asked: str | None, quick: bool, deadline: float,
             done) -> None:
    """``robocache preprocess`` with each GPU count, its share of the cores each (see
    :func:`ray_run`), each case given to ``done``; a count whose run would end past
    ``deadline`` (``time.perf_counter``) is skipped, and says so."""
    visible = torch.cuda.device_count()
    counts = gpu_counts(visible, asked)
    top = max(max(counts), 1)
    per_episode = nbytes / episodes
    base = rate = base_after = None
    for g in counts:
        cpus = min(cores, 2 if quick else max(2, cores * max(g, 1) // top))
        actors = "GPU" if g and visible >= g else "CPU"
        label = f"preprocess {g} {actors}" if g else "preprocess CPU"
        if rate is None and time.perf_counter() + PROBE_S * 4 > deadline:
            done(H.case(FAMILY, name, label, H.summarize([0.0]), gpus=g, cpus=cpus,
                        skipped=True, note="skipped: past --budget-s"))
            continue
        if rate is None:  # a probe on the first count sizes every run to ~TARGET_S
            probe = list(range(min(episodes, 16 if quick else 2000)))
            rate = len(probe) / ray_run(root, tmp / "probe-cache", g, cpus, probe)[0]
        scale = max(g, 1) / max(counts[0], 1)
        n = min(episodes, 24) if quick else min(episodes, max(16, int(rate * scale * TARGET_S)))
        if time.perf_counter() + n / (rate * scale) + 20 > deadline:
            done(H.case(FAMILY, name, label, H.summarize([0.0]), gpus=g, cpus=cpus,
                        skipped=True, note="skipped: past --budget-s"))
            continue
        wall, marks = ray_run(root, tmp / f"cache-{g}", g, cpus, list(range(n)))
        eps = n / wall
        base = base or eps
        start_s, after = steady(marks)
        if base_after is None:
            base_after = after
        then = "" if after is None else (
            f"; first group done at {start_s:.1f} s, then {after:.0f} ep/s"
            + (f" (x{after / base_after:.2f})" if base_after else ""))
        done(H.case(
            FAMILY, name, label, H.summarize([wall * 1e3]), nbytes=int(per_episode * n),
            gpus=g, actors=actors, cpus=cpus, batch=max(g, 1), episodes=n,
            episodes_per_s=eps, MBps=per_episode * eps / 1e6,
            pct_raw_read=100 * per_episode * eps / raw, speedup=eps / base,
            start_s=start_s, steady_episodes_per_s=after,
            steady_speedup=after / base_after if after and base_after else None,
            note=f"{eps:.0f} ep/s on {cpus} cores, x{eps / base:.2f} over "
                 f"{f'{counts[0]} {actors}' if counts[0] else 'CPU actors'}, "
                 f"{100 * per_episode * eps / raw:.1f}% of {against}{then}"
                 + ("" if actors == "GPU" or not g else "; CPU actors stand in (no GPU)")))


if __name__ == "__main__":
    main(run, __doc__, OPTIONS)
