"""Smoke runs of the camera benchmark families (``--quick``, CPU): ``train_vision`` through
``robocache bench`` and as a script with its own options, and ``cameras``' ingest rows."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import torch
from typer.testing import CliRunner

from robocache.bench.compare import load_results
from robocache.cli import app
from robocache.cli import bench as bench_cli

BENCH = Path(bench_cli.BENCH_DIR)


def test_train_vision_quick_through_the_cli(tmp_path):
    out = tmp_path / "r.json"
    res = CliRunner().invoke(app, ["bench", "train_vision", "--quick", "--json", str(out)])
    assert res.exit_code == 0, res.output
    doc = load_results(out)
    assert doc["meta"]["torch"] == torch.__version__
    cases = {c["impl"]: c for c in doc["cases"]}
    assert set(cases) == {"model-only", "robocache", "cpu-loader-w0"}
    for c in cases.values():
        assert c["family"] == "train_vision" and c["steps"] >= 2
        assert c["samples_per_s"] == c["steps_per_s"] * c["batch"] > 0
        assert c["ingest_decoded_by"] == {"pyav": c["frames"]}
        if not torch.cuda.is_available():
            assert c["gpu_busy"] is None and "error" in c["nvml"]


def test_train_vision_script_options(tmp_path):
    out = tmp_path / "r.json"
    subprocess.run([sys.executable, str(BENCH / "bench_train_vision.py"), "--quick",
                    "--episodes", "2", "--min-steps", "3", "--workers", "0",
                    "--json", str(out)], check=True, capture_output=True)
    doc = json.loads(out.read_text())
    assert doc["meta"]["options"] == {"episodes": 2, "min_steps": 3, "workers": "0"}
    assert all(c["episodes"] == 2 and c["steps"] >= 3 for c in doc["cases"])


def test_cameras_quick_ingest_rows():
    cameras = bench_cli.load("cameras")
    rows = {c["impl"]: c for c in cameras.run(quick=True) if c["impl"].startswith("ingest")}
    assert set(rows) >= {"ingest", "ingest-w1"}
    assert rows["ingest-w1"]["decode_workers"] == 1
    for r in rows.values():
        assert r["frames_per_s"] > 0 and r["cache_bytes_per_frame"] > 0
        assert r["decoded_by"] == {r["video_decoder"]: r["frames"]}
