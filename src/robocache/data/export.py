"""A RoboCache cache written out as a LeRobot v3.0 dataset, for LeRobot's own tooling.

:func:`export_lerobot` writes the cache at its rate, one LeRobot frame per cached step:

- ``data/chunk-000/file-000.parquet``: every numeric stream as a feature of its own dtype and
  ``[D]`` shape (scalar columns for ``D == 1``, as LeRobot writes them), the values exactly as
  cached (bit for bit), plus ``timestamp`` (float32 ``frame_index / fps``, as LeRobot records),
  ``frame_index``, ``episode_index`` (0..N-1 in cache order), ``index`` and ``task_index``.
- RGB cameras (uint8 ``[H, W, 3]`` image and video streams): each step's cached frame, decoded,
  as mp4 through PyAV (``cameras="video"``: LeRobot's recording settings, AV1 by default, one
  file per camera) or as PNG in the parquet (``cameras="image"``: lossless from the cached
  frames). A step before a camera's first frame shows that first frame (LeRobot has no
  per-stream padding). Depth cameras (uint16) are not exported.
- ``meta/info.json``, ``meta/episodes/chunk-000/file-000.parquet`` (each episode's tasks,
  length, rows and video span), ``meta/tasks.parquet`` and ``meta/stats.json`` (min, max, mean,
  std, count and the 1/10/50/90/99 % quantiles of every feature; cameras per channel in [0, 1],
  over at most :data:`STATS_FRAMES` frames).

Not exported: event streams (strings other than the task) and the ``_is_pad`` masks (LeRobot
computes its own padding from episode bounds). ``rename`` maps stream names to LeRobot keys
(``{"joint_states.position": "observation.state"}``). The dataset is written beside ``out``
and moved into place when complete, so a failed export leaves nothing behind.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from robocache._optional import require
from robocache.errors import DataError

CAMERA_MODES = ("video", "image")
STATS_FRAMES = 2000
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
INDEX_FEATURES = ("timestamp", "frame_index", "episode_index", "index", "task_index")
CHUNK = "chunk-000/file-000"


def _stats(values: np.ndarray) -> dict[str, list]:
    """LeRobot's per-feature statistics of ``[N, D]`` values (over ``N``)."""
    v = values.astype(np.float64)
    out = {"min": v.min(0), "max": v.max(0), "mean": v.mean(0), "std": v.std(0),
           "count": np.array([len(v)])}
    for q in QUANTILES:
        out[f"q{round(q * 100):02d}"] = np.quantile(v, q, axis=0)
    return {k: a.tolist() for k, a in out.items()}


def _camera(cache: Path, key: str):
    """A decoder of camera ``key``'s cached frames: ``(episode ids, frame rows)`` of steps
    (-1 before the camera's first frame: its first frame) -> uint8 ``[T, H, W, 3]``."""
    lance = require("lance", "data", "The Lance cache", "pylance")
    pil = require("PIL.Image", "data", "Decoding camera frames", "pillow")
    table = lance.dataset(str(cache / "frames" / f"{key}.lance")).to_table(
        columns=["episode_index", "frame", "encoded"])
    where = {(int(e), int(f)): i for i, (e, f) in enumerate(zip(
        table.column("episode_index").to_numpy(), table.column("frame").to_numpy(),
        strict=True))}
    encoded = table.column("encoded")

    def one(i: int) -> np.ndarray:
        with pil.open(io.BytesIO(encoded[i].as_py())) as im:
            return np.asarray(im.convert("RGB"))

    def decode(episode_ids: np.ndarray, frame: np.ndarray) -> np.ndarray:
        rows = [where[(int(e), max(int(f), 0))] for e, f in zip(episode_ids, frame,
                                                                strict=True)]
        unique = sorted(set(rows))
        with ThreadPoolExecutor(min(16, os.cpu_count() or 1)) as pool:
            decoded = dict(zip(unique, pool.map(one, unique), strict=True))
        return np.stack([decoded[r] for r in rows])

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
                   robot_type: str | None = None) -> dict[str, Any]:
    """Write the cache at ``cache`` as a LeRobot v3.0 dataset at ``out`` (see the module
    docstring).

    Args:
        cache: a complete RoboCache cache directory.
        out: the dataset directory to create; it must not exist (or be empty).
        cameras: ``"video"`` (mp4 through PyAV) or ``"image"`` (PNG in the parquet).
        rename: stream name -> LeRobot feature key (default: the stream names).
        vcodec: the video codec (``"libsvtav1"``, LeRobot's default; ``"libx264"``...).
        robot_type: ``info.json``'s ``robot_type``.

    Returns:
        A summary: ``out``, ``fps``, ``episodes``, ``frames``, ``features`` (key -> dtype),
        ``not_exported`` (stream -> why).

    Raises:
        FileNotFoundError: no cache at ``cache``.
        DataError: an unfinished or empty cache, ``out`` exists and is not empty, a bad
            ``cameras``, ``rename`` or ``vcodec``.

    Example:
        >>> export_lerobot("/tmp/bags.cache", "/tmp/lerobot")  # doctest: +SKIP
        {'out': '/tmp/lerobot', 'fps': 20, 'episodes': 2, 'frames': 40, ...}
    """
    from robocache.data.cache import read_manifest

    cache, out = Path(cache), Path(out)
    if cameras not in CAMERA_MODES:
        raise DataError(f"`cameras` (--cameras) must be one of {CAMERA_MODES}; got {cameras!r}.")
    manifest = read_manifest(cache)
    if manifest is None:
        raise FileNotFoundError(f"{cache} is not a RoboCache cache (no manifest.json); build "
                                "one with `robocache ingest SOURCE DEST`.")
    if manifest.get("status") != "complete" or not (cache / "data.lance").exists():
        raise DataError(f"{cache}: the cache is unfinished or holds no episode; run or resume "
                        "`robocache ingest` first.")
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
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        summary = _write(cache, tmp, manifest, cameras, rename, vcodec, robot_type)
        if out.exists():
            out.rmdir()  # empty (checked above)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for p in reversed(made):
            if p.exists() and not any(p.iterdir()):
                p.rmdir()
        raise
    return {"out": str(out), **summary}


