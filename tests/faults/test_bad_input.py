"""Bad input to the ops and the loader: typed errors naming the argument, empty batches give
empty results, impossible sizes refused before allocation, an empty epoch warns."""

from __future__ import annotations

import os
import subprocess
import sys

import faultlib as fl
import pytest
import torch

import robocache
from robocache.data import RobotDataset, RobotLoader
from robocache.errors import DataError, ShapeError
from robocache.kinematics import Chain, asset_path, fk, ik
from robocache.ops import augment as aug
from robocache.ops.pipeline import Augment, Pipeline, Resample

TIMES = torch.linspace(0, 1, 30, dtype=torch.float64)


def bad_times(kind: str) -> torch.Tensor:
    t = TIMES.clone()
    if kind == "nan":
        t[5] = float("nan")
        return t
    return t.flip(0)


@pytest.mark.parametrize("kind", ["nan", "decreasing"])
def test_pipeline_checks_times_as_resample_does(kind):
    data = torch.randn(2, 30, 3)
    with pytest.raises(DataError, match="`times`"):
        robocache.resample(data, bad_times(kind), TIMES[:10])
    with pytest.raises(DataError, match="Pipeline: `times`"):
        Pipeline([Resample(50.0, 20)])(data, bad_times(kind), seed=0)
    fl.record(f"Pipeline with {kind} times (CPU)", "DataError naming `times`, as resample")


def test_empty_batches():
    out = Pipeline([Resample(50.0, 20), Augment(k=3)])(torch.randn(0, 30, 4), TIMES, seed=0)
    assert out.data.shape == (0, 3, 20, 4) and out.dropped.shape == (0, 3, 0)
    assert aug.smooth(torch.randn(2, 0, 3)).shape == (2, 0, 3)
    chain = Chain.from_urdf(asset_path("panda.urdf"), "panda_hand")
    res = ik(chain, fk(chain, torch.zeros(0, chain.dof)))
    assert res.q.shape == (0, chain.dof) and res.converged.shape == (0,)
    fl.record("B = 0 / 0 steps (Pipeline, smooth, ik)", "empty results of the right shapes")


def test_impossible_sizes_refused_before_allocation():
    with pytest.raises(ShapeError, match=r"needs [\d,]+ bytes"):
        Pipeline([Resample(50.0, 200_000_000)])(torch.randn(64, 30, 32), TIMES, seed=0)
    chain = Chain.from_urdf(asset_path("panda.urdf"), "panda_hand")
    with pytest.raises(ShapeError, match=r"num_seeds"):
        ik(chain, fk(chain, torch.zeros(4, chain.dof)), num_seeds=1_000_000_000)
    fl.record("T = 2e8 (Pipeline), IK seeds 1e9", "ShapeError with the bytes needed, nothing "
              "allocated")


# Imports, a 1.5 GiB address-space allowance over what the process maps now (as `ulimit -v`),
# then each call; a stride-0 (expanded) argument is as large as it says but costs nothing.
UNDER_RLIMIT = """
import resource, sys, torch
import robocache
from robocache.errors import RoboCacheError
from robocache.kinematics import Chain, asset_path, fk
from robocache.ops.pipeline import Augment, Pipeline, Resample
chain = Chain.from_urdf(asset_path("panda.urdf"), "panda_hand")
big = lambda n, *shape, dtype=torch.float32: torch.zeros(1, *shape, dtype=dtype).expand(n, *shape)
t10 = torch.linspace(0, 1, 10, dtype=torch.float64)
CALLS = {
    "resample T = 2e8": lambda: robocache.resample(torch.randn(1, 10, 1), t10,
                                                   big(200_000_000, dtype=torch.float64)),
    "align T = 2e8": lambda: robocache.align({"a": robocache.Stream(torch.randn(10, 2), t10)},
                                             big(200_000_000, dtype=torch.float64)),
    "windows M = 5e7": lambda: robocache.windows(torch.randn(100, 8), torch.tensor([0, 100]),
                                                 big(50_000_000, dtype=torch.int64),
                                                 horizon=16),
    "key_windows M = 5e7": lambda: robocache.key_windows(
        torch.randn(100, 8), torch.tensor([0, 100]), big(50_000_000, dtype=torch.int64),
        {"a": (0, 8)}, {"a": range(16)}),
    "compute_stats bins = 1e11": lambda: robocache.compute_stats(torch.randn(10, 3),
                                                                 bins=100_000_000_000),
    "fk of 2e9 configurations": lambda: fk(chain, big(2_000_000_000, chain.dof)),
    "depth_to_points of a 100000 x 100000 image": lambda: robocache.depth_to_points(
        big(100_000, 100_000), torch.tensor([[50.0, 0, 50], [0, 50, 50], [0, 0, 1]])),
    "image_transform to 100000 x 100000": lambda: robocache.image_transform(
        torch.zeros(1, 3, 8, 8, dtype=torch.uint8), (100_000, 100_000)),
    "Pipeline T = 2e7": lambda: Pipeline([Resample(50.0, 20_000_000), Augment(k=4)])(
        torch.randn(8, 10, 8), t10, seed=0),
}
vm = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize"))
limit = vm + (3 << 29)
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
for name, call in CALLS.items():
    try:
        call()
        print(name, "|ran")
    except RoboCacheError as e:
        print(name, "|", type(e).__name__, e)
    except BaseException as e:
        print(name, "|raw", type(e).__name__, str(e).splitlines()[0])
"""

