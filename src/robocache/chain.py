"""The serial kinematic chain of a robot, from a URDF or from Denavit-Hartenberg parameters.

`Chain` holds what `robocache.kinematics` (`fk`, `jacobian`, `ik`) needs: the path of joints from
a base link to an end link, their origins, axes, types and limits (host-side, float64), and the
small device tensors the kernels read (made once per device and dtype).
"""

from __future__ import annotations

import math
import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field

import numpy as np
import torch

from robocache.errors import URDFError

__all__ = ["Chain", "asset_path"]

_MOVABLE = ("revolute", "continuous", "prismatic")


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
        key = (device if isinstance(device, torch.device) else torch.device(device), dtype)
        hit = self._cache.get(key)
        if hit is None:
            hit = self._cache[key] = tuple(torch.as_tensor(v, dtype=dtype).to(key[0])
                                           for v in (self.params, self.lower, self.upper))
        return hit
