"""A drop-in for LeRobot's ``LeRobotDataset``, served from a RoboCache cache.

    # from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from robocache import LeRobotDataset

    ds = LeRobotDataset("user/pusht", root="data/pusht",
                        delta_timestamps={"observation.state": [-1/10, 0],
                                          "action": [k / 10 for k in range(16)]})
    item = ds[0]     # LeRobot's keys, dtypes and shapes; "task" a string

The first use of a dataset directory ingests it at its native rate (every frame bit-exact, see
:mod:`robocache.data.cache`) into a cache directory next to nothing of the source's (default
``$ROBOCACHE_HOME`` or ``~/.cache/robocache``, one sub-directory per source path); later uses
reuse it. Items follow LeRobot 0.6.1's ``__getitem__``: every feature (per ``delta_timestamps``
key a window ``[K, ...]`` and ``<key>_is_pad``, the current frame otherwise), features of shape
``[1]`` as scalars, floats as float32, integers as int64, bools as bool, image and video
features as float32 ``[C, H, W]`` in [0, 1] (image features keep their PNG bytes, videos are
decoded once when the cache is built and stored as JPEG frames; a batch's frames are decoded
together, with nvJPEG on a GPU), plus ``timestamp`` (float32), ``frame_index``,
``episode_index``, ``index``, ``task_index`` (int64) and ``task`` (str).

``__getitem__`` exists for compatibility with ``torch.utils.data.DataLoader``; the fast path is
batch-level: :meth:`LeRobotDataset.batches` gathers whole batches where the cache lives (on
the GPU: one kernel launch for every key's window) and returns the same keys with a leading
batch dimension (``task``: a list of strings).
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robocache._optional import require
from robocache.data.dataset import RobotDataset, seconds_to_steps
from robocache.errors import DataError

Batch = dict[str, Any]


def default_cache_dir(root: Path) -> Path:
    """Where the cache of the dataset at ``root`` goes: ``$ROBOCACHE_HOME`` (default
    ``~/.cache/robocache``) / ``<name>-<hash of the resolved path>``."""
    home = Path(os.environ.get("ROBOCACHE_HOME", Path.home() / ".cache" / "robocache"))
    digest = hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:12]
    return home / f"{root.name}-{digest}"


class LeRobotDatasetMetadata:
    """LeRobot's dataset metadata, read from ``root/meta``: ``info``, ``fps``, ``features``,
    ``stats`` (``key -> {min, max, mean, std, count, q01, q10, q50, q90, q99}`` NumPy arrays,
    as LeRobot; without ``meta/stats.json``, the cache's min, max, mean, std, count, q01 and
    q99 of every numeric feature), ``episodes`` (one dict per episode: ``episode_index``,
    ``tasks``, ``length``, ``dataset_from_index``, ``dataset_to_index``...), ``tasks`` (a
    pandas DataFrame indexed by task with a ``task_index`` column, as LeRobot),
    ``total_frames``, ``total_episodes``."""

    def __init__(self, repo_id: str, root: Path):
        from robocache.data.formats.lerobot import LeRobotSource

        self.repo_id, self.root = repo_id, root
        source = LeRobotSource(root)  # checks the version and meta/info.json's fps
        self.info = source.info
        self.fps = self.info["fps"]
        self.features = {k: {**f, "shape": tuple(f["shape"])}
                         for k, f in self.info["features"].items()}
        self.robot_type = self.info.get("robot_type")
        self.total_frames = int(self.info["total_frames"])
        self.total_episodes = int(self.info["total_episodes"])
        self.total_tasks = int(self.info.get("total_tasks", len(source._tasks)))
        rows = source._episodes
        start = 0
        self.episodes = []
        for e in sorted(rows):
            row = {k: v for k, v in rows[e].items() if not k.startswith("stats/")}
            row.setdefault("dataset_from_index", start)
            row.setdefault("dataset_to_index", start + int(row["length"]))
            start = int(row["dataset_to_index"])
            self.episodes.append(row)
        self.task_names = [source._tasks[i] for i in sorted(source._tasks)]
        self.stats = self._stats(root)

    @staticmethod
    def _stats(root: Path) -> dict[str, dict[str, np.ndarray]]:
        path = root / "meta" / "stats.json"
        if not path.exists():
            return {}
        return {k: {s: np.array(v) for s, v in d.items()}
                for k, d in json.loads(path.read_text()).items()}

    @property
    def tasks(self):
        pd = require("pandas", "lerobot", "LeRobot's meta.tasks table")
        return pd.DataFrame({"task_index": range(len(self.task_names))},
                            index=pd.Index(self.task_names, name="task"))

    @property
    def image_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f["dtype"] == "image"]

    @property
    def video_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f["dtype"] == "video"]

    @property
    def camera_keys(self) -> list[str]:
        return self.image_keys + self.video_keys


def _item_dtype(dtype: str) -> torch.dtype:
    """The dtype LeRobot's items carry for a feature dtype."""
    if dtype in ("image", "video") or dtype.startswith("float"):
        return torch.float32
    return torch.bool if dtype == "bool" else torch.int64


