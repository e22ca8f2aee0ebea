"""robocache.kinematics against an independent float64 NumPy/SciPy product of URDF transforms,
central finite differences for the Jacobian, IK convergence on reachable targets, the Triton
kernels against the PyTorch reference (interpreter on CPU, real kernels on CUDA), and every
validation rule."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import torch
from helpers import TOL, assert_close, seeded
from scipy.spatial.transform import Rotation

from robocache.errors import DataError, DTypeError, ShapeError
from robocache.kernels import kinematics as K
from robocache.kinematics import Chain, URDFError, asset_path, fk, ik, jacobian
from robocache.reference import kinematics as R

PANDA = asset_path("panda.urdf")
IIWA = asset_path("kuka_iiwa.urdf")

# Every joint kind, a tilted non-unit axis, rpy origins, a fixed joint mid-chain and a tool tip.
TOY = """<robot name="toy">
  <link name="base"/><link name="a"/><link name="b"/><link name="c"/><link name="d"/>
  <link name="tip"/><link name="side"/>
  <joint name="j1" type="revolute"><parent link="base"/><child link="a"/>
    <origin xyz="0.1 -0.2 0.3" rpy="0.3 -0.7 1.1"/><axis xyz="0 0 1"/>
    <limit lower="-2" upper="2" effort="1" velocity="1"/></joint>
  <joint name="j2" type="prismatic"><parent link="a"/><child link="b"/>
    <origin xyz="0 0.05 0.2" rpy="0 1.5707963 0"/><axis xyz="1 1 0"/>
    <limit lower="-0.1" upper="0.3" effort="1" velocity="1"/></joint>
  <joint name="fix" type="fixed"><parent link="b"/><child link="c"/>
    <origin xyz="0.02 0 0.1" rpy="3.1415926 0 0.5"/></joint>
  <joint name="j3" type="continuous"><parent link="c"/><child link="d"/>
    <origin xyz="0 0 0.25"/><axis xyz="0.3 -0.4 0.866"/></joint>
  <joint name="tool" type="fixed"><parent link="d"/><child link="tip"/>
    <origin xyz="0.05 0.01 0.12" rpy="-0.2 0.1 0.4"/></joint>
  <joint name="j_side" type="revolute"><parent link="a"/><child link="side"/>
    <axis xyz="0 1 0"/><limit lower="-1" upper="1" effort="1" velocity="1"/></joint>
