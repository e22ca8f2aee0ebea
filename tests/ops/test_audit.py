"""The audit's vectorised checks against the per-episode loops of the reference: random packed
episodes with planted NaNs, pads, repeated and still rows, jumps; odd shapes; validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import seeded

from robocache.errors import DTypeError, ShapeError
from robocache.ops.audit import (
    longest_runs,
    sample_every,
    stream_checks,
    timing_checks,
)
from robocache.reference.audit import (
    longest_runs_ref,
    sample_every_ref,
    stream_checks_ref,
    timing_checks_ref,
)


def _packed(rng, episodes: int, dim: int, max_len: int = 40):
    lengths = rng.integers(1, max_len + 1, episodes)
    if episodes > 1:
        lengths[rng.integers(episodes)] = 1  # an episode of one row
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    n = int(offsets[-1])
    x = rng.normal(size=(n, dim)).astype(np.float32)
    # runs of repeated rows, rows barely moving, jumps, non-finite values, pads
    for start in rng.integers(0, n, 6):
        x[start:start + int(rng.integers(2, 9))] = x[start]
    for start in rng.integers(0, n, 4):
        stop = min(n, start + int(rng.integers(2, 9)))
        x[start:stop] = x[start] + rng.uniform(-1e-4, 1e-4, (stop - start, dim))
    x[rng.integers(0, n, 3)] += 40.0
    x[rng.integers(0, n, 2), rng.integers(0, dim, 2)] = np.nan
    x[rng.integers(0, n, 1), 0] = np.inf
    pad = np.zeros(n, bool)
    for start in rng.integers(0, n, 3):
        pad[start:start + int(rng.integers(1, 6))] = True
    return x, offsets, pad


@pytest.mark.parametrize("episodes,dim", [(1, 1), (2, 3), (7, 5), (13, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_stream_checks_match_reference(episodes, dim, dtype):
    rng = seeded()
    x, offsets, pad = _packed(rng, episodes, dim)
    lo, hi = np.full(dim, -2.5), np.full(dim, 2.5)
    jump = rng.uniform(3.0, 6.0, dim)
    jump[0] = np.inf  # a dimension that is never a jump
    still = np.full(dim, 1e-3)
    got = stream_checks(torch.from_numpy(x).to(dtype), torch.from_numpy(offsets),
                        torch.from_numpy(pad), lo=torch.from_numpy(lo), hi=torch.from_numpy(hi),
                        jump=torch.from_numpy(jump), still=torch.from_numpy(still))
    want = stream_checks_ref(x, offsets, pad, lo, hi, jump, still)
    for name in ("nonfinite", "out_of_range", "jumps", "frozen", "pad_run", "still"):
        np.testing.assert_array_equal(getattr(got, name).numpy(), want[name], err_msg=name)
    np.testing.assert_allclose(got.max_step.numpy(), want["max_step"], rtol=1e-5)
    np.testing.assert_allclose(got.span.numpy(), want["span"], rtol=1e-5, atol=1e-5)


def test_stream_checks_planted_episode():
    x = torch.tensor([[0.0], [0.0], [0.0], [5.0], [float("nan")], [0.5]])
    c = stream_checks(x, torch.tensor([0, 4, 6]), None, lo=torch.tensor([-1.0]),
                      hi=torch.tensor([1.0]), jump=torch.tensor([1.0]),
                      still=torch.tensor([0.1]))
    assert c.nonfinite.tolist() == [0, 1]
    assert c.out_of_range.tolist() == [1, 0]
    assert c.jumps.tolist() == [1, 0]
    assert c.max_step.tolist() == [5.0, 0.0]
    assert c.frozen.tolist() == [2, 0]
    assert c.still.tolist() == [False, True, True, False, False, False]
    assert c.span[:, 0].tolist() == [5.0, 0.0]


@pytest.mark.parametrize("episodes", [1, 3, 17])
def test_longest_runs_match_reference(episodes):
    rng = seeded()
    lengths = rng.integers(0, 30, episodes)  # empty episodes too
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    mask = rng.random(int(offsets[-1])) < 0.6
    got = longest_runs(torch.from_numpy(mask), torch.from_numpy(offsets))
    np.testing.assert_array_equal(got.numpy(), longest_runs_ref(mask, offsets))


def test_runs_stop_at_episode_boundaries():
    mask = torch.ones(6, dtype=torch.bool)
    assert longest_runs(mask, torch.tensor([0, 2, 6])).tolist() == [2, 4]


@pytest.mark.parametrize("episodes", [1, 4, 11])
def test_timing_checks_match_reference(episodes):
    rng = seeded()
    lengths = rng.integers(1, 50, episodes)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    times = np.concatenate([1.7e9 + np.cumsum(rng.uniform(0.045, 0.055, n)) for n in lengths])
    times[rng.integers(0, len(times))] += 0.3  # a gap (and the step after it goes back)
    gap, jitter = timing_checks(torch.from_numpy(times), torch.from_numpy(offsets), 0.05)
    want_gap, want_jitter = timing_checks_ref(times, offsets, 0.05)
    np.testing.assert_allclose(gap.numpy(), want_gap, rtol=1e-9, atol=1e-6)
    np.testing.assert_allclose(jitter.numpy(), want_jitter, rtol=1e-9, atol=1e-6)


@pytest.mark.parametrize("stride,points", [(1.0, 5), (2.5, 7), (7.5, 64), (0.3, 3)])
def test_sample_every_matches_np_interp(stride, points):
    rng = seeded()
    lengths = rng.integers(1, 60, 9)
    offsets = np.concatenate([[0], np.cumsum(lengths)])
    x = rng.normal(size=(int(offsets[-1]), 3))
    got, ok = sample_every(torch.from_numpy(x), torch.from_numpy(offsets), stride, points)
    want, want_ok = sample_every_ref(x, offsets, stride, points)
    np.testing.assert_array_equal(ok.numpy(), want_ok)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)


def test_validation():
    x = torch.zeros(4, 2)
    off = torch.tensor([0, 4])
    b = torch.zeros(2)
    with pytest.raises(ShapeError, match="values"):
        stream_checks(torch.zeros(4), off, None, lo=b, hi=b, jump=b, still=b)
    with pytest.raises(DTypeError, match="values"):
        stream_checks(x.to(torch.int64), off, None, lo=b, hi=b, jump=b, still=b)
    with pytest.raises(ShapeError, match="offsets"):
        stream_checks(x, torch.tensor([0, 3]), None, lo=b, hi=b, jump=b, still=b)
    with pytest.raises(ShapeError, match="jump"):
        stream_checks(x, off, None, lo=b, hi=b, jump=torch.zeros(3), still=b)
    with pytest.raises(ShapeError, match="pad"):
        stream_checks(x, off, torch.zeros(3, dtype=torch.bool), lo=b, hi=b, jump=b, still=b)
    with pytest.raises(ShapeError, match="mask"):
        longest_runs(torch.zeros(4), off)
    with pytest.raises(ShapeError, match="times"):
        timing_checks(torch.zeros(4), off, 0.1)
    with pytest.raises(ShapeError, match="period"):
        timing_checks(torch.zeros(4, dtype=torch.float64), off, 0.0)
    with pytest.raises(ShapeError, match="stride"):
        sample_every(x, off, 0.0, 4)
    with pytest.raises(ShapeError, match="points"):
        sample_every(x, off, 1.0, 0)


@pytest.mark.gpu
def test_cuda_matches_cpu():
    rng = seeded()
    x, offsets, pad = _packed(rng, 64, 7, max_len=300)
    args = dict(lo=torch.full((7,), -2.5), hi=torch.full((7,), 2.5),
                jump=torch.full((7,), 4.0), still=torch.full((7,), 1e-3))
    cpu = stream_checks(torch.from_numpy(x), torch.from_numpy(offsets), torch.from_numpy(pad),
                        **args)
    gpu = stream_checks(torch.from_numpy(x).cuda(), torch.from_numpy(offsets).cuda(),
                        torch.from_numpy(pad).cuda(), **args)
    for a, b in zip(cpu, gpu, strict=True):
        torch.testing.assert_close(b.cpu(), a)
    off = torch.from_numpy(offsets)
    for a, b in zip(sample_every(torch.from_numpy(x).cuda(), off.cuda(), 2.5, 16),
                    sample_every(torch.from_numpy(x), off, 2.5, 16), strict=True):
        torch.testing.assert_close(a.cpu(), b, equal_nan=True)
