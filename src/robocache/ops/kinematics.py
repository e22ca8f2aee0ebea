"""Serial-chain robot kinematics from URDF or DH parameters: FK, geometric Jacobian, batched IK.

A `Chain` is the path of joints from a base link to an end link. Joint values ``q [..., DOF]``
follow `Chain.joint_names` (radians for revolute/continuous joints, metres for prismatic ones);
poses are ``[..., 4, 4]`` homogeneous transforms in the base link's frame, in metres.

On CUDA, `fk` and `jacobian` are each one Triton kernel launch and `ik` one launch for all
iterations of all seeds; on CPU they run the PyTorch reference (`robocache.reference.kinematics`).
"""

from __future__ import annotations

import math
import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np
import torch

from robocache.errors import DataError, ShapeError
from robocache.observability import nvtx
from robocache.ops._checks import check_device, check_dtype, check_fits, fail, wants_validation
from robocache.ops.geometry import check_rotation
from robocache.reference.kinematics import fk_jacobian_reference, fk_reference, ik_reference

__all__ = ["Chain", "IKResult", "URDFError", "asset_path", "fk", "ik", "jacobian"]

KIN_DTYPES = (torch.float32, torch.float64)
_MOVABLE = ("revolute", "continuous", "prismatic")


class URDFError(DataError):
    """A robot description that cannot be turned into a kinematic chain."""


def asset_path(name: str) -> str:
    """Path of a robot description shipped in ``robocache/assets`` (``"panda.urdf"``,
    ``"kuka_iiwa.urdf"``; sources and licenses in its README.md).

    Raises:
        FileNotFoundError: an unknown name (the message lists the shipped files).
    """
    from importlib import resources

    folder = resources.files("robocache") / "assets"
    path = folder / name
    if not path.is_file():
        have = sorted(p.name for p in folder.iterdir() if p.name.endswith(".urdf"))
        raise FileNotFoundError(f"asset_path: no robot description {name!r}; shipped: {have}.")
    return str(path)


def _rpy_matrix(r: float, p: float, y: float) -> np.ndarray:
    """URDF rpy: fixed-axis roll about x, then pitch about y, then yaw about z (Rz Ry Rx)."""
    cr, sr, cp, sp = math.cos(r), math.sin(r), math.cos(p), math.sin(p)
    cy, sy = math.cos(y), math.sin(y)
    return np.array([[cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr],
                     [sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr],
                     [-sp, cp * sr, cp * cr]])


def _floats(elem: ET.Element | None, attr: str, default: str, where: str, n: int) -> list[float]:
    text = default if elem is None else elem.get(attr, default)
    try:
        values = [float(v) for v in text.split()]
    except ValueError:
        values = []
    if len(values) != n or not all(math.isfinite(v) for v in values):
        raise URDFError(f"{where}: attribute {attr}={text!r} must hold {n} finite numbers.")
    return values


@dataclass(frozen=True)
class _Joint:
    name: str
    kind: str
    parent: str
    child: str
    origin: np.ndarray  # [4, 4] parent -> joint frame
    axis: np.ndarray  # [3] unit, joint frame
    lower: float
    upper: float
    mimic: str | None


