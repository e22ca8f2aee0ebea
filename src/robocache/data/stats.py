"""Statistics of what the model sees: relative action chunks, streamed over a whole cache.

    >>> stats = relative_action_stats("/data/droid.cache", {"action": {
    ...     "mode": "joint", "state": "observation.state", "absolute_dims": [7]}}, horizon=50)
    >>> stats["action"].q99                      # float64 [8], exact
    $ robocache stats /data/droid.cache --relative action=joint:observation.state \\
          --absolute-dims action=7 --horizon 50

The statistics of a relative key are those of every value the loader serves for it: each
valid window start (every served step), each offset of the chunk, the transform of
:mod:`robocache.data.relative` applied exactly as the loader applies it (the same code, on the
same device), padded steps (``<key>_is_pad``: past the episode's end, or no sample) left out.
Mean and standard deviation (population, ddof 0) accumulate in float64 (Chan's parallel
formula over chunks). q01 and q99 are exact, defined as NumPy's
``np.quantile(values.astype(np.float64), q, method="linear")`` per dimension, and found in
bounded memory by a radix selection on the values' bits: each float maps to an integer key in
the same order; the first pass (with the moments) counts the keys' top 16 bits per dimension
(65,536 bins), which locates the bin holding each order statistic the quantiles interpolate;
each further pass counts the next 16 bits of the values inside those bins only. float32
values take two passes (float64 four; float16 / bfloat16 two, the second for the mergeable
histogram), whatever the data's spread or ties, and never hold more than a chunk of values.
The order statistics are then interpolated with NumPy's own formula. Like every
:class:`robocache.Stats` the result also carries the dyadic histogram that
:func:`robocache.merge_stats` merges (e.g. the statistics of several datasets).

Chunks of window starts go through the passes one after the other on a GPU, and on the CPU
on a thread pool (one torch thread each; each chunk's partial counts and moments merged in
chunk order, so the result is the same whatever the number of threads).

Where they are kept: ``relative_stats/<digest>.json`` beside the cache's ``stats.json`` (one
file per key, transform, chunk offsets and cache version: :func:`stats_file`), written
atomically, holding the transform, the offsets, the cache's identity (version, creation time,
rows: statistics of a cache rebuilt or extended since are not used) and the statistics.
Nothing else in the cache is touched. :class:`~robocache.data.dataset.RobotDataset` serves a
relative key with them (:attr:`~robocache.data.dataset.RobotDataset.stats`), so the
loader's normalizer picks them; without them normalizing the key is refused.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from robocache.data.owned import RELATIVE_STATS
from robocache.data.relative import KeySpec
from robocache.errors import DataError

#: The folder of the relative statistics, inside the cache (a cache's own: ``--overwrite``
#: removes it with the cache).
RELATIVE_DIR = RELATIVE_STATS
FORMAT = "robocache-relative-stats/1"
QUANTILES = (0.01, 0.99)
DIGIT = 16  # bits counted per pass
BINS = 1 << DIGIT
# Values (starts x offsets x dims) per chunk. GPU: one chunk's temporaries (float64 copy,
# keys, bin indices: ~40 bytes a value) stay near 1.3 GB; CPU: a chunk per thread, small
# enough for the core's caches to matter less than the pool's overhead.
CHUNK_VALUES = {"cuda": 1 << 25, "cpu": 1 << 21}


# --------------------------------------------------------------------------- storage

def _identity(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """What ties statistics to the rows they were computed over."""
    from robocache.data.versions import number

    return {"version": number(manifest), "created": manifest.get("created"),
            "rows": (manifest.get("counts") or {}).get("rows"),
            "tables": manifest.get("tables")}


def stats_file(manifest: Mapping[str, Any], key: str, spec: KeySpec,
               offsets: Sequence[int]) -> str:
    """The cache-relative path of the statistics of ``key`` under ``spec`` over chunks at row
    ``offsets``, for the cache version ``manifest`` describes."""
    from robocache.data.versions import number

    ident = {"key": key, "relative": spec.tag(offsets), "version": number(manifest)}
    digest = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:20]
    return f"{RELATIVE_DIR}/{digest}.json"


def load_relative_stats(location, manifest: Mapping[str, Any], key: str, spec: KeySpec,
                        offsets: Sequence[int]):
    """The stored :class:`robocache.Stats` of ``key``'s relative chunks (see
    :func:`stats_file`), or None: none stored, or stored for other rows (a cache rebuilt or
    extended since)."""
    from robocache.ops.normalize import Stats

    rel = stats_file(manifest, key, spec, offsets)
    try:
        doc = json.loads(location.read_text(rel))
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{location.child(rel)} is not valid JSON ({e}); delete it and compute "
                        "the statistics again (robocache stats).") from e
    if doc.get("relative") != spec.tag(offsets) or doc.get("cache") != _identity(manifest):
        return None
    return Stats.from_dict(doc["stats"])


def command_hint(dataset, key: str) -> str:
    """The ``robocache stats`` command that computes ``key``'s relative statistics for
    ``dataset`` (its relative spec and chunk offsets)."""
    spec = dataset.relative.specs[key]
    offsets = [int(o) for o in dataset.deltas[key]]
    parts = [f"robocache stats {dataset.location.uri} --relative {key}={spec.mode}:{spec.state}"]
    if spec.absolute_dims:
        parts.append(f"--absolute-dims {key}={','.join(map(str, spec.absolute_dims))}")
    if spec.state_dims != spec.dims:
        parts.append(f"--state-dims {key}={','.join(map(str, spec.state_dims))}")
    if spec.mode != "joint":
        parts.append(f"--rotation {key}={spec.rotation}")
        if spec.state_rotation != spec.rotation:
            parts.append(f"--state-rotation {key}={spec.state_rotation}")
    parts.append(f"--horizon {len(offsets)}" if offsets == list(range(len(offsets)))
                 else f"--offsets {','.join(map(str, offsets))}")
    return " ".join(parts)


# --------------------------------------------------------------------------- order keys

def _key_dtype(dtype: torch.dtype) -> tuple[torch.dtype, int]:
    bits = dtype.itemsize * 8
    return {16: torch.int16, 32: torch.int32, 64: torch.int64}[bits], bits


def order_keys(x: torch.Tensor) -> torch.Tensor:
    """Integer keys of float values ``x`` in the same order (``-0.0`` just below ``+0.0``):
    the bits as a signed integer, the magnitude bits flipped for negative values; int32 for
    16- and 32-bit floats, int64 for float64."""
    kind, bits = _key_dtype(x.dtype)
    i = x.contiguous().view(kind)
    i = i.int() if bits == 16 else i  # room for the digits' arithmetic
    return i ^ ((i >> (bits - 1)) & ((1 << (bits - 1)) - 1))


def from_keys(keys: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The float values of :func:`order_keys`' keys (its inverse)."""
    kind, bits = _key_dtype(dtype)
    i = keys ^ ((keys >> (bits - 1)) & ((1 << (bits - 1)) - 1))
    return i.to(kind).view(dtype)


