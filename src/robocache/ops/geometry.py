"""Rotations, rigid transforms and relative actions, batched over leading dimensions.

Conventions (one for the whole library):

- Quaternions are **wxyz** (scalar first), as kornia, cuRobo, pytorch_kinematics and Isaac Lab;
  `quat_xyzw_to_wxyz` / `quat_wxyz_to_xyzw` convert from/to SciPy, ROS and PyBullet order.
  Functions returning a quaternion return it unit-norm with ``w >= 0`` (``q`` and ``-q`` are the
  same rotation; the canonical sign makes results comparable).
- Rotation matrices ``[..., 3, 3]``; poses ``[..., 4, 4]`` (homogeneous, last row ``0 0 0 1``);
  rotation vectors (axis times angle, radians) ``[..., 3]``; rot6d ``[..., 6]`` = the first two
  *columns* of the matrix, concatenated (Zhou et al. 2019).
- Euler angles follow SciPy: ``order`` is three letters, lowercase = extrinsic (rotations about the
  fixed axes), uppercase = intrinsic (about the moving axes), e.g. ``"xyz"``, ``"ZYX"``, ``"zxz"``.

Every function is pure PyTorch (no host sync, no data-dependent Python branches: singular cases are
selected with ``torch.where`` and thresholds scale with the dtype's epsilon), so it runs on CPU and
CUDA, under ``torch.compile`` and inside CUDA graphs. Accurate near angle 0 and pi.
"""

from __future__ import annotations

import math

import torch

from robocache.errors import DataError
from robocache.ops._checks import FLOAT_DTYPES, check_choice, check_dtype, fail

__all__ = [
    "quat_xyzw_to_wxyz", "quat_wxyz_to_xyzw", "quat_normalize", "quat_canonical",
    "quat_multiply", "quat_conjugate", "quat_apply",
    "quat_to_matrix", "matrix_to_quat", "rotvec_to_quat", "quat_to_rotvec",
    "rotvec_to_matrix", "matrix_to_rotvec", "rot6d_to_matrix", "matrix_to_rot6d",
    "euler_to_quat", "quat_to_euler", "euler_to_matrix", "matrix_to_euler",
    "make_pose", "se3_compose", "se3_inverse", "se3_apply", "check_rotation",
    "joint_to_relative", "joint_to_absolute", "pose_to_relative", "pose_to_absolute",
]


def _check(op: str, name: str, x: torch.Tensor, tail: tuple[int, ...]) -> None:
    if not isinstance(x, torch.Tensor):
        fail(op, f"`{name}` must be a torch.Tensor; got {type(x).__name__}.", TypeError)
    check_dtype(op, name, x, FLOAT_DTYPES, f"Convert it, e.g. `{name}.float()`.")
    if x.dim() < len(tail) or tuple(x.shape[x.dim() - len(tail):]) != tail:
        want = "[..., " + ", ".join(map(str, tail)) + "]"
        fail(op, f"`{name}` must have shape {want}; got {list(x.shape)}.")


def _small(x: torch.Tensor) -> float:
    """Below this magnitude a series replaces a ratio: its truncation error is under eps."""
    return math.sqrt(torch.finfo(x.dtype).eps)


# --------------------------------------------------------------------------- quaternions

def quat_xyzw_to_wxyz(q: torch.Tensor) -> torch.Tensor:
    """Reorder quaternions ``[..., 4]`` from xyzw (SciPy, ROS) to wxyz. Values are not changed."""
    _check("quat_xyzw_to_wxyz", "q", q, (4,))
    return q[..., [3, 0, 1, 2]]


def quat_wxyz_to_xyzw(q: torch.Tensor) -> torch.Tensor:
    """Reorder quaternions ``[..., 4]`` from wxyz to xyzw (SciPy, ROS). Values are not changed."""
    _check("quat_wxyz_to_xyzw", "q", q, (4,))
    return q[..., [1, 2, 3, 0]]


