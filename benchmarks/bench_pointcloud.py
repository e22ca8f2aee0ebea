"""RGB-D frames to a 64³ voxel grid (occupancy + mean colour): RoboCache fused and unfused vs
the torch recipe a user writes today (eager and torch.compile), one frame and a batch of 8.

    $ robocache bench pointcloud --json results.json

The scene is a synthetic room (floor, two walls, a back wall, two boxes) seen by a 640x480
camera with 3% depth holes, so many neighbouring pixels fall in one voxel as in real data
(atomic contention). Minimum bytes: depth (uint16) + rgb (uint8) read once, the grid (int32
count + 3 float32 mean per voxel) zeroed once and written once.
"""

from __future__ import annotations

import torch

from robocache.bench import harness
from robocache.bench.standalone import main

FAMILY = "pointcloud"
GRID = dict(bounds_min=(-2.0, -2.0, 0.0), voxel_size=4.0 / 64, grid_size=64)


def scene(b: int, h: int = 480, w: int = 640, seed: int = 0):
    """uint16 depth [b, h, w] (mm), uint8 rgb [b, h, w, 3], intrinsics [3, 3] of a room scene."""
    g = torch.Generator().manual_seed(seed)
    fx = 600.0 * w / 640
    v, u = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
    dx, dy = (u - w / 2) / fx, (v - h / 2) / fx
    z = torch.full((h, w), 3.8)  # back wall
    for c, d in ((1.2, dy), (-1.8, dx), (1.9, dx)):  # floor, left and right walls
        t = c / d
        z = torch.where((t > 0) & (t < z), t, z)
    for x0, x1, y0, z0 in ((-0.8, -0.1, 0.6, 1.5), (0.3, 1.1, 0.2, 2.2)):  # box fronts
        hit = (z0 * dx >= x0) & (z0 * dx <= x1) & (z0 * dy >= y0) & (z0 * dy <= 1.2)
        z = torch.where(hit & (z0 < z), torch.full_like(z, z0), z)
    depth = (z * 1000 + torch.randn(b, h, w, generator=g) * 2).round()
    depth[torch.rand(b, h, w, generator=g) < 0.03] = 0
    shade = (z / 3.8 * 200).to(torch.uint8)[..., None]
    rgb = (shade + torch.randint(0, 50, (b, h, w, 3), generator=g, dtype=torch.uint8))
    k = torch.tensor([[fx, 0, w / 2], [0, fx, h / 2], [0, 0, 1]])
    return depth.to(torch.uint16), rgb, k


def torch_recipe(depth, rgb, k, bounds_min, voxel_size, grid_size):
    """What a user writes in PyTorch: backproject, floor, index_add counts and colour sums."""
    b, h, w = depth.shape
    g = grid_size
    z = depth.float() * 0.001
    v, u = torch.meshgrid(torch.arange(h, device=depth.device),
                          torch.arange(w, device=depth.device), indexing="ij")
    p = torch.stack([(u - k[0, 2]) * z / k[0, 0], (v - k[1, 2]) * z / k[1, 1], z], -1)
    idx = torch.floor((p.reshape(b, -1, 3) - torch.tensor(bounds_min, device=p.device))
                      / voxel_size).long()
    ok = (z.reshape(b, -1) > 0) & ((idx >= 0) & (idx < g)).all(-1)
    batch = torch.arange(b, device=p.device)[:, None]
    lin = torch.where(ok, ((batch * g + idx[..., 0]) * g + idx[..., 1]) * g + idx[..., 2],
                      b * g ** 3).reshape(-1)
    count = torch.zeros(b * g ** 3 + 1, device=p.device).index_add_(
        0, lin, torch.ones_like(lin, dtype=torch.float32))
    sums = torch.zeros(b * g ** 3 + 1, 3, device=p.device).index_add_(
        0, lin, rgb.reshape(-1, 3).float())
    mean = sums[:-1] / count[:-1].clamp(min=1)[:, None]
    return (count[:-1] > 0).view(b, g, g, g), mean.view(b, g, g, g, 3)


