"""`robocache bench ddp_serve`: its records from the ranks' numbers (speedup against the
source's own one-rank run, against the in-RAM run, memory against one rank's), the memory of a
rank with the processes it started, and (slow) the quick run through the CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import bench_ddp  # noqa: E402
import bench_ddp_serve as B  # noqa: E402

from robocache.bench.compare import load_results  # noqa: E402
from robocache.cli import app  # noqa: E402
from robocache.cli import bench as bench_cli  # noqa: E402

CFG = {"batch": 64, "warmup": 10, "steps": 100, "model": "resnet18", "hw": (480, 640),
       "size": (224, 224)}


def _rank(wall_step_ms, pss, *, busy=0.99, read=None, samples=30_000):
    return {"wall_step_ms": wall_step_ms, "step_ms": wall_step_ms - 1, "wall_s": 1.0,
            "busy": busy, "pss_bytes": pss, "pss_before_bytes": pss - 10, "processes": 1,
            "disk_read_bytes": read, "samples": samples, "sm_clock_mhz": None,
            "device": "cuda:0"}


def test_records_from_the_ranks_numbers():
    # one rank: 25 ms a step, 4 GB; four ranks: the slowest at 26 ms, 1 GB more in all
    disk = {1: [[_rank(25.0, 4_000, read=1_000)]],
            4: [[_rank(25.0, 1_250, read=1_000)] * 3 + [_rank(26.0, 1_250, read=1_000)]]}
    ram = {1: 64 / 0.025, 4: 4 * 64 / 0.025}
    recs = {r["world"]: r for r in B.cases("disk", disk, CFG, 100e3, ram)}
    assert recs[1]["samples_per_s"] == pytest.approx(64 / 0.025)
    assert recs[4]["samples_per_s"] == pytest.approx(4 * 64 / 0.026)  # the slowest rank's
    assert recs[4]["speedup"] == pytest.approx(4 * 25 / 26)
    assert recs[4]["vs_in_ram"] == pytest.approx(25 / 26)
    assert recs[4]["pss_total_bytes"] == 5_000 and recs[4]["pss_vs_one"] == 1.25
    assert recs[4]["pss_growth_bytes"] == 40 and recs[4]["pss_growth_vs_one"] == 4.0
    assert recs[4]["busy_min"] == 0.99 and recs[4]["epoch_fraction"] == 4 * 110 * 64 / 30_000
    frames = 4 * 110 * 64 * 2 * 2  # four ranks' warm-up and timed steps, 2 cameras x history 2
    assert recs[4]["read_per_frame_byte"] == pytest.approx(4_000 / (frames * 100e3))
    assert recs[4]["impl"] == "4 GPU" and recs[4]["name"].startswith("disk-resnet18-480x640")
    # no reads counted (no /proc/self/io), no in-RAM run, no GPU: left empty, not zero
    rec = B.cases("s3", {1: [[_rank(25.0, 4_000, busy=None)]]}, CFG, 100e3)[0]
    assert rec["read_per_frame_byte"] is None and rec["vs_in_ram"] is None
    assert rec["busy_min"] is None and "busy" not in rec["note"]


def test_rates_of_a_fed_loop_count_its_stalls():
    """A feed that stalls shows in the wall time per step, not in the median step."""
    ranks = [{"step_ms": 20.0, "wall_step_ms": 40.0}]
    assert bench_ddp.rates({1: [ranks]}, 64) == {1: 64 / 0.02}
    assert bench_ddp.rates({1: [ranks]}, 64, key="wall_step_ms") == {1: 64 / 0.04}


def test_pss_counts_the_processes_a_rank_started():
    alone, n = B.pss_tree(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.5)
        total, m = B.pss_tree(os.getpid())
    finally:
        child.kill()
        child.wait()
    assert m == n + 1 and total > alone
    read = B.disk_read_bytes()
    assert read is None or read >= 0


def test_registered_as_a_family():
    assert "ddp_serve" in bench_cli.families()
    with pytest.raises(ValueError, match="unknown sources"):
        B.run(quick=True, sources="ram,tape")


@pytest.mark.slow
def test_quick_run_through_the_cli(tmp_path):
    """Every source at 1 and 2 CPU processes (gloo), a record each with its numbers."""
    out = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["bench", "ddp_serve", "--quick", "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = load_results(out)
    assert not doc["meta"].get("errors")
    impls = {c["impl"] for c in doc["cases"]}
    assert "failed" not in impls
    recs = {(c["source"], c["world"]): c for c in doc["cases"] if "world" in c}
    sources = ("ram", "disk") if "skipped" in impls else ("ram", "disk", "s3")  # no moto
    assert {(s, w) for s in sources for w in (1, 2)} <= set(recs)
    for (source, world), c in recs.items():
        assert c["samples_per_s"] > 0 and len(c["busy_per_rank"]) == world
        assert c["processes"] >= world and c["pss_total_bytes"] > 0
        assert c["pss_vs_one"] == (1.0 if world == 1 else pytest.approx(
            c["pss_total_bytes"] / recs[source, 1]["pss_total_bytes"]))
        assert (c["vs_in_ram"] is None) == (source == "ram")
        assert c["versions"]["lance"] and ("page_cache" in c) == (source == "disk")
    if "s3" in sources:
        assert recs["s3", 1]["publish_s"] > 0 and recs["s3", 2]["disk_read_bytes"] is not None
