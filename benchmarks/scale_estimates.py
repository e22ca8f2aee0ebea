"""Render the RT-X and DROID estimates of docs/scale-out.md from benchmark results files.

    $ python benchmarks/scale_estimates.py benchmarks/results/preprocess-h200x4-DATE.json \\
          --cameras benchmarks/results/cameras-cpu-h200x4-DATE.json \\
          --cameras benchmarks/results/cameras-gpu-h200x4-DATE.json \\
          [--ingest benchmarks/results/preprocess-h200x4-LATER.json] --write docs/scale-out.md

Every figure is computed from the results files given (and names them); nothing is typed by
hand. The table replaces the text between ``<!-- estimates -->`` and ``<!-- /estimates -->``.
Inputs, from ``bench preprocess``: the ``preprocess <g> GPU`` cases (episodes/s and speedup
per GPU count), ``ingest node`` (episodes/s of one machine without Ray), ``raw-read-direct``
(the storage's read; ``raw-read`` where absent), and the episode size; from ``bench cameras``
(optional, one file or more): the best full-size camera case's frames/s.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

RTX_EPISODES = 1_000_000  # Open X-Embodiment: ~1M trajectories
DROID_EPISODES = 76_000  # DROID: 76k trajectories
DROID_FRAMES = 57_000_000  # DROID's camera frames, ~57M
NODE_GPUS = 8
NODES = (1, 2, 4, 8)
MARK = re.compile(r"(<!-- estimates -->\n).*?(<!-- /estimates -->)", re.S)


def preprocess_rates(doc: dict) -> dict:
    """What the estimates need from a ``bench preprocess`` results document."""
    cases = doc["cases"]
    ray = sorted((c for c in cases if c["impl"].startswith("preprocess ") and c.get("gpus")
                  and not c.get("skipped")),
                 key=lambda c: c["gpus"])
    node = next((c for c in cases if c["impl"] == "ingest node"), None)
    cpu = next((c for c in cases if c["impl"] == "cpu total"), None)
    raw = next((c for c in cases if c["impl"] == "raw-read-direct"), None) or \
        next((c for c in cases if c["impl"] == "raw-read"), None)
    out = {"device": doc["meta"].get("device"), "gpu_count": doc["meta"].get("gpu_count"),
           "cpu_count": doc["meta"].get("cpu_count"), "date": doc["meta"].get("date"),
           "cpu_ms": cpu["median_ms"] if cpu else None,
           "raw_GBps": raw["bytes"] / raw["median_ms"] / 1e6 if raw else None,
           "ingest_eps": node["episodes_per_s"] if node else None,
           "episode_MB": node["bytes"] / node["cached"] / 1e6 if node else None}
    if ray:
        top = ray[-1]
        out.update(gpus=top["gpus"], ray_eps=top["episodes_per_s"],
                   ray_one=ray[0]["episodes_per_s"] / max(ray[0]["gpus"], 1),
                   efficiency=top["speedup"] * ray[0]["gpus"] / top["gpus"])
    return out


def camera_rate(doc: dict) -> tuple[float, str] | None:
    """The best camera rate into the cache at full size (frames/s on the node: the ``cpu``
    section's ``cpu-w<N>``, the ``gpu`` section's ``gpu-x<G>-...`` and the ``node`` section's
    ``node-...`` cases, not the resized, decode-only or pass-through ones) and its case
    name."""
    cases = [c for c in doc["cases"]
             if re.fullmatch(r"cpu-w\d+|gpu-x\d+-p\d+-\w+|node-\w+", c["impl"])
             and c.get("frames_per_s")]
    if not cases:
        return None
    best = max(cases, key=lambda c: c["frames_per_s"])
    return best["frames_per_s"], f"{best['impl']} ({best['name']})"


def _t(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def estimates(preprocess: Path, cameras: list[Path] | None = None,
              ingest: Path | None = None) -> str:
    """The markdown table of estimated build times (one node of 8 GPUs, and N such nodes);
    ``ingest``: a later ``bench preprocess`` file whose ``ingest node`` rate (and one-core
    cost, raw read and episode size) the ``ingest`` rows use instead."""
    p = preprocess_rates(json.loads(Path(preprocess).read_text()))
    rows = []
    src = isrc = f"`{Path(preprocess).as_posix()}`"
    if ingest is not None:
        later = preprocess_rates(json.loads(Path(ingest).read_text()))
        p.update({k: later[k] for k in ("ingest_eps", "cpu_ms", "raw_GBps", "episode_MB",
                                        "date") if later[k] is not None})
        isrc = f"`{Path(ingest).as_posix()}`"
    # one 8-GPU node: one GPU's rate times 8 at the efficiency measured on the largest count
    node8 = p["ray_one"] * NODE_GPUS * p["efficiency"] if "ray_one" in p else None
    for what, episodes in (("RT-X, 1M trajectories", RTX_EPISODES),
                           ("DROID, 76k trajectories (numeric part)", DROID_EPISODES)):
        if node8:
            rows.append([f"{what}: `preprocess`, {NODE_GPUS} GPUs a node",
                         *(_t(episodes / (n * node8)) for n in NODES),
                         f"{p['ray_one']:.0f} ep/s per GPU x {NODE_GPUS} x "
                         f"{p['efficiency']:.2f} efficiency ({p['gpus']} GPUs measured); {src}"])
        if p["ingest_eps"]:
            rows.append([f"{what}: `ingest`, one machine a shard",
                         *(_t(episodes / (n * p["ingest_eps"])) for n in NODES),
                         f"{p['ingest_eps']:.0f} ep/s on {p['cpu_count']} cores; {isrc}"])
    best = [(r, f) for f in cameras or [] if (r := camera_rate(json.loads(Path(f).read_text())))]
    if best:
        (rate, case), f = max(best, key=lambda b: b[0][0])
        rows.append(["DROID, ~57M camera frames: decode + encode",
                     *(_t(DROID_FRAMES / (n * rate)) for n in NODES),
                     f"{rate:,.0f} frames/s a node, {case}; `{Path(f).as_posix()}`"])
    head = ["workload", *(f"{n} node{'s' if n > 1 else ''}" for n in NODES), "from"]
    lines = [f"Estimated from the runs on {p['device']} x{p['gpu_count']} "
             f"({p['cpu_count']} cores, {p['date']}); episodes of the benchmark's kind "
             f"({p['episode_MB']:.2f} MB each) unless stated. Raw read measured in the same "
             f"run (the storage's): {p['raw_GBps']:.2f} GB/s a node; one core: "
             f"{p['cpu_ms']:.2f} ms CPU per episode.", "", "| " + " | ".join(head) + " |",
             "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def write(doc: Path, table: str) -> None:
    """Replace the estimates block of ``doc`` with ``table``."""
    text = doc.read_text()
    if not MARK.search(text):
        raise SystemExit(f"{doc} has no <!-- estimates --> ... <!-- /estimates --> block")
    doc.write_text(MARK.sub(lambda m: m.group(1) + table + m.group(2), text))


def main() -> None:
    a = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    a.add_argument("preprocess", type=Path, help="bench preprocess results JSON")
    a.add_argument("--cameras", type=Path, action="append",
                   help="bench cameras results JSON (repeat for several)")
    a.add_argument("--ingest", type=Path,
                   help="a later bench preprocess results JSON for the ingest rows")
    a.add_argument("--write", type=Path, help="the markdown file to update (else print)")
    args = a.parse_args()
    table = estimates(args.preprocess, args.cameras, args.ingest)
    if args.write:
        write(args.write, table)
    else:
        print(table)


if __name__ == "__main__":
    main()