def run(quick: bool = False, copy_gbps: float | None = None) -> list[dict]:
    import robocache

    device = "cuda" if harness.cuda_ready() else "cpu"
    if device == "cpu" and not quick:
        return []
    h, w = (480, 640) if device == "cuda" else (48, 64)
    time = harness.gpu_time if device == "cuda" else harness.cpu_time
    cases = []
    for b in (1, 8) if device == "cuda" else (1, 2):
        depth, rgb, k = (t.to(device) for t in scene(b, h, w))
        nvox = b * 64 ** 3
        nbytes = depth.numel() * 2 + rgb.numel() + 2 * nvox * 16
        name = f"rgbd {w}x{h} -> 64^3 mean, B={b}"

        def fused(depth=depth, rgb=rgb, k=k):
            return robocache.depth_to_voxels(depth, k, rgb=rgb, mode="mean", **GRID)

        def unfused(depth=depth, rgb=rgb, k=k):
            points, valid, colors = robocache.depth_to_points(depth, k, rgb=rgb)
            return robocache.voxelize(points, features=colors, mask=valid, mode="mean", **GRID)

        def eager(depth=depth, rgb=rgb, k=k):
            return torch_recipe(depth, rgb, k, GRID["bounds_min"], GRID["voxel_size"], 64)

        impls = {"robocache fused": fused, "robocache unfused": unfused, "torch eager": eager}
        if device == "cuda":
            impls["torch.compile"] = torch.compile(eager, fullgraph=True, dynamic=False)
        for impl, fn in impls.items():
            fn()
            t = time(fn)
            extra = {"B": b, "per_frame_ms": t.median_ms / b, "timing": "do_bench"}
            if device == "cuda" and impl.startswith("robocache"):
                extra["graph_ms"] = harness.graph_time(fn, calls=20).median_ms
                extra["host_us"] = harness.host_time_us(fn, calls=300, repeats=5).median_ms
            cases.append(harness.case(FAMILY, name, impl, t, nbytes=nbytes, copy_gbps=copy_gbps,
                                      **extra))
        if device == "cuda":
            cases += _sweep(name, b, depth, rgb, k, nbytes, copy_gbps)
    return cases


def _sweep(name, b, depth, rgb, k, nbytes, copy_gbps) -> list[dict]:
    """Fused kernel variants (CUDA-graph time per call): points per program, the occupancy-only
    grid, and the sparse output (sort-based, eager time)."""
    import robocache
    from robocache.kernels import pointcloud as kernels

    cases = []
    default = kernels.MAX_BLOCK
    try:
        for block in (128, 256, 512, 1024):
            kernels.MAX_BLOCK = block
            fn = lambda: robocache.depth_to_voxels(depth, k, rgb=rgb, mode="mean", **GRID)
            fn()
            t = harness.graph_time(fn, calls=20)
            cases.append(harness.case(FAMILY, name, f"robocache fused block={block}", t,
                                      nbytes=nbytes, copy_gbps=copy_gbps, B=b, timing="graph",
                                      per_frame_ms=t.median_ms / b))
    finally:
        kernels.MAX_BLOCK = default
    occ = lambda: robocache.depth_to_voxels(depth, k, mode="occupancy", **GRID)
    occ()
    t = harness.graph_time(occ, calls=20)
    cases.append(harness.case(FAMILY, name, "robocache fused occupancy only", t, B=b,
                              timing="graph",
                              nbytes=depth.numel() * 2 + 2 * b * 64 ** 3, copy_gbps=copy_gbps,
                              per_frame_ms=t.median_ms / b))
    sparse = lambda: robocache.depth_to_voxels(depth, k, rgb=rgb, mode="mean", sparse=True, **GRID)
    sparse()
    t = harness.gpu_time(sparse)
    cases.append(harness.case(FAMILY, name, "robocache fused sparse (sort)", t, B=b,
                              per_frame_ms=t.median_ms / b))
    return cases


if __name__ == "__main__":
    main(run, __doc__)
