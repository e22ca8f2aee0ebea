"""`robocache bench dispatch` (eager host cost against a bare Triton launch): runs with
``--quick`` anywhere; without CUDA one row says it was skipped and why, with CUDA every op pairs
with its bare launch."""

from __future__ import annotations

import json

import torch
from typer.testing import CliRunner

from robocache.bench.compare import gate_of
from robocache.cli import app
from robocache.cli import bench as bench_cli


def test_dispatch_family_is_registered():
    assert "dispatch" in bench_cli.families()


def test_dispatch_bench_quick(tmp_path):
    out = tmp_path / "dispatch.json"
    res = CliRunner().invoke(app, ["bench", "dispatch", "--quick", "--json", str(out)])
    assert res.exit_code == 0, res.output
    cases = json.loads(out.read_text())["cases"]
    if not torch.cuda.is_available():  # no case can run: one row says why
        assert [(c["impl"], c["skipped"]) for c in cases] == [("skipped", True)]
        assert "no CUDA device" in cases[0]["note"] and "no CUDA device" in res.output
        return
    names = {c["name"] for c in cases}
    for name in names:
        impls = {c["impl"]: c for c in cases if c["name"] == name}
        eager = impls["robocache host overhead"]
        assert gate_of(eager) == "host" and eager["x_bare"] > 0
        assert "bare Triton launch host overhead" in impls
