"""The report card: a results file (``robocache bench --json``) rendered as Markdown, PNG plots
(roofline against the measured ceilings, batch-size scaling, speedup over each alternative) and
the numbers behind them as CSV. Renders on a machine without a GPU.
"""

from __future__ import annotations

import csv
import math
import os
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

OURS = "robocache"  # impls whose name starts with "robocache" ("robocache_cpu", ...) are ours
BATCH_KEYS = ("batch", "B")  # the extra field that is the x axis of the scaling curves
# Record fields that describe the measurement, not the case: excluded from series labels.
_MEASURED = {"family", "name", "impl", "unit", "median_ms", "q25_ms", "q75_ms", "n",
             "samples_ms", "bytes", "flops", "GBps", "pct_copy", "TFLOPs", "intensity", "bound",
             "pct_roofline", *BATCH_KEYS}
_CSV_FIRST = ["family", "name", "impl", "unit", "median_ms", "q25_ms", "q75_ms", "n", "bytes",
              "flops", "GBps", "pct_copy", "TFLOPs", "intensity", "bound", "pct_roofline"]


def is_ours(impl: str) -> bool:
    return impl.startswith(OURS)


def ceiling_values(meta: dict[str, Any]) -> dict[str, float]:
    """Measured ceilings of a results file as {name: value} (``d2d_copy_GBps`` at least, when
    the run had a GPU)."""
    out = {k: v["value"] for k, v in (meta.get("ceilings") or {}).items() if "value" in v}
    if meta.get("d2d_copy_GBps"):
        out.setdefault("d2d_copy_GBps", meta["d2d_copy_GBps"])
    return out


# a batch-size token in a case name: "B256-S100", "fk-N4096", "mean, B=8"
_BATCH_TOKEN = re.compile(r"[-_ ,]*(?<![A-Za-z0-9])(?:B|N|batch)=?(\d+)(?!\d)")


def _batch(rec: dict[str, Any]) -> tuple[int, str] | None:
    """(batch size, the case name without it) from a ``B``/``batch`` field or, failing that, a
    batch token in the name; None when the case has no batch size."""
    match = _BATCH_TOKEN.search(rec["name"])
    rest = _BATCH_TOKEN.sub("", rec["name"], count=1).strip("-_ ,") or rec["name"]
    for key in BATCH_KEYS:
        if isinstance(rec.get(key), int) and not isinstance(rec[key], bool):
            return rec[key], rest
    return (int(match.group(1)), rest) if match else None


def _params(rec: dict[str, Any]) -> str:
    """The case's string parameters as a label (e.g. 'dtype=bfloat16 time_dtype=float32')."""
    return " ".join(f"{k}={v}".replace("torch.", "") for k, v in rec.items()
                    if k not in _MEASURED and isinstance(v, str))


def _label(rec: dict[str, Any]) -> str:
    return f"{rec['family']}/{rec['name']}"


def _ordered(values) -> list:
    """Distinct values in first-seen order (the benchmark's own order)."""
    return list(dict.fromkeys(values))


def _colours(plt, cases: list[dict[str, Any]]) -> dict[str, Any]:
    """One colour per impl across every plot; ours come first (blue)."""
    impls = sorted(_ordered(r["impl"] for r in cases), key=lambda i: not is_ours(i))
    maps = (plt.cm.tab10,) if len(impls) <= 10 else (plt.cm.tab20, plt.cm.tab20b)
    palette = [m(i) for m in maps for i in range(m.N)]
    return {impl: palette[i % len(palette)] for i, impl in enumerate(impls)}


def _marker(impl: str) -> dict[str, Any]:
    return {"marker": "o", "s": 42} if is_ours(impl) else {"marker": "^", "s": 28}


