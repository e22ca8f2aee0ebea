"""The timing harness, the bench command (on a stand-in benchmark module) and the NVTX helper."""

from __future__ import annotations

import contextlib
import gzip
import json

import pytest
import torch
from typer.testing import CliRunner

from robocache.bench import harness
from robocache.bench.compare import load_results
from robocache.cli import app
from robocache.cli import bench as bench_cli
from robocache.observability import nvtx


def test_summarize_keeps_exact_quartiles_and_bounds_samples():
    samples = [float(i) for i in range(1, 1002)]
    t = harness.summarize(samples)
    assert (t.median_ms, t.q25_ms, t.q75_ms, t.n) == (501.0, 251.0, 751.0, 1001)
    assert len(t.samples_ms) == harness.MAX_STORED_SAMPLES
    assert t.samples_ms[0] == 1.0 and t.samples_ms[-1] == 1001.0
    assert harness.summarize([3.0, 1.0, 2.0]).samples_ms == [1.0, 2.0, 3.0]


def test_case_derives_bandwidth_flops_and_intensity():
    t = harness.Timing(2.0, 1.9, 2.1, 3, [1.9, 2.0, 2.1])
    rec = harness.case("f", "c", "robocache", t, nbytes=6_000_000, flops=4_000_000_000,
                       copy_gbps=3000.0, B=7)
    assert rec["GBps"] == pytest.approx(3.0) and rec["pct_copy"] == pytest.approx(0.1)
    assert rec["TFLOPs"] == pytest.approx(2.0) and rec["intensity"] == pytest.approx(666.67, 1e-4)
    assert rec["B"] == 7 and rec["samples_ms"] == [1.9, 2.0, 2.1]
    assert harness.case("f", "c", "robocache", t, timing="graph")["timing"] == "graph"


def test_roofline_position():
    ceil = {"d2d_copy_GBps": 3000.0, "gemm_bf16_TFLOPs": 600.0, "gemm_fp32_TFLOPs": 50.0}
    t = harness.Timing(1.0, 1.0, 1.0, 1, [1.0])
    mem = harness.roofline(harness.case("f", "m", "robocache", t, nbytes=1_500_000_000), ceil)
    assert mem["bound"] == "memory" and mem["pct_roofline"] == pytest.approx(50.0)
    # intensity 100 FLOP/B: bandwidth roof 300 TFLOP/s < 600 bf16 -> memory-bound at 300
    low = harness.case("f", "l", "robocache", t, nbytes=10**9, flops=10**11, dtype="bfloat16")
    assert harness.roofline(low, ceil)["bound"] == "memory"
    assert low["pct_roofline"] == pytest.approx(100 * 100 / 300)
    # same intensity in fp32: the 50 TFLOP/s roof binds
    high = harness.case("f", "h", "robocache", t, nbytes=10**9, flops=10**11, dtype="float32")
    assert harness.roofline(high, ceil)["bound"] == "compute"
    assert high["pct_roofline"] == pytest.approx(200.0)


def test_cpu_time_uses_torch_benchmark():
    t = harness.cpu_time(lambda: sum(range(1000)), repeats=3, min_s=0.005)
    assert t.n >= 1 and 0 < t.q25_ms <= t.median_ms <= t.q75_ms


FAKE_BENCH = '''
from robocache.bench import harness as H
def run(quick=False, copy_gbps=None):
    t = H.cpu_time(lambda: sum(range(100)), repeats=2, min_s=0.002)
    return [H.case("fake", "c", "robocache_cpu", t, nbytes=800, B=1)]
'''


@pytest.fixture
def fake_benchmarks(tmp_path, monkeypatch):
    d = tmp_path / "benchmarks"
    d.mkdir()
    (d / "bench_fake.py").write_text(FAKE_BENCH)
    monkeypatch.setattr(bench_cli, "BENCH_DIR", d)
    return d


