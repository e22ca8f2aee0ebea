"""RobotLoader under DDP: 2 CPU processes on gloo serve disjoint DistributedSampler shards."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from data_episodes import SPECS, make_episode
from torch.utils.data.distributed import DistributedSampler

from robocache.data import RobotDataset, RobotLoader
from robocache.data.cache import build
from robocache.data.formats.lerobot import write_lerobot
from robocache.errors import DataError

WORLD, BATCH, SEED = 2, 8, 5


def rank_main(rank: int, cache: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank,
                            world_size=WORLD)
    served = {}
    for drop_last in (True, False):
        loader = RobotLoader(RobotDataset(cache, keys=["observation.state", "action"]), BATCH,
                             device="cpu", seed=SEED, drop_last=drop_last)  # rank from the group
        assert loader.sampler.world_size == WORLD
        for epoch in (0, 1, 0):
            loader.set_epoch(epoch)
            idx = torch.cat([b["index"] for b in loader]) if len(loader) else torch.zeros(0)
            gathered = [None] * WORLD
            dist.all_gather_object(gathered, idx.tolist())
            served.setdefault(str(drop_last), []).append(gathered)
    if rank == 0:
        Path(out, "served.json").write_text(json.dumps(served))
    dist.destroy_process_group()


@pytest.fixture
def cache(tmp_path):
    import numpy as np

    rng = np.random.default_rng(3)
    write_lerobot(tmp_path / "src", [make_episode(i, rng, 1.0) for i in range(3)], SPECS,
                  fps=25.0)
    build(tmp_path / "src", tmp_path / "cache", rate_hz=23.0, progress=False, device="cpu")
    return tmp_path / "cache"


def test_two_ranks_serve_disjoint_deterministic_shards(tmp_path, cache):
    mp.spawn(rank_main, args=(str(cache), str(tmp_path)), nprocs=WORLD, join=True)
    served = json.loads((tmp_path / "served.json").read_text())
    n = len(RobotDataset(cache, keys=["action"]))
    assert n % (WORLD * BATCH) != 0  # so drop_last matters
    for drop_last, epochs in served.items():
        drop = drop_last == "True"
        for epoch, ranks in zip((0, 1, 0), epochs, strict=True):
            for r, idx in enumerate(ranks):  # exactly DistributedSampler's shard, batched
                ds = DistributedSampler(range(n), WORLD, r, shuffle=True, seed=SEED,
                                        drop_last=drop)
                ds.set_epoch(epoch)
                want = list(ds)
                assert idx == (want[:len(want) // BATCH * BATCH] if drop else want)
            flat = [i for idx in ranks for i in idx]
            if drop:  # no sample twice
                assert len(set(flat)) == len(flat)
                assert len(flat) == WORLD * (n // WORLD // BATCH * BATCH)
            else:  # none missed; only the padding repeats
                assert set(flat) == set(range(n))
                assert len(flat) - n == -n % WORLD
        assert epochs[0] == epochs[2] and epochs[0] != epochs[1]


def test_rank_is_checked(cache):
    with pytest.raises(DataError, match="`rank`"):
        RobotLoader(RobotDataset(cache, keys=["action"]), 4, device="cpu", rank=2,
                    world_size=2)


def test_set_epoch_keeps_a_restored_position(cache):
    def loader():
        return RobotLoader(RobotDataset(cache, keys=["action"]), 4, device="cpu", seed=SEED,
                           rank=1, world_size=2)

    full = loader()
    full.set_epoch(3)
    want = [b["index"] for b in full]
    first = loader()
    first.set_epoch(3)
    head = [b["index"] for _, b in zip(range(2), first, strict=False)]
    again = loader()
    again.load_state_dict(first.state_dict())
    again.set_epoch(3)  # the usual loop head after a restore: the position stays
    tail = [b["index"] for b in again]
    assert all(torch.equal(a, b) for a, b in zip(want, head + tail, strict=True))
