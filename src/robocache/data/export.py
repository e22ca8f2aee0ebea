"""A RoboCache cache written out as a LeRobot v3.0 dataset, for LeRobot's own tooling.

:func:`export_lerobot` writes the cache at its rate, one LeRobot frame per cached step:

- ``data/chunk-000/file-000.parquet``: every numeric stream as a feature of its own dtype and
  ``[D]`` shape (scalar columns for ``D == 1``, as LeRobot writes them), the values exactly as
  cached (bit for bit), plus ``timestamp`` (float32 ``frame_index / fps``, as LeRobot records),
  ``frame_index``, ``episode_index`` (0..N-1 in cache order), ``index`` and ``task_index``.
- RGB cameras (uint8 ``[H, W, 3]`` image and video streams): each step's cached frame, decoded,
  as mp4 through PyAV (``cameras="video"``: LeRobot's recording settings, AV1 by default, one
  file per camera) or as PNG in the parquet (``cameras="image"``: lossless from the cached
  frames). Each video is decoded again and checked frame by frame: every frame within
  :data:`~robocache.data.cameras.VIDEO_BUDGET_DB` of the cached frame in yuv420p and nearer
  its own step's frame than its neighbours'; otherwise the camera is encoded again at a lower
  CRF (the summary's ``video_quality`` says which CRF and the lowest PSNR). A step before a
  camera's first frame shows that first frame (LeRobot has no per-stream padding). Depth
  cameras (uint16) are not exported.
- ``meta/info.json``, ``meta/episodes/chunk-000/file-000.parquet`` (each episode's tasks,
  length, rows and video span), ``meta/tasks.parquet`` and ``meta/stats.json`` (min, max, mean,
  std, count and the 1/10/50/90/99 % quantiles of every feature; cameras per channel in [0, 1],
  over at most :data:`STATS_FRAMES` frames).

Not exported: event streams (strings other than the task) and the ``_is_pad`` masks (LeRobot
computes its own padding from episode bounds). ``rename`` maps stream names to LeRobot keys
(``{"joint_states.position": "observation.state"}``). The dataset is written beside ``out``
(``.OUT.partial-PID``) and moved into place when complete, so a failed export leaves nothing
behind; the partial folder of a killed one is removed by the next export to ``out``.
Quarantined episodes of the cache have no rows, so they are not exported (the summary lists
them).

The cache may be local or in an object store (``s3://``, ``gs://``, ``az://``:
:class:`~robocache.data.location.Location`); ``out`` is a local directory. Memory stays bounded
whatever the cache's size: one scan of the small index columns (episode, step, frame numbers,
row addresses), then each episode's rows and frames read by row address, decoded, written and
dropped (the parquet in row groups of about :data:`ROW_GROUP_BYTES`). What is held throughout
is the index (a few int64 per step and per frame) and the numeric values for their statistics
(exact quantiles need them all).
"""

from __future__ import annotations

import functools
import io
import json
import os
import re
import shutil
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from robocache._optional import require
from robocache.data.location import Location
from robocache.errors import DataError

CAMERA_MODES = ("video", "image")
STATS_FRAMES = 2000
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
INDEX_FEATURES = ("timestamp", "frame_index", "episode_index", "index", "task_index")
CHUNK = "chunk-000/file-000"
# the rows of one scan batch of the index columns
SCAN_ROWS = 1 << 16
# the data parquet's row groups: episodes are written together until about this many bytes
ROW_GROUP_BYTES = 64 << 20


def _scan(location: Location, rel: str, table, columns: list[str]) -> dict[str, np.ndarray]:
    """``columns`` of every row of ``table`` (``rel`` in ``location``) and each row's address
    (``_rowaddr``), scanned :data:`SCAN_ROWS` rows at a time: small integer columns only."""
    parts: dict[str, list[np.ndarray]] = {c: [] for c in [*columns, "_rowaddr"]}
    with location.reading(rel):
        for batch in table.scanner(columns=columns, with_row_address=True,
                                   batch_size=SCAN_ROWS).to_batches():
            for c in parts:
                parts[c].append(batch.column(c).to_numpy(zero_copy_only=False))
    return {c: np.concatenate(v) if v else np.zeros(0, np.int64) for c, v in parts.items()}


