"""Where a node-wide ingest's time goes: the build of ``bench_preprocess``'s dataset in a
child process, the CPU use of its main process and of its workers sampled from ``/proc``
every 0.25 s (a timeline in cores), and, with ``--py-spy``, py-spy samples of the main
process over the whole build (on-CPU only) and of one worker for 6 s (idle frames included),
summarized as the top frames. ``--variant NAME:VAR=VALUE,...`` builds the same dataset once
per variant with those environment variables (``PROFILE_STATS_ROWS``: the statistics' chunk
rows), the variants alternated over ``--repeats`` rounds: an A/B on one machine.

    python benchmarks/profile_ingest_node.py --episodes 40000 --out /tmp/prof --py-spy
    python benchmarks/profile_ingest_node.py --episodes 60000 --out /tmp/ab --repeats 2 \
        --variant default: --variant jemalloc:ARROW_DEFAULT_MEMORY_POOL=jemalloc

Writes ``ingest-node-profile.json`` and ``ingest-node-profile.txt`` under ``--out``. Linux
only (``/proc``); py-spy must be on ``PATH``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
TICK = os.sysconf("SC_CLK_TCK")
BUILD = """import json, os, sys, time
from robocache.data.build import stats
from robocache.data.cache import build
if __name__ == "__main__":
    stats.STATS_BATCH_ROWS = int(os.environ.get("PROFILE_STATS_ROWS", stats.STATS_BATCH_ROWS))
    t = time.perf_counter()
    m = build(sys.argv[1], sys.argv[2], rate_hz=50.0, device="cpu", progress=False)
    print(json.dumps({"wall": time.perf_counter() - t, "cached": m["counts"]["cached"]}))
"""


def _tree(root: int) -> dict[int, int]:
    """``root`` and every process below it: pid -> parent pid."""
    kids: dict[int, list[int]] = {}
    for p in filter(str.isdigit, os.listdir("/proc")):
        try:
            ppid = int(Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        kids.setdefault(ppid, []).append(int(p))
    out, todo = {}, [(root, 0)]
    while todo:
        q, parent = todo.pop()
        out[q] = parent
        todo += [(k, q) for k in kids.get(q, [])]
    return out


def _cpu_s(pid: int) -> tuple[float, float] | None:
    """The user and system CPU seconds of process ``pid`` so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[11]) / TICK, int(fields[12]) / TICK


def _thp() -> str:
    """The kernel's transparent huge page modes (enabled, defrag), as it shows them."""
    try:
        return ", ".join(Path(f"/sys/kernel/mm/transparent_hugepage/{f}").read_text().strip()
                         for f in ("enabled", "defrag"))
    except OSError:
        return "unknown"


