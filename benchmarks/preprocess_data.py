"""The dataset of ``bench_preprocess``: a multi-rate LeRobot v3.0 dataset written vectorized,
one process per data file (this module imports only NumPy and pyarrow, so the processes
start fast).

Episodes of ``SECONDS`` s: a 100 Hz 24-D state, a 50 Hz 16-D action, a 30 Hz 7-D pose
jittered by +-0.5 ms, two language events, and optionally a 15 Hz 48x64 RGB camera stored
inline; :data:`PER_FILE` episodes per data file.
"""

from __future__ import annotations

import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

SECONDS, PER_FILE = 12.0, 500
STREAMS = {"observation.state": (24, 100.0), "action": (16, 50.0),
           "observation.pose": (7, 30.0)}
CAMERA, CAMERA_HZ = (48, 64, 3), 15.0


def _layout(seconds: float, camera: bool) -> dict:
    """Rows of one episode: the union of every stream's sample times, each stream's rows."""
    # times in units of 1/3000 s: the 100 Hz grid, the 15 Hz camera (+10 ms) are exact; the
    # 30 Hz pose sits +5.5 ms (jittered by +-0.5 ms, never across a grid instant)
    grid = np.arange(int(seconds * 100) + 1) * 30.0
    pose = np.arange(int(seconds * 30) + 1) * 100.0 + 16.5
    cam = np.arange(int(seconds * CAMERA_HZ)) * 200.0 + 30.0 if camera else np.zeros(0)
    keys = np.unique(np.concatenate([grid, pose, cam]))
    at = {"observation.state": np.searchsorted(keys, grid),
          "action": np.searchsorted(keys, grid[::2]),
          "observation.pose": np.searchsorted(keys, pose),
          "language.note": np.searchsorted(keys, np.array([0.5, seconds / 2]) * 3000)}
    if camera:
        at["observation.images.cam"] = np.searchsorted(keys, cam)
    return {"times": keys / 3000.0, "at": at}


def _list_column(values: np.ndarray, present: np.ndarray, shape: tuple[int, ...]):
    """A LeRobot list column (nested lists for a multi-dimensional sample), null where a row
    has no sample: ``values [samples, *shape]`` in row order, ``present [rows]``."""
    import pyarrow as pa

    flat = pa.array(np.ascontiguousarray(values).reshape(-1))
    for size in reversed(shape[1:]):
        count = len(flat) // size
        flat = pa.ListArray.from_arrays(pa.array(np.arange(count + 1, dtype=np.int32) * size),
                                        flat)
    offsets = np.r_[0, np.cumsum(np.where(present, shape[0], 0))].astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), flat, mask=pa.array(~present))


# Columns worth a parquet dictionary (few distinct values); the float columns are not (the
# writer's default tries one for every column and falls back: 30 % of its time, measured)
DICTIONARY = ["episode_index", "task_index", "frame_index", "language.note"]
_DRAWS: dict[tuple, dict] = {}  # this process's random values, per file shape


def _draws(count: int, rows: int, lay: dict, camera: bool) -> dict:
    """The random values of a file of ``count`` episodes, drawn once per process and shape:
    every further file of that shape reuses them, offset by its first episode (the build's
    cost does not depend on the values; drawing them was half the generator's time)."""
    key = (count, rows, camera)
    if key not in _DRAWS:
        rng = np.random.default_rng(0)
        at = lay["at"]
        _DRAWS[key] = {
            "jitter": rng.uniform(-5e-4, 5e-4, (count, len(at["observation.pose"]))),
            **{name: rng.standard_normal((count, len(at[name]), dim), np.float32).cumsum(1)
               for name, (dim, _) in STREAMS.items()},
            **({"observation.images.cam": rng.integers(
                0, 255, (count * len(at["observation.images.cam"]), *CAMERA), np.uint8)}
               if camera else {})}
    return _DRAWS[key]