def _write(cache: Path, root: Path, manifest: dict, cameras: str, rename: dict[str, str],
           vcodec: str, robot_type: str | None) -> dict[str, Any]:
    lance = require("lance", "data", "The Lance cache", "pylance")
    pa = require("pyarrow", "data", "Arrow tables")
    pq = require("pyarrow.parquet", "data", "Parquet files")
    pd = require("pandas", "lerobot", "Writing LeRobot datasets")
    from robocache.data.cameras import add_video_features

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
    columns = ["episode_index", "step", "task"] + [streams[k]["column"] for k in numeric] + \
        [f"{streams[k]['column']}/frame" for k in camera]
    table = lance.dataset(str(cache / "data.lance")).to_table(columns=columns)
    ep = table.column("episode_index").to_numpy()
    step = table.column("step").to_numpy()
    order = np.lexsort((step, ep))
    ep, step = ep[order], step[order]
    ids, first, lengths = np.unique(ep, return_index=True, return_counts=True)
    n = len(ep)
    new_ep = np.searchsorted(ids, ep).astype(np.int64)
    task = np.array(table.column("task").to_pylist(), dtype=object)[order]
    task = np.where(task == None, "", task)  # noqa: E711 (elementwise)
    tasks: dict[str, int] = {}
    for t in task:
        tasks.setdefault(t, len(tasks))
    task_index = np.array([tasks[t] for t in task], np.int64)

    cols: dict[str, Any] = {}
    features: dict[str, dict] = {}
    stats: dict[str, dict] = {}
    for name in numeric:
        key, s = rename.get(name, name), streams[name]
        flat = table.column(s["column"]).combine_chunks().flatten()
        values = flat.to_numpy(zero_copy_only=False).reshape(len(table), -1)[order]
        dim = values.shape[1]
        cols[key] = pa.array(values[:, 0]) if dim == 1 else pa.FixedSizeListArray.from_arrays(
            pa.array(values.reshape(-1)), dim)
        features[key] = {"dtype": s["dtype"], "shape": [dim], "names": None}
        stats[key] = _stats(values)
    bounds = np.r_[0, np.cumsum(lengths)]
    spans = list(zip(bounds[:-1], bounds[1:], strict=True))
    every = max(1, len(spans) * int(lengths.max()) // STATS_FRAMES) if n else 1
    videos: dict[str, Any] = {}
    for name in camera:
        key, s = rename.get(name, name), streams[name]
        frame = table.column(f"{s['column']}/frame").to_numpy()[order]
        decode, samples = _camera(cache, name), []

        def clips(decode=decode, frame=frame, samples=samples):
            for a, b in spans:
                f = decode(ep[a:b], frame[a:b])
                samples.append(f[::every])
                yield f

        if cameras == "image":
            png = [_png(f) for clip in clips() for f in clip]
            cols[key] = pa.array([{"bytes": b, "path": None} for b in png],
                                 pa.struct([("bytes", pa.binary()), ("path", pa.string())]))
            h, w = samples[0].shape[1:3]
            features[key] = {"dtype": "image", "shape": [h, w, 3],
                             "names": ["height", "width", "channels"]}
        else:
            videos[key] = clips()
        stats[key] = samples  # turned into statistics once the frames went by
    frame_index = (step - step[first][np.searchsorted(ids, ep)]).astype(np.int64)
    index_cols = {"timestamp": (frame_index / rate).astype(np.float32),
                  "frame_index": frame_index, "episode_index": new_ep,
                  "index": np.arange(n, dtype=np.int64), "task_index": task_index}
    for k, v in index_cols.items():
        cols[k] = pa.array(v)
        features[k] = {"dtype": str(v.dtype), "shape": [1], "names": None}
        stats[k] = _stats(v[:, None])
    data_path = root / "data" / f"{CHUNK}.parquet"
    data_path.parent.mkdir(parents=True)
    pq.write_table(pa.table(cols), data_path)

    ep_tasks = [list(dict.fromkeys(task[a:b])) for a, b in spans]
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
    info = {"codebase_version": "v3.0", "fps": fps, "features": features,
            "total_episodes": ne, "total_frames": n, "total_tasks": len(tasks),
            "chunks_size": 1000, "data_files_size_in_mb": 100, "video_files_size_in_mb": 200,
            "data_path": "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet",
            "video_path": ("videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
                           if videos else None),
            "robot_type": robot_type, "splits": {"train": f"0:{ne}"}}
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=4) + "\n")
    if videos:
        add_video_features(root, videos, fps=rate, codec=vcodec)
    for key in (rename.get(k, k) for k in camera):
        stats[key] = _frame_stats(stats[key])
    (root / "meta" / "stats.json").write_text(json.dumps(stats, indent=4) + "\n")
    info = json.loads((root / "meta" / "info.json").read_text())
    return {"fps": fps, "episodes": ne, "frames": n, "cameras": cameras,
            "features": {k: f["dtype"] for k, f in info["features"].items()},
            "not_exported": skipped}