def _take(location: Location, rel: str, table, addresses: np.ndarray, columns: list[str]):
    """The rows at ``addresses`` (in that order) of ``table``, ``columns`` only."""
    pa = require("pyarrow", "data", "Arrow tables")
    with location.reading(rel):
        got = table._take_rows(pa.array(addresses, pa.uint64()), columns=columns)
    if got.num_rows != len(addresses):
        raise DataError(f"{location.child(rel)}: {len(addresses) - got.num_rows} rows of the "
                        "index are missing (the cache changed during the export); export "
                        "again once it is complete.")
    return got


def _stats(values: np.ndarray) -> dict[str, list]:
    """LeRobot's per-feature statistics of ``[N, D]`` values (over ``N``)."""
    v = values.astype(np.float64)
    out = {"min": v.min(0), "max": v.max(0), "mean": v.mean(0), "std": v.std(0),
           "count": np.array([len(v)])}
    for q in QUANTILES:
        out[f"q{round(q * 100):02d}"] = np.quantile(v, q, axis=0)
    return {k: a.tolist() for k, a in out.items()}


def _camera(location: Location, key: str, stream: dict):
    """A decoder of camera ``key``'s cached frames: ``(episode id, frame rows)`` of one
    episode's steps (-1 before the camera's first frame: its first frame) -> uint8
    ``[T, H, W, 3]``. Holds the table's index (episode, frame, row address: 24 bytes a
    frame); each call reads only the frames its steps show."""
    import torch

    from robocache.data.video_store import PACKET_COLUMNS, episode_packets

    pil = require("PIL.Image", "data", "Decoding camera frames", "pillow")
    rel = f"frames/{key}.lance"
    video, shape = stream["codec"] == "video", tuple(stream["shape"])
    table = location.lance(rel)
    index = _scan(location, rel, table, ["episode_index", "frame"])
    order = np.lexsort((index["frame"], index["episode_index"]))
    episode, frame = index["episode_index"][order], index["frame"][order]
    address = index["_rowaddr"][order]

    def one(data: bytes) -> np.ndarray:
        with pil.open(io.BytesIO(data)) as im:
            return np.asarray(im.convert("RGB"))

    def decode(episode_id: int, frames: np.ndarray) -> np.ndarray:
        lo, hi = np.searchsorted(episode, [episode_id, episode_id + 1])
        wanted = np.maximum(frames.astype(np.int64), 0)
        at = lo + np.searchsorted(frame[lo:hi], wanted)
        if hi == lo or (at >= hi).any() or (frame[np.minimum(at, hi - 1)] != wanted).any():
            raise DataError(f"{location.child(rel)}: episode {episode_id} shows frames its "
                            "frame table lacks (a damaged cache); rebuild it with `robocache "
                            "ingest SOURCE DEST --overwrite`.")
        unique, inverse = np.unique(at, return_inverse=True)
        if video:  # the episode's packets, each GOP decoded once
            rows = _take(location, rel, table, address[lo:hi], PACKET_COLUMNS)
            got = episode_packets(rows, unique - lo, shape).decode(
                torch.arange(len(unique))).permute(0, 2, 3, 1).numpy()
            return got[inverse.reshape(-1)]
        encoded = _take(location, rel, table, address[unique], ["encoded"]).column("encoded")
        with ThreadPoolExecutor(min(16, os.cpu_count() or 1)) as pool:
            decoded = list(pool.map(one, (encoded[i].as_py() for i in range(len(unique)))))
        return np.stack([decoded[i] for i in inverse.reshape(-1)])

    return decode


def _frame_stats(samples: list[np.ndarray]) -> dict[str, list]:
    """Per-channel statistics (LeRobot's ``[3, 1, 1]`` layout, values in [0, 1]) of sampled
    frames, each frame strided to about 150 x 150 pixels."""
    frames = np.concatenate(samples)
    h, w = frames.shape[1:3]
    k = max(1, int(np.ceil(np.sqrt(h * w / 22_500))))
    pixels = frames[:, ::k, ::k].reshape(-1, 3).astype(np.float64) / 255.0
    out = {name: [[[v]] for v in vals] for name, vals in _stats(pixels).items()}
    out["count"] = [len(frames)]
    return out


def _check_codec(vcodec: str) -> None:
    av = require("av", "video", "Writing video streams")
    try:
        av.codec.Codec(vcodec, "w")
    except Exception as e:  # PyAV's UnknownCodecError and kin
        raise DataError(f"`vcodec` (--vcodec) {vcodec!r} is not an encoder of this FFmpeg "
                        "build; pass libsvtav1 (LeRobot's default), libx264 or libx265, or "
                        "--cameras image.") from e


def _png(frame: np.ndarray) -> bytes:
    pil = require("PIL.Image", "data", "Encoding camera frames", "pillow")
    out = io.BytesIO()
    pil.fromarray(frame).save(out, format="PNG")
    return out.getvalue()