def _write_file(path: str, first: int, count: int, first_row: int, seconds: float,
                camera: bool) -> int:
    """One data file of ``count`` episodes from episode ``first`` (global row ``first_row``);
    returns its rows."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    lay = _layout(seconds, camera)
    rows = len(lay["times"])
    draws = _draws(count, rows, lay, camera)
    times = np.tile(lay["times"], (count, 1))
    pose_at = lay["at"]["observation.pose"]
    times[:, pose_at] += draws["jitter"]
    n = count * rows
    cols = {"timestamp": pa.array(times.reshape(-1).astype(np.float32)),
            "frame_index": pa.array(np.tile(np.arange(rows, dtype=np.int64), count)),
            "episode_index": pa.array(np.repeat(np.arange(first, first + count,
                                                          dtype=np.int64), rows)),
            "index": pa.array(np.arange(first_row, first_row + n, dtype=np.int64)),
            "task_index": pa.array(np.zeros(n, np.int64))}
    for name, (dim, _) in STREAMS.items():
        present = np.zeros((count, rows), bool)
        present[:, lay["at"][name]] = True
        values = draws[name] + np.float32(first % 1000)
        cols[name] = _list_column(values, present.reshape(-1), (dim,))
    if camera:
        present = np.zeros((count, rows), bool)
        present[:, lay["at"]["observation.images.cam"]] = True
        cols["observation.images.cam"] = _list_column(draws["observation.images.cam"],
                                                      present.reshape(-1), CAMERA)
    notes = np.full((count, rows), None, dtype=object)
    notes[:, lay["at"]["language.note"]] = ["reach", "grasp"]
    cols["language.note"] = pa.array(notes.reshape(-1), pa.string())
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(cols), path, use_dictionary=DICTIONARY)
    return n


def make_dataset(root: Path, episodes: int, seconds: float = SECONDS, camera: bool = False,
                 workers: int | None = None) -> tuple[Path, int]:
    """Write the LeRobot v3.0 dataset (one process per data file of :data:`PER_FILE`
    episodes); returns ``(root, source samples over all streams)``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    lay = _layout(seconds, camera)
    rows = len(lay["times"])
    template = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
    files = [(f, i, min(PER_FILE, episodes - i)) for f, i in
             enumerate(range(0, episodes, PER_FILE))]
    # from a fork server (Lance, imported by the caller, is not fork-safe); the processes
    # need only this module: NumPy and Arrow
    with ProcessPoolExecutor(workers or os.cpu_count(),
                             mp_context=multiprocessing.get_context("forkserver")) as pool:
        list(pool.map(_write_file, [str(root / template.format(chunk_index=f // 1000,
                                                               file_index=f % 1000))
                                    for f, _, _ in files],
                      [i for _, i, _ in files], [c for _, _, c in files],
                      [i * rows for _, i, _ in files], [seconds] * len(files),
                      [camera] * len(files), chunksize=max(1, len(files) // (4 * (
                          workers or os.cpu_count() or 1)))))
    f = np.repeat([f for f, _, c in files], [c for _, _, c in files])
    meta = root / "meta"
    (meta / "episodes" / "chunk-000").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({
        "episode_index": np.arange(episodes, dtype=np.int64),
        "tasks": [["benchmark"]] * episodes, "length": np.full(episodes, rows, np.int64),
        "data/chunk_index": f // 1000, "data/file_index": f % 1000,
        "dataset_from_index": np.arange(episodes, dtype=np.int64) * rows,
        "dataset_to_index": np.arange(1, episodes + 1, dtype=np.int64) * rows}),
        meta / "episodes" / "chunk-000" / "file-000.parquet")
    pq.write_table(pa.table({"task_index": [0], "task": ["benchmark"]}), meta / "tasks.parquet")
    features = {k: {"dtype": "int64", "shape": [1], "names": None}
                for k in ("frame_index", "episode_index", "index", "task_index")}
    features["timestamp"] = {"dtype": "float32", "shape": [1], "names": None}
    for name, (dim, hz) in STREAMS.items():
        features[name] = {"dtype": "float32", "shape": [dim], "names": None,
                          **({"fps": hz} if hz != 100.0 else {})}
    features["language.note"] = {"dtype": "string", "shape": [1], "names": None, "fps": None}
    if camera:
        features["observation.images.cam"] = {"dtype": "uint8", "shape": list(CAMERA),
                                              "names": ["height", "width", "channels"],
                                              "fps": CAMERA_HZ}
    info = {"codebase_version": "v3.0", "robot_type": None, "fps": 100.0,
            "total_episodes": episodes, "total_frames": episodes * rows, "total_tasks": 1,
            "chunks_size": 1000, "data_path": template,
            "video_path": "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4",
            "features": features}
    (meta / "info.json").write_text(json.dumps(info, indent=2) + "\n")
    samples = episodes * sum(len(a) for a in lay["at"].values())
    return root, samples