NAMED = {"resample": "`target_times`", "align": "`target_times`", "windows": "`indices`",
         "key_windows": "`indices`", "compute_stats": "`bins`", "fk": "`q`",
         "depth_to_points": "`depth`", "image_transform": "`size`", "Pipeline": "Resample.num"}


def test_sizes_beyond_the_process_limit_are_refused_naming_the_argument():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    p = subprocess.run([sys.executable, "-c", UNDER_RLIMIT], env=env, capture_output=True,
                       text=True, timeout=300)
    results = dict(line.split(" |", 1) for line in p.stdout.splitlines() if " |" in line)
    assert p.returncode == 0 and len(results) == len(NAMED), p.stderr
    for name, got in results.items():
        op = name.split()[0]
        ok = got.startswith(" ShapeError") and NAMED[op] in got and "RLIMIT_AS" in got
        fl.record(f"{name}, under a 1.5 GiB address-space limit (RLIMIT_AS)",
                  "ShapeError naming the argument, the bytes needed and the limit; nothing "
                  "allocated" if ok else got, lost=not ok)
        assert ok, (name, got)


@pytest.mark.parametrize("fx", [0.0, -5.0, float("inf"), float("nan")])
def test_intrinsics_checked(fx):
    k = torch.tensor([[fx, 0, 2], [0, 5.0, 2], [0, 0, 1]])
    with pytest.raises(DataError, match="`intrinsics`.*fx"):
        robocache.depth_to_points(torch.ones(4, 4), k)
    fl.record(f"depth_to_points with fx = {fx}", "DataError naming `intrinsics`")


@pytest.mark.parametrize("call, named", [
    (lambda: aug.time_warp(torch.randn(2, 5, 3), torch.linspace(0, 1, 6),
                           aug.sample_time_warp((2,), strength=0.1, seed=0)), "`times`"),
    (lambda: aug.time_warp(torch.randn(2, 5, 3), torch.linspace(0, 1, 5),
                           aug.sample_time_warp((3,), strength=0.1, seed=0)), "`params`"),
    (lambda: aug.time_warp(torch.randn(5, 3), torch.linspace(0, 1, 5),
                           aug.sample_time_warp((1,), strength=0.1, seed=0)), "`data`"),
    (lambda: aug.smooth(torch.randn(2, 5, 3), dim=3), "`dim`"),
], ids=["time_warp-times", "time_warp-params", "time_warp-data", "smooth-dim"])
def test_augment_shape_mistakes_are_typed(call, named):
    with pytest.raises(ShapeError, match=named):
        call()
    fl.record(f"augment shape mistake ({named})", "ShapeError naming the argument")


def test_loader_warns_on_an_empty_epoch_and_runs_resident_on_cpu(pristine):
    ds = RobotDataset(pristine["lerobot-v3.0"][1], history=1, horizon=2)
    with pytest.warns(UserWarning, match="no batch: batch_size"):
        batches = list(RobotLoader(ds, batch_size=len(ds) + 1, device="cpu"))
    assert batches == []
    loader = RobotLoader(ds, batch_size=8, device="cpu", resident=True)
    assert loader.resident and next(iter(loader))["action"].shape[:2] == (8, 2)
    fl.record("RobotLoader batch_size > samples", "warns that the epoch has no batch")
