"""The regression gate: compare a results file with a baseline, case by case.

Not every case can gate. Each case (same family, name and impl) gets a **gate** (`gate_of`):

- ``device``: the time is GPU time: CUDA-graph replays, and eager calls of our kernels that are
  bandwidth-bound (at least `BANDWIDTH_PCT` % of the copy ceiling, at least `DEVICE_MIN_MS`
  long, within `EAGER_GRAPH_RATIO` of their graph time when that was measured, and with a host
  time per call under `HOST_BOUND` of their time when that was measured). Such a
  case is **regressed** only when all three hold:
  1. its median is more than the threshold slower than the baseline's: `threshold` (5%), or the
     baseline's own relative interquartile range when that is wider, and by more than
     `DEVICE_FLOOR_MS` (0.5 us: launch latency differs that much between machines);
  2. the difference is significant: a one-sided Mann-Whitney U test on the stored samples
     (scipy.stats.mannwhitneyu) gives p < `alpha` — or, when either side has fewer than
     ``MIN_SAMPLES`` samples, the interquartile ranges do not overlap;
  3. the environment fingerprint (device, SMs, driver, torch, triton, CUDA) of the two files
     matches. When it differs nothing is compared: the mismatch is reported instead.
- ``host``: host time of one of our calls (unit ``us``). The host CPU is not in the fingerprint,
  so such a case gates only as a ratio to the bare Triton launch of the same family and name,
  measured in the same run: regressed when that ratio grows more than `HOST_THRESHOLD` (3x).
  Without such a reference it informs only.
- ``info``: everything else (the alternatives we compare against, CPU paths, eager calls whose
  GPU time hides host time, end-to-end loops): the change is shown, never gated.

A case may state its gate itself (``"gate": "device" | "host" | "info"``).
Records store their times in their own ``unit`` (``"ms"`` or ``"us"``, in the ``*_ms`` fields);
`compare` converts every record to milliseconds once, as it takes it in, so each threshold above
is in one unit whatever the records' units.
**Improved** is the mirror image of regressed; anything else is unchanged.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from robocache.errors import DataError, MissingDependencyError

THRESHOLD = 0.05
ALPHA = 0.01
MIN_SAMPLES = 5
# Gate classification (see the module docstring). An eager call's host cost on the H100 host is
# 10-110 us (the host rows of the baseline); below DEVICE_MIN_MS of GPU time do_bench's time can
# be the host's, and a host 3x slower moved such rows by 1.3-5x in a rerun of one commit.
GATES = ("device", "host", "info")
DEVICE_MIN_MS = 0.05
BANDWIDTH_PCT = 20.0
EAGER_GRAPH_RATIO = 1.25
# Back-to-back eager calls time the host once it needs about as long per call as the GPU: the
# fused RGB-D voxelization at B=8 (GPU 0.096 ms) timed 0.104 ms on a host needing 0.119 ms a
# call and 0.167 ms on one needing 0.205 ms, the same commit's kernels.
HOST_BOUND = 0.5
# Host ratios move far more than device times between runs of one commit on one kind of machine:
# resample's custom-op call went from 1.55x to 2.70x the bare launch (+74%, H100, two runs), align's
# eager call measured 0.99x, 1.48x and 2.77x in three. Only a change beyond that (an added sync, a
# per-call Python loop) gates.
HOST_THRESHOLD = 2.0
# Graph replays of microsecond kernels are bound by launch latency, which differs by a few hundred
# ns between machines of one kind: Panda FK N=256 replayed in 2.35 us on one H100 and 2.71/2.73 us
# (IQR 0.2%) on another, same kernel. A device case must also move by more than this.
DEVICE_FLOOR_MS = 0.0005
HOST_REFERENCE = "bare triton launch"  # in the reference's impl (any case, "_" for spaces)
FINGERPRINT_KEYS = ("device", "sm_count", "gpu_count", "driver", "cuda_runtime", "torch",
                    "triton")
# The results format (``robocache bench --json``): required fields and their types.
META_FIELDS = {"date": str, "device": str, "torch": str, "triton": str}
# A record's times are in its `unit`; this many milliseconds per unit.
UNIT_MS = {"ms": 1.0, "us": 1e-3}
CASE_FIELDS = {"family": str, "name": str, "impl": str, "unit": str, "median_ms": float,
               "q25_ms": float, "q75_ms": float, "n": int, "samples_ms": list}


def validate(doc: Any, source: str = "results") -> dict[str, Any]:
    """Check that `doc` is a results document; raise DataError naming the first bad field."""
    def need(obj, fields, where):
        for key, typ in fields.items():
            value = obj.get(key) if isinstance(obj, dict) else None
            ok = isinstance(value, (int, float) if typ is float else typ)
            if not ok or isinstance(value, bool):
                raise DataError(
                    f"{source}: {where}.{key} should be a {typ.__name__}, got {value!r}; "
                    "results files are written by `robocache bench --json`.")

    if not isinstance(doc, dict) or not isinstance(doc.get("cases"), list):
        raise DataError(f"{source}: expected an object with 'meta' and a 'cases' list, as "
                        "`robocache bench --json` writes.")
    need(doc.get("meta"), META_FIELDS, "meta")
    seen: dict[tuple[str, str, str], int] = {}
    for i, case in enumerate(doc["cases"]):
        need(case, CASE_FIELDS, f"cases[{i}]")
        if _key(case) in seen:
            raise DataError(f"{source}: cases[{seen[_key(case)]}] and cases[{i}] are both "
                            f"{_key(case)} (family, name, impl); the gate needs each once, so "
                            "give the benchmark's cases distinct names.")
        seen[_key(case)] = i
        if case["unit"] not in UNIT_MS:
            raise DataError(f"{source}: cases[{i}].unit is {case['unit']!r}; the gate knows "
                            f"{' and '.join(map(repr, UNIT_MS))}.")
    return doc


def load_results(path: str | os.PathLike) -> dict[str, Any]:
    """Read and validate a results JSON file."""
    try:
        doc = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise DataError(f"{path} is not valid JSON ({exc}).") from exc
    return validate(doc, str(path))


def fingerprint(meta: dict[str, Any]) -> dict[str, Any]:
    """The environment fields that must match for two timings to be comparable."""
    return {k: meta.get(k) for k in FINGERPRINT_KEYS}


def merge(docs: list[dict[str, Any]], sources: list[str]) -> dict[str, Any]:
    """One results document from per-family runs on the same environment (e.g. each family's
    H100 run): the first run's meta, plus ``meta.sources`` (per run: its label, date, commit,
    families, copy ceiling); cases concatenated. Raises DataError when fingerprints differ or a
    case appears twice."""
    base = fingerprint(docs[0]["meta"])
    for doc, label in zip(docs, sources, strict=True):
        if fingerprint(doc["meta"]) != base:
            raise DataError(f"{label} ran on {fingerprint(doc['meta'])}, not {base}; only runs "
                            "with one environment fingerprint can be merged.")
    meta = {**docs[0]["meta"], "sources": [
        {"source": label, "date": d["meta"].get("date"), "commit": d["meta"].get("commit"),
         "families": sorted({c["family"] for c in d["cases"]}),
         "d2d_copy_GBps": d["meta"].get("d2d_copy_GBps")}
        for d, label in zip(docs, sources, strict=True)]}
    return validate({"meta": meta, "cases": [c for d in docs for c in d["cases"]]}, "merged")


def _key(rec: dict[str, Any]) -> tuple[str, str, str]:
    return rec["family"], rec["name"], rec["impl"]


def gate_of(rec: dict[str, Any]) -> str:
    """The gate a case goes through: 'device', 'host' or 'info' (module docstring)."""
    if rec.get("gate") in GATES:
        return rec["gate"]
    impl = rec["impl"].lower()
    if "robocache" not in impl or "cpu" in impl:
        return "info"
    if rec.get("unit", "ms") == "us" and "gpu" not in impl:
        return "host"
    if rec.get("timing") == "graph" or "graph" in impl or "gpu" in impl:
        return "device"
    # graph_ms is in ms and host_us in us whatever the record's unit
    median = rec["median_ms"] * UNIT_MS[rec.get("unit", "ms")]
    graph, host = rec.get("graph_ms"), rec.get("host_us")
    if (median >= DEVICE_MIN_MS and (rec.get("pct_copy") or 0.0) >= BANDWIDTH_PCT
            and (graph is None or median <= EAGER_GRAPH_RATIO * graph)
            and (host is None or host / 1e3 < HOST_BOUND * median)):
        return "device"
    return "info"


def _in_ms(rec: dict[str, Any]) -> dict[str, Any]:
    """A copy of `rec` with its times in milliseconds and its gate settled (from the record as
    written); ``unit`` stays the record's own, the unit it is shown in."""
    scale = UNIT_MS[rec.get("unit", "ms")]
    return {**rec, "gate": gate_of(rec),
            **{k: rec[k] * scale for k in ("median_ms", "q25_ms", "q75_ms")},
            "samples_ms": [v * scale for v in _samples(rec)]}


