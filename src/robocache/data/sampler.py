"""Which samples each rank serves, epoch after epoch, resumable anywhere.

An epoch is one permutation of the samples (``randperm`` seeded by ``seed + epoch``, or the
samples in order), dealt round-robin to the ranks exactly as
``torch.utils.data.DistributedSampler`` deals it. Where an epoch stands is one number: how
many of its positions the ranks have served together (``consumed``; rank ``r`` of ``W`` serves
positions ``r, r + W, ...``, so after each rank served ``k`` samples, the first ``k * W``
positions are done). A position saved by any number of ranks resumes on any other number:
the positions after it are dealt round-robin to the new ranks, so within the epoch no sample is
served twice and none is skipped (padding aside: without ``drop_last`` the tail is padded by
repeating the epoch's first samples until it divides evenly, as ``DistributedSampler`` pads).

:class:`EpochSampler` is this as a ``torch.utils.data.Sampler`` of sample indices, for a
``DataLoader`` (or torchdata's ``StatefulDataLoader``, which saves and restores it through
``state_dict`` / ``load_state_dict``) over any dataset, e.g. :class:`robocache.LeRobotDataset`;
:class:`robocache.RobotLoader` deals its batches the same way.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import torch

from robocache.errors import DataError


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool) -> torch.Tensor:
    """The epoch's order of ``n`` samples: int64 ``[n]``."""
    if not shuffle:
        return torch.arange(n)
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))


def rank_share(order: torch.Tensor, consumed: int, rank: int, world_size: int,
               drop_last: bool) -> torch.Tensor:
    """Rank ``rank``'s samples of an epoch ``order`` whose first ``consumed`` positions were
    served: the rest dealt round-robin to ``world_size`` ranks, its tail dropped
    (``drop_last``) or padded by repeating the epoch's start so that it divides evenly.
    ``consumed = 0`` gives ``DistributedSampler``'s share."""
    n = order.numel()
    rest = max(n - consumed, 0)
    per_rank = rest // world_size if drop_last else -(-rest // world_size)
    end = consumed + per_rank * world_size
    if end > n:  # pad by repeating the start (as often as needed for tiny datasets)
        order = order.repeat(-(-end // max(n, 1)))
    return order[consumed:end][rank::world_size].contiguous()


def check_position(state: Mapping[str, Any], n: int) -> None:
    """Refuse a saved position that does not fit an epoch of ``n`` samples.

    Raises:
        DataError: a negative position, or one past the epoch's end.
    """
    consumed = int(state.get("consumed", -1))
    if not 0 <= consumed <= n or int(state.get("epoch", -1)) < 0:
        raise DataError(f"the saved position (epoch {state.get('epoch')}, {consumed} samples "
                        f"served) does not fit an epoch of {n} samples; resume with the same "
                        "dataset.")


class EpochSampler(torch.utils.data.Sampler[int]):
    """Sample indices of this rank's share of each epoch, resumable anywhere (see the module
    docstring).

    Args:
        size: the dataset, or its number of samples.
        shuffle: a new permutation each epoch (seeded by ``seed + epoch``); else in order.
        seed: the permutations' seed (every rank must pass the same).
        drop_last: drop the tail that does not divide evenly among the ranks (else pad it).
        rank, world_size: this process's share (default: from the initialized
            ``torch.distributed`` process group, else 0 and 1).

    ``set_epoch(e)`` before each epoch, as with ``DistributedSampler``. ``state_dict()``
    (saved with a checkpoint, on any rank: they agree) and ``load_state_dict`` restore the
    position; the iterator of an epoch is itself stateful, so torchdata's
    ``StatefulDataLoader`` saves exactly the samples its batches served.

    Raises:
        DataError: ``rank`` outside ``[0, world_size)``.
    """

    def __init__(self, size, *, shuffle: bool = True, seed: int = 0, drop_last: bool = False,
                 rank: int | None = None, world_size: int | None = None):
        dist = torch.distributed.is_available() and torch.distributed.is_initialized()
        self.n = size if isinstance(size, int) else len(size)
        self.rank = (torch.distributed.get_rank() if dist else 0) if rank is None else rank
        self.world_size = (torch.distributed.get_world_size() if dist else 1) \
            if world_size is None else world_size
        if not 0 <= self.rank < self.world_size:
            raise DataError(f"`rank` must be in [0, world_size); got rank={self.rank}, "
                            f"world_size={self.world_size}.")
        self.shuffle, self.seed, self.drop_last = shuffle, int(seed), drop_last
        self.epoch, self.consumed = 0, 0

    def set_epoch(self, epoch: int) -> None:
        """Serve epoch ``epoch`` next; a position restored in that epoch is kept."""
        if int(epoch) != self.epoch:
            self.epoch, self.consumed = int(epoch), 0

    def share(self) -> torch.Tensor:
        """This rank's remaining samples of the current epoch."""
        return rank_share(epoch_order(self.n, self.seed, self.epoch, self.shuffle),
                          self.consumed, self.rank, self.world_size, self.drop_last)

    def __len__(self) -> int:
        """This rank's samples in a whole epoch (as ``DistributedSampler``'s; an epoch
        resumed part-way serves fewer)."""
        n = self.n
        return n // self.world_size if self.drop_last else -(-n // self.world_size)

    def __iter__(self) -> Iterator[int]:
        return _EpochIterator(self)

    def state_dict(self) -> dict[str, Any]:
        """The position: ``epoch``, ``consumed`` (positions served by all ranks together),
        ``seed`` and ``size`` (checked on restore), ``world_size`` (the ranks that saved it)."""
        return {"epoch": self.epoch, "consumed": self.consumed, "seed": self.seed,
                "size": self.n, "world_size": self.world_size}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at ``state`` (from :meth:`state_dict`, saved by any number of ranks).

        Raises:
            DataError: a state of another seed or dataset size, or a position that does not
                fit the epoch.
        """
        for key, mine in (("seed", self.seed), ("size", self.n)):
            if key in state and int(state[key]) != mine:
                raise DataError(f"the sampler state was saved with {key}={state[key]}, this "
                                f"sampler has {mine}; build it with the same to resume.")
        check_position(state, self.n)
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])


class _EpochIterator(Iterator[int]):
    """One epoch of an :class:`EpochSampler`, stateful: its ``state_dict`` is the position
    after the samples it has yielded."""

    def __init__(self, sampler: EpochSampler):
        self.sampler = sampler
        self.start, self.yielded = sampler.consumed, 0
        self.indices = sampler.share().tolist()

    def __iter__(self) -> _EpochIterator:
        return self

    def __next__(self) -> int:
        if self.yielded >= len(self.indices):
            raise StopIteration
        self.yielded += 1
        self.sampler.consumed = self.position()
        return self.indices[self.yielded - 1]

    def position(self) -> int:
        return min(self.start + self.yielded * self.sampler.world_size, self.sampler.n)

    def state_dict(self) -> dict[str, Any]:
        return {**self.sampler.state_dict(), "consumed": self.position()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.sampler.load_state_dict(state)
        self.__init__(self.sampler)
