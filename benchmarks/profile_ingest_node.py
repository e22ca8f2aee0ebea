"""Where a node-wide ingest's time goes: the build of ``bench_preprocess``'s dataset in a
child process, the CPU use of its main process and of its workers sampled from ``/proc``
every 0.25 s (a timeline in cores), and, with ``--py-spy``, py-spy samples of the main
process over the whole build (on-CPU only) and of one worker for 6 s (idle frames included),
summarized as the top frames.

    python benchmarks/profile_ingest_node.py --episodes 40000 --out /tmp/prof --py-spy

Writes ``ingest-node-profile.json`` and ``ingest-node-profile.txt`` under ``--out``. Linux
only (``/proc``); py-spy must be on ``PATH``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
TICK = os.sysconf("SC_CLK_TCK")
BUILD = """import json, sys, time
from robocache.data.cache import build
if __name__ == "__main__":
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


def _spy(pid: int, out: Path, seconds: int = 6, idle: bool = True) -> subprocess.Popen:
    return subprocess.Popen(["py-spy", "record", "-r", "200", "-d", str(seconds), "-f", "raw",
                             *(["--idle"] if idle else []), "-o", str(out), "-p", str(pid)],
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


def profile(src: Path, dest: Path, out: Path, spy: bool) -> dict:
    child = subprocess.Popen([sys.executable, "-c", BUILD, str(src), str(dest)],
                             stdout=subprocess.PIPE, text=True)
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
    rec = {**result, "episodes_per_s": result["cached"] / result["wall"], "timeline": timeline,
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
    args = ap.parse_args()
    from preprocess_data import make_dataset

    args.out.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        tmp = args.keep or stack.enter_context(tempfile.TemporaryDirectory(
            dir=os.environ.get("ROBOCACHE_BENCH_DIR")))
        src, _ = make_dataset(Path(tmp) / "src", args.episodes)
        rec = profile(src, Path(tmp) / "cache", args.out, args.py_spy)
    rec.update(episodes=args.episodes, cores=len(os.sched_getaffinity(0)),
               commit=os.environ.get("ROBOCACHE_COMMIT"))
    (args.out / "ingest-node-profile.json").write_text(json.dumps(rec, indent=1))
    lines = [f"{rec['cached']} episodes in {rec['wall']:.1f} s = {rec['episodes_per_s']:.0f} "
             f"ep/s on {rec['cores']} cores",
             "timeline (s, worker cores, of them system, main cores, of them system):",
             *(f"  {t}" for t in rec["timeline"])]
    for who, frames in rec["top_frames"].items():
        lines += [f"py-spy {who}, top frames:", *(f"  {f}" for f in frames)]
    (args.out / "ingest-node-profile.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