def _host_references(cases) -> dict[tuple[str, str], dict[str, Any]]:
    """(family, name) -> that case's bare Triton launch (host time)."""
    return {(r["family"], r["name"]): r for r in cases
            if HOST_REFERENCE in r["impl"].lower().replace("_", " ") and r["median_ms"] > 0}


def _spread(rec: dict[str, Any]) -> float:
    """Interquartile range relative to the median."""
    return (rec["q75_ms"] - rec["q25_ms"]) / rec["median_ms"]


def _samples(rec: dict[str, Any]) -> list[float]:
    return rec.get("samples_ms") or [rec["median_ms"]]


def _significant(slower: dict[str, Any], faster: dict[str, Any],
                 alpha: float) -> tuple[bool, float | None]:
    """Is `slower` significantly slower than `faster`? Returns (verdict, p-value or None)."""
    a, b = _samples(slower), _samples(faster)
    if min(len(a), len(b)) >= MIN_SAMPLES:
        try:
            from scipy.stats import mannwhitneyu
        except ImportError as exc:
            raise MissingDependencyError("scipy", "dev", "The regression gate") from exc

        p = float(mannwhitneyu(a, b, alternative="greater").pvalue)
        return p < alpha, p
    return slower["q25_ms"] > faster["q75_ms"], None