def speedups(cases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For every timed case (unit ms) with one of our impls: alternative median / our median,
    per alternative (> 1 means we are faster). Our primary impl is "robocache" when present."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in cases:
        if r.get("unit", "ms") == "ms":
            groups[r["family"], r["name"]].append(r)
    rows = []
    for (family, name), recs in groups.items():
        ours = sorted((r for r in recs if is_ours(r["impl"])), key=lambda r: r["impl"] != OURS)
        if not ours:
            continue
        mine = ours[0]
        for alt in recs:
            if is_ours(alt["impl"]):
                continue
            rows.append({"family": family, "name": name, "ours": mine["impl"],
                         "alternative": alt["impl"], "ours_ms": mine["median_ms"],
                         "alternative_ms": alt["median_ms"],
                         "speedup": alt["median_ms"] / mine["median_ms"]})
    return rows


def write_csv(path: Path, rows: list[dict[str, Any]], first: list[str] | None = None) -> None:
    keys: list[str] = [k for k in first or [] if any(k in r for r in rows)]
    for r in rows:
        keys += [k for k, v in r.items() if k not in keys and not isinstance(v, (list, dict))]
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def _plt():
    os.environ.setdefault("MPLBACKEND", "Agg")
    try:
        import matplotlib
    except ImportError as exc:
        from robocache.errors import MissingDependencyError

        raise MissingDependencyError("matplotlib", "bench", "robocache report") from exc
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_roofline(cases: list[dict[str, Any]], ceilings: dict[str, float], path: Path,
                  colours: dict[str, Any] | None = None) -> bool:
    """Achieved GB/s of every case against the measured copy ceiling (the memory roof, where
    ops without FLOPs sit) and, when some cases declare FLOPs, a classic roofline beside it:
    TFLOP/s against FLOP/byte under the measured copy slope and GEMM roofs."""
    bw = ceilings.get("d2d_copy_GBps")
    timed = [r for r in cases if r.get("GBps")]
    if not bw or not timed:
        return False
    plt = _plt()
    labels = _ordered(_label(r) for r in timed)[::-1]  # first case on top
    placed = [r for r in timed if r.get("intensity") and r.get("TFLOPs")]
    height = max(5.0, 0.3 * len(labels) + 2)
    colours = colours or _colours(plt, cases)
    if placed:
        fig, (ax, bx) = plt.subplots(1, 2, figsize=(17, height),
                                     gridspec_kw={"width_ratios": [1, 1.3]})
        _classic_roofline(ax, placed, ceilings, colours)
    else:
        fig, bx = plt.subplots(figsize=(12, height))
    y = {label: i for i, label in enumerate(labels)}
    for r in timed:
        bx.scatter(r["GBps"], y[_label(r)], color=colours[r["impl"]], zorder=3, label=r["impl"],
                   **_marker(r["impl"]))
    bx.axvline(bw, color="k", ls="--", lw=1, label=f"copy ceiling {bw:.0f} GB/s (measured)")
    bx.set_yticks(range(len(labels)), labels, fontsize=7)
    bx.set(xscale="log", xlabel="achieved GB/s (minimum bytes / median time)",
           title="Bandwidth against the measured copy ceiling (memory roof)" if placed else
           "Memory roof: achieved GB/s against the measured copy ceiling\n"
           "(no case declares FLOPs, so every op is placed against bandwidth)")
    bx.grid(True, axis="x", which="both", alpha=0.3)
    handles = dict(zip(*bx.get_legend_handles_labels()[::-1], strict=True))
    bx.legend(handles.values(), handles.keys(), fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _classic_roofline(ax, placed: list[dict[str, Any]], ceilings: dict[str, float],
                      colours: dict[str, Any]) -> None:
    bw = ceilings["d2d_copy_GBps"]
    peaks = {k: ceilings[k] for k in ("gemm_bf16_TFLOPs", "gemm_fp32_TFLOPs") if ceilings.get(k)}
    lo = min([r["intensity"] for r in placed] + [0.01]) / 2
    hi = max([r["intensity"] for r in placed] + [2e3 * max(peaks.values(), default=1) / bw]) * 2
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(xs, [x * bw / 1e3 for x in xs], "k--", lw=1,
            label=f"copy {bw:.0f} GB/s (measured)")
    for (key, peak), style in zip(sorted(peaks.items()), ("-", ":"), strict=False):
        ax.plot(xs, [min(peak, x * bw / 1e3) for x in xs], "k", ls=style, lw=1.5,
                label=f"{key.split('_')[1]} GEMM {peak:.0f} TFLOP/s (measured)")
    for r in placed:
        ax.scatter(r["intensity"], r["TFLOPs"], color=colours[r["impl"]], zorder=3,
                   **_marker(r["impl"]))
        if is_ours(r["impl"]):
            ax.annotate(_label(r), (r["intensity"], r["TFLOPs"]), fontsize=7,
                        xytext=(4, -3), textcoords="offset points")
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP / minimum byte)",
           ylabel="TFLOP/s", title="Roofline (cases that declare FLOPs)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")


