"""Pure-PyTorch forward kinematics, geometric Jacobian and damped-least-squares IK.

Same signatures as the Triton launchers in `robocache.kernels.kinematics` (the CPU path of
`robocache.kinematics` and the twin the kernel tests compare against). A serial chain of NJ
joints, base link to end link, is passed as

- ``params [NJ, 16]``: per joint its origin (rows 0-2 of the parent-to-joint transform, 12 values,
  row-major), its unit axis in the joint frame (3) and a zero pad (rows of 64 bytes);
- ``movable``, ``prismatic``: int bit masks, bit j set when joint j moves / is prismatic. Moving
  joints take the columns of ``q`` in path order. (Structure as ints lets the kernels specialize
  at compile time and lets launches read nothing from the device.)

A joint's child link pose is ``parent @ origin @ motion(q)``, motion being a rotation about the
axis (revolute, continuous) or a translation along it (prismatic).
"""

from __future__ import annotations

import torch

# Levenberg-Marquardt constants shared with the Triton IK kernel (tuned on the Panda, see
# docs/kinematics.md): initial damping, its bounds, and the factors applied after an accepted
# (cost went down) or rejected step.
LM_LAMBDA0 = 1e-2
LM_LAMBDA_MIN = 1e-6
LM_LAMBDA_MAX = 1e4
LM_DOWN = 0.3
LM_UP = 4.0
# cos^2(theta/2) floor in the rotation error (bounds the step near theta = pi)
COS_HALF_FLOOR = 1e-6


def _walk(q: torch.Tensor, params: torch.Tensor, movable: int, prismatic: int):
    """Yield (joint frame [N,4,4], child link pose [N,4,4], column, prismatic, axis [3]) per
    path joint."""
    n = q.shape[0]
    pose = torch.eye(4, dtype=q.dtype, device=q.device).expand(n, 4, 4)
    bottom = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=q.dtype, device=q.device)
    col = 0
    for j in range(params.shape[0]):
        row = params[j].to(q.dtype)
        origin = torch.cat((row[:12].reshape(3, 4), bottom[None]), 0)
        frame = pose @ origin
        axis, slide = row[12:15], bool(prismatic >> j & 1)
        motion = torch.eye(4, dtype=q.dtype, device=q.device).repeat(n, 1, 1)
        qcol = -1
        if movable >> j & 1:
            qcol, col = col, col + 1
            v = q[:, qcol]
            if slide:
                motion[:, :3, 3] = v[:, None] * axis
            else:
                k = torch.zeros(3, 3, dtype=q.dtype, device=q.device)
                k[0, 1], k[0, 2], k[1, 2] = -axis[2], axis[1], -axis[0]
                k = k - k.T
                s, c = torch.sin(v)[:, None, None], torch.cos(v)[:, None, None]
                eye = torch.eye(3, dtype=q.dtype, device=q.device)
                motion[:, :3, :3] = eye + s * k + (1 - c) * (k @ k)
        pose = frame @ motion
        yield frame, pose, qcol, slide, axis


def fk_reference(q: torch.Tensor, params: torch.Tensor, movable: int, prismatic: int,
                 all_links: bool = False) -> torch.Tensor:
    """Poses of the end link ``[N, 4, 4]`` or of every path link ``[N, NJ, 4, 4]``, for
    ``q [N, DOF]``."""
    poses = [pose for _, pose, _, _, _ in _walk(q, params, movable, prismatic)]
    if not poses:
        eye = torch.eye(4, dtype=q.dtype, device=q.device).expand(q.shape[0], 4, 4)
        return eye[:, None].clone() if all_links else eye.clone()
    return torch.stack(poses, 1) if all_links else poses[-1].clone()


def fk_jacobian_reference(q: torch.Tensor, params: torch.Tensor, movable: int, prismatic: int):
    """End pose ``[N, 4, 4]`` and geometric Jacobian ``[N, 6, DOF]`` (rows vx vy vz wx wy wz, base
    frame, linear velocity of the end link origin)."""
    n, dof = q.shape
    cols = []
    for frame, link, col, slide, axis in _walk(q, params, movable, prismatic):
        pose = link
        if col >= 0:
            cols.append((col, frame[:, :3, :3] @ axis, frame[:, :3, 3], slide))
    jac = q.new_zeros(n, 6, dof)
    pe = pose[:, :3, 3]
    for col, z, p, slide in cols:
        if slide:
            jac[:, :3, col] += z
        else:
            jac[:, :3, col] += torch.linalg.cross(z, pe - p, dim=-1)
            jac[:, 3:, col] += z
    return pose.clone(), jac


