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
or per batch after the copy.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator, Mapping, Sequence

import torch

from robocache.data.dataset import Batch, RobotDataset
from robocache.errors import DataError
from robocache.observability import metrics


class MixedDataset:
    """Several caches (different robots, rates) sampled with weights into one batch stream.

    Each batch element picks its source with probability ``weights[i] / sum(weights)`` and a
    step uniformly inside it. Sources must serve the same key names; feature widths may differ
    (each source is normalized with its own stats, then zero-padded to the widest). A batch has
    ``source`` (int64 ``[B]``), and is grouped by source.

    Args:
        datasets: the sources.
        weights: non-negative sampling weights, one per source (default: by size).

    Raises:
        DataError: no datasets, different keys, or bad weights.
    """

    def __init__(self, datasets: Sequence[RobotDataset], weights: Sequence[float] | None = None):
        self.datasets = list(datasets)
        if not self.datasets:
            raise DataError("`datasets` is empty; pass at least one RobotDataset.")
        keys = [sorted(d.keys) for d in self.datasets]
        if any(k != keys[0] for k in keys):
            raise DataError(f"every dataset must serve the same keys; got {keys}. Pick common "
                            "keys with RobotDataset(..., keys=...).")
        w = torch.tensor([float(len(d)) for d in self.datasets] if weights is None
                         else [float(x) for x in weights], dtype=torch.float64)
        if w.shape != (len(self.datasets),) or bool((w < 0).any()) or float(w.sum()) <= 0:
            raise DataError(f"`weights` must be {len(self.datasets)} non-negative numbers with a "
                            f"positive sum; got {list(map(float, w))}.")
        self.weights = w / w.sum()

    def __len__(self) -> int:
        return sum(len(d) for d in self.datasets)


class _Sampler(torch.utils.data.Sampler):
    """Batches of (source, indices) parts: an epoch permutation for one source; weighted draws
    (with replacement, ``len // batch_size`` batches per epoch) for a mixture."""

    def __init__(self, data: RobotDataset | MixedDataset, batch_size: int, shuffle: bool,
                 drop_last: bool, seed: int):
        self.data, self.batch_size = data, batch_size
        self.shuffle, self.drop_last = shuffle, drop_last
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        n = len(self.data)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def order(self) -> torch.Tensor:
        """One source: this epoch's order of all samples (advances the generator)."""
        n = len(self.data)
        return torch.randperm(n, generator=self.generator) if self.shuffle else torch.arange(n)

    def batches(self, order: torch.Tensor) -> Iterator[list[tuple[int, torch.Tensor]]]:
        for b in range(len(self)):
            yield [(0, order[b * self.batch_size:(b + 1) * self.batch_size])]

    def __iter__(self) -> Iterator[list[tuple[int, torch.Tensor]]]:
        if isinstance(self.data, RobotDataset):
            yield from self.batches(self.order())
            return
        sizes = torch.tensor([len(d) for d in self.data.datasets])
        for _ in range(len(self)):
            src = torch.multinomial(self.data.weights, self.batch_size, replacement=True,
                                    generator=self.generator)
            counts = torch.bincount(src, minlength=len(sizes))
            yield [(i, (torch.rand(int(c), generator=self.generator) * sizes[i]).long())
                   for i, c in enumerate(counts.tolist()) if c]


class _Parts(torch.utils.data.Dataset):
    """What DataLoader workers run: fetch each part on the CPU (no CUDA in workers)."""

    def __init__(self, datasets: list[RobotDataset]):
        self.datasets = datasets

    def __getitem__(self, parts: list[tuple[int, torch.Tensor]]):
        return [(i, self.datasets[i].gather(idx)) for i, idx in parts]

    def __len__(self) -> int:
        return sum(len(d) for d in self.datasets)