def export_lerobot(cache: str | Path, out: str | Path, *, cameras: str = "video",
                   rename: dict[str, str] | None = None, vcodec: str = "libsvtav1",
                   robot_type: str | None = None,
                   storage_options: dict[str, Any] | None = None) -> dict[str, Any]:
    """Write the cache at ``cache`` as a LeRobot v3.0 dataset at ``out`` (see the module
    docstring).

    Args:
        cache: a complete RoboCache cache: a local directory, or an object-store URI
            (``s3://bucket/prefix``, ``gs://``, ``az://``).
        out: the local dataset directory to create; it must not exist (or be empty).
        cameras: ``"video"`` (mp4 through PyAV) or ``"image"`` (PNG in the parquet).
        rename: stream name -> LeRobot feature key (default: the stream names).
        vcodec: the video codec (``"libsvtav1"``, LeRobot's default; ``"libx264"``...).
        robot_type: ``info.json``'s ``robot_type``.
        storage_options: object-store settings for a URI ``cache``, Lance's key names
            (:mod:`robocache.data.location`); the standard environment variables otherwise.

    Returns:
        A summary: ``out``, ``fps``, ``episodes``, ``frames``, ``features`` (key -> dtype),
        ``not_exported`` (stream -> why), ``quarantined`` (the cache's quarantined episodes,
        which have no rows to export), ``cleaned`` (partial folders of killed exports to
        ``out`` removed first, see :func:`clean_partials`).

    Raises:
        FileNotFoundError: no cache at ``cache``.
        DataError: an unfinished or empty cache, ``out`` exists and is not empty, a bad
            ``cameras``, ``rename`` or ``vcodec``; the object store failed (one line naming
            the URI and the fix).

    Example:
        >>> export_lerobot("/tmp/bags.cache", "/tmp/lerobot")  # doctest: +SKIP
        {'out': '/tmp/lerobot', 'fps': 20, 'episodes': 2, 'frames': 40, ...}
    """
    location, out = Location(cache, storage_options), Path(out)
    if cameras not in CAMERA_MODES:
        raise DataError(f"`cameras` (--cameras) must be one of {CAMERA_MODES}; got {cameras!r}.")
    manifest = location.manifest()
    unfinished = DataError(f"{location}: the cache is unfinished or holds no episode; run or "
                           "resume `robocache ingest` first.")
    if manifest.get("status") != "complete" or not location.lance_exists("data.lance"):
        raise unfinished
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise DataError(f"`out` {out} exists and is not an empty directory; choose a new "
                        "directory (an export never overwrites).")
    streams = manifest["streams"]
    rename = dict(rename or {})
    unknown = sorted(set(rename) - set(streams))
    keys = [rename.get(k, k) for k in streams]
    if unknown or len(set(keys)) != len(keys) or set(keys) & set(INDEX_FEATURES):
        raise DataError(f"`rename` (--rename STREAM=KEY) must map streams of the cache "
                        f"({sorted(streams)}) to distinct keys other than "
                        f"{list(INDEX_FEATURES)}; got {rename}.")
    if cameras == "video":
        _check_codec(vcodec)
    made = [p for p in reversed(out.parents) if not p.exists()]  # removed again on failure
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    cleaned = clean_partials(out)  # earlier exports to ``out`` killed midway
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        (tmp / PARTIAL_MARK).write_text(json.dumps({"host": socket.gethostname(),
                                                    "pid": os.getpid()}))
        summary = _write(location, tmp, manifest, cameras, rename, vcodec, robot_type)
        (tmp / PARTIAL_MARK).unlink()
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for p in reversed(made):
            if p.exists() and not any(p.iterdir()):
                p.rmdir()
        raise
    quarantined = sorted(int(q["index"]) for q in manifest.get("quarantined", []))
    return {"out": str(out), **summary, "quarantined": quarantined,
            "cleaned": [str(p) for p in cleaned]}


# The file that marks an export's partial folder (``.OUT.partial-PID``) as RoboCache's: the
# host and pid of the export writing it, so that a later export to OUT removes it once that
# process is gone (a kill -9 leaves it behind).
PARTIAL_MARK = ".robocache-export.json"
# what an export writes at the top of its folder (a partial folder of an older version, from
# before the mark, holds nothing else)
_LAYOUT = {"data", "meta", "videos", PARTIAL_MARK}


