"""robocache.Pipeline: fused kernel == unfused composition, reproducibility, CUDA graphs."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from helpers import assert_close, seeded

from robocache.errors import DeviceError, ShapeError
from robocache.ops.normalize import compute_stats
from robocache.ops.pipeline import Augment, Normalize, Pipeline, Resample

STREAMS = ((0, 3), (3, 7), (7, 9))


def _batch(rng, B=3, S=40, D=9, epoch=True, dtype=torch.float32):
    # Irregular sampling with gaps of 50-150 ms: with near-duplicate timestamps the data's
    # slope between them turns a 1-ulp difference in a float32 warped target time (sin and
    # FMA rounding differ per device) into an arbitrarily large output difference.
    times = torch.from_numpy(np.cumsum(rng.uniform(0.05, 0.15, (B, S)), 1))
    if epoch:
        times = times + 1.7e9
    data = torch.randn(B, S, D, dtype=torch.float64)
    data[..., 3:7] = torch.nn.functional.normalize(data[..., 3:7], dim=-1)
    return data.to(dtype), times


def _pipe(stats, mode="mean_std", **aug):
    cfg = dict(k=4, position=0, orientation=3, max_translation=0.1, max_rotation=0.5,
               noise_std=0.05, time_warp=0.5, dropout=0.3, streams=STREAMS)
    cfg.update(aug)
    return Pipeline([Resample(10.0, 23), Normalize(stats, mode), Augment(**cfg)])


CASES = {
    "all": {},
    "quantile-crop": dict(keep_endpoints=False, max_crop=0.2),
    "resample-only": dict(position=None, orientation=None, noise_std=0.0, time_warp=0.0,
                          dropout=0.0, streams=()),
    "se3-only": dict(noise_std=0.0, time_warp=0.0, dropout=0.0, streams=()),
}


@pytest.mark.parametrize("case", list(CASES))
def test_fused_kernel_equals_unfused_composition(kernel_device, case):
    rng = seeded()
    data, times = _batch(rng)
    pipe = _pipe(compute_stats(data), "quantile" if "quantile" in case else "mean_std",
                 **CASES[case])
    seed = int(rng.integers(0, 2**62))
    ref = pipe(data, times, seed=seed, fused=False)
    out = pipe._fused(data.to(kernel_device), times.to(kernel_device), None, seed)
    assert out.data.shape == (3, 4, 23, 9) and out.dropped.shape == ref.dropped.shape
    assert torch.equal(out.dropped.cpu(), ref.dropped)
    # float32 chain: sin/cos/log of the warp, the rotation and Box-Muller round per device
    assert_close(out.data, ref.data, torch.float32, scale=30)


@pytest.mark.slow
@pytest.mark.parametrize("tuning", [dict(block_t=8, blocks=2, per_thread=4),
                                    dict(block_t=32, fan=4)])
def test_fused_tunings_agree(kernel_device, tuning):
    """Tile size, blocks per program, warps and search settings change only speed (T = 23
    leaves partial blocks; with 8 x 2 an empty one)."""
    from dataclasses import replace

    from robocache.kernels.pipeline import TUNING, pipeline_cuda

    rng = seeded()
    data, times = _batch(rng)
    pipe = _pipe(compute_stats(data))
    data, times = data.to(kernel_device), times.to(kernel_device)
    params = pipe._params(data.device, 9)
    outs = []
    for tu in (TUNING, replace(TUNING, **tuning)):
        out = torch.full((3, 4, 23, 9), float("nan"), device=kernel_device)
        flags = torch.zeros(3, 4, len(STREAMS), dtype=torch.bool, device=kernel_device)
        pipeline_cuda(pipe.plan, data, times, None, out, flags, *params, 4, pipe.span, 7,
                      *pipe._scalars, tuning=tu)
        outs.append((out.cpu(), flags.cpu()))
    assert torch.isfinite(outs[1][0]).all()
    assert torch.equal(outs[0][1], outs[1][1])
    assert_close(outs[1][0], outs[0][0], torch.float32)


def test_fused_with_lengths_never_reads_padding(kernel_device):
    rng = seeded()
    data, times = _batch(rng, B=2, S=30, epoch=False)
    lengths = torch.tensor([30, 17])
    data[1, 17:] = float("nan")
    times[1, 17:] = float("nan")
    pipe = _pipe(compute_stats(data[0]))
    ref = pipe(data, times, lengths=lengths, seed=3, fused=False)
    out = pipe._fused(data.to(kernel_device), times.to(kernel_device),
                      lengths.to(kernel_device), 3)
    assert torch.isfinite(out.data).all()
    assert_close(out.data, ref.data, torch.float32, scale=30)


def test_unbatched_rows_reproducible_and_independent_of_batch():
    rng = seeded()
    data, times = _batch(rng)
    pipe = _pipe(compute_stats(data))
    a = pipe(data, times, seed=11)
    assert torch.equal(a.data, pipe(data, times, seed=11).data)
    assert not torch.equal(a.data, pipe(data, times, seed=12).data)
    first = pipe(data[:1], times[:1], seed=11)
    assert torch.equal(first.data, a.data[:1]) and torch.equal(first.dropped, a.dropped[:1])
    assert first.data.dtype == torch.float32
    shared = pipe(data, times[0], seed=11)
    assert shared.data.shape == a.data.shape


def test_pipeline_without_augment_equals_resample_then_normalize():
    from robocache.ops.normalize import normalize
    from robocache.ops.resample import resample

    rng = seeded()
    data, times = _batch(rng, epoch=False)
    st = compute_stats(data)
    pipe = Pipeline([Resample(10.0, 23), Normalize(st, "min_max")])
    out = pipe(data, times, seed=0).data
    target = times[:, :1] + torch.arange(23, dtype=torch.float64) / 10.0
    exp = normalize(resample(data, times, target), st, "min_max")
    assert out.shape == (3, 1, 23, 9)
    assert_close(out[:, 0], exp.numpy(), torch.float32, scale=10)


@pytest.mark.slow
def test_fused_custom_op_registration(kernel_device):
    from dataclasses import astuple

    rng = seeded()
    data, times = _batch(rng, B=2, S=20, epoch=False)
    pipe = _pipe(compute_stats(data))
    data, times = data.to(kernel_device), times.to(kernel_device)
    o, s, sd, col = pipe._params(data.device, 9)
    args = (data, times, None, 5, o, s, sd, col, 4, 23, pipe.span, list(pipe._scalars),
            [int(v) for v in astuple(pipe.plan)])
    torch.library.opcheck(torch.ops.robocache.pipeline_fused, args)
    out, dropped = torch.ops.robocache.pipeline_fused(*args)
    ref = pipe._fused(data, times, None, 5)
    assert torch.equal(out, ref.data) and torch.equal(dropped, ref.dropped)


@pytest.mark.gpu
def test_pipeline_under_torch_compile_fullgraph():
    rng = seeded()
    data, times = _batch(rng)
    data, times = data.cuda(), times.cuda()
    pipe = _pipe(compute_stats(data))
    f = torch.compile(lambda d, t: pipe(d, t, seed=3).data, fullgraph=True)
    assert_close(f(data, times), pipe(data, times, seed=3).data.cpu(), torch.float32)


@pytest.mark.gpu
def test_cuda_fused_equals_unfused_and_graph_replay_equals_eager():
    rng = seeded()
    data, times = _batch(rng, B=5)
    data, times = data.cuda(), times.cuda()
    pipe = _pipe(compute_stats(data))
    eager = pipe(data, times, seed=9)
    unfused = pipe(data, times, seed=9, fused=False)
    assert_close(eager.data, unfused.data.cpu(), torch.float32, scale=30)
    pipe.capture(data, times)
    for seed in (9, 10):  # the replay reads its seed from device memory
        replay = pipe(data, times, seed=seed)
        assert_close(replay.data, pipe._fused(data, times, None, seed).data.cpu(),
                     torch.float32)
    small = pipe(data[:3], times[:3], seed=9)  # same bucket (8), padded rows
    assert small.data.shape[0] == 3
    assert_close(small.data, eager.data[:3].cpu(), torch.float32)


@pytest.mark.gpu
def test_graph_cache_falls_back_eagerly_with_one_warning():
    rng = seeded()
    data, times = _batch(rng, B=5)
    data, times = data.cuda(), times.cuda()
    pipe = Pipeline([Resample(10.0, 23), Augment(k=2, noise_std=0.1)], batch_buckets=(4,),
                    max_graphs=1)
    pipe.capture(data[:4], times[:4])
    with pytest.warns(UserWarning, match="running eagerly"):
        a = pipe(data, times, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        b = pipe(data, times, seed=1)
    assert torch.equal(a.data, b.data)


def test_bad_input():
    st = compute_stats(torch.randn(10, 9))
    data, times = torch.randn(2, 12, 9), torch.linspace(0, 1, 12, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"Augment.k .* must be an int >= 1"):
        Pipeline([Resample(10.0, 5), Augment(k=0)])
    with pytest.raises(ValueError, match="`std` must be finite and >= 0"):
        Pipeline([Resample(10.0, 5), Augment(noise_std=-0.1)])
    with pytest.raises(ValueError, match="then optionally Normalize"):
        Pipeline([Resample(10.0, 5), Augment(), Normalize(st)])
    with pytest.raises(ValueError, match="needs `streams`"):
        Pipeline([Resample(10.0, 5), Augment(dropout=0.5)])
    with pytest.raises(ValueError, match="rate > 0"):
        Pipeline([Resample(0.0, 5)])
    with pytest.raises(TypeError, match="steps must be"):
        Pipeline([Resample(10.0, 5), "normalize"])
    with pytest.raises(ShapeError, match="Normalize statistics have 9"):
        Pipeline([Resample(10.0, 5), Normalize(st)])(torch.randn(2, 12, 4), times, seed=0)
    with pytest.raises(ShapeError, match="Augment.orientation = 7"):
        Pipeline([Resample(10.0, 5), Augment(orientation=7)])(data, times, seed=0)
    with pytest.raises(ShapeError, match="noise_std has 2 entries"):
        Pipeline([Resample(10.0, 5), Augment(noise_std=[0.1, 0.2])])(data, times, seed=0)
    with pytest.raises(ShapeError, match="`times` must be"):
        Pipeline([Resample(10.0, 5)])(data, times[:5], seed=0)
    with pytest.raises(DeviceError, match="capture needs CUDA tensors"):
        Pipeline([Resample(10.0, 5)]).capture(data, times)