def _parse_joint(el: ET.Element) -> _Joint:
    name = el.get("name")
    if not name:
        raise URDFError("A <joint> element has no name attribute; every joint needs name=\"...\".")
    where = f"joint {name!r}"
    kind = el.get("type", "")
    ends = {}
    for tag in ("parent", "child"):
        sub = el.find(tag)
        if sub is None or not sub.get("link"):
            raise URDFError(f"{where} has no <{tag} link=\"...\"/> element; every joint names its "
                            "parent and child links.")
        ends[tag] = sub.get("link")
    origin_el = el.find("origin")
    xyz = _floats(origin_el, "xyz", "0 0 0", f"{where} <origin>", 3)
    rpy = _floats(origin_el, "rpy", "0 0 0", f"{where} <origin>", 3)
    origin = np.eye(4)
    origin[:3, :3] = _rpy_matrix(*rpy)
    origin[:3, 3] = xyz
    axis = np.array(_floats(el.find("axis"), "xyz", "1 0 0", f"{where} <axis>", 3))
    norm = float(np.linalg.norm(axis))
    if kind in _MOVABLE and norm < 1e-9:
        raise URDFError(f"{where} has a zero <axis xyz>; give the axis of motion, e.g. \"0 0 1\".")
    lower, upper = -math.inf, math.inf
    limit = el.find("limit")
    if kind in ("revolute", "prismatic") and limit is not None:
        # URDF: missing lower/upper attributes default to 0
        lower = _floats(limit, "lower", "0", f"{where} <limit>", 1)[0]
        upper = _floats(limit, "upper", "0", f"{where} <limit>", 1)[0]
        if lower > upper:
            raise URDFError(f"{where} has <limit lower={lower}> above upper={upper}.")
    mimic = el.find("mimic")
    return _Joint(name, kind, ends["parent"], ends["child"], origin,
                  axis / norm if norm else axis, lower, upper,
                  None if mimic is None else mimic.get("joint", "?"))


def _read_urdf(path_or_xml: str | os.PathLike) -> ET.Element:
    text = os.fspath(path_or_xml)
    try:
        if text.lstrip().startswith("<"):
            root = ET.fromstring(text)
        elif os.path.exists(text):
            root = ET.parse(text).getroot()
        else:
            raise URDFError(f"URDF file {text!r} does not exist; pass a path to a .urdf file or "
                            "the XML text itself.")
    except ET.ParseError as err:
        raise URDFError(f"The URDF is not well-formed XML: {err}.") from err
    if root.tag != "robot":
        raise URDFError(f"The URDF's root element is <{root.tag}>; a URDF starts with <robot>. "
                        "(Expand xacro files first: `xacro robot.urdf.xacro > robot.urdf`.)")
    return root


