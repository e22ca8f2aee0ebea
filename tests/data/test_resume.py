"""Resume anywhere: a position saved by any number of ranks continues on any other, with no
sample of the epoch served twice or skipped (RobotLoader, a mixture's draws, EpochSampler under
torchdata's StatefulDataLoader)."""

from __future__ import annotations

import pytest
import torch
from data_episodes import SPECS, make_episode
from torch.utils.data.distributed import DistributedSampler

from robocache import EpochSampler
from robocache.data import MixedDataset, RobotDataset, RobotLoader
from robocache.data.cache import build
from robocache.data.formats.lerobot import write_lerobot
from robocache.errors import DataError


@pytest.fixture(scope="module")
def caches(tmp_path_factory):
    import numpy as np

    out = []
    for k, n in enumerate((5, 7)):
        root = tmp_path_factory.mktemp(f"resume{k}")
        rng = np.random.default_rng(k)
        write_lerobot(root / "src", [make_episode(i, rng) for i in range(n)], SPECS, fps=25.0,
                      version="v3.0")
        build(root / "src", root / "c", rate_hz=25.0, progress=False, device="cpu")
        out.append(root / "c")
    return out


def served(loaders, batches=None):
    """Each rank's batches in lockstep (as DDP steps them): every rank's indices, in order."""
    its = [iter(lo) for lo in loaders]
    got = [[] for _ in loaders]
    k = 0
    while batches is None or k < batches:
        step = [next(it, None) for it in its]
        if any(b is None for b in step):
            assert all(b is None for b in step)  # ranks never disagree on the batch count
            break
        for r, b in enumerate(step):
            got[r].append(torch.stack([b.get("source", torch.zeros_like(b["index"])),
                                       b["index"]], 1))
        k += 1
    return [torch.cat(g) if g else torch.zeros(0, 2, dtype=torch.int64) for g in got]


def loaders(data, world, batch=4, **kw):
    return [RobotLoader(data, batch, device="cpu", seed=3, normalize=None, rank=r,
                        world_size=world, **kw) for r in range(world)]


