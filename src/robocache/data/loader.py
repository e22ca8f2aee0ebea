"""GPU batches from one or several caches: sampling, transfer, normalization on the device.

    >>> loader = RobotLoader(RobotDataset(cache, history=2, horizon=16), batch_size=256)
    >>> for batch in loader: ...                 # dict of CUDA tensors, normalized

Two ways to assemble a batch:

- **resident** (``num_workers=0``): the packed cache is copied to the device (GPU) and
  normalized there once; each batch is a :func:`robocache.windows` gather, replayed from a CUDA
  graph on GPUs. Nothing crosses PCIe but the epoch's order. On the CPU the same, in process.
- **workers** (``num_workers > 0``): a torch ``DataLoader`` whose workers gather windows
  on the CPU (workers never initialize CUDA) as a few packed tensors, into pinned memory; the
  loader copies them with ``non_blocking=True`` and splits keys and masks on the device.

Either way the next batch is prepared on a side CUDA stream while the current one is in use
(the consumer's stream waits on an event, tensors are ``record_stream``-ed), and normalization
(:class:`robocache.Normalizer`, per source cache) runs on the GPU: once over the resident cache,
or per batch after the copy. Resident batches with camera keys are prepared on a background
thread, :data:`CAMERA_PREFETCH` batches ahead: nvJPEG's batched decode blocks its calling
thread until the frames are decoded, and on the consumer's thread that wait would keep the
training step from being queued. Their side stream is high-priority, so the feed's kernels are
not queued behind the training's (H100, ResNet-18 on two 480x640 cameras at batch 64: GPU busy
79 % -> 82 %; fetching four batches in one nvJPEG call measured 76 % and is not done).
"""

from __future__ import annotations

import collections
import copy
import gc
import math
import os
import queue
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from robocache.data.dataset import Batch, RobotDataset, _Key
from robocache.data.frames import stack
from robocache.data.relative import PerSource
from robocache.data.sampler import check_position, epoch_order, rank_share
from robocache.errors import DataError
from robocache.observability import metrics


class MixedDataset:
    """Several caches (robots with different rates and dimensions) sampled with weights.

    Each batch element picks its source with probability ``weights[i] / sum(weights)`` and a
    step uniformly inside it (with replacement), as Octo / Open X-Embodiment mixtures do. Each
    source is normalized with its own stats (on the batch's device), then the batch is merged:

    - ``source``: int64 ``[B]``, the dataset id (an index into ``names``); a batch is grouped by
      source.
    - a key whose feature width differs between sources is zero-padded to the widest, with
      ``<key>_dim_mask`` (bool ``[B, D]``, True on the sample's own dimensions);
    - a key some sources lack is zeros there, with ``<key>_is_pad`` all True.

    Args:
        datasets: the sources.
        weights: non-negative sampling weights, one per source; default ``size ** temperature``
            (sizes in samples).
        temperature: exponent on sizes when ``weights`` is not given: 1 samples by size, 0
            uniformly over sources, in between flattens the mixture.
        names: one name per source (default: each cache's folder name).
        widths: numeric keys served at a fixed width (openpi's 32-D state and action), at
            least every source's, zero-padded with ``<key>_dim_mask``; other keys are padded
            to their widest source's width where widths differ.

    Attributes:
        language: the :class:`robocache.data.language.Language` tables the loader serves each
            batch's strings from (and tokens, when made with a tokenizer): the prompt
            (``task``) first, then any string streams; :meth:`from_config` sets them.

    Raises:
        DataError: no datasets, a key that is an action in one source and an observation in
            another, image keys of different shapes, weights that are negative, not finite,
            all zero or of the wrong length, or a width narrower than a source's.
    """

    def __init__(self, datasets: Sequence[RobotDataset], weights: Sequence[float] | None = None,
                 *, temperature: float = 1.0, names: Sequence[str] | None = None,
                 widths: Mapping[str, int] | None = None):
        self.datasets = list(datasets)
        if not self.datasets:
            raise DataError("`datasets` is empty; pass at least one RobotDataset.")
        roles = {}
        for d in self.datasets:
            for k in d.keys:
                role = "action" if k in d.action_keys else "observation"
                if roles.setdefault(k, role) != role:
                    raise DataError(f"key {k!r} is an action in one dataset and an observation "
                                    "in another; pass the same `action_keys` to each.")
        windows = {(d.history, d.horizon if d.action_keys else None) for d in self.datasets}
        if len({w[0] for w in windows}) > 1 or len({w[1] for w in windows} - {None}) > 1:
            raise DataError("every dataset must use the same `history` and `horizon`; got "
                            f"{sorted(windows, key=str)}.")
        history = self.datasets[0].history
        horizon = max(d.horizon for d in self.datasets)
        # per key: (window length, *feature shape at its widest), dtype
        self.shapes: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
        dims = [d.describe()["dims"] for d in self.datasets]
        for d, dim in zip(self.datasets, dims, strict=True):
            for k in d.keys:
                steps = horizon if roles[k] == "action" else history
                if k in d.image_keys:
                    served, dtype = d.camera_shape(k)
                    shape = (steps, *served)
                    if self.shapes.setdefault(k, (shape, dtype)) != (shape, dtype):
                        raise DataError(f"image key {k!r} is served as {self.shapes[k][0][1:]} "
                                        f"in one dataset and {shape[1:]} ({dtype}) in another; "
                                        "pass the same `image_size` / `image_dtype`.")
                    continue
                width = max(dim[k], self.shapes.get(k, ((0,), None))[0][-1])
                dtype = d.layout[k].dtype
                if self.shapes.setdefault(k, ((steps, width), dtype))[1] != dtype:
                    raise DataError(f"key {k!r} is {self.shapes[k][1]} in one dataset and "
                                    f"{dtype} in another; cache it with one dtype.")
                self.shapes[k] = ((steps, width), dtype)
        # numeric keys whose width differs between sources (or that some lack) get a dim mask
        cameras = {k for d in self.datasets for k in d.image_keys}
        self.dim_masked = {k for k in self.shapes if k not in cameras
                           and len({dim.get(k) for dim in dims}) > 1}
        for k, w in (widths or {}).items():
            if k not in self.shapes or k in cameras:
                raise DataError(f"`widths` names {k!r}, which is not a numeric key of the "
                                f"mixture; its numeric keys: {sorted(set(self.shapes) - cameras)}.")
            (steps, widest), dtype = self.shapes[k]
            if not (isinstance(w, int) and w >= widest):
                raise DataError(f"`widths[{k!r}]` must be an integer >= {widest} (the widest "
                                f"source's width); got {w!r}.")
            self.shapes[k] = ((steps, w), dtype)
            self.dim_masked.add(k)
        self.language: list = []
        self.config = None  # the resolved mixture file (robocache.data.mixture.Mixture)
        self.keys = list(roles)
        self.action_keys = [k for k, r in roles.items() if r == "action"]
        self.names = list(names) if names is not None else [d.location.name for d in
                                                             self.datasets]
        if len(self.names) != len(self.datasets):
            raise DataError(f"`names` must have {len(self.datasets)} entries; got "
                            f"{len(self.names)}.")
        if weights is None:
            if not math.isfinite(temperature) or temperature < 0:
                raise DataError(f"`temperature` must be a finite number >= 0; got "
                                f"{temperature}.")
            weights = [float(len(d)) ** temperature for d in self.datasets]
        w = [float(x) for x in weights]
        if len(w) != len(self.datasets) or not all(math.isfinite(x) and x >= 0 for x in w) \
                or sum(w) <= 0:
            raise DataError(f"`weights` must be {len(self.datasets)} finite non-negative numbers "
                            f"with a positive sum; got {w}.")
        self.weights = torch.tensor(w, dtype=torch.float64) / sum(w)

    @classmethod
    def from_config(cls, path: str | Path, **overrides) -> MixedDataset:
        """The mixture a YAML file describes (datasets, key mapping onto a common schema,
        action encodings, weights or balancing, padding widths, language): see
        :mod:`robocache.data.mixture` and docs/mixtures.md.

        Args:
            path: the mixture file.
            **overrides: its top-level settings (``history``, ``horizon``, ``balance``,
                ``pad``, ``max_length``), ``tokenizer`` (a Hugging Face tokenizer: batches
                then carry token ids), or :class:`RobotDataset` keywords given to every
                source (``image_size``, ``image_dtype``, ``in_memory``...).

        Raises:
            DataError: one line naming the file, the dataset and the fix, before any data is
                read (see :func:`robocache.data.mixture.resolve`).
        """
        from robocache.data.mixture import open_mixture

        return open_mixture(path, **overrides)

    def __len__(self) -> int:
        return sum(len(d) for d in self.datasets)


