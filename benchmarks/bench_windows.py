"""Benchmark `robocache.windows`: M = 65536 windows of 2 history + 16 horizon rows, D = 32
float32, from 1000 packed episodes (~64 MB, larger than L2), with `_is_pad` masks — against
the torch eager gather a user writes and torch.compile of it, in one run. And
`robocache.key_windows`: the same M windows of 3 keys packed in one matrix, each with its own
offsets (LeRobot's per-key delta_timestamps: state [-1, 0] x 32, action 0..15 x 32,
env [-4, -2, 0] x 16), against the per-key gather in eager torch and torch.compile of it.

    $ robocache bench windows --json benchmarks/results/windows.json

Minimum bytes: each output row read once and written once, indices read, masks written.
"""

from __future__ import annotations

import torch

import robocache
from robocache.bench import harness as H
from robocache.bench.standalone import main

FAMILY = "windows"


def make_inputs(M, episodes, mean_len, D, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(mean_len // 2, mean_len * 3 // 2, (episodes,), generator=g)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    data = torch.randn(int(offsets[-1]), D, generator=g)
    idx = torch.randint(0, int(offsets[-1]), (M,), generator=g)
    return data.to(device), offsets.to(device), idx.to(device)


def torch_windows(data, offsets, idx, history, horizon):
    """The eager gather: episode bounds by searchsorted, clamped rows, masks."""
    e = torch.searchsorted(offsets, idx, right=True) - 1
    lo, hi = offsets[e], offsets[e + 1] - 1
    rel = torch.arange(1 - history, horizon, device=data.device)
    rows = idx[:, None] + rel[None, :]
    pad = (rows < lo[:, None]) | (rows > hi[:, None])
    vals = data[torch.minimum(torch.maximum(rows, lo[:, None]), hi[:, None])]
    return vals[:, :history], pad[:, :history], vals[:, history:], pad[:, history:]


KEYS = {"observation.state": ((0, 32), [-1, 0]), "action": ((32, 32), list(range(16))),
        "observation.env": ((64, 16), [-4, -2, 0])}


def torch_key_windows(data, offsets, idx, rels):
    """The eager per-key gather: episode bounds once, then clamped rows and masks per key."""
    e = torch.searchsorted(offsets, idx, right=True) - 1
    lo, hi = offsets[e][:, None], offsets[e + 1][:, None] - 1
    out = {}
    for k, ((c, w), _) in KEYS.items():
        rows = idx[:, None] + rels[k][None, :]
        out[f"{k}_is_pad"] = (rows < lo) | (rows > hi)
        out[k] = data[torch.minimum(torch.maximum(rows, lo), hi), c:c + w]
    return out


def run_keys(M, E, L, dev, copy_gbps) -> list[dict]:
    data, offsets, idx = make_inputs(M, E, L, 80, dev, seed=1)
    cols = {k: cw for k, (cw, _) in KEYS.items()}
    offs = {k: o for k, (_, o) in KEYS.items()}
    rels = {k: torch.tensor(o, device=dev) for k, o in offs.items()}
    per_m = sum(w * len(o) for (_, w), o in KEYS.values())
    nbytes = 2 * M * per_m * data.element_size() + M * idx.element_size() + \
        M * sum(len(o) for o in offs.values())
    name = f"M{M}-3keys-L2,16,3-D32,32,16-fp32"
    rec = lambda impl, t: H.case(FAMILY, name, impl, t, nbytes=nbytes,  # noqa: E731
                                 copy_gbps=copy_gbps)
    ours = lambda: robocache.key_windows(data, offsets, idx, cols, offs)  # noqa: E731
    eager = lambda: torch_key_windows(data, offsets, idx, rels)  # noqa: E731
    if dev == "cpu":
        return [rec("robocache_cpu", H.cpu_time(ours)), rec("torch_eager_cpu", H.cpu_time(eager))]
    compiled_fn = torch.compile(torch_key_windows)
    compiled = lambda: compiled_fn(data, offsets, idx, rels)  # noqa: E731
    return [rec("robocache", H.gpu_time(ours)), rec("torch_eager", H.gpu_time(eager)),
            rec("torch_compile", H.gpu_time(compiled)),
            *(rec(f"robocache_m{bm}_p{bp}_w{nw}",
                  H.gpu_time(_launch(data, offsets, idx, cols, offs, bm, bp, nw)))
              for bm, bp, nw in SWEEP)]


# (windows, value positions per chunk, warps) per program; the default is 4 x 1024, 4 warps
SWEEP = [(8, 1024, 8), (16, 1024, 8), (2, 256, 2), (8, 256, 4), (16, 128, 8), (16, 64, 4)]


def _launch(data, offsets, idx, cols, offs, block_m, block_p, num_warps):
    """The key_windows launcher with another tile and warp count."""
    from robocache.kernels.windows import key_windows_cuda
    from robocache.ops.windows import _key_plan_on

    plan, table = _key_plan_on(cols, {k: tuple(o) for k, o in offs.items()}, data.device)
    out = torch.empty(len(idx) * plan.n_values, dtype=data.dtype, device=data.device)
    pads = torch.empty(len(idx) * plan.n_pads, dtype=torch.bool, device=data.device)
    return lambda: key_windows_cuda(data, offsets, idx, None, table, plan.n_values,
                                    plan.n_pads, plan.align, out, pads, False, block_m=block_m,
                                    block_p=block_p, num_warps=num_warps)


def run(quick: bool = False, copy_gbps: float | None = None) -> list[dict]:
    M, E, L, D, h, H_ = (1024, 20, 100, 32, 2, 16) if quick or not torch.cuda.is_available() \
        else (65536, 1000, 500, 32, 2, 16)
    dev = "cuda" if torch.cuda.is_available() and not quick else "cpu"
    data, offsets, idx = make_inputs(M, E, L, D, dev)
    K = h + H_
    nbytes = 2 * M * K * D * data.element_size() + M * idx.element_size() + M * K
    name = f"M{M}-h{h}-H{H_}-D{D}-fp32"
    rec = lambda impl, t: H.case(FAMILY, name, impl, t, nbytes=nbytes,  # noqa: E731
                                 copy_gbps=copy_gbps)
    ours = lambda: robocache.windows(data, offsets, idx, history=h, horizon=H_)  # noqa: E731
    eager = lambda: torch_windows(data, offsets, idx, h, H_)  # noqa: E731
    keyed = run_keys(M, E, L, dev, copy_gbps)
    if dev == "cpu":
        return [rec("robocache_cpu", H.cpu_time(ours)),
                rec("torch_eager_cpu", H.cpu_time(eager)), *keyed]
    compiled_fn = torch.compile(torch_windows)
    compiled = lambda: compiled_fn(data, offsets, idx, h, H_)  # noqa: E731
    return [rec("robocache", H.gpu_time(ours)), rec("torch_eager", H.gpu_time(eager)),
            rec("torch_compile", H.gpu_time(compiled)), *keyed]


if __name__ == "__main__":
    main(run, __doc__)
