"""robocache doctor on a CPU-only machine: the no-GPU report, NVML parsing against a fake
library, drift detection, the datasheet table and the all-reduce sweep (gloo on CPU)."""

from __future__ import annotations

import json
import sys
import types

import pytest
import torch
from typer.testing import CliRunner

from robocache.bench import doctor, nvml
from robocache.cli import app


def test_no_gpu_report_and_exit_code(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    path = tmp_path / "doctor.json"
    out = CliRunner().invoke(app, ["doctor", "--json", str(path)])
    assert out.exit_code == doctor.EXIT_NO_GPU, out.output
    assert "No usable CUDA GPU" in out.output and "would measure" in out.output
    snap = json.loads(path.read_text())
    assert snap["gpu_available"] is False and snap["missing"]
    assert snap["would_measure"] == list(doctor.WOULD_MEASURE)
    assert snap["software"]["torch"] == torch.__version__ and snap["host"]["logical_cores"]


def test_missing_reasons_name_the_cause(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    reasons = doctor.missing_gpu_reasons({"available": False, "error": "NVML could not start"})
    assert any("CUDA_VISIBLE_DEVICES" in r for r in reasons)
    assert "NVML could not start" in reasons


class _NVMLError(Exception):
    pass


def _fake_pynvml(fail=()):
    """Enough of pynvml for one H100-like GPU; the queries named in `fail` raise NVMLError."""
    def f(name, value):
        def call(*_args):
            if name in fail:
                raise _NVMLError(name)
            return value
        return call

    m = types.SimpleNamespace(
        NVMLError=_NVMLError, NVML_NVLINK_MAX_LINKS=18, NVML_CLOCK_SM=1, NVML_CLOCK_MEM=2,
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1, NVML_VOLATILE_ECC=0, NVML_TEMPERATURE_GPU=0,
        nvmlInit=f("init", None), nvmlShutdown=f("shutdown", None),
        nvmlSystemGetDriverVersion=f("driver", "580.159.04"),
        nvmlSystemGetCudaDriverVersion=f("cuda", 13000), nvmlDeviceGetCount=f("count", 1),
        nvmlDeviceGetHandleByIndex=f("handle", object()),
        nvmlDeviceGetName=f("name", b"NVIDIA H100 80GB HBM3"), nvmlDeviceGetUUID=f("uuid", "GPU-x"),
        nvmlDeviceGetPciInfo=f("pci", types.SimpleNamespace(busId="0000:00:05.0")),
        nvmlDeviceGetMemoryInfo=f("mem", types.SimpleNamespace(total=80 << 30, used=1 << 20)),
        nvmlDeviceGetClockInfo=f("clock", 1980), nvmlDeviceGetMaxClockInfo=f("maxclock", 1980),
        nvmlDeviceGetApplicationsClock=f("appclock", 1755),
        nvmlDeviceGetEccMode=f("ecc", (1, 1)), nvmlDeviceGetTotalEccErrors=f("eccerr", 0),
        nvmlDeviceGetCurrentClocksEventReasons=f("reasons", 0x1 | 0x4),
        nvmlDeviceGetCurrentClocksThrottleReasons=f("oldreasons", 0x1),
        nvmlDeviceGetTemperature=f("temp", 35), nvmlDeviceGetEnforcedPowerLimit=f("power", 700000),
        nvmlDeviceGetPersistenceMode=f("persist", 1), nvmlDeviceGetMigMode=f("mig", (0, 0)),
        nvmlDeviceGetMaxPcieLinkGeneration=f("gen", 5), nvmlDeviceGetMaxPcieLinkWidth=f("w", 16),
        nvmlDeviceGetCurrPcieLinkGeneration=f("cgen", 5),
        nvmlDeviceGetCurrPcieLinkWidth=f("cw", 16),
        nvmlDeviceGetNvLinkState=f("nvlink", 1), nvmlDeviceGetNvLinkVersion=f("nvlv", 6),
    )
    return m


def test_nvml_snapshot_parses_a_gpu(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(fail={"reasons", "temp"}))
    snap = nvml.snapshot()
    assert snap["available"] and snap["driver"] == "580.159.04" and snap["cuda_driver"] == "13.0"
    (gpu,) = snap["gpus"]
    assert gpu["name"] == "NVIDIA H100 80GB HBM3" and gpu["ecc_enabled"] is True
    assert gpu["throttle_reasons"] == ["gpu_idle"]  # fell back to the older query
    assert gpu["temperature_c"] is None  # unsupported query: None, not a crash
    assert gpu["pcie"]["peak_GBps_per_direction"] == pytest.approx(63.0, rel=1e-2)
    assert gpu["nvlink"] == {"links_active": 18, "links_reported": 18, "version": "4.0"}
    assert gpu["clocks_mhz"]["sm_max"] == 1980 and gpu["power_limit_w"] == 700


def test_nvml_unavailable_says_why(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml(fail={"init"}))
    snap = nvml.snapshot()
    assert snap == {"available": False, "error": snap["error"]}
    assert "NVML could not start" in snap["error"]


def test_throttle_names():
    assert nvml.throttle_names(0x1 | 0x4 | 0x40) == ["gpu_idle", "sw_power_cap",
                                                     "hw_thermal_slowdown"]
    assert nvml.throttle_names(0) == []


def test_datasheet_lookup():
    assert doctor.datasheet("NVIDIA H100 80GB HBM3")["memory_GBps"] == 3350
    assert doctor.datasheet("NVIDIA H100 PCIe")["memory_GBps"] == 2000
    assert doctor.datasheet("NVIDIA H200")["memory_GBps"] == 4800
    assert doctor.datasheet("NVIDIA H100 80GB HBM3")["source"].startswith("NVIDIA datasheet")
    assert doctor.datasheet("Some Future GPU") is None and doctor.datasheet(None) is None


def test_busbw_matches_nccl_tests():
    assert doctor.busbw(100.0, 2) == 100.0
    assert doctor.busbw(100.0, 8) == pytest.approx(175.0)


def _snap(**over):
    snap = {
        "software": {"torch": "2.11.0", "triton": "3.6.0", "python": "3.12.3"},
        "host": {"cpu_model": "Xeon", "logical_cores": 16},
        "nvml": {"available": True, "driver": "580.1", "cuda_driver": "13.0", "gpus": [
            {"index": 0, "ecc_enabled": True, "clocks_mhz": {"sm_max": 1980},
             "nvlink": {"links_active": 0}, "pcie": {"max_generation": 5, "max_width": 16},
             "throttle_reasons": ["gpu_idle"], "ecc_uncorrected_volatile": 0}]},
        "cuda_devices": [{"name": "NVIDIA H100 80GB HBM3", "sm_count": 132,
                          "memory_bytes": 80 << 30}],
        "topology": "GPU0 X",
        "ceilings": {"d2d_copy_GBps": {"value": 3000.0, "unit": "GB/s"},
                     "gemm_bf16_TFLOPs": {"value": 700.0, "unit": "TFLOP/s"}},
    }
    snap.update(over)
    snap["warnings"] = doctor.warnings(snap)
    return json.loads(json.dumps(snap))


def test_drift_none_for_same_machine():
    assert doctor.drift(_snap(), _snap()) == []


def test_drift_lists_versions_topology_and_slower_ceilings():
    now = _snap(software={"torch": "2.12.0", "triton": "3.6.0", "python": "3.12.3"},
                topology="GPU0 X NV18",
                ceilings={"d2d_copy_GBps": {"value": 2700.0, "unit": "GB/s"},  # -10%
                          "gemm_bf16_TFLOPs": {"value": 680.0, "unit": "TFLOP/s"}})  # -2.9%
    changes = doctor.drift(_snap(), now)
    assert "software.torch: '2.11.0' -> '2.12.0'" in changes
    assert "topology (nvidia-smi topo -m) changed" in changes
    assert any(c.startswith("d2d_copy_GBps: 3000 -> 2700") and "-10.0%" in c for c in changes)
    assert not any(c.startswith("gemm_bf16") for c in changes)
    assert len(changes) == 3


def test_drift_reports_new_slowdown_and_failed_ceiling():
    now = _snap(ceilings={"d2d_copy_GBps": {"error": "RuntimeError: out of memory"},
                          "gemm_bf16_TFLOPs": {"value": 700.0, "unit": "TFLOP/s"}})
    now["nvml"]["gpus"][0]["throttle_reasons"] = ["hw_thermal_slowdown"]
    now["warnings"] = doctor.warnings(now)
    changes = doctor.drift(_snap(), now)
    assert any("not now (RuntimeError: out of memory)" in c for c in changes)
    assert any("clocks are held down: hw_thermal_slowdown" in c for c in changes)


def test_allreduce_sweep_logic_on_cpu_with_gloo():
    """The NCCL sweep's process/timing/busbw logic, run over gloo on two CPU processes."""
    sweep = doctor.allreduce_sweep(2, (1024, 1 << 16), backend="gloo", iters=3)
    assert sweep["correct"] and sweep["world"] == 2
    assert [r["bytes"] for r in sweep["rows"]] == [1024, 1 << 16]
    for r in sweep["rows"]:
        assert r["time_us"] > 0
        assert r["algbw_GBps"] == pytest.approx(r["bytes"] / (r["time_us"] * 1e-6) / 1e9)
        assert r["busbw_GBps"] == pytest.approx(r["algbw_GBps"])  # 2(n-1)/n = 1 for n = 2
