"""robocache.geometry against SciPy's Rotation (float64 oracle): conversions on random and
edge-case rotations (identity, pi about each axis, tiny angles), quaternion sign handling, SE(3)
helpers against NumPy, relative/absolute action round trips, and every validation rule."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from helpers import TOL, assert_close, seeded
from scipy.spatial.transform import Rotation

import robocache
from robocache import geometry as G
from robocache.errors import DataError, DTypeError, ShapeError

DTYPES = [torch.float32, torch.float64]
ORDERS = ["xyz", "zyx", "yzx", "XYZ", "ZYX", "YXZ", "zxz", "XYX", "yzy"]


def _edge_rotations() -> Rotation:
    """Identity, pi about each axis and a diagonal, near-pi, tiny and gimbal-adjacent angles."""
    axes = np.array([[1, 0, 0], [0, 1, 0], [0, 0, 1], [1, 1, 0], [1, -1, 1], [0.3, -0.2, 0.9]],
                    dtype=np.float64)
    axes /= np.linalg.norm(axes, axis=1, keepdims=True)
    angles = [0.0, 1e-12, 1e-8, 1e-5, 1e-3, math.pi / 2, math.pi - 1e-6, math.pi]
    return Rotation.from_rotvec(np.concatenate([axes * a for a in angles]))


def _rotations(n: int, rng) -> Rotation:
    return Rotation.concatenate([Rotation.random(n, random_state=rng), _edge_rotations()])


def _t(x, dtype=torch.float64):
    return torch.as_tensor(np.asarray(x), dtype=dtype)


def _same_rotation_vec(a, b, dtype):
    """Rotation vectors are unique except at pi, where r and -r are the same rotation."""
    rtol, atol = TOL[dtype]
    a, b = a.double().numpy(), np.asarray(b)
    flip = np.linalg.norm(a + b, axis=-1) < np.linalg.norm(a - b, axis=-1)
    b = np.where(flip[:, None] & (np.linalg.norm(b, axis=-1) > math.pi - 1e-3)[:, None], -b, b)
    np.testing.assert_allclose(a, b, rtol=rtol, atol=100 * atol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_quat_matrix_roundtrip(dtype):
    r = _rotations(257, seeded())
    q = G.quat_xyzw_to_wxyz(_t(r.as_quat(), dtype))
    assert_close(G.quat_to_matrix(q), r.as_matrix(), dtype, scale=4)
    back = G.matrix_to_quat(_t(r.as_matrix(), dtype))
    expect = r.as_quat(canonical=True)[:, [3, 0, 1, 2]]
    # at w == 0 (pi) both signs are canonical: compare up to sign there
    sign = np.where(np.sum(back.double().numpy() * expect, -1) < 0, -1.0, 1.0)[:, None]
    assert_close(back, expect * sign, dtype, scale=10)
    assert bool((back[..., 0] >= 0).all())
    assert_close(back.norm(dim=-1), np.ones(len(r)), dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_quat_sign_handling(dtype):
    r = Rotation.random(64, random_state=seeded())
    q = G.quat_xyzw_to_wxyz(_t(r.as_quat(), dtype))
    for f in (G.quat_to_matrix, G.quat_to_rotvec):
        torch.testing.assert_close(f(q), f(-q), rtol=TOL[dtype][0], atol=TOL[dtype][1])
    torch.testing.assert_close(G.quat_canonical(-q), G.quat_canonical(q))
    assert_close(G.quat_to_matrix(3.0 * q), r.as_matrix(), dtype, scale=4)  # normalized first


def test_xyzw_converters():
    q = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    assert G.quat_wxyz_to_xyzw(q).tolist() == [[2.0, 3.0, 4.0, 1.0]]
    assert G.quat_xyzw_to_wxyz(G.quat_wxyz_to_xyzw(q)).tolist() == q.tolist()


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotvec(dtype):
    r = _rotations(257, seeded())
    rv = _t(r.as_rotvec(), dtype)
    assert_close(G.rotvec_to_matrix(rv), r.as_matrix(), dtype, scale=4)
    assert_close(G.quat_to_matrix(G.rotvec_to_quat(rv)), r.as_matrix(), dtype, scale=4)
    _same_rotation_vec(G.matrix_to_rotvec(_t(r.as_matrix(), dtype)), r.as_rotvec(), dtype)
    _same_rotation_vec(G.quat_to_rotvec(G.quat_xyzw_to_wxyz(_t(r.as_quat(), dtype))),
                       r.as_rotvec(), dtype)


def test_tiny_angles_keep_precision():
    rv = torch.tensor([[1e-9, -2e-9, 3e-9], [0.0, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(G.matrix_to_rotvec(G.rotvec_to_matrix(rv)), rv, rtol=1e-6,
                               atol=1e-18)
    torch.testing.assert_close(G.quat_to_rotvec(G.rotvec_to_quat(rv)), rv, rtol=1e-12, atol=0)
    assert not torch.isnan(G.rotvec_to_matrix(rv.float())).any()


def test_pi_about_each_axis():
    for axis in torch.eye(3, dtype=torch.float64):
        m = G.rotvec_to_matrix(axis * math.pi)
        rv = G.matrix_to_rotvec(m)
        assert abs(rv.norm().item() - math.pi) < 1e-12
        torch.testing.assert_close(G.rotvec_to_matrix(rv), m)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("order", ORDERS)
def test_euler_against_scipy(order, dtype):
    r = _rotations(129, seeded())
    ang = r.as_euler(order)
    expect = Rotation.from_euler(order, ang).as_matrix()
    assert_close(G.euler_to_matrix(_t(ang, dtype), order), expect, dtype, scale=4)
    out = G.matrix_to_euler(_t(r.as_matrix(), dtype), order)
    # At gimbal lock (middle angle within ~1e-7 of 0 or pi) the third angle is set to 0, as SciPy
    # does: the angles then reproduce the rotation to about that threshold.
    atol = 1e-6 if dtype == torch.float64 else 1e-4
    torch.testing.assert_close(G.euler_to_matrix(out.double(), order), _t(r.as_matrix()),
                               rtol=0, atol=atol)
    if dtype == torch.float64:  # away from lock the angles themselves match SciPy's
        proper = order[0].lower() == order[2].lower()
        regular = np.abs(np.sin(ang[:, 1]) if proper else np.cos(ang[:, 1])) > 1e-3
        diff = np.angle(np.exp(1j * (out.numpy() - ang)))  # wrap to (-pi, pi]
        np.testing.assert_allclose(diff[regular], 0, atol=1e-9)


def test_euler_bad_order():
    for bad in ("xy", "xxz", "xYz", "abc", 3):
        with pytest.raises(ValueError, match="`order` must be three axis letters"):
            G.euler_to_matrix(torch.zeros(3), bad)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rot6d(dtype):
    r = _rotations(65, seeded())
    m = _t(r.as_matrix(), dtype)
    d6 = G.matrix_to_rot6d(m)
    assert d6.shape == (len(r), 6)
    assert_close(d6[:, :3], r.as_matrix()[:, :, 0], dtype)
    assert_close(G.rot6d_to_matrix(d6), r.as_matrix(), dtype, scale=4)
    noisy = d6 + 0.05 * torch.randn(d6.shape, dtype=dtype)  # any 6-vector -> a rotation
    out = G.rot6d_to_matrix(noisy).double()
    assert_close(out.transpose(-1, -2) @ out, np.broadcast_to(np.eye(3), out.shape), dtype,
                 scale=10)
    assert_close(torch.linalg.det(out), np.ones(len(r)), dtype, scale=10)


@pytest.mark.parametrize("dtype", DTYPES)
def test_quat_multiply_apply_conjugate(dtype):
    rng = seeded()
    a, b = Rotation.random(33, random_state=rng), Rotation.random(33, random_state=rng)
    qa, qb = (G.quat_xyzw_to_wxyz(_t(x.as_quat(), dtype)) for x in (a, b))
    assert_close(G.quat_to_matrix(G.quat_multiply(qa, qb)), (a * b).as_matrix(), dtype, scale=4)
    v = rng.normal(size=(33, 3))
    assert_close(G.quat_apply(qa, _t(v, dtype)), a.apply(v), dtype, scale=10)
    assert_close(G.quat_to_matrix(G.quat_conjugate(qa)), a.inv().as_matrix(), dtype, scale=4)
    # broadcasting: one rotation, many vectors
    assert G.quat_apply(qa[0], _t(v, dtype)).shape == (33, 3)


def _poses(n, rng, dtype=torch.float64):
    r = Rotation.random(n, random_state=rng)
    return G.make_pose(_t(r.as_matrix(), dtype), _t(rng.normal(size=(n, 3)), dtype))


def test_se3():
    rng = seeded()
    a, b = _poses(17, rng), _poses(17, rng)
    an, bn = a.numpy(), b.numpy()
    assert_close(G.se3_compose(a, b), an @ bn)
    assert_close(G.se3_inverse(a), np.linalg.inv(an))
    pts = rng.normal(size=(17, 5, 3))
    expect = np.einsum("nij,npj->npi", an[:, :3, :3], pts) + an[:, None, :3, 3]
    assert_close(G.se3_apply(a, _t(pts)), expect)
    q = G.quat_xyzw_to_wxyz(_t(Rotation.random(17, random_state=rng).as_quat()))
    assert_close(G.make_pose(q, torch.zeros(3, dtype=torch.float64))[:, :3, :3],
                 G.quat_to_matrix(q).numpy())


def test_joint_relative_roundtrip():
    rng = seeded()
    state = _t(rng.normal(size=(4, 7)))
    chunk = _t(rng.normal(size=(4, 16, 7)))
    rel = G.joint_to_relative(chunk, state)
    assert_close(rel, chunk.numpy() - state.numpy()[:, None])
    assert_close(G.joint_to_absolute(rel, state), chunk.numpy())
    single = _t(rng.normal(size=(4, 7)))
    assert_close(G.joint_to_absolute(G.joint_to_relative(single, state), state), single.numpy())


@pytest.mark.parametrize("frame", ["ee", "base"])
def test_pose_relative_roundtrip(frame):
    rng = seeded()
    state = _poses(3, rng)
    chunk = _poses(3 * 8, rng).reshape(3, 8, 4, 4)
    rel = G.pose_to_relative(chunk, state, frame=frame)
    assert_close(G.pose_to_absolute(rel, state, frame=frame), chunk.numpy())
    eye = G.pose_to_relative(state, state, frame=frame)
    assert_close(eye, np.broadcast_to(np.eye(4), (3, 4, 4)))
    if frame == "ee":  # the target expressed in the current end-effector frame
        assert_close(rel, np.linalg.inv(state.numpy())[:, None] @ chunk.numpy())
    else:
        assert_close(rel[..., :3, 3], chunk[..., :3, 3].numpy() - state[:, None, :3, 3].numpy())


def test_bad_shapes_dtypes_and_choices():
    with pytest.raises(ShapeError, match=r"`q` must have shape \[\.\.\., 4\]; got \[2, 3\]"):
        G.quat_to_matrix(torch.zeros(2, 3))
    with pytest.raises(ShapeError, match=r"`m` must have shape \[\.\.\., 3, 3\]"):
        G.matrix_to_quat(torch.zeros(3, 4))
    with pytest.raises(DTypeError, match="`r`"):
        G.rotvec_to_matrix(torch.zeros(3, dtype=torch.int64))
    with pytest.raises(TypeError, match="torch.Tensor"):
        G.quat_to_matrix([1.0, 0.0, 0.0, 0.0])
    with pytest.raises(ValueError, match="`frame`"):
        G.pose_to_relative(torch.eye(4), torch.eye(4), frame="world")
    with pytest.raises(ShapeError, match="`state`"):
        G.joint_to_relative(torch.zeros(4, 7), torch.zeros(4, 6))
    with pytest.raises(ShapeError, match=r"P, 3"):
        G.se3_apply(torch.eye(4), torch.zeros(3))


def test_check_rotation():
    m = torch.eye(3).repeat(4, 1, 1)
    G.check_rotation("op", "R", m)
    m[2, 0, 0] = -1.0  # reflection: orthonormal but det -1
    with pytest.raises(DataError, match=r"`R` has a rotation part.*index \[2\].*det = -1"):
        G.check_rotation("op", "R", m)


def test_public_module():
    assert robocache.geometry.quat_to_matrix is G.quat_to_matrix
    assert robocache.kinematics.fk.__module__ == "robocache.ops.kinematics"


@pytest.mark.gpu
def test_gpu_graph_capture():
    rv = torch.randn(1000, 3, device="cuda")
    expect = G.matrix_to_rotvec(G.rotvec_to_matrix(rv))
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = G.matrix_to_rotvec(G.rotvec_to_matrix(rv))
    g.replay()
    torch.testing.assert_close(out, expect)
