"""robocache.windows against a plain-Python loop (episodes shorter than the window included),
the Triton gather kernel against the reference, and the validation rules."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import seeded

import robocache
from robocache.errors import DataError, DTypeError, ShapeError
from robocache.kernels.windows import windows_cuda
from robocache.reference.windows import windows_ref


def _episodes(rng, n, max_len):
    lengths = rng.integers(1, max_len + 1, n)
    lengths[rng.integers(n)] = 1  # an episode shorter than any window
    return np.concatenate([[0], np.cumsum(lengths)])


def _python_loop(data, offsets, indices, rel, zero):
    """The obvious per-window, per-row loop."""
    values = np.zeros((len(indices), len(rel), data.shape[1]), dtype=data.dtype)
    pads = np.zeros((len(indices), len(rel)), dtype=bool)
    for m, r in enumerate(indices):
        e = max(i for i in range(len(offsets) - 1) if offsets[i] <= r < offsets[i + 1])
        lo, hi = offsets[e], offsets[e + 1] - 1
        for k, o in enumerate(rel):
            row = r + o
            pads[m, k] = row < lo or row > hi
            values[m, k] = 0 if (pads[m, k] and zero) else data[min(max(row, lo), hi)]
    return values, pads


@pytest.mark.parametrize("pad", ["edge", "zero"])
@pytest.mark.parametrize("history,horizon", [(1, 0), (2, 16), (5, 3), (0, 7)])
def test_matches_python_loop(pad, history, horizon):
    rng = seeded()
    offsets = _episodes(rng, 9, 30)
    data = rng.standard_normal((offsets[-1], 6)).astype(np.float32)
    idx = rng.integers(0, offsets[-1], 40)
    w = robocache.windows(torch.tensor(data), torch.tensor(offsets), torch.tensor(idx),
                          history=history, horizon=horizon, pad=pad)
    rel = list(range(1 - history, 1)) + list(range(horizon))
    values, pads = _python_loop(data, offsets, idx, rel, pad == "zero")
    np.testing.assert_array_equal(w.history.numpy(), values[:, :history])
    np.testing.assert_array_equal(w.horizon.numpy(), values[:, history:])
    np.testing.assert_array_equal(w.history_is_pad.numpy(), pads[:, :history])
    np.testing.assert_array_equal(w.horizon_is_pad.numpy(), pads[:, history:])


def test_offsets_and_given_episodes():
    rng = seeded()
    offsets = _episodes(rng, 5, 20)
    data = torch.tensor(rng.integers(0, 100, (offsets[-1], 2)))  # integer data works too
    idx = rng.integers(0, offsets[-1], 17)
    eps = np.searchsorted(offsets, idx, side="right") - 1
    rel = [-3, 0, 2, 10]
    w = robocache.windows(data, torch.tensor(offsets), torch.tensor(idx), offsets=rel,
                          episodes=torch.tensor(eps))
    values, pads = _python_loop(data.numpy(), offsets, idx, rel, False)
    np.testing.assert_array_equal(w.history.numpy(), values)
    np.testing.assert_array_equal(w.history_is_pad.numpy(), pads)
    assert w.horizon.shape == (17, 0, 2)


@pytest.mark.parametrize("zero", [False, True])
@pytest.mark.parametrize("given", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_kernel_matches_reference(kernel_device, zero, given, dtype):
    rng = seeded()
    offsets = torch.tensor(_episodes(rng, 13, 25))
    data = torch.tensor(rng.standard_normal((int(offsets[-1]), 37)) * 10).to(dtype)
    idx = torch.tensor(rng.integers(0, int(offsets[-1]), 45))
    eps = torch.searchsorted(offsets, idx, right=True) - 1 if given else None
    rel = torch.tensor([-2, -1, 0, 0, 1, 2, 5])
    ref, ref_pad = windows_ref(data, offsets, idx, rel, zero, eps)
    dev = kernel_device
    out0 = torch.zeros(45, 3, 37, dtype=dtype, device=dev) - 7
    out1 = torch.zeros(45, 4, 37, dtype=dtype, device=dev) - 7
    pad0 = torch.zeros(45, 3, dtype=torch.bool, device=dev)
    pad1 = torch.ones(45, 4, dtype=torch.bool, device=dev)
    windows_cuda(data.to(dev), offsets.to(dev), idx.to(dev),
                 None if eps is None else eps.to(dev), rel.to(dev), 3, out0, out1, pad0, pad1,
                 zero)
    torch.testing.assert_close(torch.cat([out0, out1], 1).cpu(), ref, rtol=0, atol=0)
    assert torch.equal(torch.cat([pad0, pad1], 1).cpu(), ref_pad)


@pytest.mark.gpu
def test_cuda_large_graph_and_compile():
    rng = seeded()
    offsets = torch.tensor(_episodes(rng, 500, 400)).cuda()
    data = torch.randn(int(offsets[-1]), 32, device="cuda")
    idx = torch.randint(0, int(offsets[-1]), (65536,), device="cuda")
    w = robocache.windows(data, offsets, idx, history=2, horizon=16)
    c = robocache.windows(data.cpu(), offsets.cpu(), idx.cpu(), history=2, horizon=16)
    for a, b in zip(w, c, strict=True):
        assert torch.equal(a.cpu(), b)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g = robocache.windows(data, offsets, idx, history=2, horizon=16)
    graph.replay()
    assert torch.equal(g.horizon, w.horizon)
    f = torch.compile(lambda i: robocache.windows(data, offsets, i, history=2, horizon=16).horizon,
                      fullgraph=True)
    assert torch.equal(f(idx), w.horizon)


def test_traces_fullgraph_on_cpu():
    data, offsets = torch.randn(50, 3), torch.tensor([0, 20, 50])
    idx = torch.tensor([0, 19, 20, 49])
    f = torch.compile(lambda i: robocache.windows(data, offsets, i, history=2, horizon=3),
                      fullgraph=True, backend="aot_eager")
    for a, b in zip(f(idx), robocache.windows(data, offsets, idx, history=2, horizon=3),
                    strict=True):
        assert torch.equal(a, b)


def test_empty_indices():
    w = robocache.windows(torch.randn(10, 3), torch.tensor([0, 10]),
                          torch.empty(0, dtype=torch.int64), history=2, horizon=4)
    assert w.history.shape == (0, 2, 3) and w.horizon_is_pad.shape == (0, 4)


@pytest.mark.parametrize("args,kwargs,exc,match", [
    ((torch.randn(10), torch.tensor([0, 10]), torch.tensor([1])), {}, ShapeError, r"\[total, D\]"),
    ((torch.randn(10, 2), torch.tensor([0.0, 10.0]), torch.tensor([1])), {}, DTypeError,
     "episode_offsets"),
    ((torch.randn(10, 2), torch.tensor([0, 10]), torch.tensor([1.0])), {}, DTypeError, "indices"),
    ((torch.randn(10, 2), torch.tensor([0, 10]), torch.tensor([1])), {"history": -1},
     ValueError, "history"),
    ((torch.randn(10, 2), torch.tensor([0, 10]), torch.tensor([1])), {"history": 0},
     ValueError, "nothing to gather"),
    ((torch.randn(10, 2), torch.tensor([0, 10]), torch.tensor([1])), {"pad": "wrap"},
     ValueError, "pad"),
    ((torch.randn(10, 2), torch.tensor([0, 6, 4, 10]), torch.tensor([1])), {}, DataError,
     "decreases"),
    ((torch.randn(10, 2), torch.tensor([0, 9]), torch.tensor([1])), {}, DataError, "end at"),
    ((torch.randn(10, 2), torch.tensor([0, 10]), torch.tensor([10])), {}, DataError,
     r"\[0, total\)"),
    ((torch.randn(10, 2), torch.tensor([0, 4, 10]), torch.tensor([5])),
     {"episodes": torch.tensor([0])}, DataError, "outside its episode"),
    ((torch.randn(10, 2), torch.tensor([0, 10]), torch.tensor([1])), {"offsets": []},
     ValueError, "empty"),
])
def test_bad_input(args, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        robocache.windows(*args, **kwargs)


KEYS = {"state": (0, 5, [-2, -1, 0]), "gripper": (5, 1, [-1, 0, 3]),
        "action": (6, 3, list(range(7))), "image_row": (9, 2, [0])}


def _key_args(rng, dtype=np.float32, keys=KEYS):
    offsets = _episodes(rng, 7, 20)
    width = max(c + w for c, w, _ in keys.values())
    data = (rng.standard_normal((offsets[-1], width)) * 100).astype(dtype)
    idx = rng.integers(0, offsets[-1], 37)
    return (data, offsets, idx, {k: (c, w) for k, (c, w, _) in keys.items()},
            {k: o for k, (_, _, o) in keys.items()})


@pytest.mark.parametrize("pad", ["edge", "zero"])
def test_key_windows_match_python_loop(pad):
    rng = seeded()
    data, offsets, idx, cols, rels = _key_args(rng)
    w = robocache.key_windows(torch.tensor(data), torch.tensor(offsets), torch.tensor(idx),
                              cols, rels, pad=pad)
    for k, (c, width) in cols.items():
        values, pads = _python_loop(data[:, c:c + width], offsets, idx, rels[k], pad == "zero")
        np.testing.assert_array_equal(w[k].numpy(), values)
        np.testing.assert_array_equal(w[f"{k}_is_pad"].numpy(), pads)


# 16-byte aligned keys (columns and widths multiples of 4): the kernel's vectorized path
ALIGNED = {"state": (0, 8, [-1, 0]), "action": (8, 4, list(range(5))), "env": (16, 4, [-3, 0])}


@pytest.mark.parametrize("keys", [KEYS, ALIGNED], ids=["mixed", "aligned"])
@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.int64, np.float16])
@pytest.mark.parametrize("with_episodes", [False, True])
@pytest.mark.parametrize("pad", ["edge", "zero"])
def test_key_windows_kernel_matches_reference(kernel_device, keys, dtype, with_episodes, pad):
    from robocache.kernels.windows import key_windows_cuda
    from robocache.ops.windows import _key_plan, _split, _views
    from robocache.reference.windows import key_windows_ref

    rng = seeded()
    data, offsets, idx, cols, rels = _key_args(rng, dtype, keys)
    dev = kernel_device
    d, o, i = (torch.tensor(x, device=dev) for x in (data, offsets, idx))
    eps = torch.searchsorted(o, i, right=True) - 1 if with_episodes else None
    plan = _key_plan(cols, {k: tuple(v) for k, v in rels.items()})
    out = torch.full((len(idx) * plan.n_values,), 7, dtype=d.dtype, device=dev)  # poisoned
    pads = torch.ones(len(idx) * plan.n_pads, dtype=torch.bool, device=dev)
    # small blocks: several window blocks (the last one partial) and value-position blocks
    key_windows_cuda(d, o, i, eps, torch.tensor(plan.table, dtype=torch.int32, device=dev),
                     plan.n_values, plan.n_pads, plan.align, out, pads, pad == "zero",
                     block_m=16, block_p=32)
    got = _split(out, pads, _views(len(idx), plan.layout))
    want = key_windows_ref(d.cpu(), o.cpu(), i.cpu(), list(cols.values()), list(rels.values()),
                           pad == "zero")
    for k, (values, is_pad) in zip(cols, want, strict=True):
        torch.testing.assert_close(got[k].cpu(), values, rtol=0, atol=0)
        assert torch.equal(got[f"{k}_is_pad"].cpu(), is_pad)


@pytest.mark.gpu
def test_key_windows_cuda_large_matches_cpu():
    """Vectorized (aligned) and scalar layouts at training scale, episode search included."""
    rng = seeded()
    offsets = torch.tensor(_episodes(rng, 500, 400))
    data = torch.randn(int(offsets[-1]), 84)
    idx = torch.randint(0, int(offsets[-1]), (65536,))
    for cols in ({"a": (0, 32), "b": (32, 32), "c": (64, 16)},
                 {"a": (1, 31), "b": (32, 33), "c": (70, 14)}):
        offs = {"a": [-1, 0], "b": list(range(16)), "c": [-4, -2, 0]}
        for pad in ("edge", "zero"):
            w = robocache.key_windows(data.cuda(), offsets.cuda(), idx.cuda(), cols, offs,
                                      pad=pad)
            c = robocache.key_windows(data, offsets, idx, cols, offs, pad=pad)
            for k in c:
                assert torch.equal(w[k].cpu(), c[k]), k


def test_key_windows_compiles():
    rng = seeded()
    data, offsets, idx, cols, rels = _key_args(rng)
    args = (torch.tensor(data), torch.tensor(offsets), torch.tensor(idx))
    compiled = torch.compile(lambda *a: robocache.key_windows(*a, cols, rels), fullgraph=True,
                             backend="eager")
    got, want = compiled(*args), robocache.key_windows(*args, cols, rels)
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k])


def test_key_windows_validation():
    rng = seeded()
    data, offsets, idx, cols, rels = _key_args(rng)
    args = (torch.tensor(data), torch.tensor(offsets), torch.tensor(idx))
    with pytest.raises(ValueError, match=r"offsets\['state'\]"):
        robocache.key_windows(*args, cols, {**rels, "state": []})
    with pytest.raises(ValueError, match=r"offsets\['gripper'\]"):
        robocache.key_windows(*args, cols, {"state": [0]})
    with pytest.raises(ValueError, match=r"columns\['state'\]"):
        robocache.key_windows(*args, {**cols, "state": (8, 5)}, rels)
    with pytest.raises(ValueError, match="columns"):
        robocache.key_windows(*args, {}, rels)
    with pytest.raises(ValueError, match=r"offsets\['state'\].*2\*\*31"):
        robocache.key_windows(*args, cols, {**rels, "state": [-2**31]})


def test_key_layout_cache_revalidates_what_it_has_not_seen():
    """Calls are looked up by the arguments as given (tensor metadata, layout, pad); a call
    that differs in any key, column or offset (or a malformed one) is validated again."""
    from robocache.ops import windows as W

    data, offs, idx = torch.zeros(10, 6), torch.tensor([0, 4, 10]), torch.tensor([0, 5])
    cols, rels = {"s": (0, 2), "a": (2, 4)}, {"s": [-1, 0], "a": range(3)}
    W._KEY_CALLS.clear()
    first = robocache.key_windows(data, offs, idx, cols, rels)
    again = robocache.key_windows(data, offs, idx, dict(cols), {"s": (-1, 0), "a": [0, 1, 2]})
    assert len(W._KEY_CALLS) == 1 and all(torch.equal(first[k], again[k]) for k in first)
    with pytest.raises(ValueError, match="inside data's 6 columns"):
        robocache.key_windows(data, offs, idx, {"s": (0, 2), "a": (2, 5)}, rels)
    with pytest.raises(ValueError, match="missing or empty"):
        robocache.key_windows(data, offs, idx, cols, {"s": [-1, 0]})
    with pytest.raises(ValueError, match="missing or empty"):
        robocache.key_windows(data, offs, idx, cols, {"s": [-1, 0], "a": []})
    with pytest.raises(TypeError, match="episode_offsets"):
        robocache.key_windows(data, [0, 4, 10], idx, cols, rels)
    assert len(W._KEY_CALLS) == 1


def test_launchers_read_strided_index_tensors(kernel_device):
    """Index tensors that are views with a stride (every third window) gather the same windows
    as their contiguous copies."""
    from robocache.kernels.windows import key_windows_cuda
    from robocache.ops.windows import _key_plan_on

    data = torch.randn(40, 6, device=kernel_device)
    offs = torch.tensor([0, 0, 7, 7, 19, 19, 40], device=kernel_device)[::2]
    idx = torch.arange(40, device=kernel_device)[::3]
    M, rel = idx.shape[0], torch.tensor([-2, 0, 1, 3], device=kernel_device)
    got = [torch.full((M, 2, 6), float("nan"), device=kernel_device),
           torch.full((M, 2, 6), float("nan"), device=kernel_device),
           torch.ones(M, 2, dtype=torch.bool, device=kernel_device),
           torch.ones(M, 2, dtype=torch.bool, device=kernel_device)]
    windows_cuda(data, offs, idx, None, rel, 2, *got, False)
    values, is_pad = windows_ref(data.cpu(), offs.cpu(), idx.cpu(), rel.cpu(), False, None)
    assert torch.equal(got[0].cpu(), values[:, :2]) and torch.equal(got[1].cpu(), values[:, 2:])
    assert torch.equal(got[2].cpu(), is_pad[:, :2]) and torch.equal(got[3].cpu(), is_pad[:, 2:])
    plan, table = _key_plan_on({"a": (0, 2), "b": (2, 4)}, {"a": (-1, 0), "b": (0, 1, 2)},
                               data.device)
    outs = []
    for o, i in ((offs, idx), (offs.contiguous(), idx.contiguous())):
        out = torch.full((M * plan.n_values,), float("nan"), device=kernel_device)
        pads = torch.ones(M * plan.n_pads, dtype=torch.bool, device=kernel_device)
        key_windows_cuda(data, o, i, None, table, plan.n_values, plan.n_pads, plan.align, out,
                         pads, False)
        outs.append((out, pads))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])