@dataclass
class Row:
    family: str
    name: str
    impl: str
    status: str  # improved | unchanged | regressed | info | new | missing
    unit: str = "ms"  # the unit it is shown in; base_ms and new_ms are milliseconds
    gate: str = "info"  # device | host (as a ratio to the bare launch) | info
    base_ms: float | None = None
    new_ms: float | None = None
    change: float | None = None  # new / base - 1
    p_value: float | None = None


@dataclass
class Comparison:
    rows: list[Row] = field(default_factory=list)
    fingerprint_diff: dict[str, tuple[Any, Any]] = field(default_factory=dict)

    @property
    def comparable(self) -> bool:
        return not self.fingerprint_diff

    @property
    def regressed(self) -> list[Row]:
        return [r for r in self.rows if r.status == "regressed"]

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[r.status] = out.get(r.status, 0) + 1
        return out


def compare(baseline: dict[str, Any], results: dict[str, Any], *, threshold: float = THRESHOLD,
            alpha: float = ALPHA) -> Comparison:
    """Compare `results` with `baseline` (both in the ``robocache bench --json`` format)."""
    fb, fr = fingerprint(baseline["meta"]), fingerprint(results["meta"])
    diff = {k: (fb[k], fr[k]) for k in FINGERPRINT_KEYS if fb[k] != fr[k]}
    out = Comparison(fingerprint_diff=diff)
    if diff:
        return out
    base = {_key(r): _in_ms(r) for r in baseline["cases"]}
    new = {_key(r): _in_ms(r) for r in results["cases"]}
    refs = _host_references(base.values()), _host_references(new.values())
    for key in sorted(base.keys() | new.keys()):
        b, n = base.get(key), new.get(key)
        if b is None or n is None:
            out.rows.append(Row(*key, status="new" if b is None else "missing",
                                unit=(b or n).get("unit", "ms"), gate=gate_of(b or n),
                                base_ms=b and b["median_ms"], new_ms=n and n["median_ms"]))
            continue
        out.rows.append(_verdict(key, b, n, refs, threshold, alpha))
    return out