def test_bench_writes_valid_results_and_profile(tmp_path, fake_benchmarks, monkeypatch):
    monkeypatch.setattr(nvtx, "_enabled", False)  # --profile turns it on for the process
    out, traces = tmp_path / "r.json", tmp_path / "traces"
    res = CliRunner().invoke(app, ["bench", "fake", "--quick", "--json", str(out),
                                   "--profile", str(traces)])
    assert res.exit_code == 0, res.output
    doc = load_results(out)
    assert [c["family"] for c in doc["cases"]] == ["fake"]
    assert doc["meta"]["torch"] == torch.__version__ and "commit" in doc["meta"]
    assert doc["meta"]["profiled"] and harness._loop_scale == 1.0  # restored after the run
    trace = json.loads(gzip.decompress((traces / "fake.trace.json.gz").read_bytes()))
    assert any(e.get("name") == "robocache.bench.fake" for e in trace["traceEvents"])


def test_bench_runs_then_gates(tmp_path, fake_benchmarks):
    base = tmp_path / "base.json"
    assert CliRunner().invoke(app, ["bench", "--quick", "--json", str(base)]).exit_code == 0
    res = CliRunner().invoke(app, ["bench", "--quick", "--compare", str(base)])
    assert res.exit_code in (0, 1), res.output  # CPU timings on a shared runner may move
    assert "Regression gate" in res.output


def test_a_failing_family_keeps_the_others(tmp_path, fake_benchmarks):
    (fake_benchmarks / "bench_broken.py").write_text("def run(quick, copy_gbps):\n    1 / 0\n")
    out = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["bench", "--quick", "--json", str(out)])
    assert res.exit_code == 3
    doc = load_results(out)
    assert doc["meta"]["errors"] == {"broken": "ZeroDivisionError: division by zero"}
    assert doc["meta"]["families_done"] == ["broken", "fake"]
    assert [c["family"] for c in doc["cases"]] == ["fake"]


def test_bench_unknown_family(fake_benchmarks):
    res = CliRunner().invoke(app, ["bench", "nope"])
    assert res.exit_code != 0 and "fake" in res.output


def test_nvtx_disabled_is_a_shared_noop():
    nvtx.enable(False)
    assert nvtx.range("a") is nvtx.range("b")
    assert isinstance(nvtx.range("a"), contextlib.nullcontext)

    @nvtx.annotate("robocache.test")
    def f(x):
        return x + 1

    assert f(1) == 2 and f.__name__ == "f"


def test_nvtx_enabled_marks_profiler_ranges():
    nvtx.enable()
    try:
        with torch.profiler.profile() as prof, nvtx.range("robocache.test_range"):
            torch.ones(4).sum()
    finally:
        nvtx.enable(False)
    assert any(e.key == "robocache.test_range" for e in prof.key_averages())


def test_extra_read_is_off_unless_asked(monkeypatch):
    monkeypatch.delenv(harness.EXTRA_READ_ENV, raising=False)
    fn = lambda: 1  # noqa: E731
    assert harness.with_extra_read(fn, 1 << 20) is fn


def test_raw_reads_count_every_byte_and_say_which_read(tmp_path):
    files = []
    for i, size in enumerate((0, 1, 4095, 4096, (16 << 20) + 3)):
        p = tmp_path / f"f{i}"
        p.write_bytes(bytes(range(256)) * (size // 256) + bytes(size % 256))
        files.append(p)
    total = sum(p.stat().st_size for p in files)
    assert harness.raw_read_s(files)[1] == total
    cases: list[dict] = []
    rate, against = harness.raw_reads("f", "n", files, cases.append)
    assert [c["impl"] for c in cases] == ["raw-read", "raw-read-direct"]
    assert rate > 0
    if cases[1].get("skipped"):  # a file system without O_DIRECT (tmpfs)
        assert against == "the page-cache read" and "O_DIRECT refused" in cases[1]["note"]
    else:
        assert against == "the storage's read"
        assert harness.raw_read_s(files, direct=True)[1] == total
