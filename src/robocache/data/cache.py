"""Build a training cache: every episode aligned to one rate, in a Lance dataset.

    $ robocache ingest data/sample/panda_multirate /tmp/panda.cache --rate 50

Layout of a cache directory::

    data.lance/         one row per (episode, step): episode_index, step, timestamp, task,
                        one column per stream (see below) and its `<column>_is_pad` mask
    frames/<col>.lance  camera streams: one row per source frame (episode_index, frame,
                        source_frame, timestamp, encoded: JPEG/PNG bytes; a source's own JPEG/PNG
                        bytes are kept as they came), see :mod:`robocache.data.cameras`
    stats.json          per-dimension mean, std, min, max, q01, q99 of every numeric stream
    manifest.json       source, rate, streams, episodes, quarantined episodes with reasons

Target times: from the latest start to the earliest end of the episode's numeric streams, at
``rate_hz`` (so continuous streams interpolate, never extrapolate). Per stream kind:

- numeric → ``method`` (default ``linear``; ``previous`` for integer/bool data), float32 ``[D]``.
- image / video → ``frame_index``: the source frame shown at each step (``<col>/frame``, -1 when
  none) and ``<col>/offset`` (t_frame - t_step, seconds). Video frames are decoded once here
  and stored like image frames (JPEG by default, ``camera_codec``).
- event (sparse strings) → ``previous``: the latest event so far (null before the first) and its
  age in seconds (``<col>/age``).

Stream names become column names with ``.`` replaced by ``/`` (Lance reserves ``.``).

Idempotent per episode: each episode is one Lance commit, so a killed run leaves whole episodes
only; re-running skips the episodes already in ``data.lance`` (resume) and re-checks the rest. A
malformed episode is quarantined with its reason and listed in the manifest; ``read = cached +
quarantined`` always holds.
"""

from __future__ import annotations

import datetime as _dt
import json
import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from robocache.data.cameras import CODECS, DEFAULT_QUALITY, decode_videos, frames_table
from robocache.data.episode import Episode, Source, StreamSpec, check_episode
from robocache.data.lock import LOCK_NAME, CacheLock
from robocache.errors import DataError
from robocache.observability import metrics

CACHE_FORMAT = "robocache-cache/1"
STATS_BATCH_ROWS = 1 << 20