@pytest.mark.parametrize("before,after", [(4, 3), (2, 5), (3, 1), (1, 2)])
@pytest.mark.parametrize("drop_last", [True, False])
def test_a_position_saved_on_some_ranks_resumes_on_others(caches, before, after, drop_last):
    ds = RobotDataset(caches[0], keys=["action"])
    first = loaders(ds, before, drop_last=drop_last)
    for lo in first:
        lo.set_epoch(2)
    head = served(first, batches=3)
    states = [lo.state_dict() for lo in first]
    assert all(s["consumed"] == states[0]["consumed"] for s in states)  # ranks agree
    second = loaders(ds, after, drop_last=drop_last)
    for lo in second:
        lo.load_state_dict(states[0])
        lo.set_epoch(2)  # the usual loop head after a restore: the position stays
    tail = served(second)
    got = torch.cat([*head, *tail])[:, 1].tolist()
    order = torch.randperm(len(ds), generator=torch.Generator().manual_seed(3 + 2)).tolist()
    consumed, rest = states[0]["consumed"], len(ds) - states[0]["consumed"]
    assert got[:consumed] == order[:consumed] or sorted(got[:consumed]) == sorted(
        order[:consumed])  # the head: the epoch's first positions, dealt to `before` ranks
    if drop_last:  # each rank's tail that does not make a whole batch is dropped
        assert len(set(got)) == len(got)
        assert len(got) == consumed + rest // after // 4 * 4 * after
    else:  # every sample served; only the padding of the last round repeats
        assert set(got) == set(range(len(ds)))
        assert len(got) == consumed + -(-rest // after) * after
    for lo in second:  # the next epoch is a whole one again, DistributedSampler's shard
        lo.set_epoch(3)
    nxt = served(second)
    for r, idx in enumerate(nxt):
        sampler = DistributedSampler(range(len(ds)), after, r, shuffle=True, seed=3,
                                     drop_last=drop_last)
        sampler.set_epoch(3)
        want = list(sampler)
        want = want[:len(want) // 4 * 4] if drop_last else want
        assert idx[:, 1].tolist() == want


def test_the_same_ranks_resume_exactly(caches):
    ds = RobotDataset(caches[1], keys=["action"])
    full = served(loaders(ds, 2))
    first = loaders(ds, 2)
    head = served(first, batches=2)
    again = loaders(ds, 2)
    for lo in again:
        lo.load_state_dict(first[0].state_dict())
    tail = served(again)
    for r in range(2):
        assert torch.equal(full[r], torch.cat([head[r], tail[r]]))


def test_a_mixture_continues_its_draws_on_another_number_of_ranks(caches):
    mixed = MixedDataset([RobotDataset(c, keys=["action"]) for c in caches], weights=[1, 3])
    whole = served(loaders(mixed, 1, batch=12))[0]
    first = loaders(mixed, 3, batch=4)  # the same 12 draws a global batch
    head = served(first, batches=2)
    second = loaders(mixed, 2, batch=6)
    for lo in second:
        lo.load_state_dict(first[0].state_dict())
    tail = served(second)
    batches = [torch.cat([h[4 * k:4 * (k + 1)] for h in head]) for k in range(2)] + \
        [torch.cat([t[6 * k:6 * (k + 1)] for t in tail]) for k in range(len(tail[0]) // 6)]
    assert len(batches) == len(whole) // 12
    for k, got in enumerate(batches):  # each global batch: the same draws (grouped by source)
        want = whole[12 * k:12 * (k + 1)]
        assert sorted(map(tuple, got.tolist())) == sorted(map(tuple, want.tolist()))


def test_a_state_that_does_not_fit_is_refused(caches):
    ds = RobotDataset(caches[0], keys=["action"])
    lo = RobotLoader(ds, 4, device="cpu", seed=3)
    with pytest.raises(DataError, match="seed=9"):
        lo.load_state_dict({**lo.state_dict(), "seed": 9})
    with pytest.raises(DataError, match="does not fit an epoch"):
        lo.load_state_dict({**lo.state_dict(), "consumed": len(ds) + 1})
    with pytest.raises(DataError, match="does not fit an epoch"):
        EpochSampler(10).load_state_dict({"epoch": 0, "consumed": -1})
    with pytest.raises(DataError, match="size=12"):
        EpochSampler(10).load_state_dict({"epoch": 0, "consumed": 0, "size": 12})
    with pytest.raises(DataError, match="`rank`"):
        EpochSampler(10, rank=2, world_size=2)


def test_epoch_sampler_is_distributed_samplers_shard():
    for world, drop in ((1, False), (3, False), (3, True), (4, True)):
        for r in range(world):
            s, want = EpochSampler(10, seed=7, rank=r, world_size=world, drop_last=drop), \
                DistributedSampler(range(10), world, r, shuffle=True, seed=7, drop_last=drop)
            s.set_epoch(5)
            want.set_epoch(5)
            assert list(s) == list(want) and len(s) == len(want)


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumes_an_epoch_sampler_on_other_ranks(workers):
    """torchdata's StatefulDataLoader saves what its batches served (its prefetching workers
    ahead of that), and the position resumes on another number of ranks."""
    tdl = pytest.importorskip("torchdata.stateful_dataloader",
                              reason="needs torchdata (pip install torchdata)")
    data = list(range(50))

    def make(rank, world, state=None):
        sampler = EpochSampler(data, seed=1, rank=rank, world_size=world)
        loader = tdl.StatefulDataLoader(data, batch_size=3, sampler=sampler,
                                        num_workers=workers)
        if state is not None:
            loader.load_state_dict(state)
        return loader

    first = [make(r, 2) for r in range(2)]
    its = [iter(lo) for lo in first]
    head = [[next(it).tolist() for _ in range(4)] for it in its]
    state = first[0].state_dict()
    del its
    tail = [[b.tolist() for b in make(r, 3, state)] for r in range(3)]
    got = [i for part in head + tail for b in part for i in b]
    assert sorted(got) == sorted(data + got[len(data):]) and set(got) == set(data)
    assert len(got) - len(data) < 3  # only the padding of the last round repeats
