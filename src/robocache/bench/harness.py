"""Timing core shared by every ``benchmarks/bench_<family>.py``.

GPU times are CUDA-event medians from ``triton.testing.do_bench`` after warm-up (with IQR);
inputs rotate between copies whose total exceeds the L2 cache so repeated calls are not
served from it. CPU times come from ``torch.utils.benchmark``; host overhead is measured as
back-to-back eager calls on the host clock. Records keep their samples (up to
``MAX_STORED_SAMPLES`` order statistics) so the regression gate can test significance.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

L2_FLUSH_BYTES = 256 << 20  # larger than any current GPU's L2 (H100: 50 MB, H200: 60 MB)
MAX_STORED_SAMPLES = 256  # do_bench returns thousands for a fast op; keeps results files small
_loop_scale = 1.0  # < 1 while profiling: see `profiling`


def profiling(on: bool = True) -> None:
    """Shorten every timing loop 20x while a profiler records (a trace grows with each call);
    times measured so are for reading the trace, not for the record."""
    global _loop_scale
    _loop_scale = 0.05 if on else 1.0


@dataclass
class Timing:
    """Summary of repeated timings, in milliseconds."""

    median_ms: float
    q25_ms: float
    q75_ms: float
    n: int
    samples_ms: list[float]

    @property
    def iqr_ms(self) -> float:
        return self.q75_ms - self.q25_ms

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def add_rates(records: list[dict], count: int, unit: str, nbytes: int) -> None:
    """Give each record (timed over ``count`` items of ``unit`` and ``nbytes`` source bytes)
    ``<unit>``, ``<unit>_per_s``, ``MB_per_s`` and a note saying both rates."""
    for r in records:
        seconds = r["median_ms"] * 1e-3
        r[unit] = count
        r[f"{unit}_per_s"] = count / seconds
        r["MB_per_s"] = nbytes / seconds / 1e6
        r["note"] = f"{r[f'{unit}_per_s']:,.0f} {unit}/s, {r['MB_per_s']:.1f} MB/s"


def summarize(samples_ms: Sequence[float]) -> Timing:
    """Median and quartiles of all samples; the stored samples are at most MAX_STORED_SAMPLES
    evenly spaced order statistics of them (same distribution, bounded size)."""
    s = sorted(float(v) for v in samples_ms)
    if len(s) == 1:
        return Timing(s[0], s[0], s[0], 1, s)
    q = statistics.quantiles(s, n=4, method="inclusive")
    if len(s) > MAX_STORED_SAMPLES:
        step = (len(s) - 1) / (MAX_STORED_SAMPLES - 1)
        kept = [s[round(i * step)] for i in range(MAX_STORED_SAMPLES)]
    else:
        kept = s
    return Timing(statistics.median(s), q[0], q[2], len(s), kept)


def rotation_count(bytes_per_set: int, *, max_sets: int = 64) -> int:
    """How many input copies make a rotation larger than the L2 cache (at least 1)."""
    if bytes_per_set <= 0:
        return 1
    return max(1, min(max_sets, -(-L2_FLUSH_BYTES // bytes_per_set)))


def gpu_time(fn: Callable[[], Any], *, warmup_ms: float = 25, rep_ms: float = 200) -> Timing:
    """Median CUDA-event time of `fn` (triton.testing.do_bench; it clears L2 between calls)."""
    import triton.testing

    samples = triton.testing.do_bench(fn, warmup=warmup_ms * _loop_scale,
                                      rep=rep_ms * _loop_scale, return_mode="all")
    return summarize(samples)


EXTRA_READ_ENV = "ROBOCACHE_BENCH_EXTRA_READ"


def with_extra_read(fn: Callable[[], Any], nbytes: int) -> Callable[[], Any]:
    """`fn`, or, when ``ROBOCACHE_BENCH_EXTRA_READ`` is a fraction (``0.1``), `fn` preceded by
    a full read of a buffer of that fraction of `nbytes`: a known slowdown of a bandwidth-bound
    case, to check that the regression gate catches it (docs/bench.md)."""
    fraction = float(os.environ.get(EXTRA_READ_ENV) or 0)
    if fraction <= 0:
        return fn
    scratch = torch.ones(max(1, int(fraction * nbytes) // 4), device="cuda")

    def slowed(*args, **kwargs):
        scratch.sum()
        return fn(*args, **kwargs)
    return slowed


def rotating(fns: Sequence[Callable[[], Any]]) -> Callable[[], Any]:
    """Cycle through closures over different input copies, one per call."""
    state = {"i": 0}

    def call():
        i = state["i"]
        state["i"] = (i + 1) % len(fns)
        return fns[i]()

    return call


def graph_time(fn: Callable[[], Any], *, calls: int = 100, rep_ms: float = 200) -> Timing:
    """GPU time per call when `calls` back-to-back calls are replayed from one CUDA graph.

    This is the time a launch-bound op costs inside a captured training step.
    """
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    t = gpu_time(graph.replay, rep_ms=rep_ms)
    return summarize([v / calls for v in t.samples_ms])


def host_time_us(fn: Callable[[], Any], *, calls: int = 2000, repeats: int = 7) -> Timing:
    """Host microseconds per back-to-back call (validation + dispatch + launch), median of
    `repeats` runs of `calls` calls. Returned in the Timing's *_ms fields as microseconds."""
    calls = max(10, int(calls * _loop_scale))
    for _ in range(50):
        fn()
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    sync()
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        runs.append((time.perf_counter() - t0) / calls * 1e6)
        sync()
    return summarize(runs)