@dataclass
class CacheConfig:
    """Options of :func:`build` (CLI flags of ``robocache ingest`` map onto these).

    Attributes:
        rate_hz: target rate in Hz of every stream in the cache.
        device: where alignment runs: ``"cuda"``, ``"cpu"`` or ``None`` (CUDA when available).
        keys: streams to cache (default: all the source declares).
        methods: stream -> alignment method overriding the defaults (see the module docstring).
        tolerance_s: steps farther than this from any source sample are padded (``None``: off).
        episodes: source episode indices to ingest (default: all).
        source_options: reader options, e.g. ``{"fps": 10.0}`` for a ReplayBuffer.
        overwrite: delete the cache at the destination instead of resuming it (only a directory
            recognised as a RoboCache cache is ever deleted).
        retry_quarantined: read again the episodes an earlier run quarantined (by default a
            resume leaves them quarantined).
        wait: when another process is writing the destination, wait for it to finish instead
            of failing with :class:`~robocache.errors.CacheBusyError`.
        shard: ``(i, n)`` or ``"i/n"``: cache only the episodes at positions ``p`` of the
            wanted list with ``p % n == i`` (see :func:`parse_shard`), so ``n`` independent
            jobs split a dataset; ``robocache merge`` joins their caches.
        camera_codec: how camera frames are stored: ``"jpeg"`` (GPU-decodable) or ``"png"``
            (lossless); uint16 (depth) frames are always PNG.
        camera_quality: JPEG quality (1-95).
    """

    rate_hz: float = 50.0
    device: str | None = None
    keys: list[str] | None = None
    methods: dict[str, str] = field(default_factory=dict)
    tolerance_s: float | None = None
    episodes: list[int] | None = None
    source_options: dict[str, Any] = field(default_factory=dict)
    overwrite: bool = False
    retry_quarantined: bool = False
    wait: bool = False
    shard: tuple[int, int] | str | None = None
    camera_codec: str = "jpeg"
    camera_quality: int = DEFAULT_QUALITY


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` -> ``(i, n)`` with ``0 <= i < n``.

    Raises:
        DataError: anything else (the message shows the form expected).
    """
    i, sep, n = str(text).partition("/")
    if sep and i.strip().isdigit() and n.strip().isdigit() and int(i) < int(n):
        return int(i), int(n)
    raise DataError(f"`shard` (--shard) must be i/n with 0 <= i < n (shard i of n, e.g. 0/4); "
                    f"got {text!r}.")


def column_name(stream: str) -> str:
    """The Lance column of a stream (Lance reserves ``.`` for struct fields)."""
    return stream.replace(".", "/")


def default_method(spec: StreamSpec) -> str:
    if spec.kind in ("image", "video"):
        return "frame_index"
    if spec.kind == "event":
        return "previous"
    return "previous" if np.dtype(spec.dtype).kind in "biu" else "linear"


def _schema(specs: dict[str, StreamSpec]):
    import pyarrow as pa

    fields = [pa.field("episode_index", pa.int64()), pa.field("step", pa.int64()),
              pa.field("timestamp", pa.float64()), pa.field("task", pa.string())]
    for name, spec in specs.items():
        col = column_name(name)
        if spec.kind == "numeric":
            fields.append(pa.field(col, pa.list_(pa.float32(), spec.dim)))
        elif spec.kind == "event":
            fields += [pa.field(col, pa.string()), pa.field(f"{col}/age", pa.float32())]
        else:
            fields += [pa.field(f"{col}/frame", pa.int64()),
                       pa.field(f"{col}/offset", pa.float32())]
        fields.append(pa.field(f"{col}_is_pad", pa.bool_()))
    return pa.schema(fields)


def target_times(episode: Episode, specs: dict[str, StreamSpec], rate_hz: float) -> np.ndarray:
    """float64 ``[T]`` seconds: the span every numeric stream covers, at ``rate_hz``."""
    timed = [n for n, s in specs.items() if s.kind == "numeric"] or \
            [n for n, s in specs.items() if s.kind != "event"]
    if not timed:
        raise DataError(f"episode {episode.index}: no timed (non-event) stream to align.")
    start = max(float(episode.streams[n].times[0]) for n in timed)
    end = min(float(episode.streams[n].times[-1]) for n in timed)
    if end < start:
        raise DataError(f"episode {episode.index}: the streams do not overlap in time "
                        f"(latest start {start:.6f} s > earliest end {end:.6f} s).")
    steps = int(math.floor((end - start) * rate_hz + 1e-6)) + 1
    # the 1e-6 absorbs rounding in the span; clamping keeps the last step inside every stream
    return np.minimum(start + np.arange(steps, dtype=np.float64) / rate_hz, end)


def load_episode(src: Source, index: int, specs: dict[str, StreamSpec]) -> Episode:
    """Read episode ``index`` (its videos decoded) and check it against ``specs`` (a bad
    episode raises)."""
    episode = src.read(index)
    decode_videos(episode, specs)
    check_episode(episode, specs)
    return episode


def align_episode(episode: Episode, specs: dict[str, StreamSpec], config: CacheConfig,
                  device) -> dict[str, Any]:
    """Align one (checked) episode to ``config.rate_hz``; returns the Lance columns as arrays."""
    import torch

    import robocache

    t = target_times(episode, specs, config.rate_hz)
    streams, events = {}, {}
    for name, spec in specs.items():
        s = episode.streams[name]
        times = torch.as_tensor(s.times, dtype=torch.float64, device=device)
        method = config.methods.get(name, default_method(spec))
        if spec.kind == "event":
            if len(s) == 0:
                continue
            ids = torch.arange(len(s), dtype=torch.float32, device=device)[:, None]
            streams[name] = robocache.Stream(ids, times, method="previous")
            events[name] = s.data
        elif spec.kind == "numeric":
            data = torch.from_numpy(np.array(s.data.reshape(len(s), -1), np.float32)).to(device)
            streams[name] = robocache.Stream(data, times, method=method,
                                             tolerance_s=config.tolerance_s)
        else:
            streams[name] = robocache.Stream(None, times, method="frame_index",
                                             tolerance_s=config.tolerance_s)
    out = robocache.align(streams, torch.as_tensor(t, device=device))
    n = len(t)
    cols: dict[str, Any] = {
        "episode_index": np.full(n, episode.index, np.int64),
        "step": np.arange(n, dtype=np.int64),
        "timestamp": t,
        "task": np.full(n, (episode.meta.get("tasks") or [""])[0], dtype=object),
    }
    for name, spec in specs.items():
        col = column_name(name)
        if name not in streams:  # an event stream without events in this episode
            cols[col] = np.full(n, None, dtype=object)
            cols[f"{col}/age"] = np.full(n, np.nan, np.float32)
            cols[f"{col}_is_pad"] = np.ones(n, bool)
            continue
        pad = out.is_pad[name].reshape(n).cpu().numpy()
        values = out.values[name].reshape(n, -1).cpu().numpy()
        if spec.kind == "numeric":
            cols[col] = values.astype(np.float32)
        elif spec.kind == "event":
            # an event holds until the next one: only steps before the first are padding
            pad = t < episode.streams[name].times[0]
            ids = values[:, 0].round().astype(np.int64)
            cols[col] = np.where(pad, None, events[name][ids.clip(0, len(events[name]) - 1)])
            cols[f"{col}/age"] = out.age[name].reshape(n).cpu().numpy().astype(np.float32)
        else:
            cols[f"{col}/frame"] = np.where(pad, -1, values[:, 0].astype(np.int64))
            cols[f"{col}/offset"] = out.offset[name].reshape(n).cpu().numpy().astype(np.float32)
        cols[f"{col}_is_pad"] = pad.astype(bool)
    return cols


def _table(cols: dict[str, Any], schema):
    import pyarrow as pa

    arrays = []
    for f in schema:
        v = cols[f.name]
        if pa.types.is_fixed_size_list(f.type):
            arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)),
                                                            f.type.list_size))
        else:
            arrays.append(pa.array(v.tolist() if v.dtype == object else v, f.type))
    return pa.Table.from_arrays(arrays, schema=schema)


def _camera_entry(spec: StreamSpec, config: CacheConfig) -> dict[str, Any]:
    """Manifest fields of a camera stream: how its frames are stored."""
    if spec.kind not in ("image", "video"):
        return {}
    codec = spec.encoding or ("png" if spec.dtype == "uint16" else config.camera_codec)
    return {"codec": codec, "quality": config.camera_quality if codec == "jpeg" else None}


def write_episode(dest: Path, episode: Episode, cols: dict[str, Any],
                  specs: dict[str, StreamSpec], config: CacheConfig | None = None
                  ) -> list[tuple[str, Any, list]]:
    """Write one aligned episode's Lance data files under ``dest``, uncommitted (invisible
    until :func:`commit` adds them; a writer killed here leaves no rows). Returns
    ``(table path relative to dest, schema, fragments)``: camera frames first (encoded as
    ``config`` says), the aligned rows last. Safe to run in parallel processes (each writes its
    own files)."""
    config = config or CacheConfig()
    tables = [(f"frames/{name}.lance", frames_table(episode, name, spec, config.camera_codec,
                                                     config.camera_quality))
              for name, spec in specs.items() if spec.kind in ("image", "video")]
    tables.append(("data.lance", _table(cols, _schema(specs))))
    return [(rel, t.schema, write_files(t, dest / rel)) for rel, t in tables]


def write_files(data, uri: Path) -> list:
    """Lance data files of ``data`` (a table or a record batch reader) for the dataset at
    ``uri``, uncommitted; returns their fragments for :func:`commit`."""
    from lance.fragment import write_fragments

    schema = data.schema
    if not _committed(uri):  # mode "create" (not "append"): Lance warns of no dataset otherwise
        try:
            return write_fragments(data, str(uri), schema, mode="create")
        except OSError:
            if not _committed(uri):  # not the race with the first commit: a real failure
                raise
    return write_fragments(data, str(uri), schema, mode="append")


def commit(dest: Path, episodes: list[int], written: list[tuple[str, Any, list]]) -> None:
    """Add the fragments of :func:`write_episode` (for ``episodes``) to the cache, one Lance
    commit per table, rows last: an episode is cached once its rows are. Image frames a killed
    run left for these episodes are dropped first, so nothing is ever duplicated."""
    import lance

    for rel, schema, fragments in written:
        uri = str(dest / rel)
        if not _committed(dest / rel):
            lance.LanceDataset.commit(uri, lance.LanceOperation.Overwrite(schema, fragments))
            continue
        ds = lance.dataset(uri)
        if rel != "data.lance":
            ds.delete(f"episode_index IN ({', '.join(map(str, episodes))})")
            ds = lance.dataset(uri)
        lance.LanceDataset.commit(uri, lance.LanceOperation.Append(fragments),
                                  read_version=ds.version)


def _committed(uri: Path) -> bool:
    """Whether a Lance dataset has a version at ``uri`` (uncommitted files may precede one)."""
    return (uri / "_versions").is_dir()


def _done_episodes(uri: Path) -> set[int]:
    import lance

    if not _committed(uri):
        return set()
    table = lance.dataset(str(uri)).to_table(columns=["episode_index"])
    return set(np.unique(table.column(0).to_numpy()).tolist())


def _compute_stats(uri: Path, specs: dict[str, StreamSpec]) -> dict[str, dict]:
    """Per-dimension stats of every numeric stream over its non-padded steps (merged over
    batches of ``STATS_BATCH_ROWS`` rows, see :func:`robocache.merge_stats`)."""
    import lance
    import torch

    import robocache

    ds = lance.dataset(str(uri))
    stats = {}
    for name, spec in specs.items():
        if spec.kind != "numeric":
            continue
        col = column_name(name)
        parts = []
        for batch in ds.to_batches(columns=[col, f"{col}_is_pad"],
                                   batch_size=STATS_BATCH_ROWS):
            values = batch.column(0).flatten().to_numpy().reshape(-1, spec.dim)
            keep = ~batch.column(1).to_numpy(zero_copy_only=False)
            if keep.any():
                parts.append(robocache.compute_stats(torch.from_numpy(values[keep])))
        if parts:
            stats[name] = robocache.merge_stats(parts).to_dict()
    return stats


def _episode_summary(uri: Path) -> list[dict[str, Any]]:
    import lance

    table = lance.dataset(str(uri)).to_table(columns=["episode_index", "timestamp", "task"])
    ep = table.column("episode_index").to_numpy()
    ts = table.column("timestamp").to_numpy()
    tasks = table.column("task").to_pylist()
    order = np.lexsort((ts, ep))
    ep, ts = ep[order], ts[order]
    starts = np.flatnonzero(np.r_[True, ep[1:] != ep[:-1]])
    ends = np.r_[starts[1:], len(ep)]
    return [{"index": int(ep[a]), "rows": int(b - a), "start_s": float(ts[a]),
             "duration_s": float(ts[b - 1] - ts[a]), "task": tasks[order[a]]}
            for a, b in zip(starts, ends, strict=True)]


def _tmp(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp")


def _write_json(path: Path, obj: Any, indent: int | None = 2) -> None:
    """Write ``obj`` as JSON atomically (temporary file, fsync, rename): a reader or a killed
    writer never leaves a truncated file."""
    import os

    tmp = _tmp(path)
    with open(tmp, "w") as f:
        f.write(json.dumps(obj, indent=indent) + "\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_manifest(dest: Path) -> dict[str, Any] | None:
    """The manifest of the cache at ``dest``; ``None`` when there is none.

    Raises:
        DataError: ``manifest.json`` exists but is not valid JSON (truncated or corrupted).
    """
    path = dest / "manifest.json"
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise DataError(f"{path} is unreadable ({e}); if this is a RoboCache cache, rebuild it "
                        "with --overwrite (overwrite=True).") from e


def is_cache(dest: Path) -> bool:
    """Whether ``dest`` is a RoboCache cache: a directory whose ``manifest.json`` declares the
    cache format (recognised in the raw text too, so a truncated manifest still counts)."""
    path = dest / "manifest.json"
    if not path.is_file():
        return False
    text = path.read_text(errors="replace")
    try:
        return json.loads(text).get("format") == CACHE_FORMAT
    except (ValueError, AttributeError):
        return f'"format": "{CACHE_FORMAT}"' in text


def _check_dest(source: Path, dest: Path) -> None:
    """Refuse a destination that would write into the source or over files that are not a
    cache (nothing outside a cache is ever deleted or written)."""
    src, out = source.resolve(), dest.resolve()
    if out == src or src in out.parents:
        raise DataError(f"DEST {dest} is inside the source dataset {source}, which is never "
                        "written; choose a destination outside the source.")
    if out in src.parents:
        raise DataError(f"the source {source} lies inside DEST {dest}; choose a destination "
                        "that does not contain the source.")
    if dest.exists() and not dest.is_dir():
        raise DataError(f"DEST {dest} is a file, not a directory; choose a new or empty "
                        "directory for the cache.")
    # the lock and a first manifest a killed writer left half-written are ours, not foreign
    ours = {LOCK_NAME, _tmp(dest / "manifest.json").name}
    if dest.is_dir() and not is_cache(dest) and any(p.name not in ours for p in dest.iterdir()):
        raise DataError(f"DEST {dest} is not empty and is not a RoboCache cache (no manifest.json "
                        "of one), so it is neither resumed nor removed (--overwrite removes only "
                        "caches); choose a new or empty destination.")


def _remove_cache(dest: Path, log) -> None:
    """Delete the cache at ``dest`` (checked by :func:`_check_dest`), keeping the held lock file;
    says what it removes."""
    import shutil

    try:
        cached = (read_manifest(dest) or {}).get("counts", {}).get("cached", "unfinished")
    except DataError:
        cached = "unreadable manifest"
    entries = sorted(p for p in dest.iterdir() if p.name != LOCK_NAME)
    log(f"overwrite: removing the RoboCache cache at {dest} (episodes: {cached}): "
        + ", ".join(p.name for p in entries))
    for p in entries:
        shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()


def _claim(dest: Path, header: dict[str, Any], overwrite: bool, log) -> list[dict[str, Any]]:
    """With ``dest`` locked: remove the old cache (``overwrite``) or check that the cache there
    was built from the same source, rate and streams (so a resume never mixes two
    configurations); write the in-progress manifest. Returns the quarantine list carried over."""
    if overwrite and is_cache(dest):
        _remove_cache(dest, log)
    old = read_manifest(dest)
    if old is not None and (dest / "data.lance").exists():
        for key in ("source", "rate_hz", "streams"):
            if old.get(key) != header[key]:
                raise DataError(f"{dest} holds a cache with a different {key} "
                                f"({old.get(key)!r} vs {header[key]!r}); pick a new destination "
                                "or pass overwrite=True (--overwrite).")
    carried = old.get("quarantined", []) if old is not None and \
        all(old.get(k) == header[k] for k in ("source", "rate_hz", "streams")) else []
    _write_json(dest / "manifest.json", {**header, "status": "building", "quarantined": carried})
    return carried


def _device(name: str | None):
    import torch

    from robocache.errors import DeviceError

    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise DeviceError(f"`device` (--device) {name!r} is not a device; pass cuda or cpu.") \
            from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"`device` (--device) is {name!r} but no CUDA device is available; "
                          "pass cpu (or leave it unset).")
    if device.type not in ("cuda", "cpu"):
        raise DeviceError(f"`device` (--device) {name!r} is not supported; pass cuda or cpu.")
    return device


def open_specs(source: str | Path | Source, config: CacheConfig) -> tuple[Source, dict]:
    """Open ``source`` (unless already open) and pick the streams ``config.keys`` names."""
    from robocache.data.formats import open_source

    src = source if hasattr(source, "read") else open_source(source, **config.source_options)
    specs = dict(src.specs)
    if config.keys is not None:
        missing = sorted(set(config.keys) - set(specs))
        if missing:
            raise DataError(f"`keys` (--key) names streams the source lacks: {missing}; it "
                            f"has {sorted(specs)}.")
        specs = {k: specs[k] for k in config.keys}
    return src, specs


@contextmanager
def locked_run(source: str | Path | Source, dest: str | Path, config: CacheConfig | None = None,
               *, log: Callable[[str], None] | None = None, **overrides: Any) -> Iterator[Run]:
    """Validate the options, open the source, lock and claim ``dest``: the first half of
    :func:`build`, shared by the drivers that build the same cache another way (Ray). Yields
    the :class:`Run`; the lock is held until the block exits."""
    config = CacheConfig(**{**asdict(config or CacheConfig()), **overrides})
    if not (config.rate_hz > 0 and math.isfinite(config.rate_hz)):
        raise DataError(f"`rate_hz` (--rate) must be a finite rate > 0 Hz; got {config.rate_hz}.")
    if config.camera_codec not in CODECS or not 1 <= config.camera_quality <= 95:
        raise DataError(f"`camera_codec` must be one of {CODECS} and `camera_quality` in "
                        f"[1, 95]; got {config.camera_codec!r}, {config.camera_quality}.")
    if config.shard is not None:
        config.shard = parse_shard(config.shard if isinstance(config.shard, str)
                                   else "/".join(map(str, config.shard)))
    device = _device(config.device)
    src, specs = open_specs(source, config)
    dest = Path(dest)
    streams = {name: {"column": column_name(name), "kind": s.kind, "dtype": s.dtype,
                      "shape": list(s.shape), "dim": s.dim, "source_rate_hz": s.rate_hz,
                      "method": config.methods.get(name, default_method(s)),
                      **({"encoding": s.encoding} if s.encoding else {}),
                      **_camera_entry(s, config)}
               for name, s in specs.items()}
    header = {"format": CACHE_FORMAT,
              "source": {"path": str(Path(src.path).resolve()), "format": src.format},
              "rate_hz": config.rate_hz, "streams": streams}
    if config.shard is not None:
        header["shard"] = list(config.shard)
    _check_dest(Path(src.path), dest)
    dest.mkdir(parents=True, exist_ok=True)
    with CacheLock(dest, wait=config.wait):
        _check_dest(Path(src.path), dest)  # again: another writer may have changed it
        carried = _claim(dest, header, config.overwrite,
                         log or logging.getLogger(__name__).warning)
        yield Run(src, specs, config, device, dest, header, carried)


def _reason(src: Source, index: int, e: BaseException) -> str:
    """A quarantine reason: where in the source (file, rows; when the reader can tell) and the
    exception text."""
    try:
        where = src.locate(index) if hasattr(src, "locate") else None
    except Exception:  # locating is a courtesy; the reason stands without it
        where = None
    text = f"{type(e).__name__}: {e}"
    return f"{where}: {text}" if where and where not in str(e) else text


class Run:
    """One locked build of ``dest`` (from :func:`locked_run`): the episodes to do and the
    bookkeeping every driver shares (quarantine kept in the manifest as it grows, commits,
    the final manifest).

    Attributes:
        src, specs, config, device, dest, header: the source, streams, options, alignment
            device, cache directory and the manifest fields that identify the cache.
        wanted: the source episodes this build covers (after ``episodes`` and ``shard``).
        done: those already cached; quarantine: index -> entry (carried from earlier runs).
    """

    def __init__(self, src: Source, specs: dict[str, StreamSpec], config: CacheConfig, device,
                 dest: Path, header: dict[str, Any], carried: list[dict[str, Any]]):
        self.src, self.specs, self.config, self.device = src, specs, config, device
        self.dest, self.header = dest, header
        wanted = list(dict.fromkeys(config.episodes if config.episodes is not None
                                    else src.episode_indices()))
        if config.shard is not None:
            wanted = wanted[config.shard[0]::config.shard[1]]
        self.wanted = wanted
        self.done = _done_episodes(dest / "data.lance")
        self.quarantine = {int(q["index"]): q for q in carried}
        self.new, self.t0 = 0, time.perf_counter()
        self.obs = metrics.ingest(src, len(wanted))  # metrics and log events per episode

    def skip(self, index: int) -> str | None:
        """Why episode ``index`` is not read again (``"cached"``, ``"quarantined before"``)."""
        if index in self.done:
            return "cached"
        if index in self.quarantine and not self.config.retry_quarantined:
            return "quarantined before"
        return None

    @property
    def todo(self) -> list[int]:
        return [i for i in self.wanted if self.skip(i) is None]

    def passed(self, index: int, why: str) -> None:
        """Episode ``index`` is not read again, for ``why`` (from :meth:`skip`)."""
        if why == "cached":
            self.obs.skipped(index)
        else:
            self.obs.quarantined(index, None)

    def quarantined(self, index: int, reason: str, error: BaseException) -> None:
        self.quarantine[int(index)] = {"index": int(index), "reason": reason}
        self._write_running()
        self.obs.quarantined(index, error)

    def cached(self, written: dict[int, list[tuple[str, Any, list]]]) -> None:
        """Commit the files :func:`write_episode` wrote, for one or several episodes (index ->
        its files): one Lance commit per table for all of them."""
        tables: dict[str, tuple[Any, list]] = {}
        for files in written.values():
            for rel, schema, fragments in files:
                tables.setdefault(rel, (schema, []))[1].extend(fragments)
        commit(self.dest, list(written), [(rel, *t) for rel, t in tables.items()])
        retried = [i for i in written if self.quarantine.pop(int(i), None) is not None]
        if retried:  # retried and now cached
            self._write_running()
        self.new += len(written)

    def _write_running(self) -> None:
        _write_json(self.dest / "manifest.json", {**self.header, "status": "building",
                                                  "quarantined": list(self.quarantine.values())})

    def finish(self, device: str | None = None) -> dict[str, Any]:
        manifest = finish(self.dest, self.header, wanted=self.wanted, done=self.done,
                          quarantine=self.quarantine, new=self.new,
                          device=device or self.device, seconds=time.perf_counter() - self.t0,
                          specs=self.specs, timing=getattr(self.src, "timing", None))
        self.obs.done(manifest)
        return manifest


def finish(dest: Path, header: dict[str, Any], *, wanted: list[int], done: set[int],
           quarantine: dict[int, dict[str, Any]], new: int, device: Any, seconds: float,
           timing: str | None, specs: dict[str, StreamSpec] | None = None,
           stats: dict[str, dict] | None = None) -> dict[str, Any]:
    """Compact ``data.lance``, write ``stats.json`` (computed over the rows for ``specs``, or
    ``stats`` as given) and the complete manifest; returns the manifest."""
    import lance

    uri = dest / "data.lance"
    if _committed(uri):
        ds = lance.dataset(str(uri))
        if len(ds.get_fragments()) > 1:
            ds.optimize.compact_files()
            ds.cleanup_old_versions(older_than=_dt.timedelta(0))
    episodes = _episode_summary(uri) if _committed(uri) else []
    if stats is None:
        stats = _compute_stats(uri, specs) if _committed(uri) else {}
    _write_json(dest / "stats.json", stats, indent=None)
    cached_ids = {e["index"] for e in episodes}
    manifest = {
        **header,
        "status": "complete",
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "device": str(device),
        "timing": timing,
        "counts": {"read": len(wanted), "cached": sum(i in cached_ids for i in wanted),
                   "quarantined": sum(i in quarantine for i in wanted),
                   "skipped": len(done & set(wanted)), "new": new,
                   "rows": sum(e["rows"] for e in episodes)},
        "episodes": episodes,
        "quarantined": sorted(quarantine.values(), key=lambda q: q["index"]),
        "stats_path": "stats.json",
        "seconds": seconds,
    }
    _write_json(dest / "manifest.json", manifest)
    return manifest


def build(source: str | Path | Source, dest: str | Path, config: CacheConfig | None = None, *,
          progress: bool = True, log: Callable[[str], None] | None = None,
          **overrides: Any) -> dict[str, Any]:
    """Ingest a dataset into a training cache at ``dest`` (see the module docstring).

    Args:
        source: a dataset path (format detected, see :func:`robocache.data.formats.open_source`)
            or an opened source.
        dest: cache directory (created; an existing cache of the same source resumes).
        config: options; keyword ``overrides`` replace its fields (``rate_hz=50.0``...).
        progress: show a rich progress bar on stderr.
        log: where notices go (what ``overwrite`` removes); default: this module's logger.

    Returns:
        The manifest (also written to ``dest/manifest.json``): ``counts`` (read, cached,
        quarantined, skipped, rows), ``episodes``, ``quarantined`` (index + reason), ``streams``,
        ``stats_path``, ``seconds``.

    Raises:
        DataError: unknown format, a requested key the source lacks, a non-positive rate, a bad
            ``shard``, or ``dest`` holds another cache (different source, rate or streams) or
            other files.
        CacheBusyError: another process is writing ``dest`` (and ``wait`` is off).
        FileNotFoundError: ``source`` does not exist.

    Example:
        >>> m = build("data/sample/panda_multirate", "/tmp/panda.cache", rate_hz=50)
        >>> c = m["counts"]; c["read"] == c["cached"] + c["quarantined"]
        True
    """
    with locked_run(source, dest, config, log=log, **overrides) as run:
        with _progress(progress, len(run.wanted)) as advance:
            for index in run.wanted:
                why = run.skip(index)
                if why is not None:
                    run.passed(index, why)
                    advance(f"episode {index} ({why})")
                    continue
                run.obs.start()
                try:
                    # a reader may fail in any way on a corrupt file (codecs raise their own
                    # types): the episode is quarantined with the reason, the rest proceeds
                    episode = load_episode(run.src, index, run.specs)
                    run.obs.lap("read")
                    cols = align_episode(episode, run.specs, run.config, run.device)
                    run.obs.lap("align")
                except MemoryError:
                    raise
                except Exception as e:
                    run.quarantined(index, _reason(run.src, index, e), e)
                    advance(f"episode {index} quarantined")
                    continue
                run.cached({index: write_episode(run.dest, episode, cols, run.specs,
                                                 run.config)})
                run.obs.cached(index, episode, cols)
                advance(f"episode {index}")
        return run.finish()


class _progress:
    """Context manager yielding ``advance(description, n=1)``; a rich bar when enabled."""

    def __init__(self, enabled: bool, total: int, label: str = "ingest"):
        self.enabled, self.total, self.label, self.bar = enabled, total, label, None

    def __enter__(self):
        if not self.enabled:
            return lambda _desc, n=1: None
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self.bar = Progress(TextColumn(self.label), BarColumn(), MofNCompleteColumn(),
                            TimeRemainingColumn(), TextColumn("{task.description}"),
                            transient=False)
        self.bar.start()
        task = self.bar.add_task("", total=self.total)
        return lambda desc, n=1: self.bar.update(task, advance=n, description=desc)

    def __exit__(self, *exc):
        if self.bar is not None:
            self.bar.stop()
        return False