def _generator(*key: int) -> torch.Generator:
    """A generator seeded by integers (int tuples hash the same in every process)."""
    return torch.Generator().manual_seed(hash(key) & ((1 << 63) - 1))


class _Sampler(torch.utils.data.Sampler):
    """Batches of (source, indices) parts for one rank of ``world_size``, from position
    ``consumed`` of epoch ``epoch`` (samples served by all ranks together; see
    :mod:`robocache.data.sampler`: a position saved by any number of ranks resumes on any
    other).

    One source: an epoch is a permutation seeded by ``seed + epoch``, dealt round-robin to the
    ranks exactly as ``torch.utils.data.DistributedSampler`` does (``drop_last``: the tail that
    does not divide evenly among the ranks is dropped; otherwise it is padded by repeating the
    start, so every sample is served and only the padding twice). A mixture: an epoch is a
    stream of draws (source, step), position ``j`` drawn in block ``j // BLOCK`` from a
    generator seeded by ``(seed, epoch, block)`` (a few tensor ops per block, not per batch);
    global batch ``k`` is positions ``consumed + k * batch_size * world_size`` on, each rank
    taking its slice, so any batch is rebuilt without replaying more than its blocks, whatever
    the number of ranks (the resident path draws the whole epoch at its start,
    :meth:`order`)."""

    BLOCK = 1 << 14

    def __init__(self, data: RobotDataset | MixedDataset, batch_size: int, shuffle: bool,
                 drop_last: bool, seed: int, rank: int = 0, world_size: int = 1):
        self.data, self.batch_size = data, batch_size
        self.shuffle, self.drop_last, self.seed = shuffle, drop_last, seed
        self.rank, self.world_size = rank, world_size
        self.epoch, self.consumed = 0, 0
        self._blocks: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    @property
    def mixed(self) -> bool:
        return isinstance(self.data, MixedDataset)

    @property
    def num_samples(self) -> int:
        """Samples this rank serves per epoch."""
        n, w = len(self.data), self.world_size
        return n // w if self.drop_last or self.mixed else -(-n // w)

    def __len__(self) -> int:
        """Batches of this rank per (whole) epoch."""
        n = self.num_samples
        return n // self.batch_size if self.mixed or self.drop_last else -(-n // self.batch_size)

    @property
    def epoch_samples(self) -> int:
        """Positions of an epoch: its samples (one source), or its draws (a mixture)."""
        return len(self) * self.batch_size * self.world_size if self.mixed else len(self.data)

    def remaining(self) -> int:
        """Batches of this rank left in the epoch after position :attr:`consumed`."""
        if self.mixed:
            return max(self.epoch_samples - self.consumed, 0) // (self.batch_size *
                                                                  self.world_size)
        rest = max(len(self.data) - self.consumed, 0)
        mine = rest // self.world_size if self.drop_last else -(-rest // self.world_size)
        return mine // self.batch_size if self.drop_last else -(-mine // self.batch_size)

    def order(self) -> torch.Tensor:
        """This rank's order of the epoch's remaining samples: one source, its steps; a
        mixture, rows of its sources stacked in order (see ``_pack``), batch after batch,
        each batch grouped by source (drawn once for the whole epoch, so a mixed epoch is
        then served exactly like one cache's)."""
        if self.mixed:
            src, _, rows = self._draws(self._positions(torch.arange(self.remaining())))
            return rows.gather(1, torch.sort(src, dim=1, stable=True).indices).reshape(-1)
        return rank_share(epoch_order(len(self.data), self.seed, self.epoch, self.shuffle),
                          self.consumed, self.rank, self.world_size, self.drop_last)

    def batches(self, order: torch.Tensor) -> Iterator[list[tuple[int, torch.Tensor]]]:
        for b in range(self.remaining()):
            yield [(0, order[b * self.batch_size:(b + 1) * self.batch_size])]

    def _positions(self, batches: torch.Tensor) -> torch.Tensor:
        """The epoch positions of this rank's remaining batches ``batches``: int64
        ``[len(batches), batch_size]``."""
        first = self.consumed + batches * self.batch_size * self.world_size \
            + self.rank * self.batch_size
        return first[:, None] + torch.arange(self.batch_size)

    def _draws(self, positions: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """A mixture's draws at epoch ``positions``: each one's source, step in it, and row in
        the sources stacked in order (see ``_pack``), shaped like ``positions``."""
        sizes = torch.tensor([len(d) for d in self.data.datasets], dtype=torch.float64)
        if positions.numel() == 0:
            return positions, positions, positions
        # the blocks from the first position's to the last's, laid end to end: one gather
        # (masking the positions block by block cost a pass over all of them per block: 5 s
        # for an epoch of 220,000 draws on the development VM, now 0.2 s)
        lo, hi = int(positions.min()) // self.BLOCK, int(positions.max()) // self.BLOCK
        keep = {}
        for c in range(lo, hi + 1):
            key = (self.epoch, c)
            if key not in self._blocks:
                g = _generator(self.seed, self.epoch, c)
                s = torch.multinomial(self.data.weights, self.BLOCK, replacement=True,
                                      generator=g)
                t = (torch.rand(s.shape, generator=g, dtype=torch.float64)
                     * sizes.index_select(0, s)).long()
                self._blocks[key] = (s, t)
            keep[key] = self._blocks[key]
        self._blocks = keep  # the blocks of the last call only
        # index_select: advanced indexing with an index tensor took 20 ms per 16,384 draws
        # where index_select takes 0.2 ms (CPU, two busy cores)
        at = (positions - lo * self.BLOCK).reshape(-1)
        src = torch.cat([b[0] for b in keep.values()]).index_select(0, at)
        steps = torch.cat([b[1] for b in keep.values()]).index_select(0, at)
        rows = steps + (sizes.cumsum(0) - sizes).long().index_select(0, src)
        return tuple(x.reshape(positions.shape) for x in (src, steps, rows))

    def mixed_batch(self, b: int) -> list[tuple[int, torch.Tensor]]:
        """This rank's remaining batch ``b`` of a mixture, as (source, steps) parts."""
        src, steps, _ = self._draws(self._positions(torch.tensor([b])))
        src, steps = src[0], steps[0]
        return [(i, steps[src == i]) for i in range(len(self.data.datasets))
                if bool((src == i).any())]

    def __iter__(self) -> Iterator[list[tuple[int, torch.Tensor]]]:
        if not self.mixed:
            yield from self.batches(self.order())
            return
        for b in range(self.remaining()):
            yield self.mixed_batch(b)


class _Parts(torch.utils.data.Dataset):
    """What DataLoader workers run: fetch each part on the CPU (no CUDA in workers)."""

    def __init__(self, datasets: list[RobotDataset]):
        self.datasets = datasets

    def __getitem__(self, parts: list[tuple[int, torch.Tensor]]):
        return [(i, self.datasets[i].gather(idx)) for i, idx in parts]

    def __len__(self) -> int:
        return sum(len(d) for d in self.datasets)


def _merge(parts: list[tuple[int, Batch]], mixed: MixedDataset | None) -> Batch:
    """Concatenate per-source batches along B (see :class:`MixedDataset`): numeric keys
    zero-padded to their widest width with ``<key>_dim_mask``, keys a source lacks zero-filled
    and padded, ``source`` ids."""
    if mixed is None:
        return parts[0][1]
    dev = parts[0][1]["index"].device
    sizes = [b["index"].shape[0] for _, b in parts]
    out: Batch = {k: torch.cat([b[k] for _, b in parts])
                  for k in ("index", "episode_index", "timestamp")}
    for key, (shape, dtype) in mixed.shapes.items():
        values, pads, masks = [], [], []
        for (_, b), n in zip(parts, sizes, strict=True):
            v = b.get(key)
            if v is None:  # this source lacks the key: zeros, padded everywhere
                values.append(torch.zeros((n, *shape), dtype=dtype, device=dev))
                pads.append(torch.ones((n, shape[0]), dtype=torch.bool, device=dev))
                masks.append(torch.zeros((n, shape[-1]), dtype=torch.bool, device=dev))
                continue
            pads.append(b[f"{key}_is_pad"])
            if key in mixed.dim_masked:
                masks.append((torch.arange(shape[-1], device=dev) < v.shape[-1])
                             .expand(n, shape[-1]))
                v = torch.nn.functional.pad(v, (0, shape[-1] - v.shape[-1]))
            values.append(v)
        out[key] = torch.cat(values)
        out[f"{key}_is_pad"] = torch.cat(pads)
        if key in mixed.dim_masked:
            out[f"{key}_dim_mask"] = torch.cat(masks)
    out["source"] = torch.cat([torch.full((n,), i, dtype=torch.int64, device=dev)
                               for (i, _), n in zip(parts, sizes, strict=True)])
    return out


class _Packed(RobotDataset):
    """A mixture's sources (normalized, on one device) stacked into one packed cache: each
    group's columns at the widest width (zeros beyond a source's own, alignment-pad column set
    where a source lacks the key), frames concatenated (plus one zero frame for sources without
    the camera). A mixed batch is then one gather, like a single cache's (and graph-replayable);
    :meth:`fetch` adds ``source``, ``<key>_dim_mask`` and turns ``index`` back into the
    source's own."""

    rows: torch.Tensor  # int64 [N, 2]: each row's source and index in it
    dim_table: torch.Tensor  # bool [sources, sum of the masked keys' widths]
    dim_widths: dict[str, int]  # masked key -> its width in dim_table (in order)

    def fetch(self, indices: torch.Tensor, frames: list | None = None) -> Batch:
        batch = super().fetch(indices, frames)
        # two gathers whatever the number of masked keys (views split them)
        batch["source"], batch["index"] = self.rows[indices].unbind(1)
        if self.dim_widths:
            masks = self.dim_table[batch["source"]].split(list(self.dim_widths.values()), 1)
            batch.update({f"{k}_dim_mask": m
                          for k, m in zip(self.dim_widths, masks, strict=True)})
        return batch


def _pack(mixture: MixedDataset, datasets: list[RobotDataset]) -> _Packed:
    """Stack ``datasets`` (the mixture's sources, already normalized and moved) into a
    :class:`_Packed` on their device."""
    dev = datasets[0].device
    images = {k for d in datasets for k in d.image_keys}
    out = copy.copy(datasets[0])
    out.__class__ = _Packed
    sizes = torch.tensor([len(d) for d in datasets], device=dev)
    base = torch.cumsum(sizes, 0) - sizes
    out.frames, frame_base = {}, {}
    for k in images:
        have = [d.frames[k] for d in datasets if k in d.image_keys]
        counts = [len(d.frames[k]) if k in d.image_keys else 0 for d in datasets]
        frame_base[k] = np.cumsum([0] + counts[:-1]).tolist()
        out.frames[k] = stack(have)  # last: an all-zero frame
    # every key at its widest (words, then one alignment-pad column per key), as the sources'
    # own rows: bytes past a narrower source's values are zero
    first = {k: next(d for d in datasets if k in d.layout) for k in mixture.keys}
    # numeric keys at the mixture's width (a fixed `widths` entry may exceed every source's)
    dims = {k: mixture.shapes[k][0][-1] if k not in images else first[k].layout[k].dim
            for k in mixture.keys}
    words = {k: max([d.layout[k].words for d in datasets if k in d.layout]
                    + [-(-dims[k] * first[k].layout[k].dtype.itemsize // 4)])
             for k in mixture.keys}
    cols = dict(zip(mixture.keys, np.cumsum([0] + [words[k] for k in mixture.keys]).tolist(),
                    strict=False))
    width = sum(words.values())
    # an alignment-pad column for keys some source lacks or pads (none: nothing to gather)
    padded = [k for k in mixture.keys
              if any(k not in d.layout or d.layout[k].pad_col is not None for d in datasets)]
    pad_cols = {k: width + j for j, k in enumerate(padded)}
    blocks = []
    for i, d in enumerate(datasets):
        block = torch.zeros(len(d), width + len(padded), dtype=torch.int32, device=dev)
        for k in mixture.keys:
            c = cols[k]
            if k not in d.layout:  # a key this source lacks: padded (the zero frame)
                block[:, pad_cols[k]] = 1
            else:
                key = d.layout[k]
                block[:, c:c + key.words] = d.data[:, key.col:key.col + key.words]
                if key.pad_col is not None:
                    block[:, pad_cols[k]] = d.data[:, key.pad_col]
            if k in images:  # frame rows (int64 as two words) into the stacked frames
                rows = (block[:, c:c + 2].contiguous().view(torch.int64) + frame_base[k][i]
                        if k in d.layout else torch.full((len(d), 1), out.frames[k].shape[0] - 1,
                                                          dtype=torch.int64, device=dev))
                block[:, c:c + 2] = rows.view(torch.int32)
        blocks.append(block)
    out.data = torch.cat(blocks)
    out.layout = {k: _Key(cols[k], words[k], first[k].layout[k].dtype, dims[k], pad_cols.get(k))
                  for k in mixture.keys}
    out.deltas = {k: first[k].deltas[k] for k in mixture.keys}
    out.squeezed = [k for k in mixture.keys if k in first[k].squeezed]
    out.obs_keys = [k for k in mixture.keys if k not in mixture.action_keys]
    out.action_keys = list(mixture.action_keys)
    out.image_keys = [k for k in out.obs_keys if k in images]
    out.horizon = max(d.horizon for d in datasets)
    out.offsets = torch.cat([d.offsets[:-1] + base[i] for i, d in enumerate(datasets)]
                            + [sizes.sum()[None]])
    # each source's relative actions on its rows (its own widths, states and statistics)
    out.relative = PerSource([d.relative for d in datasets],
                             [{k: d.layout[k].dim for k in d.relative.deferred()}
                              if d.relative is not None else {} for d in datasets]) \
        if any(d.relative is not None for d in datasets) else None
    out.set_windows()
    # the camera keys' frame numbers on the host too, to read frames ahead of the device
    cams = [k for k in out.image_keys]
    host = torch.cat([block[:, [c for k in cams for c in (cols[k], cols[k] + 1)]].cpu()
                      for block in blocks]) if cams else torch.zeros(len(out.data), 0,
                                                                    dtype=torch.int32)
    out._host = (host, out.offsets.cpu(), {k: (2 * j, 2) for j, k in enumerate(cams)})
    out.episode_index = torch.cat([d.episode_index for d in datasets])
    out.episode_ids = torch.cat([d.episode_ids.to(dev) for d in datasets])
    out.step = torch.cat([d.step for d in datasets])
    out.timestamp = torch.cat([d.timestamp for d in datasets])
    source = torch.repeat_interleave(torch.arange(len(datasets), device=dev), sizes)
    out.rows = torch.stack([source, torch.arange(len(source), device=dev) - base[source]], 1)
    masked = [k for k in mixture.keys if k in mixture.dim_masked]
    out.dim_widths = {k: mixture.shapes[k][0][-1] for k in masked}
    dims = [d.describe()["dims"] for d in datasets]
    out.dim_table = torch.tensor([[j < dim.get(k, 0) for k, w in out.dim_widths.items()
                                   for j in range(w)] for dim in dims],
                                 dtype=torch.bool, device=dev)
    return out


class _Graphed:
    """Resident fetches of ``batch_size`` windows replayed from CUDA graphs: per batch the host
    issues one index copy and one replay instead of every gather/split op. Each of ``slots``
    graphs owns its index and output buffers (so a batch's tensors are rewritten ``slots``
    batches later)."""

    def __init__(self, dataset: RobotDataset, batch_size: int, device: torch.device,
                 slots: int = 3):
        self.index = [torch.zeros(batch_size, dtype=torch.int64, device=device)
                      for _ in range(slots)]
        warm = torch.cuda.Stream(device)
        warm.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(warm):  # compile kernels, cache constants before capture
            for _ in range(2):
                dataset.fetch(self.index[0])
        torch.cuda.current_stream(device).wait_stream(warm)
        self.graphs, self.outputs = [], []
        for index in self.index:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.outputs.append(dataset.fetch(index))
            self.graphs.append(graph)

    def __call__(self, slot: int, indices: torch.Tensor) -> Batch:
        self.index[slot].copy_(indices, non_blocking=True)
        self.graphs[slot].replay()
        return dict(self.outputs[slot])


def _default_device(distributed: bool) -> torch.device:
    """CUDA when available: under DDP this process's GPU (``LOCAL_RANK``), else the current."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    local = os.environ.get("LOCAL_RANK")
    if distributed and local is not None and int(local) < torch.cuda.device_count():
        return torch.device("cuda", int(local))
    return torch.device("cuda", torch.cuda.current_device())


# Resident camera batches a background thread keeps ready (each holds its decoded frames).
# H100, ResNet-18 on two cameras stored at 224x224, batch 64, two rounds on one machine: 3
# ahead served 2,643 / 2,644 samples/s (GPU busy 95.8 % both), 2 ahead 2,518 / 2,568 (92.2 /
# 95.1 %). Two threads preparing batches (3 ahead) served 2,564 / 2,558: nvJPEG decodes one
# call at a time, and the second thread's host work slowed the training thread's.
CAMERA_PREFETCH = 3
# Resident camera batches whose encoded frames are read from the cache ahead of their decode
# (see RobotLoader's `read_ahead`), and the most a loader takes. H200 host, frames evicted from
# the page cache, batch 256 x two 480x640 JPEG cameras (244 KB a frame): 4 ahead served 1,547
# samples/s, 16 ahead 2,054 = 1.00 GB/s of frames, the storage's own O_DIRECT read rate (1.01
# GB/s; benchmarks/results/serve-h200-2026-12-02.json): more reads in flight, deeper queues.
READ_AHEAD = 16
MAX_READ_AHEAD = 64


def _ignore_ctrl_c(worker_id: int) -> None:
    """A DataLoader worker leaves Ctrl-C to the main process, which stops the workers: killed
    by the terminal's SIGINT mid-transfer, a worker's file-descriptor sharing thread printed a
    traceback (ConnectionResetError) after the command's one line."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


class RobotLoader:
    """Iterate normalized batches of windows on ``device`` (see the module docstring).

    Args:
        data: a :class:`RobotDataset` or a :class:`MixedDataset`.
        batch_size: samples per batch.
        device: where batches go (default CUDA when available).
        shuffle: random order (one source: an epoch permutation).
        drop_last: drop the last incomplete batch (one source).
        num_workers: DataLoader worker processes gathering on the CPU; 0 = resident.
        resident: force (True) or forbid (False) the resident path (the packed cache on
            ``device``, normalized once, gathered in this process); ``None``: resident when
            ``num_workers == 0``.
        normalize: mode for every numeric key (``"mean_std"``, ``"min_max"``, ``"quantile"``),
            a key -> mode mapping, or ``None`` to leave values in data units.
        seed: sampling seed (deterministic order for a seed).
        prefetch_factor: batches each worker keeps ready (workers path).
        read_ahead: resident camera batches on a GPU: batches whose camera frames are read
            from the cache ahead of their decode, each on a thread of its own (1 to
            :data:`MAX_READ_AHEAD`; deeper keeps more reads in flight, which a cold disk and
            an object store's latency need, at the memory of that many batches' encoded
            frames: 16 x 256 samples x 2 cameras x 100 KB = 820 MB). DataLoader workers read
            their own batches' frames (``num_workers * prefetch_factor`` batches ahead).
        cuda_graph: resident path, one source, ``drop_last``: replay each batch's gather from
            a CUDA graph (the host cost per batch drops to a copy and a replay). The batch's
            tensors are graph buffers, rewritten 3 batches later: ``clone()`` what you keep.
        rank, world_size: this process's share of a data-parallel job (``torchrun``/DDP:
            default from the initialized ``torch.distributed`` process group, else 0 and 1):
            every rank builds the same sequence from ``seed`` and takes its part (one source:
            every ``world_size``-th sample of the epoch's permutation, as
            ``DistributedSampler``; a mixture: its slice of each global batch of
            ``batch_size * world_size`` draws), so ranks never overlap. Call
            :meth:`set_epoch` each epoch (or let the epoch advance after each full pass, the
            same on every rank). The default device under DDP is ``cuda:LOCAL_RANK``, so each
            rank's resident cache sits on its own GPU.
        relative_actions: serve these action keys relative to the current state in every
            source (:class:`RobotDataset`'s argument, replacing the sources' own); a relative
            key is normalized with the statistics of its relative chunks, after the transform.

    Iteration resumes: :meth:`state_dict` / :meth:`load_state_dict` save and restore the
    position (epoch, samples served), also onto another number of ranks, and breaking out of
    a loop then calling ``iter`` again continues the same epoch.

    Raises:
        DataError: ``batch_size`` < 1, ``rank`` outside ``[0, world_size)``, the workers
            path with datasets not on the CPU, a bad ``relative_actions`` entry, or a relative
            key to normalize without the statistics of its relative chunks (one line naming
            the command that computes them).
    """

    def __init__(self, data: RobotDataset | MixedDataset, batch_size: int = 256, *,
                 device: str | torch.device | None = None, shuffle: bool = True,
                 drop_last: bool = True, num_workers: int = 0, resident: bool | None = None,
                 normalize: str | Mapping[str, str] | None = "mean_std", seed: int = 0,
                 prefetch_factor: int = 4, cuda_graph: bool = True, rank: int | None = None,
                 world_size: int | None = None, read_ahead: int = READ_AHEAD,
                 relative_actions: Mapping[str, Mapping] | None = None):
        from robocache.ops.normalize import Normalizer

        if batch_size < 1:
            raise DataError(f"`batch_size` must be >= 1; got {batch_size}.")
        if not (isinstance(read_ahead, int) and 1 <= read_ahead <= MAX_READ_AHEAD):
            raise DataError(f"`read_ahead` must be an integer in [1, {MAX_READ_AHEAD}]; got "
                            f"{read_ahead!r}.")
        self.read_ahead = read_ahead
        dist = torch.distributed.is_available() and torch.distributed.is_initialized()
        rank = (torch.distributed.get_rank() if dist else 0) if rank is None else rank
        world_size = (torch.distributed.get_world_size() if dist else 1) \
            if world_size is None else world_size
        self.device = torch.device(device or _default_device(dist))
        cuda = self.device.type == "cuda"
        self.resident = num_workers == 0 if resident is None else resident
        if not 0 <= rank < world_size:
            raise DataError(f"`rank` must be in [0, world_size); got rank={rank}, "
                            f"world_size={world_size}.")
        self.mixed = isinstance(data, MixedDataset)
        self.mixture = data if self.mixed else None
        self.datasets = data.datasets if self.mixed else [data]
        if relative_actions is not None:
            self.datasets = [d.with_relative_actions(relative_actions) for d in self.datasets]
        if normalize is not None:  # relative keys only with their relative chunks' statistics
            for d in self.datasets:
                d.check_normalizable(d.keys if isinstance(normalize, str) else list(normalize))
        self.sampler = _Sampler(data, batch_size, shuffle, drop_last, seed, rank, world_size)
        # where iteration resumes (see state_dict): the epoch, the position this pass over it
        # started at, and the batches yielded since
        self.epoch, self.consumed, self.batch = 0, 0, 0
        self.normalizers = [None if normalize is None else
                            Normalizer(d.stats, normalize if isinstance(normalize, str) else
                                       {k: m for k, m in normalize.items() if k in d.stats})
                            for d in self.datasets]
        if self.resident:
            # normalize the packed cache once on the device: per batch only the gather remains
            moved = [d.to(self.device) if n is None else d.to(self.device).normalized(n)
                     for d, n in zip(self.datasets, self.normalizers, strict=True)]
            self.loader = None
            # a mixture is stacked into one packed cache: a batch is one gather (the moved
            # per-source copies are dropped once stacked)
            self.packed = _pack(data, moved) if self.mixed else moved[0]
            if not self.mixed:
                self.datasets = moved
            self.graphed = _Graphed(self.packed, batch_size, self.device) \
                if cuda and cuda_graph and (drop_last or self.mixed) \
                and not self.packed.image_keys else None  # nvJPEG is not capturable
        else:
            self.graphed = None
            # workers send few tensors (the raw windows); keys and masks are split here
            self.meta = [(d.episode_index.to(self.device), d.timestamp.to(self.device))
                         for d in self.datasets]
            if any(d.device.type != "cpu" for d in self.datasets):
                raise DataError("the workers path gathers on the CPU; pass datasets on the CPU "
                                "(not `.to('cuda')` copies) or use resident=True.")
            self.loader = torch.utils.data.DataLoader(
                _Parts(self.datasets), sampler=self.sampler, batch_size=None,
                num_workers=num_workers, pin_memory=cuda,
                persistent_workers=num_workers > 0, worker_init_fn=_ignore_ctrl_c,
                prefetch_factor=prefetch_factor if num_workers > 0 else None)
        # camera batches: high priority, so their decode's kernels go before the training's
        cameras = self.resident and bool(self.packed.image_keys)
        self.stream = torch.cuda.Stream(self.device, priority=-1 if cameras else 0) \
            if cuda else None
        self._metrics = None  # robocache.observability.metrics.LoaderStats while metrics are on
        self._bases = (None, None)  # a mixture's first stacked row per source, on its device
        # the resident path's next epoch order, drawn ahead on a thread (see _order)
        self._pool: ThreadPoolExecutor | None = None
        self._ahead: tuple | None = None
        # a mixture's string ids of the epoch's positions, drawn with its order (resident)
        self._epoch_ids: list[torch.Tensor] | None = None

    def __len__(self) -> int:
        return len(self.sampler)

    @property
    def prefetch_depth(self) -> int:
        """Batches prepared ahead of the caller: workers x ``prefetch_factor``,
        :data:`CAMERA_PREFETCH` for resident camera batches on a GPU, else 1 on a GPU (the
        side stream's next batch) and 0 on the CPU."""
        if self.loader is not None and self.loader.num_workers:
            return self.loader.num_workers * (self.loader.prefetch_factor or 0)
        if self.stream is None:
            return 0
        return CAMERA_PREFETCH if self.resident and self.packed.image_keys else 1

    def _prepare(self, parts, frames: list | None = None) -> Batch:
        """Fetch (resident) or copy (workers) the parts, normalize, merge: on the side stream
        (``frames``: the resident batch's camera frames, read ahead)."""
        done = []
        if self.resident:  # already normalized (and a mixture stacked): one gather
            return self.packed.fetch(parts[0][1].to(self.device, non_blocking=True), frames)
        for i, part in parts:
            raw = {k: v.to(self.device, non_blocking=True) for k, v in part.items()}
            if self._metrics is not None and self.stream is not None:
                self._metrics.h2d(part)
            batch = self.datasets[i].finish(raw, *self.meta[i])
            norm = self.normalizers[i]
            done.append((i, norm(batch) if norm is not None else batch))
        return _merge(done, self.mixture)

    def set_epoch(self, epoch: int) -> None:
        """Serve epoch ``epoch`` next (the same order on every rank); a position restored by
        :meth:`load_state_dict` in that epoch is kept."""
        if int(epoch) != self.epoch:
            self.epoch, self.consumed, self.batch = int(epoch), 0, 0

    def position(self) -> int:
        """Positions of this epoch the ranks have served together (see
        :mod:`robocache.data.sampler`)."""
        s = self.sampler
        return min(self.consumed + self.batch * s.batch_size * s.world_size, s.epoch_samples)

    def state_dict(self) -> dict[str, int]:
        """Where iteration stands: ``epoch`` and ``consumed`` (its positions the ranks have
        served together, the same on every rank), with the ``seed``, ``batch_size``, ``rank``
        and ``world_size`` they were served with. Save it with the model (from any rank);
        :meth:`load_state_dict` makes the next ``iter(loader)`` continue with what follows,
        as if never interrupted, on this number of ranks or another."""
        s = self.sampler
        return {"epoch": self.epoch, "consumed": self.position(), "seed": s.seed,
                "batch_size": s.batch_size, "rank": s.rank, "world_size": s.world_size}

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Resume from :meth:`state_dict`'s output, saved by any number of ranks: the epoch's
        positions after it are dealt to this loader's ranks (one source: no sample of the
        epoch served twice or skipped; a mixture: its draws continue where they stopped).

        Raises:
            DataError: the state was saved with another seed, or its position does not fit
                an epoch of this data.
        """
        if state["seed"] != self.sampler.seed:
            raise DataError(f"the loader state was saved with seed={state['seed']}, this "
                            f"loader has {self.sampler.seed}; build the loader with the same "
                            "seed to resume.")
        check_position(state, self.sampler.epoch_samples)
        self.epoch, self.consumed, self.batch = int(state["epoch"]), int(state["consumed"]), 0

    def __iter__(self) -> Iterator[Batch]:
        """This epoch's remaining batches (all of them unless resumed mid-epoch)."""
        if len(self.sampler) == 0:
            warnings.warn(f"RobotLoader: this epoch has no batch: batch_size "
                          f"{self.sampler.batch_size} exceeds the {self.sampler.num_samples} "
                          "samples (of this rank) and drop_last=True; lower batch_size or pass "
                          "drop_last=False.",
                          stacklevel=2)
        return metrics.watch_loader(self, self._epoch())

    def _epoch(self) -> Iterator[Batch]:
        self.consumed, self.batch = self.position(), 0
        self.sampler.epoch, self.sampler.consumed = self.epoch, self.consumed
        languages = self.mixture.language if self.mixed else []
        for batch in self._batches():
            for i, language in enumerate(languages):
                batch.update(self._language(i, language, batch))
            self.batch += 1
            yield batch
        self.epoch, self.consumed, self.batch = self.epoch + 1, 0, 0

    def _batches(self) -> Iterator[Batch]:
        if self.graphed is not None:
            yield from self._iter_graphed()
            return
        if self.resident:  # one copy of the epoch's order (a mixture's: packed rows), sliced
            host = self._order()
            order = host.to(self.device)
            if self.stream is not None:
                order.record_stream(self.stream)  # read there while the caller iterates
            source = self.sampler.batches(order)
        else:
            # a forked worker must never free a CUDA tensor (its allocator cannot reach the
            # device there and aborts): free this process's cyclic garbage now, and freeze
            # what is left so the workers' collector never frees a parent object
            gc.collect()
            gc.freeze()
            try:
                source = iter(self.loader)
            finally:
                gc.unfreeze()
        if self.stream is None:
            for parts in source:
                yield self._prepare(parts)
            return
        main = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(main)  # buffers moved to the device on the main stream
        if self.resident and self.packed.image_keys:
            yield from self._threaded(source, main, self.sampler.batches(host))
            return

        def launch():
            parts = next(source, None)
            if parts is None:
                return None
            with torch.cuda.stream(self.stream):
                batch = self._prepare(parts)
            event = torch.cuda.Event()
            event.record(self.stream)
            return batch, event

        ready = launch()
        while ready is not None:
            batch, event = ready
            main.wait_event(event)
            for v in batch.values():
                v.record_stream(main)
            ready = launch()  # the next batch is gathered while the caller uses this one
            yield batch

    def _order(self) -> torch.Tensor:
        """The resident path's order of this epoch's remaining samples (see
        :meth:`_Sampler.order`), on the host; a mixture's next epoch, from its start, is then
        drawn on a thread while this one is served (a mixture's draws, sort and gather are a pass
        over the epoch on the host: 75-90 ms per 110,000 draws on the development VM, two
        busy cores, against 8 ms for one cache's permutation; a GPU serves such an epoch in
        tens of ms)."""
        s = self.sampler
        key = (s.epoch, s.consumed, s.rank, s.world_size)
        ahead, self._ahead = self._ahead, None
        order, ids = ahead[1].result() if ahead is not None and ahead[0] == key \
            else self._draw(s)
        self._epoch_ids = [x.to(self.device) for x in ids]
        if not self.mixed:  # a permutation: nothing worth a thread
            return order
        following = copy.copy(s)
        following._blocks, following.epoch, following.consumed = {}, s.epoch + 1, 0
        if self._pool is None:
            self._pool = ThreadPoolExecutor(1, "robocache-order")
        self._ahead = ((following.epoch, 0, s.rank, s.world_size),
                       self._pool.submit(self._draw, following))
        return order

    def _draw(self, sampler: _Sampler) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``sampler``'s order of its epoch's remaining samples and, for a mixture with
        language, the string ids of every position of it (those :meth:`_language` would draw
        batch by batch: a resident batch then slices them, and gathers its tokens)."""
        order = sampler.order()
        languages = self.mixture.language if self.mixed else []
        if not languages:
            return order, []
        positions = sampler._positions(torch.arange(sampler.remaining())).reshape(-1)
        return order, [lang.ids(order, positions, sampler.seed, sampler.epoch)
                       for lang in languages]

    def _language(self, i: int, language, batch: Batch) -> dict:
        """The strings of a mixture's batch from its ``i``-th language (see
        :class:`robocache.data.language.Language`): its rows in the sources stacked in order,
        drawn at this rank's positions of the epoch; on the resident path, a slice of the
        ids drawn with the epoch's order."""
        s, dev = self.sampler, batch["index"].device
        if self._epoch_ids is not None and i < len(self._epoch_ids):
            n = s.batch_size
            return language.serve(self._epoch_ids[i][self.batch * n:(self.batch + 1) * n])
        if self._bases[0] != dev:
            sizes = torch.tensor([len(d) for d in self.datasets], device=dev)
            self._bases = (dev, torch.cumsum(sizes, 0) - sizes)
        rows = batch["index"] + self._bases[1][batch["source"]]
        first = s.consumed + self.batch * s.batch_size * s.world_size + s.rank * s.batch_size
        positions = torch.arange(first, first + rows.shape[0], device=dev)
        return language(rows, positions, s.seed, self.epoch)

    def _threaded(self, source: Iterator, main: torch.cuda.Stream, ahead: Iterator
                  ) -> Iterator[Batch]:
        """Batches prepared on the side stream by a background thread, up to
        :data:`CAMERA_PREFETCH` ahead of the caller (in order; an error there is raised
        here; leaving the loop stops the thread). Their camera frames are read from the cache
        :attr:`read_ahead` batches ahead of that, each batch's on a thread of its own
        (``ahead``: the same batches as ``source``, their indices on the host)."""
        ready: queue.Queue = queue.Queue(CAMERA_PREFETCH)
        stop = threading.Event()

        def put(item) -> bool:
            while not stop.is_set():
                try:
                    ready.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False

        def produce() -> None:
            reads: collections.deque = collections.deque()
            pairs = zip(source, ahead, strict=True)
            with ThreadPoolExecutor(self.read_ahead, "robocache-read") as pool:

                def submit() -> None:
                    pair = next(pairs, None)
                    if pair is not None:
                        reads.append((pair[0], pool.submit(self.packed.read_frames,
                                                           pair[1][0][1])))

                try:
                    for _ in range(self.read_ahead):
                        submit()
                    with torch.cuda.stream(self.stream):
                        while reads:
                            parts, frames = reads.popleft()
                            submit()
                            batch = self._prepare(parts, frames.result())
                            event = torch.cuda.Event()
                            event.record(self.stream)
                            if not put((batch, event)):
                                return
                    put(None)
                except BaseException as e:  # handed to the caller's thread, raised there
                    put(e)
                finally:
                    for _, f in reads:
                        f.cancel()

        worker = threading.Thread(target=produce, name="robocache-prefetch", daemon=True)
        worker.start()
        try:
            while (item := ready.get()) is not None:
                if isinstance(item, BaseException):
                    raise item
                batch, event = item
                main.wait_event(event)
                for v in batch.values():
                    v.record_stream(main)
                yield batch
        finally:
            stop.set()
            worker.join()

    def _iter_graphed(self) -> Iterator[Batch]:
        """Batches replayed from the graphs on the side stream, one ahead of the caller; a
        slot is refilled only after the main stream has passed the work queued on its
        previous batch (recorded when the caller asked for the batch after it)."""
        main = torch.cuda.current_stream(self.device)
        order = self._order().to(self.device)
        order.record_stream(self.stream)
        self.stream.wait_stream(main)
        size, slots = self.sampler.batch_size, len(self.graphed.graphs)
        released: list[torch.cuda.Event | None] = [None] * slots

        def launch(b: int):
            with torch.cuda.stream(self.stream):
                if released[b % slots] is not None:
                    self.stream.wait_event(released[b % slots])
                batch = self.graphed(b % slots, order[b * size:(b + 1) * size])
            event = torch.cuda.Event()
            event.record(self.stream)
            return batch, event

        n = self.sampler.remaining()
        ready = launch(0) if n else None
        for b in range(n):
            batch, event = ready
            main.wait_event(event)
            if b + 1 < n:
                ready = launch(b + 1)
            yield batch
            done = torch.cuda.Event()
            done.record(main)
            released[b % slots] = done