def copy_bandwidth_gbps(nbytes: int = 1 << 30) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device="cuda").uniform_()
    dst = torch.empty_like(src)
    t = gpu_time(lambda: dst.copy_(src), rep_ms=300)
    return 2 * nbytes / (t.median_ms * 1e-3) / 1e9


def raw_read_s(files: Sequence[Path], direct: bool = False) -> tuple[float, int]:
    """Seconds to read ``files`` once (no decoding, one thread per core) and the bytes read;
    ``direct``: with ``O_DIRECT`` into page-aligned buffers, past the page cache (the storage's
    own rate; raises ``OSError`` where the file system refuses it, e.g. tmpfs)."""
    import mmap
    from concurrent.futures import ThreadPoolExecutor

    def read(p: Path) -> int:
        n = 0
        if not direct:
            with open(p, "rb", buffering=0) as f:
                while chunk := f.read(16 << 20):
                    n += len(chunk)
            return n
        fd = os.open(p, os.O_RDONLY | os.O_DIRECT)
        buf = mmap.mmap(-1, 16 << 20)  # page-aligned, as O_DIRECT needs
        try:
            while (k := os.readv(fd, [buf])) > 0:
                n += k
        finally:
            os.close(fd)
            buf.close()
        return n

    os.sync()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(os.cpu_count()) as pool:
        nbytes = sum(pool.map(read, files))
    return time.perf_counter() - t0, nbytes


