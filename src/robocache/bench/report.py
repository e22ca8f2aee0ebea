"""The report card: a results file (``robocache bench --json``) rendered as Markdown, PNG plots
(roofline against the measured ceilings, batch-size scaling, speedup over each alternative) and
the numbers behind them as CSV. Renders on a machine without a GPU.
"""

from __future__ import annotations

import csv
import math
import os
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


def _batch(rec: dict[str, Any]) -> int | None:
    for key in BATCH_KEYS:
        if isinstance(rec.get(key), int):
            return rec[key]
    return None


def _series(rec: dict[str, Any], types: tuple[type, ...] = (int, str)) -> str:
    """A label of the case's parameters of `types` other than the batch size
    (e.g. 'S=500 T=250 D=64 dtype=torch.bfloat16')."""
    params = [f"{k}={v}".replace("torch.", "") for k, v in rec.items()
              if k not in _MEASURED and isinstance(v, types) and not isinstance(v, bool)]
    return " ".join(params)


def _label(rec: dict[str, Any]) -> str:
    return f"{rec['family']}/{rec['name']}"


def _ordered(values) -> list:
    """Distinct values in first-seen order (the benchmark's own order)."""
    return list(dict.fromkeys(values))


def _colours(plt, cases: list[dict[str, Any]]) -> dict[str, Any]:
    """One colour per impl across every plot; ours come first (blue)."""
    impls = sorted(_ordered(r["impl"] for r in cases), key=lambda i: not is_ours(i))
    return {impl: plt.cm.tab10(i % 10) for i, impl in enumerate(impls)}


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
    """Left: TFLOP/s against FLOP/byte under the measured roofs (ops that declare FLOPs).
    Right: achieved GB/s of every case against the measured copy ceiling."""
    bw = ceilings.get("d2d_copy_GBps")
    timed = [r for r in cases if r.get("GBps")]
    if not bw or not timed:
        return False
    plt = _plt()
    labels = _ordered(_label(r) for r in timed)[::-1]  # first case on top
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(16, max(5.0, 0.3 * len(labels) + 2)),
                                 gridspec_kw={"width_ratios": [1, 1.3]})
    colours = colours or _colours(plt, cases)

    peaks = {k: ceilings[k] for k in ("gemm_bf16_TFLOPs", "gemm_fp32_TFLOPs") if ceilings.get(k)}
    placed = [r for r in timed if r.get("intensity") and r.get("TFLOPs")]
    lo = min([r["intensity"] for r in placed] + [0.01]) / 2
    hi = max([r["intensity"] for r in placed] + [2e3 * max(peaks.values(), default=1) / bw]) * 2
    xs = [lo * (hi / lo) ** (i / 200) for i in range(201)]
    ax.plot(xs, [x * bw / 1e3 for x in xs], "k--", lw=1,
            label=f"copy {bw:.0f} GB/s (measured)")
    for (key, peak), style in zip(sorted(peaks.items()), ("-", ":"), strict=False):
        ax.plot(xs, [min(peak, x * bw / 1e3) for x in xs], "k", ls=style, lw=1.5,
                label=f"{key.split('_')[1]} GEMM {peak:.0f} TFLOP/s (measured)")
    for r in placed:
        ax.scatter(r["intensity"], r["TFLOPs"], color=colours[r["impl"]], s=36, zorder=3)
        if is_ours(r["impl"]):
            ax.annotate(_label(r), (r["intensity"], r["TFLOPs"]), fontsize=7,
                        xytext=(4, -3), textcoords="offset points")
    ax.set(xscale="log", yscale="log", xlabel="arithmetic intensity (FLOP / minimum byte)",
           ylabel="TFLOP/s", title="Roofline (ops that declare FLOPs)"
           if placed else "Roofline (no case declares FLOPs yet)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")

    y = {label: i for i, label in enumerate(labels)}
    for r in timed:
        bx.scatter(r["GBps"], y[_label(r)], color=colours[r["impl"]], s=30, zorder=3,
                   label=r["impl"])
    bx.axvline(bw, color="k", ls="--", lw=1, label=f"copy ceiling {bw:.0f} GB/s (measured)")
    bx.set_yticks(range(len(labels)), labels, fontsize=7)
    bx.set(xscale="log", xlabel="achieved GB/s (minimum bytes / median time)",
           title="Bandwidth against the measured copy ceiling")
    bx.grid(True, axis="x", which="both", alpha=0.3)
    handles = dict(zip(*bx.get_legend_handles_labels()[::-1], strict=True))
    bx.legend(handles.values(), handles.keys(), fontsize=8, loc="upper left",
              bbox_to_anchor=(1.01, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def _scaling_series(cases: list[dict[str, Any]]) -> tuple[str, dict[tuple[str, str], list]]:
    """Lines of (x, median ms) per (impl, parameters) for one family: over the batch size when
    some shape was run at two batch sizes or more, else over the minimum bytes (problem size)."""
    by_batch: dict[tuple[str, str], list] = defaultdict(list)
    by_bytes: dict[tuple[str, str], list] = defaultdict(list)
    for r in cases:
        if _batch(r) is not None:
            by_batch[r["impl"], _series(r)].append((_batch(r), r["median_ms"]))
        if r.get("bytes"):
            by_bytes[r["impl"], _series(r, (str,))].append((r["bytes"], r["median_ms"]))
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
    fig, axes = plt.subplots(1, len(panels), figsize=(8 * len(panels), 6), squeeze=False)
    for ax, (family, (axis, lines)) in zip(axes[0], panels.items(), strict=True):
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
        ax.annotate(f"{s:.3g}x", (s, y), fontsize=6, va="center",
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
    colours = _colours(_plt(), cases)  # one colour per impl across the three plots
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
        "## Ceilings measured in the same run", "",
    ]
    ceiling_rows = [[k, v.get("value"), v.get("unit"), v.get("peak"), v.get("pct_peak"),
                     v.get("what", v.get("error"))]
                    for k, v in (meta.get("ceilings") or {}).items()]
    if not ceiling_rows and meta.get("d2d_copy_GBps"):
        ceiling_rows = [["d2d_copy_GBps", meta["d2d_copy_GBps"], "GB/s", None, None,
                         "device-to-device copy, bytes read + written"]]
    md += [_md_table(["ceiling", "value", "unit", "datasheet peak", "% of peak", "what"],
                     ceiling_rows) if ceiling_rows else "None (the run had no GPU).", ""]
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
