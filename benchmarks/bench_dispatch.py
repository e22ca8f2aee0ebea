"""Host cost of the one dispatch path (`robocache.ops._dispatch`): an eager call of each public
op on a tiny CUDA input against the bare Triton launch of the same kernel, in one run.

    $ robocache bench dispatch --json benchmarks/results/dispatch.json
    $ python benchmarks/bench_dispatch.py --quick      # no CUDA: one "skipped" row saying why

Each op gives two rows of the same name: ``robocache host overhead`` (host us per eager call:
validation, cached plan, dispatch, allocation, launch) and ``bare Triton launch host overhead``
(its first kernel launch replayed through ``kernel[grid](...)``, nothing else), both the wall
clock of back-to-back calls with one CUDA sync per repeat, the two rows' repeats alternating.
The first row carries ``x_bare``, their ratio; the target is <= 1.5. Host rows gate only as
this ratio (`robocache.bench.compare`).
"""

from __future__ import annotations

import math

import torch

from robocache.bench import harness as H
from robocache.bench.standalone import main

FAMILY = "dispatch"


def _calls(dev: str) -> dict:
    """Op name -> a zero-argument eager call on a tiny input (inputs made once, here)."""
    import robocache
    from robocache import augment
    from robocache.kinematics import Chain, asset_path, fk, jacobian
    from robocache.ops.pipeline import Augment, Pipeline, Resample

    g = torch.Generator().manual_seed(0)
    data = torch.randn(4, 32, 7, generator=g).to(dev)
    data3 = torch.randn(4, 32, 3, generator=g).to(dev)
    times = torch.linspace(0, 1, 32, dtype=torch.float64, device=dev)
    target = torch.linspace(0, 1, 16, dtype=torch.float64, device=dev)
    packed = torch.randn(256, 8, generator=g).to(dev)
    offsets = torch.tensor([0, 100, 256], device=dev)
    idx = torch.tensor([0, 50, 99, 100, 150, 200, 230, 255], device=dev)
    x = torch.randn(64, 7, generator=g).to(dev)
    stats = robocache.compute_stats(torch.randn(500, 7, generator=g))
    chain = Chain.from_urdf(asset_path("panda.urdf"), "panda_hand")
    q = torch.zeros(256, chain.dof, device=dev)
    frames = torch.randint(0, 256, (2, 3, 48, 64), dtype=torch.uint8, generator=g).to(dev)
    depth = torch.rand(1, 48, 64, generator=g).to(dev) + 0.5
    k = torch.tensor([[50.0, 0, 32], [0, 50.0, 24], [0, 0, 1]], device=dev)
    pipe = Pipeline([Resample(rate=50.0, num=16), Augment(k=2, noise_std=0.01)])
    cols, rels = {"state": (0, 6), "action": (6, 2)}, {"state": [-1, 0], "action": range(8)}
    return {
        "resample": lambda: robocache.resample(data, times, target),
        "align": lambda: robocache.align({"a": (data, times), "b": (data3, times)},
                                         target),
        "windows": lambda: robocache.windows(packed, offsets, idx, history=2, horizon=4),
        "key_windows": lambda: robocache.key_windows(packed, offsets, idx, cols, rels),
        "normalize": lambda: robocache.normalize(x, stats),
        "add_noise": lambda: augment.add_noise(x, 0.01, seed=0),
        "fk": lambda: fk(chain, q),
        "jacobian": lambda: jacobian(chain, q),
        "image_transform": lambda: robocache.image_transform(frames, (24, 24)),
        "depth_to_points": lambda: robocache.depth_to_points(depth, k, max_depth=math.inf),
        "pipeline": lambda: pipe(data, times.expand(4, -1), seed=0),
    }


def _interleaved(call, bare, *, calls: int, repeats: int = 7):
    """Host time of `call` and of `bare`, their repeats alternating, so that drift of the
    host (clocks, other load) reaches both alike."""
    runs: tuple[list, list] = ([], [])
    for _ in range(repeats):
        for fn, out in zip((call, bare), runs, strict=True):
            out.append(H.host_time_us(fn, calls=calls, repeats=1).median_ms)
    return H.summarize(runs[0]), H.summarize(runs[1])


def run(quick: bool = False, copy_gbps: float | None = None) -> list[dict]:
    if not torch.cuda.is_available():  # host cost against a bare launch means CUDA launches
        return [H.case(FAMILY, "all-ops", "skipped", H.summarize([0.0]), unit="us",
                       skipped=True, note="skipped: no CUDA device; the host cost of an eager "
                                          "call is measured against a bare Triton launch on "
                                          "CUDA: run on a GPU")]
    from robocache.bench.launch import bare_launch

    out: list[dict] = []
    calls = _calls("cuda")
    for name, call in calls.items():
        call()  # compile and cache plans outside the timing
        bare = bare_launch(call)
        eager_t, bare_t = _interleaved(call, bare, calls=200 if quick else 2000)
        out.append(H.case(FAMILY, f"{name}-tiny", "robocache host overhead", eager_t,
                          unit="us", x_bare=eager_t.median_ms / bare_t.median_ms,
                          note="host us per eager call of the public op"))
        out.append(H.case(FAMILY, f"{name}-tiny", "bare Triton launch host overhead", bare_t,
                          unit="us",
                          note="the op's first kernel launch through kernel[grid](...), "
                               "nothing else"))
    return out


if __name__ == "__main__":
    main(run, __doc__)