def _verdict(key, b: dict[str, Any], n: dict[str, Any], refs, threshold: float,
             alpha: float) -> Row:
    """One case present on both sides, judged by the gate of its baseline record."""
    row = Row(*key, status="info", unit=n.get("unit", "ms"), gate=gate_of(b),
              base_ms=b["median_ms"], new_ms=n["median_ms"],
              change=n["median_ms"] / b["median_ms"] - 1)
    if row.gate == "host":
        ref_b, ref_n = (r.get(key[:2]) for r in refs)
        if ref_b is None or ref_n is None:
            row.gate = "info"
            return row
        # how much more host time than the bare launch, now against then; a case (or
        # reference) that spreads widely within a run needs a larger change
        row.change = ((n["median_ms"] / ref_n["median_ms"])
                      / (b["median_ms"] / ref_b["median_ms"]) - 1)
        limit = max(HOST_THRESHOLD, _spread(b) + _spread(ref_b))
        row.status = ("regressed" if row.change > limit else
                      "improved" if row.change < -limit else "unchanged")
    elif row.gate == "device":
        limit = max(threshold, _spread(b), DEVICE_FLOOR_MS / b["median_ms"])
        row.status = "unchanged"
        if row.change > limit:
            worse, row.p_value = _significant(n, b, alpha)
            row.status = "regressed" if worse else row.status
        elif row.change < -limit:
            better, row.p_value = _significant(b, n, alpha)
            row.status = "improved" if better else row.status
    return row


def print_comparison(cmp: Comparison, *, threshold: float = THRESHOLD,
                     alpha: float = ALPHA) -> None:
    from rich.table import Table

    from robocache._console import console as make_console
    from robocache._console import print_table

    console = make_console()
    if not cmp.comparable:
        console.print("[bold yellow]Environment fingerprints differ; nothing was compared:[/]")
        for k, (b, n) in cmp.fingerprint_diff.items():
            console.print(f"  {k}: baseline {b!r}, results {n!r}")
        return
    colour = {"regressed": "red", "improved": "green", "new": "cyan", "missing": "yellow"}
    # a family absent from the results altogether is one line under the table, not a row a case
    ran = {r.family for r in cmp.rows if r.status != "missing"}
    absent: dict[str, int] = {}
    for r in cmp.rows:
        if r.family not in ran:
            absent[r.family] = absent.get(r.family, 0) + 1
    table = Table(title=f"Regression gate: device cases > {threshold:.0%} (or their IQR) slower "
                        f"and p < {alpha:g} (Mann-Whitney U); host cases > "
                        f"{HOST_THRESHOLD:.0%} more than the bare launch; info cases not gated")
    for col in ("family", "case", "impl", "gate", "baseline", "now", "change", "p", "status"):
        table.add_column(col, justify="right" if col in ("baseline", "now", "change", "p")
                         else "left")
    order = {"regressed": 0, "improved": 1, "missing": 2, "new": 3, "unchanged": 4, "info": 5}
    for r in sorted((r for r in cmp.rows if r.family in ran), key=lambda r: order[r.status]):
        c = colour.get(r.status)
        table.add_row(
            r.family, r.name, r.impl, "÷ bare launch" if r.gate == "host" else r.gate,
            f"{r.base_ms / UNIT_MS[r.unit]:.4g} {r.unit}" if r.base_ms is not None else "",
            f"{r.new_ms / UNIT_MS[r.unit]:.4g} {r.unit}" if r.new_ms is not None else "",
            f"{100 * r.change:+.1f}%" if r.change is not None else "",
            f"{r.p_value:.2g}" if r.p_value is not None else "",
            f"[{c}]{r.status}[/]" if c else r.status)
    print_table(table, console)
    if absent:
        console.print("not in the results (not run): " +
                      ", ".join(f"{f} ({n} cases)" for f, n in sorted(absent.items())))
    console.print(", ".join(f"{v} {k}" for k, v in sorted(cmp.counts().items())))
