"""Benchmark `robocache.kinematics` (Panda, end link ``panda_hand``) against what a user has:
pytorch_kinematics 0.10 (FK, Jacobian, PseudoInverseIK) and the PyTorch reference run eagerly on the
GPU — in one run.

    $ robocache bench kinematics --json benchmarks/results/kinematics.json
    $ python benchmarks/bench_kinematics.py --quick      # CPU-only smoke run

Minimum bytes: q read once, the poses (16 values) or Jacobians (6 x DOF) written once.
IK records the converged fraction of 256 reachable targets (FK of random in-limit configurations)
at 1 mm / 0.01 rad next to the time of one full solve.
"""

from __future__ import annotations

import time

import torch

from robocache.bench import harness as H
from robocache.bench.launch import bare_launch
from robocache.bench.standalone import main
from robocache.kinematics import Chain, asset_path, fk, ik, jacobian
from robocache.reference.kinematics import fk_jacobian_reference, fk_reference

FAMILY = "kinematics"
SIZES = (256, 4096, 65536)
IK_TARGETS = 256
IK_CONFIGS = ((32, 50), (16, 50), (64, 30))  # (seeds, max_iters); the first is ik()'s default


def _panda() -> Chain:
    return Chain.from_urdf(asset_path("panda.urdf"), "panda_hand")


