"""docs/scale-out.md's estimates are rendered from results files (never typed by hand)."""

import json
import sys
from pathlib import Path

from robocache.bench import harness as H

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import scale_estimates  # noqa: E402


def preprocess_results(tmp_path: Path) -> Path:
    cases = [H.case("preprocess", "12s-numeric", "cpu total", H.summarize([1.8])),
             H.case("preprocess", "d", "raw-read", H.summarize([1000.0]), nbytes=4_000_000_000),
             H.case("preprocess", "d", "ingest node", H.summarize([20_000.0]),
                    nbytes=2_000_000_000, cached=10_000, episodes_per_s=500.0)]
    for g, eps in ((1, 100.0), (2, 190.0), (4, 360.0)):
        cases.append(H.case("preprocess", "d", f"preprocess {g} GPU", H.summarize([1.0]),
                            gpus=g, episodes_per_s=eps, speedup=eps / 100.0))
    meta = {"device": "NVIDIA H200", "gpu_count": 4, "cpu_count": 64, "date": "2026-11-27"}
    path = tmp_path / "preprocess.json"
    path.write_text(json.dumps({"meta": meta, "cases": cases}))
    return path


def test_estimates_follow_from_the_measured_rates(tmp_path):
    cpu, gpu = tmp_path / "cameras.json", tmp_path / "cameras-gpu.json"
    cpu.write_text(json.dumps({"meta": {}, "cases": [  # full size only: not resized, served,
        {"impl": "cpu-w64", "name": "480x640", "frames_per_s": 10_000.0},  # or passed through
        {"impl": "cpu-w64-to224", "name": "480x640", "frames_per_s": 5e4},
        {"impl": "pass-through-w64", "name": "rlds", "frames_per_s": 1e6},
        {"impl": "robocache", "name": "serve", "frames_per_s": 1e6}]}))
    gpu.write_text(json.dumps({"meta": {}, "cases": [
        {"impl": "gpu-x4-p1-nvjpeg", "name": "480x640", "frames_per_s": 5_000.0},
        {"impl": "nvdec-decode-only", "name": "480x640", "frames_per_s": 4e4}]}))
    table = scale_estimates.estimates(preprocess_results(tmp_path), [cpu, gpu])
    # 100 ep/s a GPU x 8 x 0.9 (360 / 4 / 100) = 720 ep/s a node: 1M in 1389 s = 23.1 min
    assert "| RT-X, 1M trajectories: `preprocess`, 8 GPUs a node | 23.1 min | 11.6 min |" in table
    # ingest, 500 ep/s a machine: 1M in 2000 s, 76k in 152 s
    assert "| RT-X, 1M trajectories: `ingest`, one machine a shard | 33.3 min |" in table
    assert "| DROID, 76k trajectories (numeric part): `ingest`, one machine a shard | 2.5 min" \
        in table
    # 57M frames at 10k frames/s a node: 5700 s
    assert "| DROID, ~57M camera frames: decode + encode | 95.0 min |" in table
    assert "4.00 GB/s" in table and "0.20 MB each" in table and "1.80 ms" in table
    for row in table.splitlines()[4:]:
        assert "preprocess.json" in row or "cameras.json" in row


def test_the_doc_has_the_block_the_script_writes(tmp_path):
    doc = tmp_path / "scale-out.md"
    doc.write_text((ROOT / "docs" / "scale-out.md").read_text())
    scale_estimates.write(doc, scale_estimates.estimates(preprocess_results(tmp_path)))
    text = doc.read_text()
    assert "<!-- estimates -->\nEstimated from the runs on NVIDIA H200 x4" in text
    assert text.count("<!-- /estimates -->") == 1


def test_ingest_rows_from_a_later_run(tmp_path):
    first = preprocess_results(tmp_path)
    later = tmp_path / "later"
    later.mkdir()
    doc = json.loads(first.read_text())
    doc["cases"] = [c for c in doc["cases"] if not c["impl"].startswith("preprocess ")]
    for c in doc["cases"]:
        if c["impl"] == "ingest node":
            c["episodes_per_s"] = 1000.0
    (later / "ingest.json").write_text(json.dumps(doc))
    table = scale_estimates.estimates(first, ingest=later / "ingest.json")
    # Ray's rows from the first file; ingest at 1,000 ep/s: 1M in 1000 s, from the later one
    assert "| RT-X, 1M trajectories: `preprocess`, 8 GPUs a node | 23.1 min |" in table
    ingest = next(r for r in table.splitlines() if "`ingest`, one machine" in r)
    assert "| 16.7 min |" in ingest and "ingest.json" in ingest and "1000 ep/s" in ingest
