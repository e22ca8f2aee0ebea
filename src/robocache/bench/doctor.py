"""Certify the GPU stack: what is installed, what state the GPUs are in, and the ceilings this
machine reaches right now (copy, GEMM, host link, and with several GPUs P2P and NCCL all-reduce),
each next to the datasheet peak of the GPU model. Snapshots are JSON; `drift` lists what changed
between two of them.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from robocache import _env
from robocache.bench import nvml

SCHEMA = "robocache.doctor/1"
GEMM_N = 8192
DRIFT_TOLERANCE = 0.05  # a ceiling more than 5% below the saved one is drift
ALLREDUCE_SIZES = tuple(1 << p for p in range(20, 31, 2))  # 1 MiB .. 1 GiB, x4 steps

EXIT_OK, EXIT_DRIFT, EXIT_NO_GPU = 0, 1, 2

WOULD_MEASURE = (
    "device-to-device copy bandwidth (1 GiB, bytes read + written)",
    f"bf16 and fp32 GEMM TFLOP/s at {GEMM_N}^3",
    "host-to-device and device-to-host bandwidth, pinned and pageable (256 MiB)",
    "with >= 2 GPUs: P2P copy bandwidth per GPU pair and NCCL all-reduce bus bandwidth over "
    "1 MiB..1 GiB",
)

# NVIDIA datasheet peaks (dense, no sparsity), matched by substring of the device name, most
# specific first. memory: HBM/GDDR GB/s; nvlink: GB/s per direction.
DATASHEET_SOURCE = "NVIDIA datasheet (dense, no sparsity)"
_DATASHEET = (
    ("H100 NVL", dict(memory_GBps=3900, bf16_TFLOPs=835, fp32_TFLOPs=60, nvlink_GBps=300)),
    ("H100 PCIe", dict(memory_GBps=2000, bf16_TFLOPs=756, fp32_TFLOPs=51, nvlink_GBps=300)),
    ("H100", dict(memory_GBps=3350, bf16_TFLOPs=989, fp32_TFLOPs=67, nvlink_GBps=450)),
    ("H200 NVL", dict(memory_GBps=4800, bf16_TFLOPs=835, fp32_TFLOPs=60, nvlink_GBps=450)),
    ("H200", dict(memory_GBps=4800, bf16_TFLOPs=989, fp32_TFLOPs=67, nvlink_GBps=450)),
    ("A100-SXM4-80GB", dict(memory_GBps=2039, bf16_TFLOPs=312, fp32_TFLOPs=19.5,
                            nvlink_GBps=300)),
    ("A100-SXM4-40GB", dict(memory_GBps=1555, bf16_TFLOPs=312, fp32_TFLOPs=19.5,
                            nvlink_GBps=300)),
    ("A100 80GB PCIe", dict(memory_GBps=1935, bf16_TFLOPs=312, fp32_TFLOPs=19.5,
                            nvlink_GBps=300)),
    ("L40S", dict(memory_GBps=864, bf16_TFLOPs=362, fp32_TFLOPs=91.6)),
    ("L4", dict(memory_GBps=300, bf16_TFLOPs=121, fp32_TFLOPs=30.3)),
)


def datasheet(device_name: str | None) -> dict[str, Any] | None:
    """Datasheet peaks of a GPU model, or None when the model is not in the table."""
    for key, peaks in _DATASHEET:
        if device_name and key in device_name:
            return {"model": key, "source": DATASHEET_SOURCE, **peaks}
    return None


def busbw(algbw: float, world: int) -> float:
    """All-reduce bus bandwidth from algorithm bandwidth, as nccl-tests defines it."""
    return algbw * 2 * (world - 1) / world


# ---------------------------------------------------------------------------------------------
# What is installed
# ---------------------------------------------------------------------------------------------

def software() -> dict[str, Any]:
    import torch

    nccl = torch.cuda.nccl.version() if torch.cuda.is_available() else None
    return {**_env.versions(), "nvidia-ml-py": _env.dist_version("nvidia-ml-py"),
            "nccl": ".".join(map(str, nccl)) if isinstance(nccl, tuple) else nccl}


def topology_text() -> str | None:
    """`nvidia-smi topo -m` as printed (the GPU/NIC/CPU-affinity matrix), or None."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "topo", "-m"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def cuda_devices() -> list[dict[str, Any]]:
    import torch

    devices = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        devices.append({"index": i, "name": p.name, "sm_count": p.multi_processor_count,
                        "capability": f"{p.major}.{p.minor}", "memory_bytes": p.total_memory,
                        "l2_bytes": getattr(p, "L2_cache_size", None)})
    return devices