def clean_partials(out: Path) -> list[Path]:
    """Remove the partial folders (``.OUT.partial-PID`` beside ``out``) that earlier exports to
    ``out`` left when they were killed: only RoboCache's own (marked with
    :data:`PARTIAL_MARK`, or holding nothing but an export's layout), of this host, and only
    when their process is gone. Returns those removed."""
    found = re.compile(rf"\.{re.escape(out.name)}\.partial-(\d+)")
    removed = []
    try:
        entries = list(out.parent.iterdir())
    except OSError:  # no parent yet: nothing left there
        return removed
    for p in entries:
        match = found.fullmatch(p.name)
        if match is None or p.is_symlink() or not p.is_dir():
            continue
        pid = int(match.group(1))
        try:
            mark = json.loads((p / PARTIAL_MARK).read_text())
            ours = mark.get("pid") == pid and mark.get("host") == socket.gethostname()
        except (OSError, ValueError, AttributeError):
            ours = {c.name for c in p.iterdir()} <= _LAYOUT
        if ours and not _alive(pid):
            shutil.rmtree(p, ignore_errors=True)
            removed.append(p)
    return removed


def _alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (another user's counts as running)."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        pass
    return True


def _write(location: Location, root: Path, manifest: dict, cameras: str,
           rename: dict[str, str], vcodec: str, robot_type: str | None) -> dict[str, Any]:
    """Write the dataset into the new folder ``root``: the index columns scanned once, then
    episode by episode (see the module docstring)."""
    pa = require("pyarrow", "data", "Arrow tables")
    pq = require("pyarrow.parquet", "data", "Parquet files")
    pd = require("pandas", "lerobot", "Writing LeRobot datasets")
    from robocache.data.cameras import VIDEO_BUDGET_DB, add_video_features

    streams = manifest["streams"]
    rate = float(manifest["rate_hz"])
    fps: int | float = int(rate) if rate.is_integer() else rate
    skipped: dict[str, str] = {}
    numeric, camera = [], []
    for name, s in streams.items():
        if s["kind"] == "numeric":
            numeric.append(name)
        elif s["kind"] in ("image", "video") and s["dtype"] == "uint8" and \
                len(s.get("shape", s.get("source_shape", []))) == 3:
            camera.append(name)
        else:
            skipped[name] = ("depth cameras are not exported" if s["kind"] in ("image", "video")
                             else f"{s['kind']} streams have no LeRobot feature")
    data = location.lance("data.lance")
    frame_cols = [f"{streams[k]['column']}/frame" for k in camera]
    index = _scan(location, "data.lance", data, ["episode_index", "step", *frame_cols])
    order = np.lexsort((index["step"], index["episode_index"]))
    ep, step, address = (index[c][order] for c in ("episode_index", "step", "_rowaddr"))
    frames = {k: index[c][order] for k, c in zip(camera, frame_cols, strict=True)}
    del index
    ids, first, lengths = np.unique(ep, return_index=True, return_counts=True)
    n = len(ep)
    if not n:
        raise DataError(f"{location}: the cache holds no episode; run or resume "
                        "`robocache ingest` first.")
    new_ep = np.searchsorted(ids, ep).astype(np.int64)
    bounds = np.r_[0, np.cumsum(lengths)]
    spans = list(zip(bounds[:-1], bounds[1:], strict=True))
    frame_index = (step - step[first][new_ep]).astype(np.int64)
    index_cols = {"timestamp": (frame_index / rate).astype(np.float32),
                  "frame_index": frame_index, "episode_index": new_ep,
                  "index": np.arange(n, dtype=np.int64)}

    every = max(1, len(spans) * int(lengths.max()) // STATS_FRAMES)
    decoders = {name: _camera(location, name, streams[name]) for name in camera}
    samples: dict[str, list[np.ndarray]] = {name: [] for name in camera}

    def clips(name: str):
        """Camera ``name``'s frames, one episode at a time (a sample kept for its stats)."""
        samples[name] = []
        for e, (a, b) in enumerate(spans):
            f = decoders[name](int(ids[e]), frames[name][a:b])
            samples[name].append(f[::every])
            yield f

    features: dict[str, dict] = {}
    values: dict[str, list[np.ndarray]] = {name: [] for name in numeric}
    tasks: dict[str, int] = {}
    task_index = np.zeros(n, np.int64)
    ep_tasks: list[list[str]] = []
    images = {name: clips(name) for name in camera} if cameras == "image" else {}
    data_path = root / "data" / f"{CHUNK}.parquet"
    data_path.parent.mkdir(parents=True)
    writer, pending = None, []
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    try:
        for e, (a, b) in enumerate(spans):
            rows = _take(location, "data.lance", data, address[a:b],
                         ["task", *[streams[k]["column"] for k in numeric]])
            task = [t if t is not None else "" for t in rows.column("task").to_pylist()]
            task_index[a:b] = [tasks.setdefault(t, len(tasks)) for t in task]
            ep_tasks.append(list(dict.fromkeys(task)))
            cols: dict[str, Any] = {}
            for name in numeric:
                key, s = rename.get(name, name), streams[name]
                flat = rows.column(s["column"]).combine_chunks().flatten()
                v = flat.to_numpy(zero_copy_only=False).reshape(b - a, -1)
                values[name].append(v)
                cols[key] = pa.array(v[:, 0]) if v.shape[1] == 1 else \
                    pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)), v.shape[1])
            for name, clip in images.items():
                cols[rename.get(name, name)] = pa.array(
                    [{"bytes": _png(f), "path": None} for f in next(clip)], image_type)
            for k, v in index_cols.items():
                cols[k] = pa.array(v[a:b])
            cols["task_index"] = pa.array(task_index[a:b])
            pending.append(pa.table(cols))
            if sum(t.nbytes for t in pending) >= ROW_GROUP_BYTES or e == len(spans) - 1:
                batch = pa.concat_tables(pending)
                if writer is None:
                    writer = pq.ParquetWriter(data_path, batch.schema)
                writer.write_table(batch, row_group_size=batch.num_rows)
                pending = []
    finally:
        if writer is not None:
            writer.close()

    stats: dict[str, dict] = {}
    for name in numeric:
        key, s = rename.get(name, name), streams[name]
        v = np.concatenate(values.pop(name))
        features[key] = {"dtype": s["dtype"], "shape": [v.shape[1]], "names": None}
        stats[key] = _stats(v)
    for name in camera:  # filled once the frames went by (a video's as it is encoded)
        stats[rename.get(name, name)] = {}
    for name in images:
        h, w = samples[name][0].shape[1:3]
        features[rename.get(name, name)] = {"dtype": "image", "shape": [h, w, 3],
                                            "names": ["height", "width", "channels"]}
    index_cols["task_index"] = task_index
    for k, v in index_cols.items():
        features[k] = {"dtype": str(v.dtype), "shape": [1], "names": None}
        stats[k] = _stats(v[:, None])

    ne = len(ids)
    episodes = pa.table({
        "episode_index": np.arange(ne, dtype=np.int64), "tasks": ep_tasks,
        "length": lengths.astype(np.int64),
        "data/chunk_index": np.zeros(ne, np.int64), "data/file_index": np.zeros(ne, np.int64),
        "dataset_from_index": bounds[:-1].astype(np.int64),
        "dataset_to_index": bounds[1:].astype(np.int64),
        "meta/episodes/chunk_index": np.zeros(ne, np.int64),
        "meta/episodes/file_index": np.zeros(ne, np.int64),
    })
    meta_path = root / "meta" / "episodes" / f"{CHUNK}.parquet"
    meta_path.parent.mkdir(parents=True)
    pq.write_table(episodes, meta_path)
    pd.DataFrame({"task_index": list(tasks.values())},
                 index=pd.Index(list(tasks), name="task")).to_parquet(
        root / "meta" / "tasks.parquet")
    videos = {rename.get(name, name): functools.partial(clips, name) for name in camera} \
        if cameras == "video" else {}
    info = {"codebase_version": "v3.0", "fps": fps, "features": features,
            "total_episodes": ne, "total_frames": n, "total_tasks": len(tasks),
            "chunks_size": 1000, "data_files_size_in_mb": 100, "video_files_size_in_mb": 200,
            "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
            "video_path": ("videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
                           if videos else None),
            "robot_type": robot_type, "splits": {"train": f"0:{ne}"}}
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=4) + "\n")
    quality = add_video_features(root, videos, fps=rate, codec=vcodec,
                                 budget_db=VIDEO_BUDGET_DB) if videos else {}
    for name in camera:
        stats[rename.get(name, name)] = _frame_stats(samples[name])
    (root / "meta" / "stats.json").write_text(json.dumps(stats, indent=4) + "\n")
    info = json.loads((root / "meta" / "info.json").read_text())
    return {"fps": fps, "episodes": ne, "frames": n, "cameras": cameras,
            "features": {k: f["dtype"] for k, f in info["features"].items()},
            "not_exported": skipped, "video_quality": quality}