def raw_reads(family: str, name: str, files: Sequence[Path], done: Callable[[dict], Any]
              ) -> tuple[float, str]:
    """The ``raw-read`` cases of ``files`` (every core), through the page cache and with
    ``O_DIRECT`` (``raw-read-direct``), each given to ``done``. Returns the rate a build of
    these files is compared with, in bytes/s, and what it is: the storage's read where the file
    system allows ``O_DIRECT``, else the page cache's (a just-written dataset's page-cache read
    is memory bandwidth more than the disk's)."""
    cores = os.cpu_count() or 1
    read_s, nbytes = raw_read_s(files)
    cached = nbytes / read_s
    done(case(family, name, "raw-read", summarize([read_s * 1e3]), nbytes=nbytes,
              threads=cores, MB_per_s=cached / 1e6,
              note=f"{cached / 1e9:.2f} GB/s through the page cache, {nbytes / 1e9:.2f} GB"))
    try:
        read_s, _ = raw_read_s(files, direct=True)
    except OSError as e:
        done(case(family, name, "raw-read-direct", summarize([0.0]), skipped=True,
                  note=f"O_DIRECT refused here ({e.strerror}): compared with the page-cache "
                       "read"))
        return cached, "the page-cache read"
    done(case(family, name, "raw-read-direct", summarize([read_s * 1e3]), nbytes=nbytes,
              threads=cores, MB_per_s=nbytes / read_s / 1e6,
              note=f"{nbytes / read_s / 1e9:.2f} GB/s from the storage (O_DIRECT)"))
    return nbytes / read_s, "the storage's read"


def gpu_state() -> dict[str, Any] | None:
    """GPU 0's clocks, throttle reasons and temperature now (NVML), or None without NVML."""
    from robocache.bench import nvml

    state = nvml.snapshot()
    if not state["available"] or not state["gpus"]:
        return None
    gpu = state["gpus"][0]
    return {k: gpu[k] for k in ("clocks_mhz", "throttle_reasons", "temperature_c")}


def metadata() -> dict[str, Any]:
    """Run metadata: date, versions, commit, device, driver and clocks (NVML, when present)."""
    from robocache import _env
    from robocache.bench import nvml

    v = _env.versions()
    meta: dict[str, Any] = {
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "robocache": v["robocache"],
        "commit": _env.git_commit(),
        "python": v["python"],
        "torch": v["torch"],
        "triton": v["triton"],
        "cuda_runtime": v["cuda_runtime"],
        "host": platform.node(),
        "cpu": _env.cpu_model(),
        "cpu_count": os.cpu_count(),
    }
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        meta.update(device=p.name, sm_count=p.multi_processor_count,
                    memory_bytes=p.total_memory,
                    capability=f"{p.major}.{p.minor}", gpu_count=torch.cuda.device_count())
        state = nvml.snapshot()
        if state["available"] and state["gpus"]:
            gpu = state["gpus"][0]
            meta.update(driver=state["driver"], cuda_driver=state["cuda_driver"],
                        clocks_mhz=gpu["clocks_mhz"], throttle_reasons=gpu["throttle_reasons"],
                        ecc_enabled=gpu["ecc_enabled"], power_limit_w=gpu["power_limit_w"])
    else:
        meta["device"] = "cpu"
    return meta