def missing_gpu_reasons(nvml_state: dict[str, Any]) -> list[str]:
    """Why torch sees no CUDA device, in the user's terms."""
    import torch

    reasons = []
    if torch.version.cuda is None:
        reasons.append(f"this torch build ({torch.__version__}) is CPU-only; install a CUDA "
                       "build from https://pytorch.org/get-started/locally/")
    if os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1"):
        reasons.append("CUDA_VISIBLE_DEVICES hides every GPU "
                       f"(CUDA_VISIBLE_DEVICES={os.environ['CUDA_VISIBLE_DEVICES']!r})")
    if not nvml_state.get("available"):
        reasons.append(nvml_state.get("error") or "NVML is unavailable")
    elif not nvml_state.get("gpus"):
        reasons.append("the NVIDIA driver is loaded but reports no GPU")
    return reasons or ["torch.cuda.is_available() is False"]


# ---------------------------------------------------------------------------------------------
# Ceilings
# ---------------------------------------------------------------------------------------------

def _ceiling(value: float, unit: str, what: str, peak: float | None = None,
             peak_label: str = DATASHEET_SOURCE) -> dict[str, Any]:
    rec = {"value": value, "unit": unit, "what": what}
    if peak:
        rec.update(peak=peak, peak_source=peak_label, pct_peak=100.0 * value / peak)
    return rec


def gemm_tflops(dtype, n: int = GEMM_N) -> float:
    """TFLOP/s of an n x n x n matmul (2 n^3 FLOPs) in `dtype`; fp32 is measured with TF32 off."""
    import torch

    from robocache.bench.harness import gpu_time

    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    tf32 = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    try:
        t = gpu_time(lambda: a @ b, rep_ms=300)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
    return 2 * n**3 / (t.median_ms * 1e-3) / 1e12


def host_copy_gbps(direction: str, pinned: bool, nbytes: int = 256 << 20) -> float:
    """Host<->device copy bandwidth in GB/s (bytes counted once), `direction` 'h2d' or 'd2h'."""
    import torch

    from robocache.bench.harness import gpu_time

    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    src, dst = (host, dev) if direction == "h2d" else (dev, host)
    t = gpu_time(lambda: dst.copy_(src, non_blocking=pinned), rep_ms=300)
    return nbytes / (t.median_ms * 1e-3) / 1e9


def p2p_gbps(src: int, dst: int, nbytes: int = 1 << 30, iters: int = 20,
             repeats: int = 5) -> float:
    """One-direction GPU `src` -> GPU `dst` copy bandwidth in GB/s (bytes counted once), the
    median of `repeats` wall-clock runs of `iters` copies with both devices synchronized."""
    import torch

    a = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{src}")
    b = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{dst}")

    def sync():
        torch.cuda.synchronize(src)
        torch.cuda.synchronize(dst)

    b.copy_(a)
    sync()
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            b.copy_(a)
        sync()
        runs.append((time.perf_counter() - t0) / iters)
    return nbytes / statistics.median(runs) / 1e9