def _spy(pid: int, out: Path, seconds: int = 6, idle: bool = True, native: bool = False
         ) -> subprocess.Popen:
    return subprocess.Popen(["py-spy", "record", "-r", "200", "-d", str(seconds), "-f", "raw",
                             *(["--idle"] if idle else []), *(["--native"] if native else []),
                             "-o", str(out), "-p", str(pid)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def top_frames(raw: Path, n: int = 12) -> list[str]:
    """The frames py-spy's ``raw`` samples end in most often (own), then the project's
    functions on the most samples' stacks (inclusive), as lines."""
    own, inclusive, total = Counter(), Counter(), 0
    for line in raw.read_text().splitlines():
        stack, _, k = line.rpartition(" ")
        frames = stack.split(";")
        own[frames[-1]] += int(k)
        for f in set(frames):
            if "robocache" in f:
                inclusive[f] += int(k)
        total += int(k)
    return [f"{100 * k / total:5.1f}%  {frame}" for frame, k in own.most_common(n)] + \
        [f"{100 * k / total:5.1f}%  (incl.) {frame}" for frame, k in inclusive.most_common(n)]


def profile(src: Path, dest: Path, out: Path, spy: bool, env: dict[str, str] | None = None
            ) -> dict:
    child = subprocess.Popen([sys.executable, "-c", BUILD, str(src), str(dest)],
                             stdout=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    samples, t0 = [], time.perf_counter()
    # the main process from its start, on-CPU samples only: its start-up and its tail
    spies = {"main": _spy(child.pid, out / "spy-main.txt", 600, idle=False)} if spy else {}
    while child.poll() is None:
        tree = _tree(child.pid)
        snap = {q: c for q in tree if (c := _cpu_s(q)) is not None}
        samples.append((time.perf_counter() - t0, snap))
        # a worker: below the build's own children (a fork server's child) once one works
        busy = [q for q, c in snap.items() if tree[q] not in (0, child.pid) and sum(c) > 0.5]
        if spy and "worker" not in spies and busy:
            spies["worker"] = _spy(busy[0], out / "spy-worker.txt")
        time.sleep(0.25)
    result = json.loads(child.stdout.read().strip().splitlines()[-1])
    for p in spies.values():
        p.wait()
    # (seconds, worker cores, of which in the kernel, main cores, of which in the kernel),
    # over each ~2 s
    timeline = []
    for (ta, a), (tb, b) in zip(samples[::8], samples[8::8], strict=False):
        workers = [sum(c[i] - a[q][i] for q, c in b.items() if q != child.pid and q in a)
                   for i in (0, 1)]
        main = [b.get(child.pid, (0.0, 0.0))[i] - a.get(child.pid, (0.0, 0.0))[i]
                for i in (0, 1)]
        span = tb - ta
        timeline.append((round(tb, 1), round(sum(workers) / span, 1), round(workers[1] / span, 1),
                         round(sum(main) / span, 2), round(main[1] / span, 2)))
    last: dict[int, tuple[float, float]] = {}  # each process's CPU time when last seen
    for _, snap in samples:
        last.update(snap)
    mine = last.pop(child.pid, (0.0, 0.0))
    cpu = {"main_user_s": mine[0], "main_system_s": mine[1],
           "workers_user_s": sum(c[0] for c in last.values()),
           "workers_system_s": sum(c[1] for c in last.values())}
    rec = {**result, **cpu, "episodes_per_s": result["cached"] / result["wall"],
           "timeline": timeline,
           "top_frames": {who: top_frames(out / f"spy-{who}.txt") for who in spies
                          if (out / f"spy-{who}.txt").exists()}}
    return rec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=40000)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--py-spy", action="store_true", help="also sample main and one worker")
    ap.add_argument("--keep", type=Path, default=None,
                    help="build the dataset (src/) and its cache (cache/) here and leave them, "
                         "e.g. for profile_stats.py --cache")
    ap.add_argument("--variant", action="append", default=None,
                    help="NAME:VAR=VALUE,... environment of one variant (repeatable)")
    ap.add_argument("--repeats", type=int, default=1, help="rounds over the variants")
    args = ap.parse_args()
    from preprocess_data import make_dataset

    variants = {}
    for v in args.variant or ["default:"]:
        name, _, assigns = v.partition(":")
        variants[name] = dict(a.split("=", 1) for a in assigns.split(",") if a)
    args.out.mkdir(parents=True, exist_ok=True)
    runs = []
    with contextlib.ExitStack() as stack:
        tmp = args.keep or stack.enter_context(tempfile.TemporaryDirectory(
            dir=os.environ.get("ROBOCACHE_BENCH_DIR")))
        src, _ = make_dataset(Path(tmp) / "src", args.episodes)
        for r in range(args.repeats):
            for name, env in variants.items():
                last = r == args.repeats - 1 and name == list(variants)[-1]
                dest = Path(tmp) / "cache"
                rec = profile(src, dest, args.out, args.py_spy, env)
                runs.append({"variant": name, "env": env, "round": r, **rec})
                if not (last and args.keep):
                    shutil.rmtree(dest)
    meta = {"episodes": args.episodes, "cores": len(os.sched_getaffinity(0)),
            "commit": os.environ.get("ROBOCACHE_COMMIT"), "thp": _thp()}
    rec = {**runs[-1], **meta, "runs": runs}
    (args.out / "ingest-node-profile.json").write_text(json.dumps(rec, indent=1))
    lines = [f"# {meta['episodes']} episodes, {meta['cores']} cores, transparent huge pages: "
             f"{meta['thp']}",
             "variant  round  wall s  ep/s  workers user/system s  main user/system s"]
    lines += [f"{r['variant']:12s} {r['round']}  {r['wall']:6.1f}  {r['episodes_per_s']:5.0f}  "
              f"{r['workers_user_s']:7.1f} / {r['workers_system_s']:6.1f}  "
              f"{r['main_user_s']:6.1f} / {r['main_system_s']:5.1f}" for r in runs]
    for name in variants:
        first = next(r for r in runs if r["variant"] == name)
        lines += [f"{name}, round 0: timeline (s, worker cores, of them system, main cores, "
                  "of them system):", *(f"  {t}" for t in first["timeline"])]
    for who, frames in rec["top_frames"].items():
        lines += [f"py-spy {who}, top frames:", *(f"  {f}" for f in frames)]
    (args.out / "ingest-node-profile.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