class LeRobotDataset(torch.utils.data.Dataset):
    """LeRobot's ``LeRobotDataset`` over a RoboCache cache (see the module docstring).

    Args:
        repo_id: the dataset's name (``root`` defaults to ``$HF_LEROBOT_HOME/<repo_id>``, as
            LeRobot); nothing is downloaded.
        root: the LeRobot dataset directory (v3.0 or v2.1), never written.
        episodes: serve only these episodes (LeRobot's indices are then relative to them).
        image_transforms: applied to each camera key of an item (and of a batch).
        delta_timestamps: per key offsets in seconds, multiples of ``1 / fps`` within
            ``tolerance_s``.
        tolerance_s: LeRobot's timestamp tolerance (> 0): for ``delta_timestamps`` and for the
            frames' timestamps when the cache is built.
        revision, force_cache_sync, download_videos, video_backend: accepted for LeRobot's
            signature (videos are decoded by PyAV when the cache is built, whatever
            ``video_backend``); ``force_cache_sync=True`` rebuilds the RoboCache cache.
        cache: the cache directory (default :func:`default_cache_dir`).
        device: where the cache is gathered: ``"cpu"`` (default) or ``"cuda"``.
        build_timeout_s: when another process is building the cache (the other ranks of a
            ``torchrun`` job constructing the same dataset), seconds to wait for it (its
            progress is logged at INFO) before failing; then the finished cache is opened.

    Raises:
        FileNotFoundError: no dataset at ``root``.
        DataError: bad ``meta/info.json`` (version, fps), ``delta_timestamps`` off the fps grid,
            for an unknown key or empty, ``tolerance_s <= 0``, episodes not in the dataset,
            or requested episodes (all by default) quarantined while caching (the reason
            names the row and offset).
        CacheBusyError: another process still builds the cache after ``build_timeout_s``.
    """

    def __init__(self, repo_id: str, root: str | Path | None = None,
                 episodes: list[int] | None = None, image_transforms: Callable | None = None,
                 delta_timestamps: dict[str, list[float]] | None = None,
                 tolerance_s: float = 1e-4, revision: str | None = None,
                 force_cache_sync: bool = False, download_videos: bool = True,
                 video_backend: str | None = None, *, cache: str | Path | None = None,
                 device: str | torch.device = "cpu", build_timeout_s: float = 3600.0):
        from robocache.data.cache import build
        from robocache.data.lock import build_once

        if root is None:
            home = os.environ.get("HF_LEROBOT_HOME",
                                  Path.home() / ".cache" / "huggingface" / "lerobot")
            root = Path(home) / repo_id
        self.repo_id, self.root = repo_id, Path(root)
        if not (self.root / "meta" / "info.json").is_file():
            raise FileNotFoundError(f"{self.root} holds no LeRobot dataset (no meta/info.json); "
                                    "download it first, e.g. with LeRobot or "
                                    "`huggingface-cli download --repo-type dataset REPO`.")
        if image_transforms is not None and not callable(image_transforms):
            raise TypeError("`image_transforms` must be callable or None.")
        self.meta = LeRobotDatasetMetadata(repo_id, self.root)
        self.delta_timestamps, self.tolerance_s = delta_timestamps, tolerance_s
        self.episodes, self.image_transforms = episodes, image_transforms
        self.revision, self.video_backend = revision, video_backend
        self.cache = Path(cache) if cache is not None else default_cache_dir(self.root)
        manifest = self.cache / "manifest.json"
        if force_cache_sync or not self._reusable(manifest):
            build_once(self.cache, lambda: build(
                self.root, self.cache, rate_hz="native", grid_tolerance_s=tolerance_s,
                progress=False, overwrite=force_cache_sync, rebuild_changed=True),
                lambda: self._reusable(manifest),
                timeout_s=build_timeout_s, fix="pass a larger build_timeout_s")
        bad = [q for q in json.loads(manifest.read_text())["quarantined"]
               if episodes is None or q["index"] in set(episodes)]
        if bad:
            raise DataError(f"{self.root}: {len(bad)} requested episodes could not be cached; "
                            f"episode {bad[0]['index']}: {bad[0]['reason']}; repair them, or "
                            "pass `episodes` naming the others to serve those.")
        if not self.meta.stats:  # no meta/stats.json: the cache's, in LeRobot's layout
            stats = json.loads((self.cache / "stats.json").read_text())
            self.meta.stats = {k: {s: np.array(d[s]) for s in ("min", "max", "mean", "std",
                                                               "count", "q01", "q99")}
                               for k, d in stats.items()}
        streams = json.loads(manifest.read_text())["streams"]
        # served: numeric and camera features (sparse string events of the multi-rate
        # extension are not item keys in LeRobot)
        self.feature_keys = [k for k in self.meta.features if k in streams
                             and streams[k]["kind"] in ("numeric", "image", "video")]
        self._cameras = [k for k in self.feature_keys if streams[k]["kind"] in ("image", "video")]
        steps = None
        if delta_timestamps is not None:
            steps = seconds_to_steps(delta_timestamps, float(self.meta.fps), tolerance_s,
                                     self.feature_keys)
        self.delta_indices = steps
        self._ds = RobotDataset(self.cache, keys=self.feature_keys, episodes=episodes,
                                delta_steps=steps or {}).to(device)
        eps = self.meta.episodes
        size = max(e["episode_index"] for e in eps) + 1
        from_index = torch.zeros(size, dtype=torch.int64)
        for e in eps:
            from_index[e["episode_index"]] = int(e["dataset_from_index"])
        self._from_index, self._task_index = from_index.to(device), self._row_tasks().to(device)
        # DataLoader workers forked after this never call Lance (everything served, camera
        # frames included, is in memory now): pylance's warning at each fork does not apply
        warnings.filterwarnings("ignore", "lance is not fork-safe")

    def _row_tasks(self) -> torch.Tensor:
        """int64 ``[rows]``: the task index of each served row (the cache's per-step task, i.e.
        LeRobot's per-frame ``task_index``)."""
        ids = {t: i for i, t in enumerate(self.meta.task_names)}
        lut = torch.tensor([ids.get(t, 0) for t in self._ds.task_names], dtype=torch.int64)
        return lut[self._ds.task_id]

    def _reusable(self, manifest: Path) -> bool:
        """The cache at ``manifest`` is a finished native-rate cache that read every episode of
        this dataset, cached or quarantined, from the files as they are (otherwise
        :func:`robocache.cache.build` resumes it and caches again what changed, or refuses
        another)."""
        from robocache.data.source_identity import changed_since

        if not manifest.exists():
            return False
        m = json.loads(manifest.read_text())
        return (m.get("status") == "complete" and m.get("native") is True
                and m["source"]["path"] == str(self.root.resolve())
                and m["counts"]["read"] == self.meta.total_episodes and not changed_since(m))

    @property
    def fps(self) -> int:
        return self.meta.fps

    @property
    def features(self) -> dict[str, dict]:
        return self.meta.features

    @property
    def num_frames(self) -> int:
        return len(self._ds)

    @property
    def num_episodes(self) -> int:
        return int(self._ds.episode_ids.shape[0])

    def __len__(self) -> int:
        return len(self._ds)

    def __getitem__(self, idx: int) -> Batch:
        if not isinstance(idx, (int, np.integer)):
            raise TypeError(f"index with an int; got {type(idx).__name__} (batches: "
                            "`get_batch(indices)` or `batches(batch_size)`).")
        if not -len(self) <= idx < len(self):
            raise IndexError(f"index {idx} is out of range for {len(self)} frames.")
        batch = self.get_batch(torch.tensor([int(idx) % len(self)]))
        return {k: v[0] for k, v in batch.items()}

    def get_batch(self, indices: torch.Tensor | Sequence[int]) -> Batch:
        """Items ``indices`` (int ``[B]``, relative to the served episodes) as one batch: the
        item keys with a leading ``B`` (``task``: a list of ``B`` strings)."""
        idx = torch.as_tensor(indices, dtype=torch.int64).to(self._ds.device)
        return self._lerobot(self._ds.fetch(idx))

    def batches(self, batch_size: int, *, shuffle: bool = True, drop_last: bool = True,
                seed: int = 0) -> Iterator[Batch]:
        """Batches of LeRobot items over an epoch, gathered where the cache lives (the fast
        path: ``LeRobotDataset(..., device="cuda").batches(256)``)."""
        if batch_size < 1:
            raise DataError(f"`batch_size` must be >= 1; got {batch_size}.")
        n = len(self)
        order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)) if shuffle \
            else torch.arange(n)
        order = order.to(self._ds.device)
        stop = n - n % batch_size if drop_last else n
        for b in range(0, stop, batch_size):
            yield self.get_batch(order[b:b + batch_size])

    def _lerobot(self, batch: Batch) -> Batch:
        """RobotDataset's batch in LeRobot's keys, dtypes and shapes."""
        index = batch["index"]
        episode = batch["episode_index"]
        frame = self._ds.step[index]
        out: Batch = {}
        for k in self.feature_keys:
            f = self.meta.features[k]
            v = batch[k]
            if k in self._cameras:
                v = self._camera(v)
            else:
                lead = v.shape[:-1]
                shape = () if tuple(f["shape"]) == (1,) else tuple(f["shape"])
                v = v.reshape(*lead, *shape).to(_item_dtype(f["dtype"]))
            out[k] = v
            if self.delta_indices is not None and k in self.delta_indices:
                out[f"{k}_is_pad"] = batch[f"{k}_is_pad"]
        out["timestamp"] = batch["timestamp"].to(torch.float32)
        out["frame_index"] = frame
        out["episode_index"] = episode
        out["index"] = self._from_index[episode] + frame
        out["task_index"] = self._task_index[index]
        out["task"] = [self.meta.task_names[int(i)] for i in out["task_index"].tolist()]
        return out

    def _camera(self, frames: torch.Tensor) -> torch.Tensor:
        """A camera key's frames (float32 ``[B, (K,) C, H, W]`` in [0, 1], decoded per batch by
        the camera path) with ``image_transforms`` applied, as LeRobot serves them."""
        return self.image_transforms(frames) if self.image_transforms is not None else frames

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(repo_id={self.repo_id!r}, root={str(self.root)!r}, "
                f"frames={len(self)}, episodes={self.num_episodes}, fps={self.fps}, "
                f"cache={str(self.cache)!r})")