</robot>"""

ROBOTS = [(PANDA, "panda_hand"), (IIWA, "lbr_iiwa_link_7"), (TOY, "tip")]


# --------------------------------------------------------------------------- the NumPy oracle

def _numpy_chain(urdf: str, end: str):
    """Independent parse: [(origin 4x4, type, unit axis, child)] from the root to `end`."""
    root = ET.fromstring(urdf) if urdf.lstrip().startswith("<") else ET.parse(urdf).getroot()
    by_child = {j.find("child").get("link"): j for j in root.findall("joint")}
    path, link = [], end
    while link in by_child:
        j = by_child[link]
        o = j.find("origin")
        xyz = [float(v) for v in (o.get("xyz", "0 0 0") if o is not None else "0 0 0").split()]
        rpy = [float(v) for v in (o.get("rpy", "0 0 0") if o is not None else "0 0 0").split()]
        origin = np.eye(4)
        origin[:3, :3] = Rotation.from_euler("xyz", rpy).as_matrix()  # URDF: fixed-axis x, y, z
        origin[:3, 3] = xyz
        ax = j.find("axis")
        axis = np.array([float(v) for v in (ax.get("xyz") if ax is not None else "1 0 0").split()])
        if j.get("type") != "fixed":
            axis = axis / np.linalg.norm(axis)
        path.append((origin, j.get("type"), axis, link))
        link = j.find("parent").get("link")
    return path[::-1]


def _numpy_fk(urdf: str, end: str, q: np.ndarray, all_links=False):
    path = _numpy_chain(urdf, end)
    out = np.zeros((q.shape[0], len(path), 4, 4))
    for n, qn in enumerate(q):
        t, k = np.eye(4), 0
        for i, (origin, kind, axis, _) in enumerate(path):
            m = np.eye(4)
            if kind in ("revolute", "continuous"):
                m[:3, :3] = Rotation.from_rotvec(axis * qn[k]).as_matrix()
            elif kind == "prismatic":
                m[:3, 3] = axis * qn[k]
            k += kind != "fixed"
            t = t @ origin @ m
            out[n, i] = t
    return out if all_links else out[:, -1]


def _random_q(chain: Chain, n: int, rng, dtype=torch.float64) -> torch.Tensor:
    lo = np.where(np.isfinite(chain.lower), chain.lower, -math.pi)
    hi = np.where(np.isfinite(chain.upper), chain.upper, math.pi)
    return torch.as_tensor(rng.uniform(lo, hi, size=(n, chain.dof)), dtype=dtype)


# --------------------------------------------------------------------------- parsing

def test_parse_panda():
    c = Chain.from_urdf(PANDA, "panda_hand")
    assert c.dof == 7 and c.base_link == "panda_link0" and c.end_link == "panda_hand"
    assert c.joint_names == tuple(f"panda_joint{i}" for i in range(1, 8))
    assert c.link_names[-3:] == ("panda_link7", "panda_link8", "panda_hand")
    np.testing.assert_allclose(c.lower[:2], [-2.9671, -1.8326])
    np.testing.assert_allclose(c.upper[5], 3.8223)


def test_parse_toy_types_limits_and_text_input():
    c = Chain.from_urdf(TOY, "tip")
    assert c.joint_names == ("j1", "j2", "j3")
    assert c.joint_types == ("revolute", "prismatic", "continuous")
    assert c.link_names == ("a", "b", "c", "d", "tip")
    assert np.isinf(c.lower[2]) and np.isinf(c.upper[2])
    sub = Chain.from_urdf(TOY, "d", base_link="b")
    assert sub.joint_names == ("j3",) and sub.base_link == "b"


# --------------------------------------------------------------------------- FK

@pytest.mark.parametrize("urdf,end", ROBOTS, ids=["panda", "iiwa", "toy"])
@pytest.mark.parametrize("n", [1, 7, 33])
def test_fk_matches_numpy(urdf, end, n):
    rng = seeded()
    c = Chain.from_urdf(urdf, end)
    q = _random_q(c, n, rng)
    assert_close(fk(c, q), _numpy_fk(urdf, end, q.numpy()), scale=10)
    assert_close(fk(c, q, all_links=True), _numpy_fk(urdf, end, q.numpy(), all_links=True),
                 scale=10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("urdf,end", ROBOTS, ids=["panda", "iiwa", "toy"])
def test_fk_kernel(urdf, end, dtype, kernel_device):
    rng = seeded()
    c = Chain.from_urdf(urdf, end)
    q = _random_q(c, 131, rng)  # > one 128-row program: a partial second block
    p, _, _ = c.tensors(kernel_device, dtype)
    st = (c.movable, c.prismatic)
    qd = q.to(kernel_device, dtype)
    expect = _numpy_fk(urdf, end, q.numpy(), all_links=True)
    # float32 sin/cos and 10 chained products: a few ulps per joint
    assert_close(K.fk_cuda(qd, p, *st), expect[:, -1], dtype, scale=10)
    assert_close(K.fk_cuda(qd, p, *st, all_links=True), expect, dtype, scale=10)


def test_fk_shapes_unbatched_and_leading_dims():
    c = Chain.from_urdf(PANDA, "panda_hand")
    q = _random_q(c, 6, seeded())
    assert fk(c, q[0]).shape == (4, 4)
    assert fk(c, q.reshape(2, 3, 7)).shape == (2, 3, 4, 4)
    assert fk(c, q.reshape(2, 3, 7), all_links=True).shape == (2, 3, 9, 4, 4)
    assert fk(c, q[:0]).shape == (0, 4, 4)
    torch.testing.assert_close(fk(c, q.reshape(2, 3, 7)).reshape(6, 4, 4), fk(c, q))
    assert fk(c, q.float()).dtype == torch.float32


def test_fk_does_not_write_inputs():
    c = Chain.from_urdf(PANDA, "panda_hand")
    q = _random_q(c, 5, seeded())
    before = q.clone()
    fk(c, q)
    jacobian(c, q)
    torch.testing.assert_close(q, before, rtol=0, atol=0)


# --------------------------------------------------------------------------- DH

def _dh_standard_numpy(a, alpha, d, theta, q):
    t = np.eye(4)
    for i in range(len(a)):
        th = theta[i] + q[i]
        ct, st, ca, sa = math.cos(th), math.sin(th), math.cos(alpha[i]), math.sin(alpha[i])
        t = t @ np.array([[ct, -st * ca, st * sa, a[i] * ct], [st, ct * ca, -ct * sa, a[i] * st],
                          [0, sa, ca, d[i]], [0, 0, 0, 1]])
    return t


def test_from_dh_standard_matches_textbook_product():
    # UR5 standard DH parameters (Universal Robots)
    a = [0, -0.425, -0.39225, 0, 0, 0]
    d = [0.089159, 0, 0, 0.10915, 0.09465, 0.0823]
    alpha = [math.pi / 2, 0, 0, math.pi / 2, -math.pi / 2, 0]
    theta = [0.1, -0.2, 0, 0.3, 0, 0]
    c = Chain.from_dh(a, alpha, d, theta, name="ur5")
    q = _random_q(c, 9, seeded())
    expect = np.stack([_dh_standard_numpy(a, alpha, d, theta, qi) for qi in q.numpy()])
    assert_close(fk(c, q), expect, scale=10)
    assert c.dof == 6 and c.link_names[-1] == "ee"


def test_from_dh_modified_equals_panda_urdf():
    # Franka's published (Craig) DH parameters reproduce the URDF's panda_link7 frame
    a = [0, 0, 0, 0.0825, -0.0825, 0, 0.088]
    d = [0.333, 0, 0.316, 0, 0.384, 0, 0]
    alpha = [0, -math.pi / 2, math.pi / 2, math.pi / 2, -math.pi / 2, math.pi / 2, math.pi / 2]
    dh = Chain.from_dh(a, alpha, d, convention="modified")
    urdf = Chain.from_urdf(PANDA, "panda_link7")
    q = _random_q(urdf, 11, seeded())
    assert_close(fk(dh, q), fk(urdf, q).numpy(), scale=1e5)  # URDF rounds pi/2 to 1.5708


def test_from_dh_prismatic_and_errors():
    c = Chain.from_dh([0.1, 0.2], [0, 0], [0.3, 0.0], joint_types="rp")
    pose = fk(c, torch.tensor([0.0, 0.5], dtype=torch.float64))
    np.testing.assert_allclose(pose[:3, 3].numpy(), [0.3, 0, 0.8])
    with pytest.raises(ValueError, match="one entry per joint"):
        Chain.from_dh([0, 1], [0], [0, 0])
    with pytest.raises(ValueError, match="'r' or 'p'"):
        Chain.from_dh([0], [0], [0], joint_types="x")
    with pytest.raises(ValueError, match="convention"):
        Chain.from_dh([0], [0], [0], convention="craig")


# --------------------------------------------------------------------------- Jacobian

def _fd_jacobian(c: Chain, q: torch.Tensor, eps=1e-6) -> torch.Tensor:
    """Central differences: linear rows from positions, angular from dR R^T (base frame)."""
    t = fk(c, q)
    cols = []
    for i in range(c.dof):
        dq = torch.zeros(c.dof, dtype=q.dtype)
        dq[i] = eps
        tp, tm = fk(c, q + dq), fk(c, q - dq)
        lin = (tp[:, :3, 3] - tm[:, :3, 3]) / (2 * eps)
        w = (tp[:, :3, :3] - tm[:, :3, :3]) / (2 * eps) @ t[:, :3, :3].transpose(-1, -2)
        cols.append(torch.cat((lin, torch.stack((w[:, 2, 1], w[:, 0, 2], w[:, 1, 0]), -1)), -1))
    return torch.stack(cols, -1)


@pytest.mark.parametrize("urdf,end", ROBOTS, ids=["panda", "iiwa", "toy"])
def test_jacobian_matches_finite_differences(urdf, end):
    c = Chain.from_urdf(urdf, end)
    q = _random_q(c, 17, seeded())
    torch.testing.assert_close(jacobian(c, q), _fd_jacobian(c, q), rtol=1e-7, atol=1e-8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("urdf,end", ROBOTS, ids=["panda", "iiwa", "toy"])
def test_jacobian_kernel(urdf, end, dtype, kernel_device):
    c = Chain.from_urdf(urdf, end)
    q = _random_q(c, 130, seeded())
    expect = _fd_jacobian(c, q)
    p, _, _ = c.tensors(kernel_device, dtype)
    out = K.jacobian_cuda(q.to(kernel_device, dtype), p, c.movable, c.prismatic)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(out.cpu().double(), expect, rtol=max(rtol, 1e-7),
                               atol=max(10 * atol, 1e-8))


def test_jacobian_shapes():
    c = Chain.from_urdf(TOY, "tip")
    q = _random_q(c, 4, seeded())
    assert jacobian(c, q[0]).shape == (6, 3)
    assert jacobian(c, q.reshape(2, 2, 3)).shape == (2, 2, 6, 3)
    j = jacobian(c, q)
    # prismatic column: pure translation along its world axis
    assert torch.all(j[:, 3:, 1] == 0)
    torch.testing.assert_close(j[:, :3, 1].norm(dim=-1), torch.ones(4, dtype=torch.float64))


# --------------------------------------------------------------------------- IK

def _ik_targets(c: Chain, n: int, rng, dtype=torch.float64, device="cpu"):
    return fk(c, _random_q(c, n, rng, dtype).to(device))


@pytest.mark.slow
@pytest.mark.parametrize("urdf,end", ROBOTS[:2], ids=["panda", "iiwa"])
def test_ik_converges_on_reachable_targets(urdf, end):
    c = Chain.from_urdf(urdf, end)
    target = _ik_targets(c, 256, seeded())
    res = ik(c, target, generator=torch.Generator().manual_seed(0))
    assert res.q.shape == (256, 7) and res.converged.shape == (256,)
    # random reachable targets (a fresh seed each run): over 40 target sets 0-2 of 256 panda
    # targets missed (mean 0.6, iiwa 0.05), and 3 in one CI run; 98 % (5 misses) is Poisson
    # tail ~4e-5 at that rate
    assert res.converged.float().mean() >= 0.98
    lo, hi = torch.as_tensor(c.lower), torch.as_tensor(c.upper)
    assert bool(((res.q >= lo) & (res.q <= hi)).all())
    # the reported errors are the true ones
    pose = fk(c, res.q)
    ok = res.converged
    pos = (pose[:, :3, 3] - target[:, :3, 3]).norm(dim=-1)
    torch.testing.assert_close(pos, res.pos_err, rtol=1e-6, atol=1e-9)
    rot = torch.as_tensor(Rotation.from_matrix(
        (target[:, :3, :3] @ pose[:, :3, :3].transpose(-1, -2)).numpy()).magnitude())
    torch.testing.assert_close(rot, res.rot_err, rtol=1e-5, atol=1e-7)
    assert bool((pos[ok] <= 1e-3).all()) and bool((rot[ok] <= 1e-2).all())


def test_ik_q_init_is_kept_when_it_already_solves():
    c = Chain.from_urdf(PANDA, "panda_hand")
    q = _random_q(c, 5, seeded())
    res = ik(c, fk(c, q), q_init=q, num_seeds=4, max_iters=0)
    assert bool(res.converged.all())
    torch.testing.assert_close(res.q, q)


def ik_rounding_bound(chain: Chain, q: torch.Tensor, iters: int) -> float:
    """How far two float64 implementations of the LM iteration may drift apart by rounding alone.

    Each iteration solves ``(J J^T + lam I) y = e``: the solve's relative forward error is up to
    ``eps * cond`` with ``cond <= 1 + |J|_2^2 / lam`` (worst at the smallest damping,
    ``LM_LAMBDA_MIN`` = 1e-6: about 4e6 for the Panda, so ~1e-9 per step), and the steps' errors
    add up over ``iters`` iterations; a factor 4 covers the other O(eps) terms. ``|J|_2`` is
    bounded by its largest value at the given joint values (starts and solutions).
    """
    _, jac = R.fk_jacobian_reference(q, *chain.tensors("cpu", torch.float64)[:1], chain.movable,
                                     chain.prismatic)
    jnorm2 = float(torch.linalg.matrix_norm(jac, ord=2).max()) ** 2
    cond = 1 + jnorm2 / R.LM_LAMBDA_MIN
    return 4 * iters * torch.finfo(torch.float64).eps * cond


def _ik_kernel_vs_reference(c: Chain, rng, dtype, device) -> None:
    seeds, iters = 3, 12
    target = _ik_targets(c, 5, rng, dtype)
    q0 = _random_q(c, 5 * seeds, rng, dtype)
    p, lo, hi = c.tensors("cpu", dtype)
    args = (c.movable, c.prismatic, seeds, iters, 1e-3, math.sin(5e-3))
    ref = R.ik_reference(target, q0, lo, hi, p, *args)
    kp, klo, khi = c.tensors(device, dtype)
    dev = lambda t: t.to(device)  # noqa: E731
    out = K.ik_cuda(dev(target), dev(q0), klo, khi, kp, *args)
    if dtype == torch.float64:  # same arithmetic up to rounding, same accept/reject decisions
        tol = ik_rounding_bound(c, torch.cat([q0, ref[0]]), iters)
        for a, b in zip(out, ref, strict=True):
            torch.testing.assert_close(a.cpu(), b, rtol=0, atol=tol)
    else:  # float32 rounding may flip an accept; compare what matters
        assert bool(((out[0].cpu() >= lo) & (out[0].cpu() <= hi)).all())
        conv = lambda r: (r[1] <= 1e-3) & (r[2] <= math.sin(5e-3))  # noqa: E731
        assert abs(conv(out).float().mean().item() - conv(ref).float().mean().item()) <= 0.2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ik_kernel_matches_reference(dtype, kernel_device):
    _ik_kernel_vs_reference(Chain.from_urdf(PANDA, "panda_hand"), seeded(), dtype, kernel_device)


@pytest.mark.gpu
def test_ik_kernel_matches_reference_float64_1000_seeds():
    c = Chain.from_urdf(PANDA, "panda_hand")
    for _ in range(1000):  # streams derived from the test's seed: --seed replays the sweep
        _ik_kernel_vs_reference(c, seeded(), torch.float64, "cuda")


# --------------------------------------------------------------------------- custom ops

def test_custom_ops_opcheck():
    c = Chain.from_urdf(PANDA, "panda_hand")
    q = _random_q(c, 3, seeded())
    p, lo, hi = c.tensors("cpu", torch.float64)
    st = (c.movable, c.prismatic)
    torch.library.opcheck(torch.ops.robocache.kinematics_fk.default, (q, p, *st, True))
    torch.library.opcheck(torch.ops.robocache.kinematics_jacobian.default, (q, p, *st))
    torch.library.opcheck(torch.ops.robocache.kinematics_ik.default,
                          (fk(c, q), q, lo, hi, p, *st, 1, 3, 1e-3, 5e-3))


# --------------------------------------------------------------------------- bad input

def test_unknown_end_link_lists_links():
    with pytest.raises(URDFError, match="'panda_gripper' is not a link.*panda_link0, panda_link1"):
        Chain.from_urdf(PANDA, "panda_gripper")


def test_unknown_base_link_and_not_ancestor():
    with pytest.raises(URDFError, match="base_link 'nope' is not a link"):
        Chain.from_urdf(TOY, "tip", base_link="nope")
    with pytest.raises(URDFError, match="'side' is not an ancestor of end_link 'tip'"):
        Chain.from_urdf(TOY, "tip", base_link="side")


@pytest.mark.parametrize("edit,match", [
    (('<parent link="b"/>', ""), r"joint 'fix' has no <parent link"),
    (('<parent link="c"/>', '<parent link="ghost"/>'), r"joint 'j3' names link 'ghost'"),
    (('<joint name="j_side" type="revolute"><parent link="a"/><child link="side"/>',
      '<joint name="j_side" type="revolute"><parent link="a"/><child link="tip"/>'),
     r"link 'tip' is the child of two joints, 'tool' and 'j_side'"),
    (('type="continuous"', 'type="floating"'), r"joint 'j3' has type 'floating'"),
    (('<axis xyz="0.3 -0.4 0.866"/>', '<axis xyz="0 0 0"/>'), r"joint 'j3' has a zero <axis"),
    (('rpy="0.3 -0.7 1.1"', 'rpy="0.3 oops 1.1"'), r"joint 'j1' <origin>: attribute rpy"),
    (('lower="-2" upper="2"', 'lower="2" upper="-2"'), r"joint 'j1' has <limit lower"),
    (('<robot name="toy">', '<model name="toy">'), r"root element is <model>"),
])
def test_malformed_urdf(edit, match):
    text = TOY.replace(*edit)
    if edit[0] == '<robot name="toy">':
        text = text.replace("</robot>", "</model>")
    with pytest.raises(URDFError, match=match):
        Chain.from_urdf(text, "tip")


def test_cycle_and_not_xml_and_missing_file_and_base_as_end():
    cyc = """<robot name="r"><link name="a"/><link name="b"/>
      <joint name="ab" type="fixed"><parent link="a"/><child link="b"/></joint>
      <joint name="ba" type="fixed"><parent link="b"/><child link="a"/></joint></robot>"""
    with pytest.raises(URDFError, match="cycle"):
        Chain.from_urdf(cyc, "b")
    with pytest.raises(URDFError, match="not well-formed XML"):
        Chain.from_urdf("<robot><link name='a'></robot>", "a")
    with pytest.raises(URDFError, match="does not exist"):
        Chain.from_urdf("/nonexistent/robot.urdf", "a")
    with pytest.raises(URDFError, match="is the base link"):
        Chain.from_urdf(PANDA, "panda_link0")


def test_mimic_joint_on_path_rejected():
    with pytest.raises(URDFError, match="'panda_finger_joint2' mimics joint 'panda_finger_joint1'"):
        Chain.from_urdf(PANDA, "panda_rightfinger")
    assert Chain.from_urdf(PANDA, "panda_leftfinger").dof == 8  # no mimic on that path


def test_wrong_q_width_dtype_type_and_nan():
    c = Chain.from_urdf(PANDA, "panda_hand")
    with pytest.raises(ShapeError, match=r"\[\.\.\., 7\].*panda_joint1.*got \[4, 6\]"):
        fk(c, torch.zeros(4, 6))
    with pytest.raises(ShapeError, match=r"\[\.\.\., 7\]"):
        jacobian(c, torch.zeros(()))
    with pytest.raises(DTypeError, match="float32, float64"):
        fk(c, torch.zeros(4, 7, dtype=torch.float16))
    with pytest.raises(TypeError, match="Chain"):
        fk("panda", torch.zeros(7))
    with pytest.raises(TypeError, match="torch.Tensor"):
        fk(c, [0.0] * 7)
    q = torch.zeros(3, 7)
    q[1, 4] = math.nan
    with pytest.raises(DataError, match=r"NaN at index \[1, 4\] \(joint 'panda_joint5'\)"):
        fk(c, q)
    assert torch.isnan(fk(c, q, validate=False)[1]).any()  # unchecked: NaN in, NaN out


def test_ik_bad_input():
    c = Chain.from_urdf(PANDA, "panda_hand")
    target = fk(c, torch.zeros(2, 7, dtype=torch.float64))
    bent = target.clone()
    bent[1, :3, :3] *= 1.1
    with pytest.raises(DataError, match=r"not orthonormal.*index \[1\]"):
        ik(c, bent)
    with pytest.raises(ShapeError, match=r"\[\.\.\., 4, 4\]"):
        ik(c, target[:, :3])
    with pytest.raises(ShapeError, match="q_init"):
        ik(c, target, q_init=torch.zeros(3, 7, dtype=torch.float64))
    with pytest.raises(DataError, match="q_init"):
        ik(c, target, q_init=torch.full((7,), math.nan, dtype=torch.float64))
    with pytest.raises(ValueError, match="num_seeds"):
        ik(c, target, num_seeds=0)
    with pytest.raises(DTypeError):
        ik(c, target.half())


def test_asset_path_unknown():
    with pytest.raises(FileNotFoundError, match="panda.urdf"):
        asset_path("ur5.urdf")


# --------------------------------------------------------------------------- GPU

@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gpu_fk_jacobian_large(dtype):
    c = Chain.from_urdf(PANDA, "panda_hand")
    q = _random_q(c, 65537, seeded()).cuda()
    p, _, _ = c.tensors("cuda", torch.float64)
    ref_pose, ref_jac = R.fk_jacobian_reference(q, p, c.movable, c.prismatic)
    assert_close(fk(c, q.to(dtype)), ref_pose.cpu(), dtype, scale=10)
    assert_close(jacobian(c, q.to(dtype)), ref_jac.cpu(), dtype, scale=10)
    assert_close(fk(c, q.to(dtype), all_links=True)[:, -1], ref_pose.cpu(), dtype, scale=10)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gpu_ik_converges(dtype):
    c = Chain.from_urdf(PANDA, "panda_hand")
    target = _ik_targets(c, 256, seeded(), dtype, "cuda")
    res = ik(c, target, generator=torch.Generator("cuda").manual_seed(0))
    assert res.converged.float().mean() >= 0.99
    lo, hi = (torch.as_tensor(v, device="cuda", dtype=dtype) for v in (c.lower, c.upper))
    assert bool(((res.q >= lo) & (res.q <= hi)).all())
    pose = fk(c, res.q.double())
    pos = (pose[:, :3, 3] - target[:, :3, 3].double()).norm(dim=-1)
    assert bool((pos[res.converged] <= 1.01e-3).all())


@pytest.mark.gpu
def test_gpu_cuda_graph_and_compile():
    c = Chain.from_urdf(PANDA, "panda_hand")
    q = _random_q(c, 300, seeded(), torch.float32).cuda()
    expect, expect_jac = fk(c, q), jacobian(c, q)  # also warms both
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fk(c, q)
        jac = jacobian(c, q)
    g.replay()
    torch.testing.assert_close(out, expect)
    torch.testing.assert_close(jac, expect_jac)
    q.copy_(_random_q(c, 300, seeded(), torch.float32))  # replays read the new values
    g.replay()
    torch.testing.assert_close(out, fk(c, q))
    torch.testing.assert_close(jac, jacobian(c, q))
    compiled = torch.compile(lambda x: jacobian(c, x) + 0, fullgraph=True)
    torch.testing.assert_close(compiled(q), jacobian(c, q))


@pytest.mark.gpu
def test_gpu_cached_launch_fresh_arguments():
    """Eager calls relaunch a cached compiled kernel: each call must read its own q and write its
    own output, and a q whose address is not 16-byte aligned must take the normal launch."""
    c = Chain.from_urdf(PANDA, "panda_hand")
    p, _, _ = c.tensors("cuda", torch.float64)
    rng = seeded()
    for q in (_random_q(c, 257, rng), _random_q(c, 257, rng)):
        ref_pose, ref_jac = R.fk_jacobian_reference(q.cuda(), p, c.movable, c.prismatic)
        q32 = q.to("cuda", torch.float32)
        torch.testing.assert_close(fk(c, q32).double(), ref_pose, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(jacobian(c, q32).double(), ref_jac, rtol=1e-4, atol=1e-5)
    flat = torch.empty(257 * c.dof + 1, device="cuda")
    q_odd = flat[1:].view(257, c.dof)
    q_odd.copy_(_random_q(c, 257, rng))
    ref_pose, ref_jac = R.fk_jacobian_reference(q_odd.double(), p, c.movable, c.prismatic)
    torch.testing.assert_close(fk(c, q_odd).double(), ref_pose, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(jacobian(c, q_odd).double(), ref_jac, rtol=1e-4, atol=1e-5)
