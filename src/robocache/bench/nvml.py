"""GPU state read through NVML (the ``nvidia-ml-py`` package): driver, clocks, ECC, throttling,
PCIe and NVLink, per device. Every query that a GPU or driver does not support reads as None
rather than failing the whole snapshot.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# NVML's clock-event ("throttle") reason bits, by the name nvidia-smi prints.
_REASONS = {
    "gpu_idle": 0x1,
    "applications_clocks_setting": 0x2,
    "sw_power_cap": 0x4,
    "hw_slowdown": 0x8,
    "sync_boost": 0x10,
    "sw_thermal_slowdown": 0x20,
    "hw_thermal_slowdown": 0x40,
    "hw_power_brake_slowdown": 0x80,
    "display_clock_setting": 0x100,
}
# Reasons that mean the GPU runs below the clocks it could: a benchmark taken now is suspect.
SLOWDOWN_REASONS = ("sw_power_cap", "hw_slowdown", "sw_thermal_slowdown", "hw_thermal_slowdown",
                    "hw_power_brake_slowdown")
# nvmlDeviceGetNvLinkVersion's enum -> the NVLink generation it stands for
_NVLINK_VERSIONS = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0"}


def throttle_names(mask: int) -> list[str]:
    """Names of the clock-event reason bits set in `mask` (NVML's bitmask)."""
    return [name for name, bit in _REASONS.items() if mask & bit]


def pcie_peak_gbps(generation: int | None, width: int | None) -> float | None:
    """Theoretical one-direction PCIe bandwidth in GB/s of a link (128b/130b encoding, gen 3+)."""
    gts = {3: 8.0, 4: 16.0, 5: 32.0, 6: 64.0}.get(generation or 0)
    if gts is None or not width:
        return None
    return gts * width * (128 / 130) / 8


def _query(fn: Callable[..., Any], *args: Any) -> Any:
    import pynvml

    try:
        value = fn(*args)
    except (pynvml.NVMLError, AttributeError, TypeError):
        return None
    return value.decode() if isinstance(value, bytes) else value


def _device(pynvml, i: int) -> dict[str, Any]:
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    q = _query
    mem = q(pynvml.nvmlDeviceGetMemoryInfo, h)
    ecc = q(pynvml.nvmlDeviceGetEccMode, h)
    reasons = q(pynvml.nvmlDeviceGetCurrentClocksEventReasons, h)
    if reasons is None:
        reasons = q(pynvml.nvmlDeviceGetCurrentClocksThrottleReasons, h)
    power = q(pynvml.nvmlDeviceGetEnforcedPowerLimit, h)
    gen = q(pynvml.nvmlDeviceGetMaxPcieLinkGeneration, h)
    width = q(pynvml.nvmlDeviceGetMaxPcieLinkWidth, h)
    links = [q(pynvml.nvmlDeviceGetNvLinkState, h, link)
             for link in range(pynvml.NVML_NVLINK_MAX_LINKS)]
    sm, memclk = pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_MEM
    return {
        "index": i,
        "name": q(pynvml.nvmlDeviceGetName, h),
        "uuid": q(pynvml.nvmlDeviceGetUUID, h),
        "pci_bus_id": q(lambda: pynvml.nvmlDeviceGetPciInfo(h).busId),
        "memory_total_bytes": mem.total if mem else None,
        "memory_used_bytes": mem.used if mem else None,
        "clocks_mhz": {
            "sm": q(pynvml.nvmlDeviceGetClockInfo, h, sm),
            "mem": q(pynvml.nvmlDeviceGetClockInfo, h, memclk),
            "sm_max": q(pynvml.nvmlDeviceGetMaxClockInfo, h, sm),
            "mem_max": q(pynvml.nvmlDeviceGetMaxClockInfo, h, memclk),
            "sm_application": q(pynvml.nvmlDeviceGetApplicationsClock, h, sm),
        },
        "ecc_enabled": bool(ecc[0]) if ecc else None,
        "ecc_uncorrected_volatile": q(pynvml.nvmlDeviceGetTotalEccErrors, h,
                                      pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                                      pynvml.NVML_VOLATILE_ECC),
        "throttle_reasons": throttle_names(reasons) if reasons is not None else None,
        "temperature_c": q(pynvml.nvmlDeviceGetTemperature, h, pynvml.NVML_TEMPERATURE_GPU),
        "power_limit_w": power / 1000 if power else None,
        "persistence_mode": q(pynvml.nvmlDeviceGetPersistenceMode, h),
        "mig_mode": (q(pynvml.nvmlDeviceGetMigMode, h) or [None])[0],
        "pcie": {"max_generation": gen, "max_width": width,
                 "current_generation": q(pynvml.nvmlDeviceGetCurrPcieLinkGeneration, h),
                 "current_width": q(pynvml.nvmlDeviceGetCurrPcieLinkWidth, h),
                 "peak_GBps_per_direction": pcie_peak_gbps(gen, width)},
        "nvlink": {"links_active": sum(1 for s in links if s),
                   "links_reported": sum(1 for s in links if s is not None),
                   "version": _NVLINK_VERSIONS.get(q(pynvml.nvmlDeviceGetNvLinkVersion, h, 0))
                   if any(links) else None},
    }


def snapshot() -> dict[str, Any]:
    """Driver and per-GPU state, or ``{"available": False, "error": ...}`` saying why not."""
    try:
        import pynvml
    except ImportError:
        return {"available": False,
                "error": "nvidia-ml-py is not installed (pip install 'robocache[bench]')."}
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return {"available": False, "error": f"NVML could not start: {exc} (no NVIDIA driver?)"}
    try:
        cuda = _query(pynvml.nvmlSystemGetCudaDriverVersion)
        return {
            "available": True,
            "driver": _query(pynvml.nvmlSystemGetDriverVersion),
            "cuda_driver": f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else None,
            "gpus": [_device(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount())],
        }
    finally:
        pynvml.nvmlShutdown()


class UtilizationSampler:
    """Samples NVML's GPU utilization (``nvmlDeviceGetUtilizationRates().gpu``: the percent of
    the driver's last sample period, 1/6 s to 1 s, during which a kernel was running) on a
    background thread every ``interval_s`` while in a ``with`` block.

    ``summary()`` -> ``{"mean_pct", "min_pct", "max_pct", "samples"}``, or
    ``{"error": ...}`` where NVML (``nvidia-ml-py``) or the query is unavailable. Coarse: a
    GPU busy in short bursts reads as busy for the whole period, so read it beside a measure
    of kernel time (CUDA events).

    Args:
        index: NVML device index, used when ``pci_bus_id`` is not given.
        pci_bus_id: the device's PCI bus id (e.g. torch's ``"0000:1A:00.0"``), so the sampled
            GPU is the CUDA device whatever ``CUDA_VISIBLE_DEVICES`` says.
    """

    def __init__(self, index: int = 0, pci_bus_id: str | None = None, interval_s: float = 0.05):
        self.index, self.pci_bus_id, self.interval_s = index, pci_bus_id, interval_s
        self.values: list[int] = []
        self.error: str | None = None
        self._thread = None
        self._stop = None

    def __enter__(self) -> UtilizationSampler:
        import threading

        try:
            import pynvml

            pynvml.nvmlInit()
            handle = (pynvml.nvmlDeviceGetHandleByPciBusId(self.pci_bus_id)
                      if self.pci_bus_id else pynvml.nvmlDeviceGetHandleByIndex(self.index))
            pynvml.nvmlDeviceGetUtilizationRates(handle)
        except Exception as exc:  # ImportError, NVMLError: no sampling, said why
            self.error = f"{type(exc).__name__}: {exc}"
            return self
        self._stop = threading.Event()

        def poll() -> None:
            while not self._stop.wait(self.interval_s):
                try:
                    self.values.append(int(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu))
                except pynvml.NVMLError as exc:
                    self.error = f"NVMLError: {exc}"
                    return

        self._thread = threading.Thread(target=poll, name="robocache-nvml", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> bool:
        if self._thread is not None:
            import pynvml

            self._stop.set()
            self._thread.join()
            pynvml.nvmlShutdown()
        return False

    def summary(self) -> dict[str, Any]:
        if not self.values:
            return {"error": self.error or "no samples (window shorter than the interval)"}
        v = self.values
        return {"mean_pct": sum(v) / len(v), "min_pct": min(v), "max_pct": max(v),
                "samples": len(v)}
