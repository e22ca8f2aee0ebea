"""Prometheus metrics of ingest, the loader, the ops and the GPUs (``prometheus-client``).

Off by default and then free: a hook is one module-global check. :func:`enable` (called by
:func:`robocache.observability.start_exporter`, ``--metrics-port`` and ``--pushgateway``)
registers everything in ``prometheus_client.REGISTRY``, so an exporter or a push of that registry
(yours or ours) carries them. Names follow Prometheus' conventions: prefix ``robocache_``, base
units (seconds, bytes), ``_total`` on counters, ratios in 0-1; labels are few-valued (``dataset``,
``rank``, ``op``, ``stage``, ``reason``, ``gpu``), never an episode or a batch size.

How each part records:

- **ingest** (:func:`ingest`, called by :func:`robocache.cache.build` once per episode):
  ``prometheus_client`` counters and histograms.
- **loader** (:func:`watch_loader`, per batch, where a metric update costs more than 2% of a 55 us
  GPU-resident batch: ``Counter.inc`` 1.1 us, ``Histogram.observe`` 2.1 us on a CI-class CPU):
  plain Python numbers in the consuming process, turned into metric families only when a scrape
  or a push collects them (a custom collector). DataLoader worker processes record nothing: every
  loader number is taken where the batch arrives, so no multiprocess mode is needed and the
  exporter thread of the training process serves them while workers run.
- **ops** (every public op passes through :func:`robocache.observability.nvtx.annotate`): calls and
  tensor bytes (arguments and results) per op, plain counters, no device sync. Calls inside
  ``torch.compile``-d code or replayed CUDA graphs are not seen.
- **GPU** (a collector querying NVML and torch at scrape time): memory used/total, utilisation,
  torch's allocated/reserved bytes. Without a GPU (or NVML) there are no GPU series.
"""

from __future__ import annotations

import dataclasses
import math
import os
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from robocache._optional import require
from robocache.observability import logs

_on = False
_lock = threading.Lock()
_ingest_metrics: dict[str, Any] = {}
_loaders: dict[tuple[str, str], LoaderStats] = {}
_ops: dict[str, list[int]] = {}  # op -> [calls, bytes]
_frames: dict[str, int] = {}  # camera frame decoder ("nvjpeg", "cpu") -> frames decoded
_ceilings: dict[str, float] = {}

# batch waits: 50 us .. 10 s (a GPU-resident batch takes ~55 us on an H100, a starved one seconds)
WAIT_BUCKETS = (5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25,
                0.5, 1.0, 2.5, 5.0, 10.0)