def pose_error(pose: torch.Tensor, target: torch.Tensor):
    """Task-space error of ``pose`` towards ``target`` (both ``[N, 4, 4]``, base frame).

    Returns (e [N, 6], position error [N] in metres, half chord [N]). ``e`` stacks the position
    difference and ``2 sin(theta/2) * axis`` of the rotation ``target @ pose^T`` (theta, axis): it
    matches the angular velocity to first order and, unlike ``sin(theta) * axis``, keeps growing up
    to pi. The half chord ``sin(theta/2) = |R - R_target|_F / sqrt(8)`` is accurate at small angles;
    ``2 asin`` of it is the rotation error in radians. (Triton has no atan2/asin outside libdevice,
    which its CPU interpreter lacks, so the kernel uses these forms too.)
    """
    dp = target[:, :3, 3] - pose[:, :3, 3]
    r = target[:, :3, :3] @ pose[:, :3, :3].transpose(-1, -2)
    v = 0.5 * torch.stack((r[:, 2, 1] - r[:, 1, 2], r[:, 0, 2] - r[:, 2, 0],
                           r[:, 1, 0] - r[:, 0, 1]), -1)
    cos_half = (0.25 * (r.diagonal(dim1=-2, dim2=-1).sum(-1) + 1)).clamp_min(COS_HALF_FLOOR).sqrt()
    half_chord = (target[:, :3, :3] - pose[:, :3, :3]).square().sum((-1, -2)).div(8).sqrt()
    return torch.cat((dp, v / cos_half[:, None]), -1), dp.norm(dim=-1), half_chord


def ik_reference(target: torch.Tensor, q0: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor,
                 params: torch.Tensor, movable: int, prismatic: int, seeds: int, max_iters: int,
                 tol_pos: float, tol_half_chord: float):
    """Levenberg-Marquardt IK for ``P = T * seeds`` problems, each seed of target ``p // seeds``.

    Args mirror `robocache.kernels.kinematics.ik_cuda`: ``target [T, 4, 4]``, ``q0 [P, DOF]``
    (inside the limits), ``lower/upper [DOF]``. Each iteration solves
    ``dq = J^T (J J^T + lambda I)^-1 e``, clamps ``q + dq`` to the limits and keeps it only if the
    cost ``|e|^2`` went down (then lambda shrinks; else it grows). Converged problems stop moving.

    A problem has converged when its position error is ``<= tol_pos`` and its half chord (see
    `pose_error`) ``<= tol_half_chord`` (``sin(tol_rot / 2)``).

    Returns (q [P, DOF], position error [P] m, half chord [P]).
    """
    tgt = target.repeat_interleave(seeds, 0)
    q = q0.clone()
    pose, jac = fk_jacobian_reference(q, params, movable, prismatic)
    e, perr, rerr = pose_error(pose, tgt)
    cost = (e * e).sum(-1)
    lam = torch.full_like(cost, LM_LAMBDA0)
    eye = torch.eye(6, dtype=q.dtype, device=q.device)
    for _ in range(max_iters):
        active = ~((perr <= tol_pos) & (rerr <= tol_half_chord))
        if not bool(active.any()):  # the CPU path may sync; the kernel never does
            break
        a = jac @ jac.transpose(-1, -2) + lam[:, None, None] * eye
        y = torch.linalg.solve(a, e.unsqueeze(-1))
        qn = torch.minimum(torch.maximum(q + (jac.transpose(-1, -2) @ y).squeeze(-1), lower), upper)
        pose_n, jac_n = fk_jacobian_reference(qn, params, movable, prismatic)
        e_n, perr_n, rerr_n = pose_error(pose_n, tgt)
        cost_n = (e_n * e_n).sum(-1)
        accept = active & (cost_n < cost)
        q = torch.where(accept[:, None], qn, q)
        jac = torch.where(accept[:, None, None], jac_n, jac)
        e = torch.where(accept[:, None], e_n, e)
        cost, perr, rerr = (torch.where(accept, a_, b_) for a_, b_ in
                            ((cost_n, cost), (perr_n, perr), (rerr_n, rerr)))
        lam = torch.where(accept, lam * LM_DOWN, lam * LM_UP).clamp(LM_LAMBDA_MIN, LM_LAMBDA_MAX)
    return q, perr, rerr