def _merge(parts: list[tuple[int, Batch]], mixed: bool) -> Batch:
    """Concatenate per-source batches along B, zero-padding feature dims to the widest."""
    if not mixed:
        return parts[0][1]
    out: Batch = {}
    for key in parts[0][1]:
        tensors = [b[key] for _, b in parts]
        if tensors[0].dim() >= 3 and tensors[0].is_floating_point():
            width = max(t.shape[-1] for t in tensors)
            tensors = [torch.nn.functional.pad(t, (0, width - t.shape[-1])) for t in tensors]
        out[key] = torch.cat(tensors)
    dev = out[next(iter(out))].device
    out["source"] = torch.cat([torch.full((b["index"].shape[0],), i, dtype=torch.int64,
                                          device=dev) for i, b in parts])
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
        cuda_graph: resident path, one source, ``drop_last``: replay each batch's gather from
            a CUDA graph (the host cost per batch drops to a copy and a replay). The batch's
            tensors are graph buffers, rewritten 3 batches later: ``clone()`` what you keep.

    Raises:
        DataError: ``batch_size`` < 1, or the workers path with datasets not on the CPU.
    """

    def __init__(self, data: RobotDataset | MixedDataset, batch_size: int = 256, *,
                 device: str | torch.device | None = None, shuffle: bool = True,
                 drop_last: bool = True, num_workers: int = 0, resident: bool | None = None,
                 normalize: str | Mapping[str, str] | None = "mean_std", seed: int = 0,
                 prefetch_factor: int = 4, cuda_graph: bool = True):
        from robocache.ops.normalize import Normalizer

        if batch_size < 1:
            raise DataError(f"`batch_size` must be >= 1; got {batch_size}.")
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        cuda = self.device.type == "cuda"
        self.resident = num_workers == 0 if resident is None else resident
        self.mixed = isinstance(data, MixedDataset)
        self.datasets = data.datasets if self.mixed else [data]
        self.sampler = _Sampler(data, batch_size, shuffle, drop_last, seed)
        self.normalizers = [None if normalize is None else
                            Normalizer(d.stats, normalize if isinstance(normalize, str) else
                                       {k: m for k, m in normalize.items() if k in d.stats})
                            for d in self.datasets]
        if self.resident:
            # normalize the packed cache once on the device: per batch only the gather remains
            self.datasets = [d.to(self.device) if n is None else
                             d.to(self.device).normalized(n)
                             for d, n in zip(self.datasets, self.normalizers, strict=True)]
            self.loader = None
            self.graphed = _Graphed(self.datasets[0], batch_size, self.device) \
                if cuda and cuda_graph and drop_last and not self.mixed else None
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
                persistent_workers=num_workers > 0,
                prefetch_factor=prefetch_factor if num_workers > 0 else None)
        self.stream = torch.cuda.Stream(self.device) if cuda else None
        self._metrics = None  # robocache.observability.metrics.LoaderStats while metrics are on

    def __len__(self) -> int:
        return len(self.sampler)

    def _prepare(self, parts) -> Batch:
        """Fetch (resident) or copy (workers) the parts, normalize, merge: on the side stream."""
        done = []
        for i, part in parts:
            if self.resident:  # already normalized
                done.append((i, self.datasets[i].fetch(part.to(self.device, non_blocking=True))))
                continue
            raw = {k: v.to(self.device, non_blocking=True) for k, v in part.items()}
            if self._metrics is not None and self.stream is not None:
                self._metrics.h2d(part)
            batch = self.datasets[i].finish(raw, *self.meta[i])
            norm = self.normalizers[i]
            done.append((i, norm(batch) if norm is not None else batch))
        return _merge(done, self.mixed)

    def __iter__(self) -> Iterator[Batch]:
        if len(self.sampler) == 0:
            warnings.warn(f"RobotLoader: this epoch has no batch: batch_size "
                          f"{self.sampler.batch_size} exceeds the {len(self.sampler.data)} "
                          "samples and drop_last=True; lower batch_size or pass drop_last=False.",
                          stacklevel=2)
        return metrics.watch_loader(self, self._batches())

    def _batches(self) -> Iterator[Batch]:
        if self.graphed is not None:
            yield from self._iter_graphed()
            return
        if self.resident and not self.mixed:  # one copy of the epoch's order, sliced there
            order = self.sampler.order().to(self.device)
            if self.stream is not None:
                order.record_stream(self.stream)  # read there while the caller iterates
            source = self.sampler.batches(order)
        elif self.resident:
            source = iter(self.sampler)
        else:
            with warnings.catch_warnings():
                # workers fork after Lance was used in this process; they never call Lance
                # (they gather from tensors), which is what its fork warning is about
                warnings.filterwarnings("ignore", "lance is not fork-safe")
                source = iter(self.loader)
        if self.stream is None:
            for parts in source:
                yield self._prepare(parts)
            return
        main = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(main)  # buffers moved to the device on the main stream

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

    def _iter_graphed(self) -> Iterator[Batch]:
        """Batches replayed from the graphs on the side stream, one ahead of the caller; a
        slot is refilled only after the main stream has passed the work queued on its
        previous batch (recorded when the caller asked for the batch after it)."""
        main = torch.cuda.current_stream(self.device)
        order = self.sampler.order().to(self.device)
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

        n = len(self.sampler)
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