def _allreduce_worker(rank: int, world: int, init_file: str, backend: str,
                      sizes: Sequence[int], iters: int, out_path: str) -> None:
    import torch
    import torch.distributed as dist

    cuda = backend == "nccl"
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank,
                            world_size=world, **({"device_id": device} if cuda else {}))
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    try:
        check = torch.full((4,), float(rank + 1), device=device)
        dist.all_reduce(check)
        correct = bool((check == world * (world + 1) / 2).all())
        rows = []
        for nbytes in sizes:
            x = torch.zeros(max(1, nbytes // 4), dtype=torch.float32, device=device)
            for _ in range(3):
                dist.all_reduce(x)
            sync()
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                dist.all_reduce(x)
            sync()
            elapsed = torch.tensor([(time.perf_counter() - t0) / iters], device=device)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank sets the time
            seconds = float(elapsed)
            algbw = x.numel() * 4 / seconds / 1e9
            rows.append({"bytes": x.numel() * 4, "time_us": seconds * 1e6, "algbw_GBps": algbw,
                         "busbw_GBps": busbw(algbw, world)})
        if rank == 0:
            Path(out_path).write_text(json.dumps({"correct": correct, "rows": rows}))
    finally:
        dist.destroy_process_group()


def allreduce_sweep(world: int, sizes: Sequence[int] = ALLREDUCE_SIZES, *, backend: str = "nccl",
                    iters: int = 20) -> dict[str, Any]:
    """All-reduce (sum, float32) over `world` processes, one per GPU, for each size in bytes.

    Returns {"backend", "world", "correct", "rows": [{bytes, time_us, algbw_GBps, busbw_GBps}]};
    time is the slowest rank's mean over `iters` calls after warm-up, busbw = algbw*2(n-1)/n.
    """
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        init, out = os.path.join(tmp, "init"), os.path.join(tmp, "out.json")
        mp.spawn(_allreduce_worker, args=(world, init, backend, tuple(sizes), iters, out),
                 nprocs=world, join=True)
        result = json.loads(Path(out).read_text())
    return {"backend": backend, "world": world, **result}


def measure_ceilings(*, quick: bool = False, host: bool = True, multi_gpu: bool = True,
                     log: Callable[[str], None] = lambda _msg: None) -> dict[str, Any]:
    """Measure this machine's ceilings now; each value carries its unit, what was measured and,
    where the GPU model is known, its datasheet peak and the percentage reached.

    A ceiling that fails to measure is recorded with its error instead of a value.
    """
    import torch

    name = torch.cuda.get_device_name(0)
    peaks = datasheet(name) or {}
    gemm_n = 4096 if quick else GEMM_N
    ceilings: dict[str, Any] = {}

    def attempt(key: str, fn: Callable[[], dict[str, Any]]) -> None:
        log(f"measuring {key}")
        try:
            ceilings[key] = fn()
        except Exception as exc:  # a broken measurement is a finding, not a crash
            ceilings[key] = {"error": f"{type(exc).__name__}: {exc}"}

    from robocache.bench.harness import copy_bandwidth_gbps

    attempt("d2d_copy_GBps", lambda: _ceiling(
        copy_bandwidth_gbps((256 << 20) if quick else (1 << 30)), "GB/s",
        "device-to-device copy, bytes read + bytes written counted", peaks.get("memory_GBps")))
    attempt("gemm_bf16_TFLOPs", lambda: _ceiling(
        gemm_tflops(torch.bfloat16, gemm_n), "TFLOP/s", f"bf16 matmul {gemm_n}^3 (2n^3 FLOPs)",
        peaks.get("bf16_TFLOPs")))
    attempt("gemm_fp32_TFLOPs", lambda: _ceiling(
        gemm_tflops(torch.float32, gemm_n), "TFLOP/s",
        f"fp32 matmul {gemm_n}^3, TF32 off (2n^3 FLOPs)", peaks.get("fp32_TFLOPs")))
    if host:
        pcie = (nvml.snapshot().get("gpus") or [{}])[0].get("pcie", {})
        link = pcie.get("peak_GBps_per_direction")
        label = (f"PCIe gen{pcie.get('max_generation')} x{pcie.get('max_width')} theoretical "
                 "per direction (from NVML)")
        for direction in ("h2d", "d2h"):
            for pinned in (True, False):
                kind = "pinned" if pinned else "pageable"
                attempt(f"{direction}_{kind}_GBps", lambda d=direction, p=pinned, k=kind:
                        _ceiling(host_copy_gbps(d, p), "GB/s",
                                 f"{d.upper()} copy of 256 MiB from {k} host memory, bytes "
                                 "counted once", link, label))
    world = torch.cuda.device_count()
    if multi_gpu and world >= 2:
        for src in range(world):
            for dst in range(world):
                if src != dst:
                    attempt(f"p2p_{src}to{dst}_GBps", lambda s=src, d=dst: {
                        **_ceiling(p2p_gbps(s, d), "GB/s",
                                   f"GPU{s} -> GPU{d} copy of 1 GiB, bytes counted once",
                                   peaks.get("nvlink_GBps"),
                                   f"{DATASHEET_SOURCE}, NVLink per direction"),
                        "peer_access": torch.cuda.can_device_access_peer(s, d)})
        log("measuring NCCL all-reduce sweep")
        try:
            sweep = allreduce_sweep(world, (1 << 20, 1 << 24) if quick else ALLREDUCE_SIZES)
            best = max(r["busbw_GBps"] for r in sweep["rows"])
            ceilings["nccl_allreduce_busbw_GBps"] = {
                **_ceiling(best, "GB/s", f"peak NCCL all-reduce bus bandwidth over {world} GPUs "
                           "(busbw = algbw*2(n-1)/n), float32 sum",
                           peaks.get("nvlink_GBps"), f"{DATASHEET_SOURCE}, NVLink per direction"),
                "sweep": sweep}
        except Exception as exc:
            ceilings["nccl_allreduce_busbw_GBps"] = {"error": f"{type(exc).__name__}: {exc}"}
    return ceilings


# ---------------------------------------------------------------------------------------------
# Snapshot and drift
# ---------------------------------------------------------------------------------------------

def snapshot(*, measure: bool = True, quick: bool = False,
             log: Callable[[str], None] = lambda _msg: None) -> dict[str, Any]:
    """Everything doctor knows about this machine now, as a JSON-ready dict.

    ``gpu_available`` is False (and ``missing`` says why) when torch sees no CUDA device.
    """
    import torch

    state = nvml.snapshot()
    snap: dict[str, Any] = {
        "schema": SCHEMA,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "software": software(),
        "host": _env.host(),
        "nvml": state,
        "gpu_available": torch.cuda.is_available(),
    }
    if not snap["gpu_available"]:
        snap["missing"] = missing_gpu_reasons(state)
        snap["would_measure"] = list(WOULD_MEASURE)
        return snap
    snap["cuda_devices"] = cuda_devices()
    snap["topology"] = topology_text()
    snap["datasheet"] = datasheet(snap["cuda_devices"][0]["name"])
    snap["warnings"] = warnings(snap)
    if measure:
        snap["ceilings"] = measure_ceilings(quick=quick, log=log)
        snap["warnings"] = warnings(snap)  # adds the ceilings that failed to measure
    return snap


def warnings(snap: dict[str, Any]) -> list[str]:
    """Conditions that make measurements on this machine suspect."""
    out = []
    for gpu in snap.get("nvml", {}).get("gpus", []):
        slow = [r for r in gpu.get("throttle_reasons") or [] if r in nvml.SLOWDOWN_REASONS]
        if slow:
            out.append(f"GPU{gpu['index']} clocks are held down: {', '.join(slow)}")
        if gpu.get("ecc_uncorrected_volatile"):
            out.append(f"GPU{gpu['index']} has {gpu['ecc_uncorrected_volatile']} uncorrected "
                       "ECC errors since the driver loaded")
    for key, rec in (snap.get("ceilings") or {}).items():
        if "error" in rec:
            out.append(f"{key} could not be measured: {rec['error']}")
    return out


def _identity(snap: dict[str, Any]) -> dict[str, Any]:
    """The fields whose change is drift, flattened to 'section.field' keys."""
    gpus = snap.get("nvml", {}).get("gpus", [])
    flat = {f"software.{k}": v for k, v in snap.get("software", {}).items()}
    flat.update({
        "nvml.driver": snap.get("nvml", {}).get("driver"),
        "nvml.cuda_driver": snap.get("nvml", {}).get("cuda_driver"),
        "host.cpu_model": snap.get("host", {}).get("cpu_model"),
        "host.logical_cores": snap.get("host", {}).get("logical_cores"),
        "gpu.count": len(snap.get("cuda_devices", [])),
        "gpu.names": [d["name"] for d in snap.get("cuda_devices", [])],
        "gpu.sm_counts": [d["sm_count"] for d in snap.get("cuda_devices", [])],
        "gpu.memory_bytes": [d["memory_bytes"] for d in snap.get("cuda_devices", [])],
        "gpu.ecc_enabled": [g.get("ecc_enabled") for g in gpus],
        "gpu.sm_clock_max_mhz": [g.get("clocks_mhz", {}).get("sm_max") for g in gpus],
        "gpu.nvlink_links_active": [g.get("nvlink", {}).get("links_active") for g in gpus],
        "gpu.pcie_max": [(g.get("pcie", {}).get("max_generation"),
                          g.get("pcie", {}).get("max_width")) for g in gpus],
        "topology": snap.get("topology"),
    })
    return json.loads(json.dumps(flat))  # tuples -> lists, as they come back from a file


def drift(saved: dict[str, Any], now: dict[str, Any],
          tolerance: float = DRIFT_TOLERANCE) -> list[str]:
    """What changed from snapshot `saved` to `now`: versions, driver, GPUs, topology, a ceiling
    more than `tolerance` lower, or a slowdown that was not there before. Empty when nothing did."""
    changes = []
    old_id, new_id = _identity(saved), _identity(now)
    for key in sorted(old_id.keys() | new_id.keys()):
        if old_id.get(key) != new_id.get(key):
            if key == "topology":
                changes.append("topology (nvidia-smi topo -m) changed")
            else:
                changes.append(f"{key}: {old_id.get(key)!r} -> {new_id.get(key)!r}")
    old_c, new_c = saved.get("ceilings") or {}, now.get("ceilings") or {}
    for key, old in old_c.items():
        if "value" not in old:
            continue
        new = new_c.get(key, {})
        if "value" not in new:
            changes.append(f"{key}: measured {old['value']:.4g} {old['unit']} before, "
                           f"not now ({new.get('error', 'not measured')})")
        elif new["value"] < old["value"] * (1 - tolerance):
            changes.append(f"{key}: {old['value']:.4g} -> {new['value']:.4g} {old['unit']} "
                           f"({100 * (new['value'] / old['value'] - 1):+.1f}%)")
    before = set(saved.get("warnings") or [])
    changes += [f"new warning: {w}" for w in now.get("warnings") or [] if w not in before]
    return changes