def _scaling_series(cases: list[dict[str, Any]]) -> tuple[str, dict[tuple[str, str], list]]:
    """Lines of (x, median ms) per (impl, parameters) for one family: over the batch size when
    some shape was run at two batch sizes or more, else over the minimum bytes (problem size)."""
    by_batch: dict[tuple[str, str], list] = defaultdict(list)
    by_bytes: dict[tuple[str, str], list] = defaultdict(list)
    for r in cases:
        batch = _batch(r)
        if batch is not None:
            by_batch[r["impl"], batch[1]].append((batch[0], r["median_ms"]))
        if r.get("bytes"):
            by_bytes[r["impl"], _params(r)].append((r["bytes"], r["median_ms"]))
    for axis, lines in (("batch size", by_batch), ("minimum bytes moved", by_bytes)):
        lines = {k: sorted(v) for k, v in lines.items() if len({x for x, _ in v}) >= 2}
        if lines:
            return axis, lines
    return "", {}


def plot_scaling(cases: list[dict[str, Any]], path: Path,
                 colours: dict[str, Any] | None = None) -> bool:
    """Median time against batch size (or, when no shape was run at several batch sizes,
    against problem size), one panel per family, one line per impl and shape."""
    families: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in cases:
        if r.get("unit", "ms") == "ms":
            families[r["family"]].append(r)
    panels = {f: _scaling_series(recs) for f, recs in sorted(families.items())}
    panels = {f: p for f, p in panels.items() if p[1]}
    if not panels:
        return False
    plt = _plt()
    colours = colours or _colours(plt, cases)
    styles = ("-", "--", ":", "-.")
    cols = min(2, len(panels))
    rows = -(-len(panels) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(9 * cols, 6 * rows), squeeze=False)
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    for ax, (family, (axis, lines)) in zip(axes.flat, panels.items(), strict=False):
        shapes = _ordered(label for _, label in lines)
        for (impl, label), pts in sorted(lines.items()):
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o",
                    color=colours[impl], ls=styles[shapes.index(label) % len(styles)],
                    lw=2 if is_ours(impl) else 1.2, label=f"{impl} {label}".strip())
        ax.set(xscale="log", yscale="log", xlabel=axis, ylabel="median time (ms)",
               title=f"{family}: scaling with {axis}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def plot_speedup(rows: list[dict[str, Any]], path: Path,
                 colours: dict[str, Any] | None = None) -> bool:
    """Our speedup over each alternative, per case (log scale; right of 1 is faster)."""
    if not rows:
        return False
    plt = _plt()
    colours = colours or _colours(plt, [{"impl": r["alternative"]} for r in rows])
    # one bar per (case, alternative), grouped by case, first case on top; bars grow from 1
    # so a slowdown points left
    labels = [f"{r['family']}/{r['name']} vs {r['alternative']}" for r in rows][::-1]
    speed = [r["speedup"] for r in rows][::-1]
    fig, ax = plt.subplots(figsize=(11, max(4.0, 0.22 * len(rows) + 1.5)))
    ax.barh(range(len(rows)), [s - 1 for s in speed], left=1, height=0.75,
            color=[colours[r["alternative"]] for r in rows][::-1])
    for y, s in enumerate(speed):
        ax.annotate(f"{s:.3g}x" if s < 100 else f"{s:,.0f}x", (s, y), fontsize=6, va="center",
                    xytext=(2 if s >= 1 else -2, 0), ha="left" if s >= 1 else "right",
                    textcoords="offset points")
    ax.axvline(1, color="k", lw=1)
    ax.set_yticks(range(len(rows)), labels, fontsize=6.5)
    ax.set(xscale="log", xlim=(min(0.5, min(speed) / 2), max(speed) * 3),
           xlabel="speedup = alternative median / RoboCache median (same run; > 1: faster)",
           title="RoboCache speedup over each alternative")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _fmt(v: Any, digits: int = 4) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return ""
    return f"{v:.{digits}g}" if isinstance(v, float) else str(v)