def _digit(keys: torch.Tensor, level: int, bits: int) -> torch.Tensor:
    """Digit ``level`` (16 bits, from the top) of the keys, in [0, 65536), in key order."""
    shift = bits - DIGIT * (level + 1)
    if level == 0:
        return (keys >> shift) + (1 << (DIGIT - 1))
    return (keys >> shift) & (BINS - 1)


def numpy_ranks(n: int, q: float) -> tuple[int, int, float]:
    """The order statistics (0-based) NumPy's 'linear' quantile ``q`` of ``n`` values
    interpolates between, and its weight: NumPy's own arithmetic."""
    v = (n - 1) * q
    if v >= n - 1:
        return n - 1, n - 1, v - math.floor(v)
    lo = math.floor(v)
    return lo, lo + 1, v - lo


def numpy_lerp(a: np.ndarray, b: np.ndarray, t: float) -> np.ndarray:
    """NumPy's ``_lerp`` (float64): ``a + (b - a) t``, from ``b`` when ``t >= 0.5``."""
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


# --------------------------------------------------------------------------- the passes

class _Pass:
    """One pass's per-chunk reduction of one key's valid values ``xt [D, N]`` (one dimension
    per row: every step along contiguous memory) and the merge of the chunks' results (in
    chunk order). Level 0: count, mean and squared deviations (float64), extremes, and the
    counts of the keys' top 16 bits; level l > 0: the counts of the keys' digit l among the
    values whose higher digits equal one of ``prefixes`` (``[S, D]``, distinct rows); and,
    with ``grid``, the dyadic histogram of :class:`robocache.Stats`."""

    def __init__(self, level: int, bits: int, dim: int, prefixes: torch.Tensor | None,
                 grid: tuple[torch.Tensor, torch.Tensor] | None):
        self.level, self.bits, self.dim = level, bits, dim
        self.prefixes, self.grid = prefixes, grid  # [S, D] key prefixes; (scale, origin)

    def chunk(self, xt: torch.Tensor) -> dict[str, torch.Tensor]:
        d, dev = self.dim, xt.device
        out: dict[str, torch.Tensor] = {}
        keys = order_keys(xt)
        base = (torch.arange(d, device=dev, dtype=keys.dtype) * BINS)[:, None]
        if self.level == 0:
            n = xt.shape[1]
            x64 = xt.double()
            mean = x64.sum(1) / max(n, 1)
            lo, hi = torch.aminmax(xt, dim=1) if n else (torch.full((d,), torch.inf, device=dev),
                                                         torch.full((d,), -torch.inf,
                                                                    device=dev))
            out.update(n=torch.tensor(float(n), dtype=torch.float64, device=dev), mean=mean,
                       m2=x64.sub_(mean[:, None]).square_().sum(1), lo=lo.double(),
                       hi=hi.double())
            out["counts"] = torch.bincount((_digit(keys, 0, self.bits) + base).view(-1),
                                           minlength=d * BINS)
        elif self.prefixes is not None:
            shift = self.bits - DIGIT * self.level
            high, idx = keys >> shift, _digit(keys, self.level, self.bits) + base
            out["counts"] = torch.stack([
                torch.bincount(idx[high == p.to(high.dtype)[:, None]], minlength=d * BINS)
                for p in self.prefixes])
        if self.grid is not None:  # the dyadic histogram of robocache.Stats
            from robocache.ops.normalize import DEFAULT_BINS

            scale, origin = self.grid  # float64 [D, 1]: 2**-e and the first bin's index
            # floor(x / 2**e) - origin: the scaling is exact, as in reference.grid_index
            j = xt.double().mul_(scale).floor_().sub_(origin).clamp_(0, DEFAULT_BINS - 1)
            j = j.int() + (torch.arange(d, device=dev, dtype=torch.int32) * DEFAULT_BINS)[:, None]
            out["hist"] = torch.bincount(j.view(-1), minlength=d * DEFAULT_BINS)
        return out

    @staticmethod
    def merge(acc: dict[str, torch.Tensor] | None, part: dict[str, torch.Tensor]
              ) -> dict[str, torch.Tensor]:
        if acc is None:
            return part
        out = {k: acc[k] + part[k] for k in ("counts", "hist") if k in acc}
        if "n" in acc:  # Chan's parallel mean and squared deviations
            na, nb = acc["n"], part["n"]
            n = na + nb
            delta = part["mean"] - acc["mean"]
            w = nb / n.clamp_min(1)
            out.update(n=n, mean=acc["mean"] + delta * w,
                       m2=acc["m2"] + part["m2"] + delta.square() * na * w,
                       lo=torch.minimum(acc["lo"], part["lo"]),
                       hi=torch.maximum(acc["hi"], part["hi"]))
        return out


