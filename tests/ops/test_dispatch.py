"""The one dispatch path (`robocache.ops._dispatch`): every registered custom op passes
`torch.library.opcheck` on tiny inputs, and every public op traces under
``torch.compile(fullgraph=True)`` and matches its eager result.

Runs on ``kernel_device``: CUDA when present; otherwise CPU, where ops with a reference run it
and the kernel-only ops (voxelizers, the fused pipeline) run their launchers through the
Triton interpreter.
"""

from __future__ import annotations

import importlib
import math
import os
import pkgutil
import subprocess
import sys

import pytest
import torch

import robocache
from robocache import augment as A
from robocache import geometry as G
from robocache.kinematics import Chain, asset_path, fk, ik, jacobian
from robocache.ops import _dispatch
from robocache.ops.pipeline import Augment, Normalize, Pipeline, Resample

DEV = "cuda" if torch.cuda.is_available() else "cpu"
for _m in pkgutil.iter_modules(robocache.ops.__path__):  # every op module registers its ops
    importlib.import_module(f"robocache.ops.{_m.name}")
GRID = dict(bounds_min=(-1.0, -1.0, 0.0), voxel_size=(0.5, 0.5, 0.5), grid_size=(4, 4, 4))


def _g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _rand(*shape, dtype=torch.float32, seed=0):
    return torch.randn(*shape, generator=_g(seed), dtype=dtype).to(DEV)


def _times(b, s, dtype=torch.float64):
    return (torch.arange(s, dtype=dtype) / 10).expand(b, s).contiguous().to(DEV)


def _quat(*lead, seed=0):
    return G.quat_normalize(_rand(*lead, 4, seed=seed))


def _camera(b=2, h=4, w=5):
    depth = (torch.rand(b, h, w, generator=_g(1)) * 2 + 0.5).to(DEV)
    k = torch.tensor([[4.0, 0, w / 2], [0, 4.0, h / 2], [0, 0, 1]]).expand(b, 3, 3)
    return depth, k.contiguous().to(DEV)


def _panda() -> Chain:
    return Chain.from_urdf(asset_path("panda.urdf"), "panda_hand")


# ---------------------------------------------------------------- opcheck per registered op

def _op_args(name: str) -> tuple:
    """Tiny arguments of each registered op (in its schema's order)."""
    if name.startswith("kinematics_"):
        chain = _panda()
        params, lower, upper = chain.tensors(torch.device(DEV), torch.float32)
        q = _rand(3, chain.dof)
        st = (chain.movable, chain.prismatic)
        if name == "kinematics_fk":
            return (q, params, *st, True)
        if name == "kinematics_jacobian":
            return (q, params, *st)
        target = fk(chain, q)
        return (target, q.repeat_interleave(2, 0), lower, upper, params, *st, 2, 3, 1e-3, 5e-3)
    if name == "depth_to_points":
        return (*_camera(), None, 1.0, 0.0, math.inf)
    if name == "voxelize_points":
        pts = _rand(2, 7, 3)
        return (pts, None, None, None, [-1.0, -1.0, -1.0], [0.5] * 3, [4, 4, 4], "count", False)
    if name == "voxelize_depth":
        return (*_camera(), None, None, 1.0, 0.0, math.inf, [-2.0, -2.0, 0.0], [0.5] * 3,
                [8, 8, 6], "occupancy", False)
    if name == "normalize_affine":
        return (_rand(3, 5), _rand(5, seed=1), _rand(5, seed=2).abs() + 0.5, True, False)
    if name == "add_noise":
        return (_rand(3, 5), torch.full((5,), 0.1, device=DEV), 7)
    if name == "compute_stats":
        return (_rand(11, 3), 16, True)
    if name == "image_transform":
        frames = torch.randint(0, 256, (2, 3, 6, 8), dtype=torch.uint8, generator=_g())
        p = robocache.sample_image_transforms(2, (6, 8), seed=0)
        slots = 0  # the reference reads no slots; the kernel compiles the sampled ops' slots
        if DEV == "cuda":
            from robocache.kernels.image import slot_ops

            slots = slot_ops(p.ops)
        return (frames.to(DEV), p.crop.float().to(DEV), p.affine.float().to(DEV),
                p.ops.to(torch.int32).to(DEV), p.factors.float().to(DEV), 4, 5, slots,
                torch.uint8)
    if name == "resample":
        return (_rand(2, 5, 3), _times(2, 5), _times(2, 4) + 0.05, None, "linear", "clamp", True)
    if name == "windows":
        return (_rand(9, 2), torch.tensor([0, 4, 9], device=DEV),
                torch.tensor([0, 3, 8], device=DEV), None, [-1, 0, 1, 2], 2, False)
    if name == "key_windows":
        return (_rand(9, 4), torch.tensor([0, 4, 9], device=DEV),
                torch.tensor([0, 3, 8], device=DEV), None, [0, 2, 2, 3, 1, 3], [-1, 0, 0, 1, 2],
                True)
    if name == "align":
        return (_times(2, 6, torch.float32) + 0.03, [_rand(2, 5, 3), None],
                [_times(2, 5), _times(2, 5)], [None, None], [0, 6], [math.nan, 0.2], "clamp")
    if name == "pipeline_fused":
        pipe = Pipeline([Resample(10.0, 4), Augment(k=2, position=0, max_translation=0.1,
                                                    noise_std=0.1)])
        off, scale, std, col = pipe._params(torch.device(DEV), 4)
        return (_rand(2, 5, 4), _times(2, 5), None, 3, off, scale, std, col, 2, 4, pipe.span,
                list(pipe._scalars), pipe._plan_ints)
    raise AssertionError(f"no opcheck arguments for robocache::{name}; add them here")