STAGE_BUCKETS = (1e-3, 5e-3, 1e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def enabled() -> bool:
    return _on


def rank() -> str:
    """This process' rank label: ``RANK`` (torchrun, Ray Train) or ``0``."""
    return os.environ.get("RANK", "0")


def enable() -> None:
    """Register RoboCache's metrics in ``prometheus_client.REGISTRY`` and turn the hooks on.

    Raises:
        MissingDependencyError: ``prometheus-client`` is not installed.
    """
    global _on
    with _lock:
        if _on:
            return
        pc = require("prometheus_client", "metrics", "Metrics", "prometheus-client")
        if not _ingest_metrics:
            _ingest_metrics.update(_make_ingest_metrics(pc))
            pc.REGISTRY.register(_Collector())
            pc.Info("robocache_build", "RoboCache version.").info(
                {"version": _version()})
        from robocache.observability import nvtx

        nvtx.count_ops(_count_op)
        _on = True


def disable() -> None:
    """Turn the hooks off (registered metrics keep their values)."""
    global _on
    from robocache.observability import nvtx

    nvtx.count_ops(None)
    _on = False


def _version() -> str:
    import robocache

    return robocache.__version__


def set_copy_ceiling(gbps: float, gpu: int | str = 0) -> None:
    """Publish the measured device copy bandwidth (``robocache doctor``'s ``d2d_copy_GBps``) as
    ``robocache_gpu_copy_ceiling_bytes_per_second`` for the dashboard's bandwidth panel."""
    _ceilings[str(gpu)] = float(gbps) * 1e9


# -------------------------------------------------------------------------------------- ingest

def _make_ingest_metrics(pc) -> dict[str, Any]:
    c, d = pc.Counter, ["dataset"]
    return {
        "read": c("robocache_ingest_episodes_read", "Episodes the ingest read or tried to.", d),
        "cached": c("robocache_ingest_episodes_cached", "Episodes aligned and written.", d),
        "skipped": c("robocache_ingest_episodes_skipped",
                     "Episodes already in the cache (resumed runs).", d),
        "quarantined": c("robocache_ingest_episodes_quarantined",
                         "Episodes quarantined, by reason (the exception type).",
                         d + ["reason"]),
        "samples": c("robocache_ingest_samples_read", "Source samples read, all streams.", d),
        "steps": c("robocache_ingest_steps_written", "Aligned steps (cache rows) written.", d),
        "frames": c("robocache_ingest_frames_written", "Camera frames stored in the cache.", d),
        "bytes_in": c("robocache_ingest_read_bytes", "Bytes of source arrays read.", d),
        "bytes_out": c("robocache_ingest_written_bytes",
                       "Bytes of aligned columns and frames written.", d),
        "stage": pc.Histogram("robocache_ingest_stage_seconds",
                              "Seconds per episode in each ingest stage.", d + ["stage"],
                              buckets=STAGE_BUCKETS),
        "planned": pc.Gauge("robocache_ingest_episodes_planned",
                            "Episodes the current ingest run covers.", d),
    }


def _nbytes(a: Any) -> int:
    return int(getattr(a, "nbytes", 0) or 0)


class IngestRecorder:
    """What :func:`robocache.cache.build` reports per episode: metrics (when enabled) and log
    events (always: free unless logging is configured)."""

    def __init__(self, dataset: str, planned: int):
        self.dataset = dataset
        self.mark = time.perf_counter()
        self.seconds: dict[str, float] = {}
        if _on:
            _ingest_metrics["planned"].labels(dataset).set(planned)

    def _count(self, key: str, value: float = 1, *labels: str) -> None:
        if _on:
            _ingest_metrics[key].labels(self.dataset, *labels).inc(value)

    def start(self) -> None:
        """An episode begins: the next :meth:`lap` times from here."""
        self.mark, self.seconds = time.perf_counter(), {}

    def lap(self, stage: str) -> None:
        """Stage ``stage`` of this episode ended now."""
        now = time.perf_counter()
        seconds, self.mark = now - self.mark, now
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds
        if _on:
            _ingest_metrics["stage"].labels(self.dataset, stage).observe(seconds)

    def stage(self, stage: str, seconds: float) -> None:
        """Stage ``stage`` of this episode took ``seconds``, timed elsewhere (on the worker
        thread that read and decoded it)."""
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds
        if _on:
            _ingest_metrics["stage"].labels(self.dataset, stage).observe(seconds)

    def skipped(self, index: int) -> None:
        self._count("read")
        self._count("skipped")
        logs.event("ingest.episode", status="skipped", dataset=self.dataset, episode=index,
                   metric="robocache_ingest_episodes_skipped_total")

    def quarantined(self, index: int, error: BaseException | None) -> None:
        """Episode quarantined by ``error`` (its type is the ``reason`` label), or ``None``:
        quarantined by an earlier run and not retried (reason ``previous_run``)."""
        reason = "previous_run" if error is None else type(error).__name__
        self._count("read")
        self._count("quarantined", 1, reason)
        logs.event("ingest.episode", status="quarantined", dataset=self.dataset,
                   episode=index, reason=reason, detail=None if error is None else str(error),
                   metric="robocache_ingest_episodes_quarantined_total")

    def cached(self, index: int, episode, cols: Mapping[str, Any]) -> None:
        """Episode written: ``episode`` as read, ``cols`` the aligned columns."""
        self.lap("write")
        self.cached_sizes(index, episode_sizes(episode, cols))

    def cached_sizes(self, index: int, sizes: Mapping[str, int]) -> None:
        """Episode written, given its :func:`episode_sizes` (computed where it was aligned)."""
        self._count("read")
        self._count("cached")
        for key in ("samples", "steps", "frames", "bytes_in", "bytes_out"):
            self._count(key, sizes[key])
        logs.event("ingest.episode", status="cached", dataset=self.dataset, episode=index,
                   steps=sizes["steps"], bytes_read=sizes["bytes_in"],
                   bytes_written=sizes["bytes_out"],
                   seconds={k: round(v, 6) for k, v in self.seconds.items()},
                   metric="robocache_ingest_episodes_cached_total")

    def done(self, manifest: Mapping[str, Any]) -> None:
        logs.event("ingest.summary", dataset=self.dataset, **manifest["counts"],
                   seconds=round(manifest["seconds"], 6))


def episode_sizes(episode, cols: Mapping[str, Any]) -> dict[str, int]:
    """What a cached episode counts for: source samples, aligned steps, image frames, bytes
    read (data and timestamps) and written (aligned columns and frames)."""
    streams = episode.streams.values()
    images = [s for s in streams if s.spec.kind == "image"]
    return {"samples": sum(len(s) for s in streams), "steps": len(cols["step"]),
            "frames": sum(len(s) for s in images),
            "bytes_in": sum(_nbytes(s.data) + _nbytes(s.times) for s in streams),
            "bytes_out": sum(_nbytes(v) for v in cols.values())
            + sum(_nbytes(s.data) for s in images)}


def ingest(source, planned: int) -> IngestRecorder:
    """The recorder of one :func:`robocache.cache.build` run over ``source`` (label
    ``dataset``: the source directory's name)."""
    return IngestRecorder(Path(str(getattr(source, "path", source))).name, planned)


# -------------------------------------------------------------------------------------- loader

class LoaderStats:
    """Loader numbers of one (dataset, rank), updated by the consuming process per batch.

    Per batch the hot path reads the clock twice and appends the wait to a list; every
    ``FLUSH_WAITS`` batches the waits are bucketed with NumPy. ``_waits`` (bucket counts, sum,
    pending waits) is replaced whole, so a collecting thread always reads a consistent triple.
    """

    FLUSH_WAITS = 4096

    def __init__(self, dataset: str, rank: str):
        self.labels = (dataset, rank)
        self.samples = self.h2d_bytes = 0
        self.bytes_per_sample = self.step_sum = 0.0
        self._waits: tuple[np.ndarray, float, list[float]] = (
            np.zeros(len(WAIT_BUCKETS) + 1, np.int64), 0.0, [])
        self.first_batch_s = float("nan")
        self.prefetch = 0

    def h2d(self, tensors: Mapping[str, Any]) -> None:
        """Host-to-device copy of ``tensors`` (the workers path)."""
        self.h2d_bytes += sum(t.numel() * t.element_size() for t in tensors.values())

    @staticmethod
    def _bucketed(counts: np.ndarray, total: float, waits: list[float]):
        hist = np.bincount(np.searchsorted(WAIT_BUCKETS, waits, side="left"),
                           minlength=len(counts))
        return counts + hist, total + math.fsum(waits)

    def waits(self) -> tuple[np.ndarray, float]:
        """Per-bucket counts (``le`` bounds ``WAIT_BUCKETS`` then +Inf, not cumulative) and the
        sum of the consumer's waits, seconds."""
        counts, total, pending = self._waits
        return self._bucketed(counts, total, list(pending))

    def _flush(self) -> list[float]:
        counts, total, pending = self._waits
        self._waits = (*self._bucketed(counts, total, pending), [])
        return self._waits[2]

    def watch(self, batches: Iterator[dict], batch_size: int | None) -> Iterator[dict]:
        """Yield ``batches``, timing the consumer's wait in ``next()`` and the interval between
        deliveries (their ratio is the stall ratio). ``batch_size``: every batch's size when
        fixed (else read from each batch's ``index``)."""
        clock, pending, flush_at = time.perf_counter, self._waits[2], self.FLUSH_WAITS
        start = last = clock()
        first = True
        for batch in batches:
            got = clock()
            if first:
                first, self.first_batch_s = False, got - start
                if not self.bytes_per_sample:
                    n = batch["index"].shape[0]
                    self.bytes_per_sample = sum(v.numel() * v.element_size()
                                                for v in batch.values()) / max(n, 1)
            pending.append(got - start)
            self.step_sum += got - last
            self.samples += batch_size or batch["index"].shape[0]
            if len(pending) >= flush_at:
                pending = self._flush()
            last = got
            yield batch
            start = clock()


def _dataset_label(loader) -> str:
    """The source dataset's directory name (as ingest labels it); ``+``-joined for a mixture."""
    def name(d) -> str:
        source = getattr(d, "manifest", {}).get("source", {}).get("path")
        return Path(str(source or getattr(d, "path", "memory"))).name

    return "+".join(name(d) for d in loader.datasets)


def watch_loader(loader, batches: Iterator[dict]) -> Iterator[dict]:
    """``batches`` of ``loader``, timed when metrics are on (unchanged, at no cost, when off).
    Sets ``loader._metrics`` to the stats so the loader can report its copies."""
    if not _on:
        loader._metrics = None
        return batches
    key = (_dataset_label(loader), rank())
    stats = _loaders.get(key)
    if stats is None:
        stats = _loaders.setdefault(key, LoaderStats(*key))
    stats.prefetch = loader.prefetch_depth
    loader._metrics = stats
    fixed = loader.sampler.drop_last or loader.mixed
    return stats.watch(batches, loader.sampler.batch_size if fixed else None)


def loader_summary(dataset: str | None = None) -> dict[str, dict[str, float]]:
    """The loader numbers of this process by ``dataset/rank`` (what a scrape reports)."""
    out = {}
    for (d, r), s in list(_loaders.items()):
        if dataset in (None, d):
            counts, wait = s.waits()
            out[f"{d}/{r}"] = {"batches": int(counts.sum()), "samples": s.samples,
                               "wait_seconds": wait, "step_seconds": s.step_sum,
                               "h2d_bytes": s.h2d_bytes, "first_batch_seconds": s.first_batch_s,
                               "stall_ratio": wait / s.step_sum if s.step_sum else 0.0}
    return out


# ----------------------------------------------------------------------------------------- ops

def _tensor_bytes(x: Any, depth: int = 0) -> int:
    import torch

    if isinstance(x, torch.Tensor):
        return x.numel() * x.element_size()
    if depth >= 3:
        return 0
    if isinstance(x, Mapping):
        return sum(_tensor_bytes(v, depth + 1) for v in x.values())
    if isinstance(x, (list, tuple)):
        return sum(_tensor_bytes(v, depth + 1) for v in x)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return sum(_tensor_bytes(getattr(x, f.name), depth + 1) for f in dataclasses.fields(x))
    return 0


def _count_op(op: str, args: tuple, kwargs: dict, out: Any) -> None:
    import torch

    if torch.compiler.is_compiling():
        return
    entry = _ops.get(op)
    if entry is None:
        entry = _ops.setdefault(op, [0, 0])
    entry[0] += 1
    entry[1] += _tensor_bytes(args) + _tensor_bytes(kwargs) + _tensor_bytes(out)


def count_frames(decoder: str, n: int) -> None:
    """Record ``n`` camera frames decoded by ``decoder`` (``"nvjpeg"`` or ``"cpu"``); a no-op
    while metrics are off. Frames decoded in DataLoader worker processes are not seen."""
    if _on:
        _frames[decoder] = _frames.get(decoder, 0) + n


def frames_summary() -> dict[str, int]:
    """Camera frames decoded in this process, by decoder."""
    return dict(_frames)


def op_summary() -> dict[str, dict[str, int]]:
    """Calls and bytes per op recorded in this process."""
    return {op: {"calls": c, "bytes": b} for op, (c, b) in list(_ops.items())}


# ----------------------------------------------------------------------------------------- GPU

def _gpu_samples() -> Iterator[tuple[str, str, float]]:
    """(metric, gpu, value) from NVML and torch; nothing without a GPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
    except Exception:  # no NVML library, no driver, no GPU: no GPU series
        count = 0
    for i in range(count):
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            util = pynvml.nvmlDeviceGetUtilizationRates(h)
        except Exception:
            continue
        yield "memory_used_bytes", str(i), float(mem.used)
        yield "memory_total_bytes", str(i), float(mem.total)
        yield "utilization_ratio", str(i), util.gpu / 100.0
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        for i in range(torch.cuda.device_count()):
            yield "torch_allocated_bytes", str(i), float(torch.cuda.memory_allocated(i))
            yield "torch_reserved_bytes", str(i), float(torch.cuda.memory_reserved(i))
    for gpu, value in list(_ceilings.items()):
        yield "copy_ceiling_bytes_per_second", gpu, value


GPU_METRICS = {
    "memory_used_bytes": "GPU memory in use (NVML, all processes).",
    "memory_total_bytes": "GPU memory installed (NVML).",
    "utilization_ratio": "Fraction of the last sample period a kernel ran (NVML).",
    "torch_allocated_bytes": "Memory held by this process' tensors (torch).",
    "torch_reserved_bytes": "Memory reserved by this process' caching allocator (torch).",
    "copy_ceiling_bytes_per_second": "Measured device copy bandwidth (robocache doctor).",
}


# ------------------------------------------------------------------------------ the collector

class _Collector:
    """Loader, op and GPU families, built from plain numbers when a scrape or push collects."""

    def collect(self):
        from prometheus_client.core import (
            CounterMetricFamily,
            GaugeMetricFamily,
            HistogramMetricFamily,
        )

        lab = ["dataset", "rank"]
        fam = {
            "batches": CounterMetricFamily("robocache_loader_batches",
                                           "Batches the loader delivered.", labels=lab),
            "samples": CounterMetricFamily("robocache_loader_samples",
                                           "Samples the loader delivered.", labels=lab),
            "bytes": CounterMetricFamily("robocache_loader_bytes",
                                         "Bytes of the batches delivered.", labels=lab),
            "h2d": CounterMetricFamily("robocache_loader_h2d_bytes",
                                       "Bytes copied host to device per batch (workers path).",
                                       labels=lab),
            "step": CounterMetricFamily(
                "robocache_loader_step_seconds",
                "Seconds between batch deliveries (consumer compute + wait).", labels=lab),
            "wait": HistogramMetricFamily(
                "robocache_loader_wait_seconds",
                "Seconds the consumer waited in next() for a batch.", labels=lab),
            "stall": GaugeMetricFamily(
                "robocache_loader_stall_ratio",
                "Wait / time between deliveries since the process started (0-1).", labels=lab),
            "first": GaugeMetricFamily("robocache_loader_first_batch_seconds",
                                       "Seconds from iter() to the first batch (latest epoch).",
                                       labels=lab),
            "prefetch": GaugeMetricFamily("robocache_loader_prefetch_depth",
                                          "Batches prepared ahead of the consumer.",
                                          labels=lab),
        }
        for labels, s in list(_loaders.items()):
            labels = list(labels)
            counts, wait = s.waits()
            fam["batches"].add_metric(labels, int(counts.sum()))
            fam["samples"].add_metric(labels, s.samples)
            fam["bytes"].add_metric(labels, s.samples * s.bytes_per_sample)
            fam["h2d"].add_metric(labels, s.h2d_bytes)
            fam["step"].add_metric(labels, s.step_sum)
            bounds = [str(b) for b in WAIT_BUCKETS] + ["+Inf"]
            fam["wait"].add_metric(labels, list(zip(bounds, np.cumsum(counts).tolist(),
                                                    strict=True)), wait)
            fam["stall"].add_metric(labels, wait / s.step_sum if s.step_sum else 0.0)
            if s.first_batch_s == s.first_batch_s:
                fam["first"].add_metric(labels, s.first_batch_s)
            fam["prefetch"].add_metric(labels, s.prefetch)
        yield from fam.values()
        calls = CounterMetricFamily("robocache_op_calls", "Calls of each public op.",
                                    labels=["op"])
        nbytes = CounterMetricFamily("robocache_op_bytes",
                                     "Bytes of the tensors each op took and returned.",
                                     labels=["op"])
        for op, (c, b) in list(_ops.items()):
            calls.add_metric([op], c)
            nbytes.add_metric([op], b)
        yield calls
        yield nbytes
        frames = CounterMetricFamily("robocache_camera_frames_decoded",
                                     "Camera frames decoded for served batches.",
                                     labels=["decoder"])
        for decoder, n in list(_frames.items()):
            frames.add_metric([decoder], n)
        yield frames
        gpu = {k: GaugeMetricFamily(f"robocache_gpu_{k}", h, labels=["gpu"])
               for k, h in GPU_METRICS.items()}
        for key, index, value in _gpu_samples():
            gpu[key].add_metric([index], value)
        yield from (g for g in gpu.values() if g.samples)