def write_json(path: str | os.PathLike, payload: dict[str, Any]) -> Path:
    """Write `payload` as JSON; atomically (temp file + rename), so a run killed mid-write
    leaves the previous complete file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(payload, indent=1, default=float) + "\n")
    os.replace(tmp, path)
    return path


def cuda_ready() -> bool:
    return torch.cuda.is_available()


def cpu_time(fn: Callable[[], Any], *, repeats: int = 15, min_s: float = 0.02) -> Timing:
    """Host time of `fn` in ms (for CPU implementations): torch.utils.benchmark's
    blocked_autorange over about `repeats` * `min_s` seconds, one sample per block, using all
    of torch's threads (the Timer's default is one)."""
    from torch.utils.benchmark import Timer

    fn()
    timer = Timer(stmt="fn()", globals={"fn": fn}, num_threads=torch.get_num_threads())
    m = timer.blocked_autorange(min_run_time=repeats * min_s * _loop_scale)
    return summarize([t * 1e3 for t in m.times])


def case(family: str, name: str, impl: str, timing: Timing, /, *, nbytes: int | None = None,
         flops: int | None = None, copy_gbps: float | None = None, unit: str = "ms",
         **extra: Any) -> dict[str, Any]:
    """One benchmark record: what ran, its timing, and its bandwidth against the copy ceiling.

    `nbytes` is the minimum traffic (each input read once, each output written once) and
    `flops` the minimum arithmetic; from them come GB/s, TFLOP/s and the arithmetic intensity
    (FLOP/byte) that places the op on the roofline. Extra keywords are stored as they are: shape
    parameters (ints/strings such as ``batch=256, dtype="bfloat16"``) group the report's
    scaling curves, with ``batch`` as the x axis. The first four are positional-only, so an extra
    may reuse their names (``timing="graph"``).
    """
    rec: dict[str, Any] = {"family": family, "name": name, "impl": impl, "unit": unit,
                           **timing.to_dict(), "bytes": nbytes, "flops": flops}
    if unit == "ms" and timing.median_ms > 0:
        if nbytes:
            rec["GBps"] = nbytes / (timing.median_ms * 1e-3) / 1e9
            if copy_gbps:
                rec["pct_copy"] = 100.0 * rec["GBps"] / copy_gbps
        if flops:
            rec["TFLOPs"] = flops / (timing.median_ms * 1e-3) / 1e12
            if nbytes:
                rec["intensity"] = flops / nbytes
    rec.update(extra)
    return rec


def roofline(rec: dict[str, Any], ceilings: dict[str, float]) -> dict[str, Any]:
    """Place a record on the roofline of the measured `ceilings` (``d2d_copy_GBps`` and
    ``gemm_bf16_TFLOPs`` / ``gemm_fp32_TFLOPs``): adds ``bound`` ('memory' or 'compute') and
    ``pct_roofline``, the achieved fraction of min(peak compute, intensity x copy bandwidth).
    16-bit records (``dtype`` containing '16') use the bf16 GEMM peak, others fp32.
    A record without FLOPs is memory-bound by definition: its roofline is the copy ceiling.
    """
    bw = ceilings.get("d2d_copy_GBps")
    if not bw or not rec.get("GBps"):
        return rec
    peak = ceilings.get("gemm_bf16_TFLOPs" if "16" in str(rec.get("dtype", ""))
                        else "gemm_fp32_TFLOPs")
    if not rec.get("intensity") or not peak:
        rec.update(bound="memory", pct_roofline=100.0 * rec["GBps"] / bw)
        return rec
    attainable = min(peak, rec["intensity"] * bw / 1e3)  # TFLOP/s
    rec.update(bound="memory" if rec["intensity"] * bw / 1e3 < peak else "compute",
               pct_roofline=100.0 * rec["TFLOPs"] / attainable)
    return rec


def one_line(rec: dict[str, Any]) -> str:
    """A case as one line of text (printed as it finishes, before the run's table)."""
    unit = rec.get("unit", "ms")
    note = f"  {rec['note']}" if rec.get("note") else ""
    return f"{rec['family']} · {rec['name']} · {rec['impl']}: {rec['median_ms']:.4g} {unit}{note}"


def print_table(results: dict[str, Any]) -> None:
    from rich.table import Table

    from robocache._console import print_table

    meta = results["meta"]
    title = f"{meta.get('device')} · torch {meta.get('torch')} · triton {meta.get('triton')}"
    if meta.get("d2d_copy_GBps"):
        title += f" · copy {meta['d2d_copy_GBps']:.0f} GB/s"
    table = Table(title=title)
    for col in ("family", "case", "impl", "median", "IQR", "GB/s", "% copy", "note"):
        table.add_column(col, justify="right" if col in ("median", "IQR", "GB/s", "% copy")
                         else "left")
    for r in results["cases"]:
        unit = r.get("unit", "ms")
        table.add_row(
            r["family"], r["name"], r["impl"], f"{r['median_ms']:.4g} {unit}",
            f"{r['q75_ms'] - r['q25_ms']:.2g}",
            f"{r['GBps']:.0f}" if r.get("GBps") else "",
            f"{r['pct_copy']:.1f}" if r.get("pct_copy") else "",
            str(r.get("note", "")),
        )
    print_table(table)
