"""Serial-chain robot kinematics from URDF or DH parameters: FK, geometric Jacobian, batched IK.

A `Chain` is the path of joints from a base link to an end link. Joint values ``q [..., DOF]``
follow `Chain.joint_names` (radians for revolute/continuous joints, metres for prismatic ones);
poses are ``[..., 4, 4]`` homogeneous transforms in the base link's frame, in metres.

On CUDA, `fk` and `jacobian` are each one Triton kernel launch and `ik` one launch for all
iterations of all seeds; on CPU they run the PyTorch reference (`robocache.reference.kinematics`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from robocache.chain import Chain, asset_path
from robocache.errors import DataError, ShapeError, URDFError
from robocache.observability import nvtx
from robocache.ops._checks import check_device, check_dtype, check_fits, fail, wants_validation
from robocache.ops._dispatch import Op
from robocache.ops.geometry import check_rotation
from robocache.reference.kinematics import fk_jacobian_reference, fk_reference, ik_reference

__all__ = ["Chain", "IKResult", "URDFError", "asset_path", "fk", "ik", "jacobian"]

KIN_DTYPES = (torch.float32, torch.float64)


# --------------------------------------------------------------------------- registered ops

def _ik_cpu(target: torch.Tensor, q0: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor,
            params: torch.Tensor, movable: int, prismatic: int, seeds: int, max_iters: int,
            tol_pos: float, tol_half_chord: float
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return ik_reference(target, q0, lower, upper, params, movable, prismatic, seeds, max_iters,
                        tol_pos, tol_half_chord)


def _fk_cpu(q: torch.Tensor, params: torch.Tensor, movable: int, prismatic: int,
            all_links: bool) -> torch.Tensor:
    return fk_reference(q, params, movable, prismatic, all_links)


def _jacobian_cpu(q: torch.Tensor, params: torch.Tensor, movable: int,
                  prismatic: int) -> torch.Tensor:
    return fk_jacobian_reference(q, params, movable, prismatic)[1]


def _fk_fake(q, params, movable, prismatic, all_links):
    n, nj = q.shape[0], params.shape[0]
    return q.new_empty((n, nj, 4, 4) if all_links else (n, 4, 4))


def _jacobian_fake(q, params, movable, prismatic):
    return q.new_empty((q.shape[0], 6, q.shape[1]))


def _ik_fake(target, q0, lower, upper, params, movable, prismatic, seeds, max_iters, tol_pos,
             tol_half_chord):
    return torch.empty_like(q0), q0.new_empty(q0.shape[0]), q0.new_empty(q0.shape[0])


_K = "robocache.kernels.kinematics:"
_FK = Op("kinematics_fk", cpu=_fk_cpu, cuda=_K + "fk_cuda", fake=_fk_fake)
_JACOBIAN = Op("kinematics_jacobian", cpu=_jacobian_cpu, cuda=_K + "jacobian_cuda",
               fake=_jacobian_fake)
_IK = Op("kinematics_ik", cpu=_ik_cpu, cuda=_K + "ik_cuda", fake=_ik_fake)


# --------------------------------------------------------------------------- public ops

def _check_q(op: str, chain: Chain, q: torch.Tensor, validate: bool | None,
             what: str, words: int) -> torch.Tensor:
    """``q`` checked and flattened to ``[N, dof]``; refused before any copy when ``words``
    values of q's dtype per configuration (the op's output and working memory, ``what``)
    cannot fit."""
    if not isinstance(chain, Chain):
        fail(op, f"`chain` must be a robocache.kinematics.Chain (from Chain.from_urdf or "
             f"Chain.from_dh); got {type(chain).__name__}.", TypeError)
    if not isinstance(q, torch.Tensor):
        fail(op, f"`q` must be a torch.Tensor; got {type(q).__name__}.", TypeError)
    check_dtype(op, "q", q, KIN_DTYPES, "Kinematics runs in float32 or float64: `q.float()`.")
    if q.dim() == 0 or q.shape[-1] != chain.dof:
        fail(op, f"`q` must have shape [..., {chain.dof}] (one value per joint of chain "
             f"{chain.name!r}: {', '.join(chain.joint_names)}); got {list(q.shape)}.", ShapeError)
    n = q.numel() // chain.dof
    check_fits(op, f"{n} configurations x {what}", n * (words + chain.dof) * q.element_size(),
               q.device, "pass fewer configurations in `q` per call.")
    if wants_validation(validate, q) and bool(torch.isnan(q).any()):
        idx = [int(v) for v in torch.isnan(q).nonzero()[0]]
        fail(op, f"`q` has a NaN at index {idx} (joint {chain.joint_names[idx[-1]]!r}); drop or "
             "repair that configuration.", DataError)
    if q.dim() == 2 and q.is_contiguous():  # the common case skips two torch calls (host us)
        return q
    return q.reshape(-1, chain.dof).contiguous()


@nvtx.annotate("robocache.fk")
def fk(chain: Chain, q: torch.Tensor, *, all_links: bool = False,
       validate: bool | None = None) -> torch.Tensor:
    """Forward kinematics: poses of the end link (or of every link on the chain) in the base frame.

    Args:
        chain: a `Chain`.
        q: joint values ``[..., DOF]``, float32 or float64 (rad / m), any leading shape.
        all_links: also return the intermediate links: ``[..., L, 4, 4]`` ordered as
            ``chain.link_names`` (``L`` = joints on the path, fixed ones included).
        validate: check ``q`` for NaN (one device sync). Default: on CPU yes, on CUDA only with
            ``ROBOCACHE_VALIDATE=1``.

    Returns:
        ``[..., 4, 4]`` (or ``[..., L, 4, 4]``) in q's dtype and device; metres.

    Raises:
        TypeError: ``chain`` or ``q`` of the wrong type. DTypeError: q not float32/float64.
        ShapeError: the last dimension of q is not ``chain.dof``. DataError: NaN in q (validating).

    Example:
        >>> pose = fk(chain, torch.zeros(1024, chain.dof, device="cuda"))
        >>> pose.shape
        torch.Size([1024, 4, 4])
    """
    lead = q.shape[:-1] if isinstance(q, torch.Tensor) else ()
    links = len(chain.link_names) if all_links else 1
    # the poses and the reference's per-joint transforms
    flat = _check_q("fk", chain, q, validate, f"{links} link poses", (links + 3) * 16)
    params, _, _ = chain.tensors(q.device, q.dtype)
    out = _FK(flat, params, chain.movable, chain.prismatic, bool(all_links))
    return out if q.dim() == 2 else out.reshape(*lead, *out.shape[1:])


@nvtx.annotate("robocache.jacobian")
def jacobian(chain: Chain, q: torch.Tensor, *, validate: bool | None = None) -> torch.Tensor:
    """Geometric Jacobian of the end link, in the base frame.

    Rows 0-2 are the linear velocity of the end link's origin, rows 3-5 the angular velocity,
    both expressed in the base frame (``[v; w] = J dq``); column i belongs to
    ``chain.joint_names[i]``. Revolute column: ``[z x (p_end - p_i); z]``; prismatic: ``[z; 0]``.

    Args:
        chain: a `Chain`.
        q: joint values ``[..., DOF]``, float32 or float64.
        validate: as in `fk`.

    Returns:
        ``[..., 6, DOF]`` in q's dtype.

    Raises:
        As `fk`.

    Example:
        >>> jacobian(chain, torch.zeros(7)).shape
        torch.Size([6, 7])
    """
    lead = q.shape[:-1] if isinstance(q, torch.Tensor) else ()
    # the Jacobians and every link's pose they are made of
    flat = _check_q("jacobian", chain, q, validate, "a Jacobian",
                    6 * chain.dof + (len(chain.link_names) + 3) * 16)
    params, _, _ = chain.tensors(q.device, q.dtype)
    out = _JACOBIAN(flat, params, chain.movable, chain.prismatic)
    return out if q.dim() == 2 else out.reshape(*lead, 6, chain.dof)


class IKResult(NamedTuple):
    """Result of `ik`, one entry per target.

    Attributes:
        q: ``[..., DOF]`` best joint solution found (within the joint limits).
        converged: ``[...]`` bool, position and rotation errors within tolerance.
        pos_err: ``[...]`` position error in metres.
        rot_err: ``[...]`` rotation error (angle of ``target @ pose^T``) in radians.
    """

    q: torch.Tensor
    converged: torch.Tensor
    pos_err: torch.Tensor
    rot_err: torch.Tensor


@nvtx.annotate("robocache.ik")
def ik(chain: Chain, target: torch.Tensor, *, q_init: torch.Tensor | None = None,
       num_seeds: int = 32, max_iters: int = 50, tol_pos: float = 1e-3, tol_rot: float = 1e-2,
       generator: torch.Generator | None = None, validate: bool | None = None) -> IKResult:
    """Inverse kinematics: joint values that put the end link at ``target``.

    Levenberg-Marquardt (damped least squares ``dq = J^T (J J^T + lambda I)^-1 e`` with adaptive
    lambda, steps clamped to the joint limits and kept only when the error decreases) from
    ``num_seeds`` starts per target, all solved in parallel. On CUDA it is one kernel launch for
    all iterations (no host sync per iteration; a block of problems stops once all converged). Of
    each target's seeds the converged one closest to ``q_init`` is returned (without ``q_init``:
    the most accurate), else the one with the smallest error.

    Args:
        chain: a `Chain`.
        target: desired end-link poses ``[..., 4, 4]`` in the base frame, float32/float64.
        q_init: ``[..., DOF]`` (or ``[DOF]``) starting configuration, used as seed 0 (clamped to
            the limits); the other seeds are uniform within the limits (``[-pi, pi]`` where a
            joint has none).
        num_seeds: starts per target (>= 1).
        max_iters: iteration cap per seed.
        tol_pos: position tolerance in metres; tol_rot: rotation tolerance in radians.
        generator: random generator for the seeds (reproducible results).
        validate: check that the target rotations are orthonormal and q_init has no NaN (one
            sync). Default: on CPU yes, on CUDA only with ``ROBOCACHE_VALIDATE=1``.

    Returns:
        `IKResult` (q ``[..., DOF]``, converged ``[...]``, pos_err ``[...]`` m, rot_err ``[...]``
        rad).

    Raises:
        ShapeError: target not ``[..., 4, 4]``, or q_init of the wrong shape. DTypeError: not
        float32/float64. DeviceError: q_init elsewhere than target. ValueError: num_seeds < 1,
        max_iters < 0 or non-positive tolerances. DataError (validating): a non-orthonormal
        target rotation or a NaN in q_init.

    Example:
        >>> chain = Chain.from_urdf(asset_path("panda.urdf"), "panda_hand")
        >>> res = ik(chain, fk(chain, torch.zeros(256, 7, device="cuda")))
        >>> res.q.shape, res.converged.shape
        (torch.Size([256, 7]), torch.Size([256]))
    """
    op = "ik"
    if not isinstance(chain, Chain):
        fail(op, f"`chain` must be a robocache.kinematics.Chain; got {type(chain).__name__}.",
             TypeError)
    if not isinstance(target, torch.Tensor):
        fail(op, f"`target` must be a torch.Tensor; got {type(target).__name__}.", TypeError)
    check_dtype(op, "target", target, KIN_DTYPES, "Use `target.float()`.")
    if target.dim() < 2 or target.shape[-2:] != (4, 4):
        fail(op, f"`target` must be poses [..., 4, 4]; got {list(target.shape)}.")
    if num_seeds < 1 or max_iters < 0 or not (tol_pos > 0 and tol_rot > 0):
        fail(op, f"need num_seeds >= 1, max_iters >= 0 and positive tolerances; got "
             f"num_seeds={num_seeds}, max_iters={max_iters}, tol_pos={tol_pos}, "
             f"tol_rot={tol_rot}.", ValueError)
    lead = target.shape[:-2]
    tgt = target.reshape(-1, 4, 4).contiguous()
    n, dof, dev, dt = tgt.shape[0], chain.dof, target.device, target.dtype
    check = wants_validation(validate, target)
    if check:
        check_rotation(op, "target", tgt[:, :3, :3])
    if n == 0:  # no target: nothing to solve
        empty = target.new_empty(lead)
        return IKResult(target.new_empty(*lead, dof), torch.zeros(lead, dtype=torch.bool,
                        device=dev), empty, empty.clone())
    # the seeds' joint values, their solver state (q, a step, the Jacobian) and errors
    check_fits(op, f"{n} targets x {num_seeds} seeds", n * num_seeds * (dof * (3 + 6) + 2)
               * target.element_size(), dev, "lower num_seeds or solve fewer targets per call.")
    params, lower, upper = chain.tensors(dev, dt)
    lo = torch.where(torch.isfinite(lower), lower, -math.pi)
    hi = torch.where(torch.isfinite(upper), upper, math.pi)
    u = torch.rand((n, num_seeds, dof), generator=generator, dtype=dt,
                   device=generator.device if generator is not None else dev).to(dev)
    q0 = lo + (hi - lo) * u
    if q_init is not None:
        check_device(op, "q_init", q_init, dev, "target")
        check_dtype(op, "q_init", q_init, KIN_DTYPES, "Use `q_init.float()`.")
        if q_init.shape not in (torch.Size((*lead, dof)), torch.Size((dof,))):
            fail(op, f"`q_init` must have shape [..., {dof}] matching target's leading shape "
                 f"{list(lead)}, or [{dof}]; got {list(q_init.shape)}.")
        if check and bool(torch.isnan(q_init).any()):
            fail(op, "`q_init` has NaN values; pass finite joint values or None.", DataError)
        init = torch.minimum(torch.maximum(q_init.to(dt).expand(*lead, dof).reshape(n, dof),
                                           lower), upper)
        q0[:, 0] = init
    tol_chord = math.sin(min(tol_rot, math.pi) / 2)
    q, perr, chord = _IK(tgt, q0.reshape(-1, dof), lower, upper, params, chain.movable,
                         chain.prismatic, num_seeds, int(max_iters), float(tol_pos), tol_chord)
    q, perr, chord = q.reshape(n, num_seeds, dof), perr.reshape(n, -1), chord.reshape(n, -1)
    ok = (perr <= tol_pos) & (chord <= tol_chord)
    err = perr / tol_pos + chord / tol_chord
    tie = err if q_init is None else (q - init[:, None]).square().sum(-1)
    best = torch.where(ok, tie, err + 1e30).argmin(-1, keepdim=True)
    pick = lambda t: t.gather(1, best).squeeze(1)
    q_best = q.gather(1, best[..., None].expand(n, 1, dof)).squeeze(1)
    rot = 2 * torch.asin(pick(chord).clamp(0, 1))
    return IKResult(q_best.reshape(*lead, dof), pick(ok).reshape(lead), pick(perr).reshape(lead),
                    rot.reshape(lead))