@dataclass(frozen=True, eq=False)
class Chain:
    """The serial chain from `base_link` to `end_link` of a robot.

    Build with `Chain.from_urdf` or `Chain.from_dh`. Attributes are host-side (NumPy, float64);
    the small device tensors the kernels read are made once per (device, dtype) and cached.

    Attributes:
        name: robot name.
        base_link, end_link: the frames poses are expressed in / computed for.
        joint_names: the ``DOF`` movable joints in q order (base to end).
        joint_types: their URDF types ("revolute", "continuous", "prismatic").
        link_names: the child link of every joint on the path (fixed joints included), base to
            end: the ``L`` axis of ``fk(..., all_links=True)``; the last one is `end_link`.
        lower, upper: joint limits ``[DOF]`` (rad or m; +-inf for continuous joints).
    """

    name: str
    base_link: str
    end_link: str
    joint_names: tuple[str, ...]
    joint_types: tuple[str, ...]
    link_names: tuple[str, ...]
    lower: np.ndarray
    upper: np.ndarray
    params: np.ndarray  # [NJ, 16]: origin rows 0-2, axis, zero pad
    movable: int  # bit j: path joint j moves (takes the next q column)
    prismatic: int  # bit j: path joint j is prismatic
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def dof(self) -> int:
        return len(self.joint_names)

    def __repr__(self) -> str:
        return (f"Chain({self.name!r}: {self.base_link} -> {self.end_link}, dof={self.dof}, "
                f"joints={list(self.joint_names)})")

    @classmethod
    def from_urdf(cls, path_or_xml: str | os.PathLike, end_link: str,
                  base_link: str | None = None) -> Chain:
        """Parse a URDF (file path or XML text) into the chain ``base_link -> end_link``.

        Args:
            path_or_xml: path to a ``.urdf`` file, or the XML text itself.
            end_link: name of the link whose pose `fk` returns (e.g. ``"panda_hand"``).
            base_link: frame of every pose; default: the root of the tree.

        Returns:
            A `Chain`. Revolute, continuous, prismatic and fixed joints are supported (origin
            xyz/rpy, axis, limits); visual/collision/inertial elements are ignored.

        Raises:
            URDFError (a `robocache.errors.DataError`): malformed XML; a joint with no
                parent/child or naming an undefined link; a link that is the child of two joints
                or a cycle (not a tree); an unknown `end_link` or `base_link` (the message lists
                the links); a floating/planar joint or a mimic joint on the path.

        Example:
            >>> chain = Chain.from_urdf("panda.urdf", "panda_hand")
            >>> chain.dof
            7
        """
        root = _read_urdf(path_or_xml)
        robot = root.get("name", "robot")
        links = [el.get("name") for el in root.findall("link")]
        known = set(links)
        by_child: dict[str, _Joint] = {}
        for el in root.findall("joint"):
            j = _parse_joint(el)
            for end in (j.parent, j.child):
                if end not in known:
                    raise URDFError(f"joint {j.name!r} names link {end!r}, which no <link> element "
                                    "defines; add the link or fix the name.")
            if j.child in by_child:
                raise URDFError(f"link {j.child!r} is the child of two joints, "
                                f"{by_child[j.child].name!r} and {j.name!r}: a URDF must be a "
                                "tree.")
            by_child[j.child] = j
        listing = ", ".join(links)
        if end_link not in known:
            raise URDFError(f"end_link {end_link!r} is not a link of robot {robot!r}; its links "
                            f"are: {listing}.")
        if base_link is not None and base_link not in known:
            raise URDFError(f"base_link {base_link!r} is not a link of robot {robot!r}; its "
                            f"links are: {listing}.")
        path: list[_Joint] = []
        link, seen = end_link, {end_link}
        while link != base_link and link in by_child:
            j = by_child[link]
            path.append(j)
            link = j.parent
            if link in seen:
                raise URDFError(f"the joints form a cycle through link {link!r} (joint "
                                f"{j.name!r}): a URDF must be a tree.")
            seen.add(link)
        if base_link is not None and link != base_link:
            raise URDFError(f"base_link {base_link!r} is not an ancestor of end_link {end_link!r}; "
                            f"the path from {end_link!r} reaches the root {link!r} without it.")
        if not path:
            raise URDFError(f"end_link {end_link!r} is the base link: the chain has no joints; "
                            f"pick a link further out, one of: {listing}.")
        path.reverse()
        for j in path:
            if j.kind not in _MOVABLE and j.kind != "fixed":
                raise URDFError(f"joint {j.name!r} has type {j.kind!r}; supported types are "
                                "revolute, continuous, prismatic and fixed.")
            if j.mimic is not None and j.kind != "fixed":
                raise URDFError(f"joint {j.name!r} mimics joint {j.mimic!r}; mimic joints are not "
                                "supported on a chain: choose an end link whose path has none "
                                "(e.g. the hand rather than a finger).")
        return cls._build(robot, link, end_link, [
            (j.name, j.kind, j.child, j.origin, j.axis, j.lower, j.upper) for j in path])

    @classmethod
    def from_dh(cls, a, alpha, d, theta=None, *, joint_types: str | None = None,
                convention: str = "standard", lower=None, upper=None,
                name: str = "dh_robot") -> Chain:
        """A chain from Denavit-Hartenberg parameters (one entry per joint; metres, radians).

        Args:
            a, alpha, d: link length, link twist and link offset per joint.
            theta: joint angle offsets (revolute: added to q; prismatic: the fixed angle).
            joint_types: one letter per joint, ``"r"`` revolute or ``"p"`` prismatic (default:
                all revolute).
            convention: ``"standard"`` (``T_i = Rz(theta) Tz(d) Tx(a) Rx(alpha)``) or
                ``"modified"`` (Craig: ``T_i = Rx(alpha) Tx(a) Rz(theta) Tz(d)``).
            lower, upper: joint limits (default unlimited).

        Returns:
            A `Chain` with links ``link1..linkN`` on base ``base``; its end pose is the DH frame N.
            With the standard convention the intermediate link poses are taken right after each
            joint's motion (before that joint's ``Tz(d) Tx(a) Rx(alpha)``), which moves to the next
            joint's origin; an ``ee`` fixed link carries the last one.

        Raises:
            ValueError: lists of different lengths, a bad ``joint_types`` or ``convention``.
        """
        a, alpha, d = (np.asarray(v, dtype=np.float64).reshape(-1) for v in (a, alpha, d))
        n = a.shape[0]
        theta = np.zeros(n) if theta is None else np.asarray(theta, dtype=np.float64).reshape(-1)
        types = joint_types or "r" * n
        if not (alpha.shape[0] == d.shape[0] == theta.shape[0] == n == len(types)) or n == 0:
            raise ValueError(f"from_dh: a, alpha, d, theta and joint_types need one entry per "
                             f"joint (got {n}, {alpha.shape[0]}, {d.shape[0]}, {theta.shape[0]}, "
                             f"{len(types)}).")
        if set(types) - {"r", "p"}:
            raise ValueError(f"from_dh: joint_types letters must be 'r' or 'p'; got {types!r}.")
        if convention not in ("standard", "modified"):
            raise ValueError(f"from_dh: convention must be 'standard' or 'modified'; got "
                             f"{convention!r}.")
        lo = np.full(n, -math.inf) if lower is None else np.asarray(lower, np.float64).reshape(n)
        hi = np.full(n, math.inf) if upper is None else np.asarray(upper, np.float64).reshape(n)

        def rz(t):
            m = np.eye(4)
            m[:2, :2] = [[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]]
            return m

        def rx(t):
            m = np.eye(4)
            m[1:3, 1:3] = [[math.cos(t), -math.sin(t)], [math.sin(t), math.cos(t)]]
            return m

        def tr(x, z):
            m = np.eye(4)
            m[0, 3], m[2, 3] = x, z
            return m

        joints, carry = [], np.eye(4)
        for i in range(n):
            kind = "revolute" if types[i] == "r" else "prismatic"
            if convention == "modified":
                origin = rx(alpha[i]) @ tr(a[i], 0) @ rz(theta[i]) @ tr(0, d[i])
            elif kind == "revolute":
                origin, after = carry @ rz(theta[i]), tr(0, d[i]) @ tr(a[i], 0) @ rx(alpha[i])
            else:
                origin, after = carry @ rz(theta[i]) @ tr(0, d[i]), tr(a[i], 0) @ rx(alpha[i])
            joints.append((f"joint{i + 1}", kind, f"link{i + 1}", origin, np.array([0.0, 0, 1]),
                           lo[i], hi[i]))
            if convention == "standard":
                carry = after
        if convention == "standard":
            joints.append(("ee_joint", "fixed", "ee", carry, np.array([0.0, 0, 1]), 0.0, 0.0))
        return cls._build(name, "base", joints[-1][2], joints)

    @classmethod
    def _build(cls, name, base, end, joints) -> Chain:
        params = np.zeros((len(joints), 16))
        movable = [j for j in joints if j[1] in _MOVABLE]
        for i, (_, _, _, origin, axis, _, _) in enumerate(joints):
            params[i, :12] = origin[:3].reshape(-1)
            params[i, 12:15] = axis
        return cls(name=name, base_link=base, end_link=end,
                   joint_names=tuple(j[0] for j in movable),
                   joint_types=tuple(j[1] for j in movable),
                   link_names=tuple(j[2] for j in joints),
                   lower=np.array([j[5] for j in movable], dtype=np.float64),
                   upper=np.array([j[6] for j in movable], dtype=np.float64),
                   params=params,
                   movable=sum(1 << i for i, j in enumerate(joints) if j[1] in _MOVABLE),
                   prismatic=sum(1 << i for i, j in enumerate(joints) if j[1] == "prismatic"))

    def tensors(self, device: torch.device | str, dtype: torch.dtype):
        """(params [NJ, 16], lower [DOF], upper [DOF]) on `device` in `dtype`, made once and
        cached (so calls copy nothing host-to-device after the first)."""
        key = (torch.device(device), dtype)
        if key not in self._cache:
            self._cache[key] = (
                torch.as_tensor(self.params, dtype=dtype).to(key[0]),
                torch.as_tensor(self.lower, dtype=dtype).to(key[0]),
                torch.as_tensor(self.upper, dtype=dtype).to(key[0]),
            )
        return self._cache[key]