def _locate(counts: torch.Tensor, within: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of ``counts [R, D, BINS]`` the bin holding 0-based rank ``within [R, D]``, and
    the rank inside that bin."""
    cum = counts.cumsum(-1)
    b = torch.searchsorted(cum, within[..., None], right=True)[..., 0]
    before = torch.where(b > 0, cum.gather(-1, (b - 1).clamp_min(0)[..., None])[..., 0], 0)
    return b, within - before


def _chunks(n: int, width: int, device: torch.device) -> list[tuple[int, int]]:
    per = max(1, CHUNK_VALUES["cuda" if device.type == "cuda" else "cpu"] // max(width, 1))
    return [(a, min(n, a + per)) for a in range(0, n, per)]


def _scan(view, passes: Mapping[str, _Pass], device: torch.device, threads: int,
          progress: Callable[[int, int], None] | None, done: list[int], total: int
          ) -> dict[str, dict[str, torch.Tensor]]:
    """One pass over every window start of ``view``: each key's :class:`_Pass` per chunk,
    merged in chunk order (chunks on ``threads`` CPU threads, or one after the other on a
    GPU)."""
    from robocache.data.build.align import one_thread

    width = max(len(view.deltas[k]) * view.layout[k].dim for k in passes)
    chunks = _chunks(len(view), width, device)

    def run(span: tuple[int, int]) -> dict[str, dict[str, torch.Tensor]]:
        batch = view.fetch(torch.arange(*span, device=device))
        out = {}
        for k, p in passes.items():
            # the valid steps' values, one dimension per row
            xt = batch[k][~batch[f"{k}_is_pad"]].t().contiguous()
            out[k] = p.chunk(xt)
        return out

    acc: dict[str, dict[str, torch.Tensor] | None] = dict.fromkeys(passes)

    def add(part) -> None:
        for k in passes:
            acc[k] = _Pass.merge(acc[k], part[k])
        done[0] += 1
        if progress is not None:
            progress(done[0], total)

    if device.type == "cuda" or threads <= 1:
        for span in chunks:
            add(run(span))
        return acc
    with one_thread("cpu"), ThreadPoolExecutor(threads) as pool:
        pending = []
        for span in chunks:  # at most 2 chunks a thread in flight: bounded memory
            pending.append(pool.submit(run, span))
            if len(pending) >= 2 * threads:
                add(pending.pop(0).result())
        for f in pending:
            add(f.result())
    return acc


def _stats_view(dataset, specs: Mapping[str, KeySpec], offsets: Mapping[str, list[int]]):
    """A shallow copy of ``dataset`` serving only the relative keys (chunks at ``offsets``)
    and their state keys, transformed as ``specs`` say, not normalized."""
    import copy

    from robocache.data.relative import RelativeActions

    view = copy.copy(dataset)
    keys = list(dict.fromkeys([*specs, *(s.state for s in specs.values())]))
    view.layout = {k: dataset.layout[k] for k in keys}
    view.deltas = {k: offsets[k] if k in specs else [0] for k in keys}
    view.squeezed, view.image_keys, view.frames = [], [], {}
    view.action_keys = list(specs)
    view.obs_keys = [k for k in keys if k not in specs]
    view.relative = RelativeActions(specs)
    view.set_windows()
    return view


def relative_action_stats(source, relative_actions: Mapping[str, Mapping[str, Any]] | None = None,
                          horizon: int | Sequence[int] | None = None, *,
                          device: str | torch.device | None = None, store: bool | None = None,
                          threads: int | None = None,
                          storage_options: Mapping[str, Any] | None = None,
                          progress: Callable[[int, int], None] | None = None):
    """Mean, std and exact q01/q99 of relative action chunks over a whole cache (see the
    module docstring), stored in the cache.

    Args:
        source: a cache (directory or URI), or a :class:`~robocache.data.dataset.RobotDataset`
            (its served steps: its episodes, kept ranges and split).
        relative_actions: as :class:`~robocache.data.dataset.RobotDataset`'s (default: the
            dataset's own).
        horizon: chunk length (offsets ``0..horizon-1``), or the row offsets of a chunk
            (LeRobot's ``delta_timestamps`` in steps); default: the dataset's own windows.
        device: where the passes run (default: CUDA when available, else the CPU).
        store: keep them in the cache (:func:`stats_file`); default: when ``source`` serves
            every step of the cache (statistics of a subset are returned only).
        threads: CPU threads (default: the usable cores).
        storage_options: object-store settings of a cache URI.
        progress: called with (chunks done, chunks in all) after each chunk of each pass.

    Returns:
        ``{key: robocache.Stats}`` (float64 CPU tensors; ``relative`` names the transform and
        the offsets, ``exact_quantiles`` is True).

    Raises:
        DataError: a bad ``relative_actions`` entry or horizon, no relative key, no valid
            value, NaN or infinity among the transformed values, ``store=True`` for a subset
            of the cache.

    Example:
        >>> s = relative_action_stats(cache, {"action": {"mode": "joint",
        ...     "state": "observation.state"}}, horizon=50)
        >>> s["action"].q01.shape
        torch.Size([8])
    """
    from robocache._env import usable_cores
    from robocache.data.dataset import RobotDataset
    from robocache.data.location import Location
    from robocache.data.relative import parse
    from robocache.ops import normalize as N
    from robocache.reference import normalize as ref

    if isinstance(horizon, bool) or (horizon is not None and not (
            (isinstance(horizon, int) and horizon >= 1) or (
                isinstance(horizon, Sequence) and len(horizon) > 0
                and all(isinstance(o, int) and not isinstance(o, bool) for o in horizon)))):
        raise DataError(f"`horizon` must be an integer >= 1 or a non-empty list of integer row "
                        f"offsets; got {horizon!r}.")
    if isinstance(source, RobotDataset):
        dataset = source
        spec = relative_actions if relative_actions is not None else \
            {k: s.entry() for k, s in (source.relative.specs.items() if source.relative
                                       else ())}
    else:
        if relative_actions is None or horizon is None:
            raise DataError("pass `relative_actions` and `horizon` with a cache path (a "
                            "RobotDataset brings its own).")
        spec = relative_actions
        streams = Location(source, storage_options).manifest()["streams"]
        fields = {k: (int(np.prod(s["shape"], dtype=np.int64)), np.dtype(s["dtype"]).kind == "f",
                      s["kind"] != "numeric") for k, s in streams.items()
                  if s["kind"] in ("numeric", "image", "video")}
        specs = parse(spec, fields, [k for k, f in fields.items() if not f[2]])
        keys = list(dict.fromkeys([*specs, *(s.state for s in specs.values())]))
        dataset = RobotDataset(source, keys=keys, storage_options=storage_options)
    fields = {k: (key.dim, key.dtype.is_floating_point, k in dataset.image_keys)
              for k, key in dataset.layout.items()}
    specs = parse(spec, fields, list(fields))
    if not specs:
        raise DataError("`relative_actions` names no relative key (every entry is "
                        "'absolute'); nothing to compute.")
    offsets = {k: (list(range(horizon)) if isinstance(horizon, int) else
                   [int(o) for o in horizon]) if horizon is not None else
               [int(o) for o in dataset.deltas[k]] for k in specs}
    whole = len(dataset) == int(dataset.manifest["counts"]["rows"])
    if store and not whole:
        raise DataError(f"the dataset serves {len(dataset):,} of the cache's "
                        f"{dataset.manifest['counts']['rows']:,} steps; statistics of a subset "
                        "are not stored (pass store=False, or a dataset of the whole cache).")
    store = whole if store is None else store
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    threads = threads or usable_cores()
    t0 = time.perf_counter()
    view = _stats_view(dataset, specs, offsets).to(device)
    kinds = {k: _key_dtype(view.layout[k].dtype)[1] for k in specs}
    levels = {k: b // DIGIT for k, b in kinds.items()}
    npasses = max(2, max(levels.values()))
    per_pass = len(_chunks(len(view), max(len(offsets[k]) * specs[k].width for k in specs),
                           device))
    done, total = [0], per_pass * npasses

    first = _scan(view, {k: _Pass(0, kinds[k], specs[k].width, None, None) for k in specs},
                  device, threads, progress, done, total)
    state = {}
    for k, acc in first.items():
        n = int(acc["n"]) if acc is not None else 0
        if n == 0:
            raise DataError(f"`{k}` has no valid value in its relative chunks (every step is "
                            "padded); check the cache and `horizon`.")
        bad = (~torch.isfinite(acc["lo"]) | ~torch.isfinite(acc["hi"])).cpu()  # (NaN too)
        if bool(bad.any()):
            raise DataError(f"`{k}`'s relative chunks hold NaN or infinity (dimension "
                            f"{int(bad.nonzero()[0])}); repair the cache's values (or the "
                            "state's rotations) before computing statistics.")
        lo, hi = acc["lo"].cpu(), acc["hi"].cpu()
        e = ref.fit_exponent(lo, hi, N.DEFAULT_BINS)
        ranks = sorted({r for q in QUANTILES for r in numpy_ranks(n, q)[:2]})
        within = torch.tensor(ranks, device=device)[:, None].expand(-1, specs[k].width)
        bins, rest = _locate(acc["counts"].view(1, -1, BINS).expand(len(ranks), -1, -1),
                             within.contiguous())
        origin = ref.grid_index(lo, e)
        grid = (torch.ldexp(torch.ones_like(lo), -e.double())[:, None].to(device),
                origin.double()[:, None].to(device))
        state[k] = {"n": n, "acc": acc, "ranks": ranks, "prefix": bins - (1 << (DIGIT - 1)),
                    "rest": rest, "grid": grid, "dyadic": (e, origin)}
    hist = {}
    for level in range(1, npasses):
        passes = {}
        for k in specs:
            s = state[k]
            deeper = level < levels[k]
            # one slot per distinct row of prefixes (a quantile's two ranks mostly share it)
            slots, s["slot"] = torch.unique(s["prefix"], dim=0, return_inverse=True)
            passes[k] = _Pass(level, kinds[k], specs[k].width, slots if deeper else None,
                              s["grid"] if level == npasses - 1 else None)
        found = _scan(view, passes, device, threads, progress, done, total)
        for k, acc in found.items():
            s = state[k]
            if level < levels[k]:
                counts = acc["counts"].view(-1, specs[k].width, BINS)[s["slot"]]
                digit, s["rest"] = _locate(counts, s["rest"])
                s["prefix"] = (s["prefix"] << DIGIT) + digit
            if "hist" in acc:
                hist[k] = acc["hist"].view(specs[k].width, N.DEFAULT_BINS).cpu()
    out = {}
    for k, spec in specs.items():
        s = state[k]
        acc = s["acc"]
        values = from_keys(s["prefix"], view.layout[k].dtype).double().cpu().numpy()
        row = dict(zip(s["ranks"], values, strict=True))
        quant = []
        for q in QUANTILES:
            a, b, t = numpy_ranks(s["n"], q)
            quant.append(torch.from_numpy(numpy_lerp(row[a], row[b], t)))
        e, origin = s["dyadic"]
        out[k] = N.Stats(count=s["n"], mean=acc["mean"].cpu(),
                         std=(acc["m2"] / s["n"]).sqrt().cpu(), min=acc["lo"].cpu(),
                         max=acc["hi"].cpu(), q01=quant[0], q99=quant[1], hist_exponent=e,
                         hist_origin=origin, hist_counts=hist[k], exact_quantiles=True,
                         relative=spec.tag(offsets[k]))
    seconds = time.perf_counter() - t0
    if store:
        for k, spec in specs.items():
            _store(dataset, k, spec, offsets[k], out[k], seconds, device)
    return out


def _store(dataset, key: str, spec: KeySpec, offsets: list[int], stats, seconds: float,
           device: torch.device) -> str:
    """Write ``stats`` to :func:`stats_file` (atomically); returns its path in the cache."""
    import datetime as dt

    rel = stats_file(dataset.manifest, key, spec, offsets)
    doc = {"format": FORMAT, "key": key, "relative": spec.tag(offsets),
           "transform": spec.entry(), "offsets": offsets,
           "cache": _identity(dataset.manifest),
           "created": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
           "seconds": round(seconds, 3), "device": str(device), "stats": stats.to_dict()}
    dataset.location.write_bytes(rel, (json.dumps(doc) + "\n").encode())
    return rel


def stored(cache, storage_options: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """The relative statistics files of ``cache`` (each file's key, transform, offsets, and
    whether it matches the cache's current rows), for listings."""
    from robocache.data.location import Location

    location = Location(cache, storage_options)
    manifest = location.manifest()
    out = []
    for rel in sorted(location.sizes(RELATIVE_DIR)):
        if not rel.endswith(".json"):
            continue
        doc = json.loads(location.read_text(rel))
        out.append({"file": rel, "key": doc.get("key"), "transform": doc.get("transform"),
                    "offsets": doc.get("offsets"),
                    "current": doc.get("cache") == _identity(manifest),
                    "stats": doc.get("stats")})
    return out


__all__ = ["RELATIVE_DIR", "relative_action_stats", "load_relative_stats", "stats_file",
           "stored", "command_hint", "order_keys", "from_keys"]