def quat_normalize(q: torch.Tensor) -> torch.Tensor:
    """Unit-norm quaternions ``[..., 4]`` (a zero quaternion stays zero)."""
    _check("quat_normalize", "q", q, (4,))
    return q / q.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(q.dtype).tiny)


def quat_canonical(q: torch.Tensor) -> torch.Tensor:
    """Unit wxyz quaternions with ``w >= 0`` (``q`` and ``-q`` are the same rotation)."""
    q = quat_normalize(q)
    return torch.where(q[..., :1] < 0, -q, q)


def quat_multiply(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Hamilton product ``a * b`` of wxyz quaternions (rotation ``b`` first, then ``a``).

    Args:
        a, b: ``[..., 4]`` wxyz, broadcastable.

    Returns:
        ``[..., 4]``, not renormalized.
    """
    _check("quat_multiply", "a", a, (4,))
    _check("quat_multiply", "b", b, (4,))
    aw, ax, ay, az = a.unbind(-1)
    bw, bx, by, bz = b.unbind(-1)
    return torch.stack((aw * bw - ax * bx - ay * by - az * bz,
                        aw * bx + ax * bw + ay * bz - az * by,
                        aw * by - ax * bz + ay * bw + az * bx,
                        aw * bz + ax * by - ay * bx + az * bw), -1)


def quat_conjugate(q: torch.Tensor) -> torch.Tensor:
    """Conjugate ``(w, -x, -y, -z)``: the inverse rotation of a unit quaternion."""
    _check("quat_conjugate", "q", q, (4,))
    return q * q.new_tensor([1.0, -1.0, -1.0, -1.0])


def quat_apply(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Rotate vectors ``v [..., 3]`` by unit wxyz quaternions ``q [..., 4]`` (broadcastable)."""
    _check("quat_apply", "q", q, (4,))
    _check("quat_apply", "v", v, (3,))
    shape = torch.broadcast_shapes(q.shape[:-1], v.shape[:-1])
    w, u = q[..., :1].expand(*shape, 1), q[..., 1:].expand(*shape, 3)
    t = 2 * torch.linalg.cross(u, v.expand(*shape, 3), dim=-1)
    return v + w * t + torch.linalg.cross(u, t, dim=-1)


def quat_to_matrix(q: torch.Tensor) -> torch.Tensor:
    """Rotation matrices ``[..., 3, 3]`` from wxyz quaternions ``[..., 4]`` (normalized first).

    Example:
        >>> quat_to_matrix(torch.tensor([1.0, 0, 0, 0])).shape
        torch.Size([3, 3])
    """
    _check("quat_to_matrix", "q", q, (4,))
    w, x, y, z = q.unbind(-1)
    s = 2.0 / (q * q).sum(-1).clamp_min(torch.finfo(q.dtype).tiny)
    m = torch.stack((1 - s * (y * y + z * z), s * (x * y - z * w), s * (x * z + y * w),
                     s * (x * y + z * w), 1 - s * (x * x + z * z), s * (y * z - x * w),
                     s * (x * z - y * w), s * (y * z + x * w), 1 - s * (x * x + y * y)), -1)
    return m.reshape(*q.shape[:-1], 3, 3)


def matrix_to_quat(m: torch.Tensor) -> torch.Tensor:
    """Unit wxyz quaternions (``w >= 0``) from rotation matrices ``[..., 3, 3]``.

    Of the four algebraically equal formulas the one with the largest denominator is selected per
    element (Shepperd's method), so the result is accurate near pi as well as near 0.
    """
    _check("matrix_to_quat", "m", m, (3, 3))
    m00, m01, m02, m10, m11, m12, m20, m21, m22 = m.reshape(*m.shape[:-2], 9).unbind(-1)
    # 4 q_i^2 for i = w, x, y, z
    sq = torch.stack((1 + m00 + m11 + m22, 1 + m00 - m11 - m22,
                      1 - m00 + m11 - m22, 1 - m00 - m11 + m22), -1)
    r = sq.clamp_min(0).sqrt()  # 2 |q_i|
    cand = torch.stack((
        torch.stack((sq[..., 0], m21 - m12, m02 - m20, m10 - m01), -1),
        torch.stack((m21 - m12, sq[..., 1], m10 + m01, m02 + m20), -1),
        torch.stack((m02 - m20, m10 + m01, sq[..., 2], m12 + m21), -1),
        torch.stack((m10 - m01, m20 + m02, m21 + m12, sq[..., 3]), -1),
    ), -2) / (2 * r.clamp_min(0.1)).unsqueeze(-1)
    best = r.argmax(-1, keepdim=True)
    q = cand.gather(-2, best.unsqueeze(-1).expand(*best.shape, 4)).squeeze(-2)
    return quat_canonical(q)


def rotvec_to_quat(r: torch.Tensor) -> torch.Tensor:
    """Unit wxyz quaternions from rotation vectors ``[..., 3]`` (axis * angle, radians)."""
    _check("rotvec_to_quat", "r", r, (3,))
    theta = r.norm(dim=-1, keepdim=True)
    small = theta < _small(r)
    safe = torch.where(small, torch.ones_like(theta), theta)
    k = torch.where(small, 0.5 - theta * theta / 48, torch.sin(safe / 2) / safe)
    return quat_canonical(torch.cat((torch.cos(theta / 2), r * k), -1))


def quat_to_rotvec(q: torch.Tensor) -> torch.Tensor:
    """Rotation vectors ``[..., 3]`` (angle in ``[0, pi]``) from wxyz quaternions ``[..., 4]``."""
    _check("quat_to_rotvec", "q", q, (4,))
    q = quat_canonical(q)
    w, v = q[..., :1], q[..., 1:]
    n = v.norm(dim=-1, keepdim=True)
    small = n < _small(q)
    angle = 2 * torch.atan2(n, w)
    safe_n = torch.where(small, torch.ones_like(n), n)
    safe_w = torch.where(small, w, torch.ones_like(w))  # w ~ 1 where n is small
    k = torch.where(small, 2 / safe_w * (1 - n * n / (3 * safe_w * safe_w)), angle / safe_n)
    return v * k


def rotvec_to_matrix(r: torch.Tensor) -> torch.Tensor:
    """Rotation matrices ``[..., 3, 3]`` from rotation vectors ``[..., 3]`` (Rodrigues' formula)."""
    _check("rotvec_to_matrix", "r", r, (3,))
    theta = r.norm(dim=-1, keepdim=True).unsqueeze(-1)
    small = theta < _small(r)
    safe = torch.where(small, torch.ones_like(theta), theta)
    a = torch.where(small, 1 - theta * theta / 6, torch.sin(safe) / safe)
    # (1 - cos t) / t^2 written as 2 sin^2(t/2) / t^2: no cancellation for small t
    b = torch.where(small, 0.5 - theta * theta / 24, 2 * torch.sin(safe / 2) ** 2 / (safe * safe))
    x, y, z = r.unbind(-1)
    o = torch.zeros_like(x)
    k = torch.stack((o, -z, y, z, o, -x, -y, x, o), -1).reshape(*r.shape[:-1], 3, 3)
    eye = torch.eye(3, dtype=r.dtype, device=r.device)
    return eye + a * k + b * (k @ k)


def matrix_to_rotvec(m: torch.Tensor) -> torch.Tensor:
    """Rotation vectors ``[..., 3]`` (angle in ``[0, pi]``) from rotation matrices ``[..., 3, 3]``.
    """
    return quat_to_rotvec(matrix_to_quat(m))


def rot6d_to_matrix(d6: torch.Tensor) -> torch.Tensor:
    """Rotation matrices from rot6d ``[..., 6]`` (two columns, Gram-Schmidt orthonormalized).

    The first three values are the first column, the next three the second; the third column is
    their cross product. Any 6-vector with independent halves maps to a valid rotation.
    """
    _check("rot6d_to_matrix", "d6", d6, (6,))
    tiny = torch.finfo(d6.dtype).tiny
    a, b = d6[..., :3], d6[..., 3:]
    c0 = a / a.norm(dim=-1, keepdim=True).clamp_min(tiny)
    b = b - (c0 * b).sum(-1, keepdim=True) * c0
    c1 = b / b.norm(dim=-1, keepdim=True).clamp_min(tiny)
    c2 = torch.linalg.cross(c0, c1, dim=-1)
    return torch.stack((c0, c1, c2), -1)


def matrix_to_rot6d(m: torch.Tensor) -> torch.Tensor:
    """rot6d ``[..., 6]``: the first two columns of ``m [..., 3, 3]``, column by column."""
    _check("matrix_to_rot6d", "m", m, (3, 3))
    return torch.cat((m[..., :, 0], m[..., :, 1]), -1)


# --------------------------------------------------------------------------- Euler angles

_AXES = {"x": 0, "y": 1, "z": 2}


def _check_order(op: str, order: str) -> tuple[list[int], bool]:
    ok = (isinstance(order, str) and len(order) == 3 and (order.islower() or order.isupper())
          and all(c in _AXES for c in order.lower()) and order[0] != order[1] != order[2])
    if not ok:
        fail(op, f"`order` must be three axis letters, all lowercase (extrinsic) or all uppercase "
             f"(intrinsic), no axis twice in a row, e.g. 'xyz', 'ZYX' or 'zxz'; got {order!r}.",
             ValueError)
    return [_AXES[c] for c in order.lower()], order.islower()


def euler_to_quat(angles: torch.Tensor, order: str) -> torch.Tensor:
    """Unit wxyz quaternions from Euler angles ``[..., 3]`` (radians) in SciPy's ``order``.

    Extrinsic ``"xyz"`` rotates about fixed x, then fixed y, then fixed z (``R = Rz Ry Rx``);
    intrinsic ``"XYZ"`` about x, then the new y, then the new z (``R = Rx Ry Rz``).
    """
    axes, extrinsic = _check_order("euler_to_quat", order)
    _check("euler_to_quat", "angles", angles, (3,))
    q = None
    for i, ax in enumerate(axes):
        half = angles[..., i] / 2
        parts = [torch.cos(half)] + [torch.sin(half) if a == ax else torch.zeros_like(half)
                                     for a in range(3)]
        e = torch.stack(parts, -1)
        q = e if q is None else (quat_multiply(e, q) if extrinsic else quat_multiply(q, e))
    return quat_canonical(q)


def quat_to_euler(q: torch.Tensor, order: str) -> torch.Tensor:
    """Euler angles ``[..., 3]`` in ``[-pi, pi]`` (SciPy's ``as_euler``) from wxyz quaternions.

    At gimbal lock (middle angle 0 or pi, within a dtype-scaled tolerance) the third angle is set
    to 0, as SciPy does; the result still reproduces the rotation.
    """
    axes, extrinsic = _check_order("quat_to_euler", order)
    _check("quat_to_euler", "q", q, (4,))
    q = quat_normalize(q)
    i, j, k = axes if extrinsic else axes[::-1]
    symmetric = i == k
    if symmetric:
        k = 3 - i - j
    sign = (i - j) * (j - k) * (k - i) // 2
    w, v = q[..., 0], q[..., 1:]
    if symmetric:
        a, b, c, d = w, v[..., i], v[..., j], v[..., k] * sign
    else:
        a, b = w - v[..., j], v[..., i] + v[..., k] * sign
        c, d = v[..., j] + w, v[..., k] * sign - v[..., i]
    mid = 2 * torch.atan2(torch.hypot(c, d), torch.hypot(a, b))
    half_sum, half_diff = torch.atan2(b, a), torch.atan2(d, c)
    # SciPy's 1e-7 in float64; a few ulps otherwise (near lock only first + third is defined)
    eps = 1e-7 if q.dtype == torch.float64 else 8 * torch.finfo(q.dtype).eps
    at0 = mid.abs() <= eps
    at_pi = (mid - math.pi).abs() <= eps
    regular = ~(at0 | at_pi)
    locked = torch.where(at0, 2 * half_sum, 2 * half_diff * (-1 if extrinsic else 1))
    zero = torch.zeros_like(mid)
    first = torch.where(regular, half_sum - half_diff, locked)
    third = torch.where(regular, half_sum + half_diff, zero)
    if not symmetric:
        third = third * sign
        mid = mid - math.pi / 2
    out = [first, mid, third] if extrinsic else [third, mid, first]
    return torch.remainder(torch.stack(out, -1) + math.pi, 2 * math.pi) - math.pi


def euler_to_matrix(angles: torch.Tensor, order: str) -> torch.Tensor:
    """Rotation matrices ``[..., 3, 3]`` from Euler angles ``[..., 3]`` (see `euler_to_quat`)."""
    return quat_to_matrix(euler_to_quat(angles, order))


def matrix_to_euler(m: torch.Tensor, order: str) -> torch.Tensor:
    """Euler angles ``[..., 3]`` from rotation matrices (see `quat_to_euler`)."""
    return quat_to_euler(matrix_to_quat(m), order)


# --------------------------------------------------------------------------- SE(3)

def make_pose(rotation: torch.Tensor, translation: torch.Tensor) -> torch.Tensor:
    """Poses ``[..., 4, 4]`` from rotations (``[..., 3, 3]`` matrix or ``[..., 4]`` wxyz quaternion)
    and translations ``[..., 3]`` (metres); leading dimensions broadcast."""
    if rotation.shape[-1:] == (4,):
        rotation = quat_to_matrix(rotation)
    _check("make_pose", "rotation", rotation, (3, 3))
    _check("make_pose", "translation", translation, (3,))
    lead = torch.broadcast_shapes(rotation.shape[:-2], translation.shape[:-1])
    top = torch.cat((rotation.expand(*lead, 3, 3), translation.expand(*lead, 3).unsqueeze(-1)), -1)
    bottom = torch.zeros_like(top[..., :1, :])  # no host copy: CUDA graphs capture it
    bottom[..., 0, 3] = 1.0
    return torch.cat((top, bottom), -2)


def se3_compose(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` for poses ``[..., 4, 4]``: ``b`` expressed in ``a``'s frame, then ``a`` applied."""
    _check("se3_compose", "a", a, (4, 4))
    _check("se3_compose", "b", b, (4, 4))
    return a @ b


def se3_inverse(t: torch.Tensor) -> torch.Tensor:
    """Inverse of rigid poses ``[..., 4, 4]``: ``[R^T, -R^T p]`` (exact, no general inverse)."""
    _check("se3_inverse", "t", t, (4, 4))
    rt = t[..., :3, :3].transpose(-1, -2)
    return make_pose(rt, -(rt @ t[..., :3, 3:]).squeeze(-1))


def se3_apply(t: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    """Transform points ``[..., P, 3]`` by poses ``[..., 4, 4]``: ``R p + t`` per point."""
    _check("se3_apply", "t", t, (4, 4))
    _check("se3_apply", "points", points, (3,))
    if points.dim() < 2:
        fail("se3_apply", f"`points` must have shape [..., P, 3]; got {list(points.shape)}.")
    return points @ t[..., :3, :3].transpose(-1, -2) + t[..., None, :3, 3]


def check_rotation(op: str, name: str, r: torch.Tensor, atol: float | None = None) -> None:
    """Data-dependent check (one sync): rotations ``[..., 3, 3]`` are orthonormal, det +1.

    Raises:
        DataError: naming the first offending index and its deviation.
    """
    tol = atol if atol is not None else (1e-3 if r.dtype != torch.float64 else 1e-6)
    eye = torch.eye(3, dtype=r.dtype, device=r.device)
    dev = (r.transpose(-1, -2) @ r - eye).abs().amax((-1, -2))
    det = torch.linalg.det(r)
    bad = ~((dev <= tol) & ((det - 1).abs() <= tol))
    if bool(bad.any()):
        idx = tuple(int(v) for v in bad.nonzero()[0])
        fail(op, f"`{name}` has a rotation part that is not orthonormal with determinant +1 at "
             f"index {list(idx)} (max |R^T R - I| = {float(dev[idx]):.3g}, det = "
             f"{float(det[idx]):.4g}, tolerance {tol:g}); re-orthonormalize it, e.g. through "
             "robocache.geometry.matrix_to_quat then quat_to_matrix.", DataError)


# --------------------------------------------------------------------------- actions

def _state_like(op: str, x: torch.Tensor, state: torch.Tensor, event: int) -> torch.Tensor:
    """`state` broadcast to `x`, where `x` may carry one extra chunk axis (horizon T) before the
    last `event` dims."""
    if x.dim() == state.dim() + 1:
        state = state.unsqueeze(-event - 1)
    if x.dim() != state.dim() or x.shape[-event:] != state.shape[-event:]:
        fail(op, f"`state` {list(state.shape)} must match the actions {list(x.shape)} up to an "
             "optional chunk axis: actions [..., D] with state [..., D], or actions [..., T, D] "
             "with state [..., D] (D is [4, 4] for poses).")
    return state


def joint_to_relative(actions: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """Joint-space deltas ``actions - state`` relative to the current joint state.

    Args:
        actions: absolute joint targets ``[..., D]`` or an action chunk ``[..., T, D]``.
        state: current joint positions ``[..., D]``.

    Returns:
        Deltas with the shape of ``actions``; `joint_to_absolute` inverts it exactly.

    Example:
        >>> joint_to_relative(torch.zeros(8, 16, 7), torch.ones(8, 7)).shape
        torch.Size([8, 16, 7])
    """
    return actions - _state_like("joint_to_relative", actions, state, 1)


def joint_to_absolute(deltas: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
    """Absolute joint targets ``state + deltas`` (inverse of `joint_to_relative`)."""
    return deltas + _state_like("joint_to_absolute", deltas, state, 1)


_FRAMES = ("ee", "base")


def pose_to_relative(poses: torch.Tensor, state: torch.Tensor, frame: str = "ee") -> torch.Tensor:
    """End-effector actions relative to the current end-effector pose.

    Args:
        poses: absolute target poses ``[..., 4, 4]`` or a chunk ``[..., T, 4, 4]`` (base frame).
        state: current end-effector pose ``[..., 4, 4]`` (base frame).
        frame: ``"ee"`` (default; UMI/GR00T-style): ``state^-1 @ pose``, the target expressed in the
            current end-effector frame. ``"base"``: rotation ``R R0^T`` and translation ``p - p0``,
            both in the base frame.

    Returns:
        Relative poses ``[..., (T,) 4, 4]``; `pose_to_absolute` with the same ``frame`` inverts it.

    Raises:
        ShapeError: shapes that do not match; ValueError: an unknown ``frame``.
    """
    check_choice("pose_to_relative", "frame", frame, _FRAMES)
    _check("pose_to_relative", "poses", poses, (4, 4))
    s = _state_like("pose_to_relative", poses, state, 2)
    if frame == "ee":
        return se3_inverse(s) @ poses
    rot = poses[..., :3, :3] @ s[..., :3, :3].transpose(-1, -2)
    return make_pose(rot, poses[..., :3, 3] - s[..., :3, 3])


def pose_to_absolute(rel: torch.Tensor, state: torch.Tensor, frame: str = "ee") -> torch.Tensor:
    """Absolute poses from relative end-effector actions (inverse of `pose_to_relative`)."""
    check_choice("pose_to_absolute", "frame", frame, _FRAMES)
    _check("pose_to_absolute", "rel", rel, (4, 4))
    s = _state_like("pose_to_absolute", rel, state, 2)
    if frame == "ee":
        return s @ rel
    rot = rel[..., :3, :3] @ s[..., :3, :3]
    return make_pose(rot, rel[..., :3, 3] + s[..., :3, 3])