# --------------------------------------------------------------------------- custom ops

def _fk_impl(q: torch.Tensor, params: torch.Tensor, movable: int, prismatic: int,
             all_links: bool) -> torch.Tensor:
    if q.is_cuda:
        from robocache.kernels.kinematics import fk_cuda
        return fk_cuda(q, params, movable, prismatic, all_links)
    return fk_reference(q, params, movable, prismatic, all_links)


def _jacobian_impl(q: torch.Tensor, params: torch.Tensor, movable: int,
                   prismatic: int) -> torch.Tensor:
    if q.is_cuda:
        from robocache.kernels.kinematics import jacobian_cuda
        return jacobian_cuda(q, params, movable, prismatic)
    return fk_jacobian_reference(q, params, movable, prismatic)[1]


def _ik_impl(target: torch.Tensor, q0: torch.Tensor, lower: torch.Tensor, upper: torch.Tensor,
             params: torch.Tensor, movable: int, prismatic: int, seeds: int, max_iters: int,
             tol_pos: float, tol_half_chord: float
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    fn = ik_reference
    if q0.is_cuda:
        from robocache.kernels.kinematics import ik_cuda as fn
    return fn(target, q0, lower, upper, params, movable, prismatic, seeds, max_iters, tol_pos,
              tol_half_chord)


_fk_op = torch.library.custom_op("robocache::kinematics_fk", _fk_impl, mutates_args=())
_jacobian_op = torch.library.custom_op("robocache::kinematics_jacobian", _jacobian_impl,
                                       mutates_args=())
_ik_op = torch.library.custom_op("robocache::kinematics_ik", _ik_impl, mutates_args=())


@_fk_op.register_fake
def _(q, params, movable, prismatic, all_links):
    n, nj = q.shape[0], params.shape[0]
    return q.new_empty((n, nj, 4, 4) if all_links else (n, 4, 4))


@_jacobian_op.register_fake
def _(q, params, movable, prismatic):
    return q.new_empty((q.shape[0], 6, q.shape[1]))


@_ik_op.register_fake
def _(target, q0, lower, upper, params, movable, prismatic, seeds, max_iters, tol_pos,
      tol_half_chord):
    return torch.empty_like(q0), q0.new_empty(q0.shape[0]), q0.new_empty(q0.shape[0])


def _dispatch(impl, op, *args):
    """Eager calls go straight to the implementation (no dispatcher overhead); traced calls go
    through the registered custom op so torch.compile sees one opaque node."""
    return op(*args) if torch.compiler.is_compiling() else impl(*args)


# --------------------------------------------------------------------------- public ops

def _check_q(op: str, chain: Chain, q: torch.Tensor, validate: bool | None) -> torch.Tensor:
    if not isinstance(chain, Chain):
        fail(op, f"`chain` must be a robocache.kinematics.Chain (from Chain.from_urdf or "
             f"Chain.from_dh); got {type(chain).__name__}.", TypeError)
    if not isinstance(q, torch.Tensor):
        fail(op, f"`q` must be a torch.Tensor; got {type(q).__name__}.", TypeError)
    check_dtype(op, "q", q, KIN_DTYPES, "Kinematics runs in float32 or float64: `q.float()`.")
    if q.dim() == 0 or q.shape[-1] != chain.dof:
        fail(op, f"`q` must have shape [..., {chain.dof}] (one value per joint of chain "
             f"{chain.name!r}: {', '.join(chain.joint_names)}); got {list(q.shape)}.", ShapeError)
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
    flat = _check_q("fk", chain, q, validate)
    params, _, _ = chain.tensors(q.device, q.dtype)
    out = _dispatch(_fk_impl, _fk_op, flat, params, chain.movable, chain.prismatic,
                    bool(all_links))
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
    flat = _check_q("jacobian", chain, q, validate)
    params, _, _ = chain.tensors(q.device, q.dtype)
    out = _dispatch(_jacobian_impl, _jacobian_op, flat, params, chain.movable, chain.prismatic)
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
    q, perr, chord = _dispatch(_ik_impl, _ik_op, tgt, q0.reshape(-1, dof), lower, upper, params,
                               chain.movable, chain.prismatic, num_seeds, int(max_iters),
                               float(tol_pos), tol_chord)
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