def _md_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def render(results: dict[str, Any], out_dir: str | os.PathLike) -> dict[str, Path]:
    """Write report.md, cases.csv, speedup.csv and the PNG plots that have data into `out_dir`.

    Returns {artifact name: path}.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta, cases = results["meta"], results["cases"]
    ceilings = ceiling_values(meta)
    rows = speedups(cases)
    written = {"cases.csv": out / "cases.csv"}
    write_csv(written["cases.csv"], cases, _CSV_FIRST)
    if rows:
        written["speedup.csv"] = out / "speedup.csv"
        write_csv(written["speedup.csv"], rows)
    # one colour per impl across the three plots (host-time cases are not plotted)
    colours = _colours(_plt(), [r for r in cases if r.get("unit", "ms") == "ms"])
    for name, ok in (("roofline.png", plot_roofline(cases, ceilings, out / "roofline.png",
                                                    colours)),
                     ("scaling.png", plot_scaling(cases, out / "scaling.png", colours)),
                     ("speedup.png", plot_speedup(rows, out / "speedup.png", colours))):
        if ok:
            written[name] = out / name

    clocks = (meta.get("gpu_state_end") or meta).get("clocks_mhz") or {}
    md = [
        "# RoboCache report card", "",
        f"{meta.get('device')} · {meta.get('date')} · commit `{(meta.get('commit') or '?')[:10]}`"
        f" · torch {meta.get('torch')} · triton {meta.get('triton')} · CUDA "
        f"{meta.get('cuda_runtime')} · driver {meta.get('driver')} · SM clock "
        f"{clocks.get('sm', '?')}/{clocks.get('sm_max', '?')} MHz · {len(cases)} cases", "",
        *([meta["note"], ""] if meta.get("note") else []),
        "## Ceilings measured in the same run", "",
    ]
    ceiling_rows = [[k, v.get("value"), v.get("unit"), v.get("peak"), v.get("pct_peak"),
                     v.get("what", v.get("error"))]
                    for k, v in (meta.get("ceilings") or {}).items()]
    if not ceiling_rows and meta.get("d2d_copy_GBps"):  # a run that measured the copy only
        from robocache.bench.doctor import datasheet

        peak = (datasheet(meta.get("device")) or {}).get("memory_GBps")
        ceiling_rows = [["d2d_copy_GBps", meta["d2d_copy_GBps"], "GB/s", peak,
                         peak and 100 * meta["d2d_copy_GBps"] / peak,
                         "device-to-device copy, bytes read + written"]]
    md += [_md_table(["ceiling", "value", "unit", "datasheet peak", "% of peak", "what"],
                     ceiling_rows) if ceiling_rows else "None (the run had no GPU).", ""]
    if meta.get("sources"):  # a file merged from several runs (compare.merge)
        md += ["## Runs merged into this file", "", meta.get("note", ""), "",
               _md_table(["run", "date", "families", "copy GB/s"],
                         [[s["source"], s["date"], ", ".join(s["families"]),
                           s["d2d_copy_GBps"]] for s in meta["sources"]]), ""]
    if meta.get("errors"):
        md += ["## Families that failed", "",
               *[f"- `{k}`: {v}" for k, v in meta["errors"].items()], ""]
    if "roofline.png" in written:
        md += ["## Roofline", "", "![roofline](roofline.png)", ""]
    if rows:
        md += ["## Speedup over the alternatives (same run)", "",
               "![speedup](speedup.png)" if "speedup.png" in written else "", "",
               _md_table(["family", "case", "ours", "alternative", "ours ms", "alternative ms",
                          "speedup"],
                         [[r["family"], r["name"], r["ours"], r["alternative"], r["ours_ms"],
                           r["alternative_ms"], f"{r['speedup']:.2f}x"] for r in rows]), ""]
    if "scaling.png" in written:
        md += ["## Scaling", "", "![scaling](scaling.png)", ""]
    md += ["## All cases", "", "Numbers behind the plots: `cases.csv`"
           + (", `speedup.csv`" if rows else "") + ".", "",
           _md_table(["family", "case", "impl", "median", "IQR", "GB/s", "% copy", "bound",
                      "% roofline"],
                     [[r["family"], r["name"], r["impl"],
                       f"{r['median_ms']:.4g} {r.get('unit', 'ms')}",
                       r["q75_ms"] - r["q25_ms"], r.get("GBps"), r.get("pct_copy"),
                       r.get("bound"), r.get("pct_roofline")] for r in cases]), ""]
    written["report.md"] = out / "report.md"
    written["report.md"].write_text("\n".join(md))
    return written
