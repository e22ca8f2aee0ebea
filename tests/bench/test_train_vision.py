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


def test_cameras_quick_rows():
    """The camera benchmark's quick run: encoders, the fidelity table, the CPU camera path
    with 1 and 2 worker processes and RLDS pass-through, each row with its numbers."""
    cameras = bench_cli.load("cameras")
    rows = {(c["name"], c["impl"]): c
            for c in cameras.run(quick=True, sections="encode,fidelity,cpu,rlds")}
    impls = {impl for _, impl in rows}
    assert {"pillow-420", "simplejpeg-444", "cpu-w1", "cpu-w2", "cpu-w1-to224", "raw-read",
            "pass-through-w1", "jpeg-444-q95", "jpeg-420-q95", "pyav-decode"} <= impls
    for (_, impl), r in rows.items():
        if impl.startswith("cpu-w"):
            assert r["decoded_by"] == {"pyav": r["frames"]} and r["frames_per_s"] > 0
            assert r["workers"] == int(impl.removeprefix("cpu-w").removesuffix("-to224"))
            assert r["stored_size"] == ((224, 224) if impl.endswith("-to224") else None)
        if impl.startswith("pass-through"):
            assert r["frames"] > 0 and r["pct_of_raw_read"] > 0
    fidelity = {impl: r for (name, impl), r in rows.items() if name.endswith("fidelity")}
    assert fidelity["jpeg-444-q95"]["psnr_min_dB"] >= 40.0
    assert fidelity["jpeg-420-q95"]["psnr_min_dB"] < 35.0
    assert fidelity["pyav-decode"]["max_abs_diff"] == 0  # ingest decodes what LeRobot decodes