def _random_q(chain: Chain, n: int, device, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    lo, hi = (torch.as_tensor(v, dtype=torch.float64) for v in (chain.lower, chain.upper))
    return (lo + (hi - lo) * torch.rand(n, chain.dof, generator=g, dtype=torch.float64)).to(
        device, dtype)


def _pk_chain(device, dtype):
    try:
        import pytorch_kinematics as pk
    except ImportError:
        return None, None
    with open(asset_path("panda.urdf"), "rb") as f:
        chain = pk.build_serial_chain_from_urdf(f.read(), "panda_hand")
    return pk, chain.to(device=device, dtype=dtype)


def _cpu_cases(chain: Chain) -> list[dict]:
    q = _random_q(chain, 256, "cpu")
    return [H.case(FAMILY, "fk-N256", "robocache-cpu", H.cpu_time(lambda: fk(chain, q))),
            H.case(FAMILY, "jacobian-N256", "robocache-cpu",
                   H.cpu_time(lambda: jacobian(chain, q)))]


def run(quick: bool = False, copy_gbps: float | None = None) -> list[dict]:
    chain = _panda()
    if not torch.cuda.is_available():
        return _cpu_cases(chain) if quick else []
    dev, dt = "cuda", torch.float32
    pk, pk_chain = _pk_chain(dev, dt)
    params, _, _ = chain.tensors(dev, dt)
    st = (chain.movable, chain.prismatic)
    out: list[dict] = []
    for n in SIZES[:1] if quick else SIZES:
        q = _random_q(chain, n, dev)
        fk_bytes = n * chain.dof * 4 + n * 16 * 4
        jac_bytes = n * chain.dof * 4 + n * 6 * chain.dof * 4
        pose = fk(chain, q)
        ref = fk_reference(q.double(), params.double(), *st)
        extra = {"N": n, "max_abs_err_vs_fp64": float((pose.double() - ref).abs().max())}
        fk_eager = H.gpu_time(lambda q=q: fk(chain, q))
        fk_graph = H.graph_time(lambda q=q: fk(chain, q))
        out.append(H.case(FAMILY, f"fk-N{n}", "robocache", fk_eager, nbytes=fk_bytes,
                          copy_gbps=copy_gbps, **extra))
        out.append(H.case(FAMILY, f"fk-N{n}", "robocache (CUDA graph)", fk_graph,
                          nbytes=fk_bytes, copy_gbps=copy_gbps, N=n))
        q64 = q.double()
        out.append(H.case(FAMILY, f"fk-N{n}", "robocache fp64",
                          H.gpu_time(lambda q64=q64: fk(chain, q64)), nbytes=2 * fk_bytes,
                          copy_gbps=copy_gbps, N=n))
        jac = jacobian(chain, q)
        jref = fk_jacobian_reference(q.double(), params.double(), *st)[1]
        t = H.gpu_time(lambda q=q: jacobian(chain, q))
        out.append(H.case(FAMILY, f"jacobian-N{n}", "robocache", t, nbytes=jac_bytes,
                          copy_gbps=copy_gbps, N=n, x_fk=t.median_ms / fk_eager.median_ms,
                          max_abs_err_vs_fp64=float((jac.double() - jref).abs().max())))
        t = H.graph_time(lambda q=q: jacobian(chain, q))
        out.append(H.case(FAMILY, f"jacobian-N{n}", "robocache (CUDA graph)", t,
                          nbytes=jac_bytes, copy_gbps=copy_gbps, N=n,
                          x_fk=t.median_ms / fk_graph.median_ms))
        out.append(H.case(FAMILY, f"fk-N{n}", "torch eager (reference)",
                          H.gpu_time(lambda q=q: fk_reference(q, params, *st)), nbytes=fk_bytes,
                          copy_gbps=copy_gbps, N=n))
        if pk is not None:
            m = pk_chain.forward_kinematics(q).get_matrix()
            out.append(H.case(FAMILY, f"fk-N{n}", "pytorch_kinematics",
                              H.gpu_time(lambda q=q: pk_chain.forward_kinematics(q).get_matrix()),
                              nbytes=fk_bytes, copy_gbps=copy_gbps, N=n,
                              max_abs_diff_vs_robocache=float((m - pose).abs().max())))
            pj = pk_chain.jacobian(q)
            out.append(H.case(FAMILY, f"jacobian-N{n}", "pytorch_kinematics",
                              H.gpu_time(lambda q=q: pk_chain.jacobian(q)), nbytes=jac_bytes,
                              copy_gbps=copy_gbps, N=n,
                              max_abs_diff_vs_robocache=float((pj - jac).abs().max())))
    q = _random_q(chain, 256, dev)
    for name, fn in (("fk", fk), ("jacobian", jacobian)):
        call = lambda fn=fn: fn(chain, q)  # noqa: E731
        out.append(H.case(FAMILY, f"{name}-N256", "robocache host overhead",
                          H.host_time_us(call), unit="us", note="host us per eager call"))
        out.append(H.case(FAMILY, f"{name}-N256", "bare Triton launch host overhead",
                          H.host_time_us(bare_launch(call)), unit="us",
                          note="the same kernel launch through kernel[grid](...), nothing else"))
    out += _ik_cases(chain, pk, pk_chain, quick)
    return out


def _ik_cases(chain, pk, pk_chain, quick) -> list[dict]:
    out = []
    target = fk(chain, _random_q(chain, IK_TARGETS, "cuda", seed=1))
    for seeds, iters in IK_CONFIGS[:1] if quick else IK_CONFIGS:
        gen = torch.Generator(device="cuda").manual_seed(0)
        res = ik(chain, target, num_seeds=seeds, max_iters=iters, generator=gen)
        lo, hi = (torch.as_tensor(v, device="cuda", dtype=torch.float32)
                  for v in (chain.lower, chain.upper))
        t = H.gpu_time(lambda s=seeds, i=iters, g=gen: ik(chain, target, num_seeds=s,
                                                          max_iters=i, generator=g))
        out.append(H.case(FAMILY, f"ik-{IK_TARGETS}targets", f"robocache {seeds}x{iters}", t,
                          targets=IK_TARGETS, seeds=seeds, max_iters=iters,
                          converged_frac=float(res.converged.float().mean()),
                          within_limits=bool(((res.q >= lo) & (res.q <= hi)).all()),
                          max_pos_err=float(res.pos_err.max()),
                          max_rot_err=float(res.rot_err.max())))
    if pk is not None and not quick:
        lim = torch.as_tensor(pk_chain.get_joint_limits(), device="cuda").T
        solver = pk.PseudoInverseIK(pk_chain, max_iterations=30, num_retries=10,
                                    joint_limits=lim, early_stopping_any_converged=True,
                                    early_stopping_no_improvement="all", lr=0.2)
        goal = pk.Transform3d(matrix=target)
        sol = solver.solve(goal)
        samples = []
        for _ in range(3):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            sol = solver.solve(goal)
            torch.cuda.synchronize()
            samples.append((time.perf_counter() - t0) * 1e3)
        out.append(H.case(FAMILY, f"ik-{IK_TARGETS}targets", "pytorch_kinematics 10x30",
                          H.summarize(samples), targets=IK_TARGETS, seeds=10, max_iters=30,
                          converged_frac=float(sol.converged_any.float().mean()),
                          note="PseudoInverseIK, wall clock"))
    return out


if __name__ == "__main__":
    main(run, __doc__)
