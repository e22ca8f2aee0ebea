"""The policy-storage benchmark's task and stores: the target is seen only in the image, at a
sub-pixel position; actions are the next states; the three stores serve the frames (PNG
exactly); and, where LeRobot is installed, a ``--quick`` run end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from robocache.bench.compare import load_results
from robocache.cli import bench as bench_cli

BENCH = Path(bench_cli.BENCH_DIR)
sys.path.insert(0, str(BENCH))
import bench_policy_storage as P  # noqa: E402

HW = (96, 128)


def _centroid(frame: np.ndarray, u: float, v: float) -> np.ndarray:
    """The red disc's centre (px), weighted by how much redder than grey each pixel is, in a
    window around (u, v)."""
    f = frame.astype(np.float64)
    red = np.clip(f[..., 0] - (f[..., 1] + f[..., 2]) / 2 - 60, 0, None)
    ys, xs = np.mgrid[0:HW[0], 0:HW[1]] + 0.5
    w = red * ((np.abs(xs - u) < 5) & (np.abs(ys - v) < 5))
    return np.array([(w * xs).sum() / w.sum(), (w * ys).sum() / w.sum()])


@pytest.mark.parametrize("seed", [0, 3, 7])
def test_the_target_is_drawn_at_its_subpixel_position(seed):
    rng = np.random.default_rng(seed)
    target, _ = P.trajectory(rng, 120)
    table = rng.bit_generator.state  # the texture's draws, replayed for the shifted target
    parked = np.zeros((1, 2))  # the end effector in the corner, off the target
    frame = P.render(rng, target, parked, HW, torch.zeros((1, *HW, 3)))[0]
    u, v = target * np.array([HW[1] / P.WORKSPACE_M[0], HW[0] / P.WORKSPACE_M[1]])
    assert np.hypot(*(_centroid(frame, u, v) - [u, v])) < 0.15
    # a third of a pixel to the right moves the disc's edge pixels: the position is continuous
    rng.bit_generator.state = table
    third = P.WORKSPACE_M[0] / HW[1] / 3
    shifted = P.render(rng, target + [third, 0.0], parked, HW, torch.zeros((1, *HW, 3)))[0]
    assert not np.array_equal(shifted, frame)
    assert _centroid(shifted, u, v)[0] - _centroid(frame, u, v)[0] == pytest.approx(1 / 3,
                                                                                    abs=0.1)


def test_actions_are_the_next_states_and_reach_the_target():
    target, s = P.trajectory(np.random.default_rng(1), 120)
    assert s.shape == (121, 4)
    np.testing.assert_allclose(s[-1, :2], target, atol=1e-6)
    assert s[0, 3] == 1.0 and s[-1, 3] == 0.0  # the gripper closes once there
    assert np.abs(np.diff(s[:, :2], axis=0)).max() < 0.02  # smooth: < 2 cm a step


def test_stores_serve_the_frames(tmp_path):
    src, raw = P.write_source(tmp_path / "d.hdf5", 2, 12, (32, 48), seed=5)
    raw = torch.from_numpy(raw).permute(0, 3, 1, 2)
    got = {}
    for store in P.STORES:
        P._build(src, tmp_path / store, store)
        frames = P.served_frames(tmp_path / store, torch.device("cpu"))
        got[store] = P.psnr(frames, raw)
        assert frames.shape == raw.shape and P._frame_bytes(tmp_path / store) > 0
    assert got["png"] == float("inf")
    assert 30 < got["video"] < got["jpeg"] < 60
    ds = P._numeric(tmp_path / "png", 100)
    item = ds[[0, 11]]
    assert item[P.ACTION].shape == (2, 100, 4) and item[P.STATE].shape == (2, 4)
    assert item[f"{P.ACTION}_is_pad"].sum(1).tolist() == [88, 99]


def test_quick_run_end_to_end(tmp_path):
    pytest.importorskip("lerobot.policies.act.modeling_act")
    out = tmp_path / "r.json"
    subprocess.run([sys.executable, str(BENCH / "bench_policy_storage.py"), "--quick",
                    "--steps", "2", "--json", str(out)], check=True, timeout=1800)
    doc = load_results(out)
    cases = {c["impl"]: c for c in doc["cases"]}
    assert {f"{s}-seed{k}" for s in P.STORES for k in (0, 1)} | set(P.STORES) | {
        f"ingest-{s}" for s in P.STORES} | {"verdict"} == set(cases)
    for s in P.STORES:
        assert cases[s]["steps"] == 2 and len(cases[s]["heldout_l1_seeds"]) == 2
    assert cases["ingest-png"]["psnr_db"] == float("inf")
    assert cases["verdict"]["store"] in cases["verdict"]["within_spread"]
    assert json.loads(out.read_text())["meta"]["options"]["steps"] == 2


def test_without_lerobot_the_family_is_skipped(monkeypatch):
    for name in ("lerobot", "lerobot.policies", "lerobot.policies.act",
                 "lerobot.policies.act.modeling_act"):
        monkeypatch.setitem(sys.modules, name, None)  # import fails as if not installed
    (case,) = P.run(quick=True)
    assert case["impl"] == "skipped" and case["skipped"] and "lerobot==0.6.1" in case["note"]