_REGISTERED = sorted(_dispatch.OPS)


def test_every_registered_op_has_a_case():
    for name in _REGISTERED:
        _op_args(name)  # raises for an op without arguments here
    assert {"resample", "align", "windows", "key_windows", "normalize_affine", "compute_stats",
            "add_noise", "image_transform", "pipeline_fused"} <= set(_REGISTERED)


@pytest.mark.parametrize("name", _REGISTERED, ids=_REGISTERED)
def test_opcheck(name):
    op = getattr(torch.ops.robocache, name).default
    torch.library.opcheck(op, _op_args(name))


def test_eager_skips_the_dispatcher(monkeypatch):
    """An eager call runs the implementation directly (no custom-op dispatch on the hot path)."""
    op = _dispatch.OPS["normalize_affine"]
    calls = []
    monkeypatch.setattr(op, "op", lambda *a: calls.append(a))
    args = _op_args("normalize_affine")
    torch.testing.assert_close(op(*args), (op.cpu if DEV == "cpu" else op.cuda())(*args))
    assert calls == []


def test_cpu_path_imports_no_triton():
    """CPU calls of the ops reach the references: Triton is imported on the first CUDA call."""
    code = (
        "import sys, torch, robocache\n"
        "from robocache import augment\n"
        "from robocache.ops.pipeline import Augment, Pipeline, Resample\n"
        "x, t = torch.randn(2, 6, 4), torch.linspace(0, 1, 6, dtype=torch.float64)\n"
        "robocache.resample(x, t, t[:3])\n"
        "robocache.normalize(x, robocache.compute_stats(x))\n"
        "augment.add_noise(x, 0.1, seed=0)\n"
        "Pipeline([Resample(10.0, 4), Augment(k=2, noise_std=0.1)])(x, t, seed=1)\n"
        "robocache.windows(x[0], torch.tensor([0, 6]), torch.tensor([1, 5]), history=2)\n"
        "assert 'triton' not in sys.modules, 'a CPU call imported triton'\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr


# ---------------------------------------------------------------- fullgraph trace per public op

def _stats():
    return robocache.compute_stats(torch.randn(50, 4, generator=_g()))


def _cases() -> dict:
    """Public op -> (function of tensors, its tensor arguments)."""
    chain = _panda()
    q = _rand(3, chain.dof)
    quat, vec, mat = _quat(5), _rand(5, 3, seed=1), G.quat_to_matrix(_quat(5, seed=2))
    pose = G.make_pose(mat, vec)
    angles = _rand(5, 3, seed=3)
    data, times = _rand(2, 6, 4), _times(2, 6)
    offs, idx = torch.tensor([0, 4, 9], device=DEV), torch.tensor([0, 3, 8], device=DEV)
    packed = _rand(9, 4)
    depth, k = _camera()
    stats = _stats()
    rig = A.sample_rigid((2,), max_translation=0.1, max_rotation=0.2, seed=1, device=DEV)
    warp = A.sample_time_warp((2,), strength=0.3, seed=1, device=DEV)
    frames = torch.randint(0, 256, (2, 3, 6, 8), dtype=torch.uint8, generator=_g()).to(DEV)
    params = robocache.sample_image_transforms(2, (6, 8), seed=0).to(DEV)
    pipe = Pipeline([Resample(10.0, 4), Normalize(_stats()),
                     Augment(k=2, position=0, noise_std=0.1)])
    norm = robocache.Normalizer({"a": stats}, "min_max")
    return {
        "resample": (lambda d, t: robocache.resample(d, t, t[:, :4] + 0.05), (data, times)),
        "align": (lambda d, t: robocache.align({"a": (d, t)}, t[:, :4] + 0.05).values["a"],
                  (data, times)),
        "windows": (lambda d, i: robocache.windows(d, offs, i, history=2, horizon=2).horizon,
                    (packed, idx)),
        "key_windows": (lambda d, i: robocache.key_windows(
            d, offs, i, {"s": (0, 2), "a": (2, 2)}, {"s": [-1, 0], "a": [0, 1, 2]})["a"],
            (packed, idx)),
        "normalize": (lambda x: robocache.normalize(x, stats, "quantile"), (_rand(7, 4),)),
        "Normalizer": (lambda x: norm({"a": x})["a"], (_rand(7, 4),)),
        "compute_stats": (lambda x: robocache.compute_stats(x, bins=8).q99, (_rand(20, 3),)),
        "merge_stats": (lambda x: robocache.merge_stats([stats, stats]).mean.to(x) + x,
                        (_rand(4),)),
        "Pipeline": (lambda d, t: pipe(d, t, seed=3).data, (data, times)),
        "depth_to_points": (lambda d: robocache.depth_to_points(d, k).points, (depth,)),
        "voxelize": (lambda p: robocache.voxelize(p, mode="count", **GRID).grid,
                     (_rand(2, 9, 3),)),
        "depth_to_voxels": (lambda d: robocache.depth_to_voxels(d, k, **GRID).grid, (depth,)),
        "image_transform": (lambda f: robocache.image_transform(f, (4, 5), params), (frames,)),
        "kinematics.fk": (lambda x: fk(chain, x), (q,)),
        "kinematics.jacobian": (lambda x: jacobian(chain, x), (q,)),
        "kinematics.ik": (lambda t: ik(chain, t, num_seeds=2, max_iters=2).q, (fk(chain, q),)),
        "augment.variants": (lambda x: A.variants(x, 3), (data,)),
        "augment.rigid_transform": (lambda p: A.rigid_transform(
            rig, positions=p[:, :, :3])[0], (data,)),
        "augment.warp_phase": (lambda u: A.warp_phase(u, warp), (torch.rand(2, 5).to(DEV),)),
        "augment.time_warp": (lambda d, t: A.time_warp(d, t, warp), (data, times)),
        "augment.add_noise": (lambda x: A.add_noise(x, 0.1, seed=5), (data,)),
        "augment.smooth": (lambda x: A.smooth(x, sigma=1.0), (data,)),
        "augment.drop_streams": (lambda x: A.drop_streams(
            x, [(0, 2), (2, 4)], torch.tensor([[True, False], [False, True]], device=DEV)),
            (data,)),
        "geometry.quat_xyzw_to_wxyz": (G.quat_xyzw_to_wxyz, (quat,)),
        "geometry.quat_wxyz_to_xyzw": (G.quat_wxyz_to_xyzw, (quat,)),
        "geometry.quat_normalize": (G.quat_normalize, (quat,)),
        "geometry.quat_canonical": (G.quat_canonical, (quat,)),
        "geometry.quat_multiply": (G.quat_multiply, (quat, _quat(5, seed=4))),
        "geometry.quat_conjugate": (G.quat_conjugate, (quat,)),
        "geometry.quat_apply": (G.quat_apply, (quat, vec)),
        "geometry.quat_to_matrix": (G.quat_to_matrix, (quat,)),
        "geometry.matrix_to_quat": (G.matrix_to_quat, (mat,)),
        "geometry.rotvec_to_quat": (G.rotvec_to_quat, (vec,)),
        "geometry.quat_to_rotvec": (G.quat_to_rotvec, (quat,)),
        "geometry.rotvec_to_matrix": (G.rotvec_to_matrix, (vec,)),
        "geometry.matrix_to_rotvec": (G.matrix_to_rotvec, (mat,)),
        "geometry.rot6d_to_matrix": (G.rot6d_to_matrix, (_rand(5, 6),)),
        "geometry.matrix_to_rot6d": (G.matrix_to_rot6d, (mat,)),
        "geometry.euler_to_quat": (lambda a: G.euler_to_quat(a, "xyz"), (angles,)),
        "geometry.quat_to_euler": (lambda x: G.quat_to_euler(x, "ZYX"), (quat,)),
        "geometry.euler_to_matrix": (lambda a: G.euler_to_matrix(a, "zyz"), (angles,)),
        "geometry.matrix_to_euler": (lambda m: G.matrix_to_euler(m, "xyz"), (mat,)),
        "geometry.make_pose": (G.make_pose, (mat, vec)),
        "geometry.se3_compose": (G.se3_compose, (pose, pose)),
        "geometry.se3_inverse": (G.se3_inverse, (pose,)),
        "geometry.se3_apply": (G.se3_apply, (pose, _rand(5, 7, 3))),
        "geometry.joint_to_relative": (G.joint_to_relative, (_rand(2, 6, 4), _rand(2, 4))),
        "geometry.joint_to_absolute": (G.joint_to_absolute, (_rand(2, 6, 4), _rand(2, 4))),
        "geometry.pose_to_relative": (G.pose_to_relative, (pose[None].expand(2, 5, 4, 4),
                                                            pose[:2])),
        "geometry.pose_to_absolute": (G.pose_to_absolute, (pose[None].expand(2, 5, 4, 4),
                                                            pose[:2])),
    }


_NAMES = list(_cases())


def test_every_public_op_has_a_trace_case():
    public = {f"geometry.{n}" for n in G.__all__ if n != "check_rotation"}
    public |= {f"augment.{n}" for n in A.__all__ if n[0].islower() and not n.startswith("sample")}
    public |= {f"kinematics.{n}" for n in ("fk", "jacobian", "ik")}
    public |= {"resample", "align", "windows", "key_windows", "normalize", "Normalizer",
               "compute_stats", "merge_stats", "Pipeline", "depth_to_points", "voxelize",
               "depth_to_voxels", "image_transform"}
    assert public <= set(_NAMES)


@pytest.mark.parametrize("name", _NAMES, ids=_NAMES)
def test_fullgraph_trace(name):
    fn, args = _cases()[name]
    torch._dynamo.reset()
    compiled = torch.compile(fn, fullgraph=True, backend="eager")
    torch.manual_seed(0)  # the same draws for ops that sample (ik's seeds)
    got = compiled(*args)
    torch.manual_seed(0)
    want = fn(*args)
    torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.gpu
def test_out_is_written_by_the_kernel_on_cuda():
    """An eager CUDA call with out= returns out, holding what a call without it returns
    (contiguous outs for normalize/add_noise, a strided one for image_transform)."""
    import robocache

    x = torch.randn(33, 5, device="cuda")
    s = robocache.compute_stats(x.cpu())
    out = torch.full_like(x, float("nan"))
    assert robocache.normalize(x, s, "mean_std", out=out) is out
    torch.testing.assert_close(out, robocache.normalize(x, s, "mean_std"), rtol=0, atol=0)
    out = torch.full_like(x, float("nan"))
    assert robocache.augment.add_noise(x, 0.1, seed=3, out=out) is out
    torch.testing.assert_close(out, robocache.augment.add_noise(x, 0.1, seed=3), rtol=0, atol=0)
    frames = torch.randint(0, 256, (2, 3, 8, 10), dtype=torch.uint8, device="cuda")
    out = torch.full((2, 4, 5, 3), 7, dtype=torch.uint8, device="cuda").permute(0, 3, 1, 2)
    assert robocache.image_transform(frames, (4, 5), dtype=torch.uint8, out=out) is out
    torch.testing.assert_close(out, robocache.image_transform(frames, (4, 5), dtype=torch.uint8),
                               rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("name", _NAMES, ids=_NAMES)
def test_relaunch_with_inputs_at_new_addresses_equals_the_first_call(name):
    """The eager path's cached launches (compiled kernel reused, binding skipped) give what
    the first, fully bound launch gave: on the same inputs and on copies at new addresses."""
    fn, args = _cases()[name]
    results = []
    for inputs in (args, tuple(a.clone() for a in args), args):
        torch.manual_seed(0)
        results.append(fn(*inputs))
    torch.testing.assert_close(results[1], results[0], rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(results[2], results[0], rtol=0, atol=0, equal_nan=True)
