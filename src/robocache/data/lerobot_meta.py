"""LeRobot's dataset metadata (``meta/``) as LeRobot 0.6.1 exposes it, without LeRobot.

:class:`LeRobotDatasetMetadata` reads ``meta/info.json``, ``meta/stats.json``, the tasks and the
episodes of a LeRobot v3.0 or v2.1 dataset directory: ``info`` with attribute access
(``meta.info.fps``) and dict access, ``episodes`` as a table with columns
(``meta.episodes["dataset_from_index"]``, ``meta.episodes[i]``), ``tasks`` as LeRobot's
pandas DataFrame, and LeRobot's helpers (``names``, ``shapes``, ``get_task_index``,
``filter_episodes``, ``get_data_file_path``...). :func:`find_root` finds a dataset where
LeRobot keeps it (``$HF_LEROBOT_HOME/<repo_id>`` or a Hub snapshot under
``$HF_LEROBOT_HOME/hub``); nothing is downloaded.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from robocache._optional import require
from robocache.errors import DataError

#: LeRobot's dataset format version, the Hub revision LeRobot reads by default.
CODEBASE_VERSION = "v3.0"


def lerobot_home() -> Path:
    """``$HF_LEROBOT_HOME`` (default ``$HF_HOME/lerobot``, ``~/.cache/huggingface/lerobot``),
    as LeRobot resolves it."""
    hf_home = os.environ.get("HF_HOME", Path.home() / ".cache" / "huggingface")
    return Path(os.environ.get("HF_LEROBOT_HOME", Path(hf_home) / "lerobot")).expanduser()


def lerobot_part(module: str, name: str, why: str, instead: str = "") -> Any:
    """LeRobot's own ``module.name``, for what LeRobot itself does (``why``: the sentence
    that says so; ``instead``: what to do without LeRobot, after the install advice).

    Raises:
        ImportError: LeRobot is not installed (the message says what to do)."""
    import importlib

    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as e:
        raise ImportError(f"{why}, and LeRobot is not installed here ({e}); install it (`pip "
                          f"install lerobot`: Python >= 3.12){instead}.") from e


def find_root(repo_id: str, root: str | Path | None = None,
              revision: str | None = None) -> Path:
    """The local directory of dataset ``repo_id``: ``root`` when given; else
    ``$HF_LEROBOT_HOME/<repo_id>`` when it holds ``meta/info.json``; else the snapshot LeRobot's
    Hub download left in ``$HF_LEROBOT_HOME/hub/datasets--<owner>--<name>`` (the one
    ``refs/<revision>`` names, ``revision`` defaulting to ``v3.0`` then ``main``, else the
    newest snapshot holding ``meta/info.json``). As LeRobot, a ``$HF_LEROBOT_HOME/<repo_id>``
    that is a legacy Hub mirror (it holds ``.cache/huggingface/download``) gives way to the
    snapshot; it is read only where there is none (LeRobot would download one).

    Raises:
        FileNotFoundError: no dataset there (the message names the places looked at).
    """
    if root is not None:
        path = Path(root).expanduser()
        if not (path / "meta" / "info.json").is_file():
            raise FileNotFoundError(f"{path} holds no LeRobot dataset (no meta/info.json); "
                                    "download it first, e.g. with LeRobot or "
                                    "`huggingface-cli download --repo-type dataset REPO`.")
        return path
    home = lerobot_home()
    local = home / repo_id
    # a legacy Hub mirror (``snapshot_download(local_dir=...)`` left its download metadata
    # there): LeRobot reads the snapshot cache instead, so the mirror is the last resort
    legacy = (local / ".cache" / "huggingface" / "download").exists()
    if (local / "meta" / "info.json").is_file() and not legacy:
        return local
    repo = home / "hub" / ("datasets--" + repo_id.replace("/", "--"))
    for ref in dict.fromkeys([revision or CODEBASE_VERSION, "main"]):
        ref_file = repo / "refs" / ref
        commit = ref_file.read_text().strip() if ref_file.is_file() else ref
        snap = repo / "snapshots" / commit
        if (snap / "meta" / "info.json").is_file():
            return snap
    snaps = sorted((p for p in (repo / "snapshots").glob("*") if (p / "meta" / "info.json")
                    .is_file()), key=lambda p: (p / "meta" / "info.json").stat().st_mtime)
    if snaps:
        return snaps[-1]
    if (local / "meta" / "info.json").is_file():  # the legacy mirror: nothing newer here
        return local
    raise FileNotFoundError(f"no local copy of {repo_id!r}: neither {local} nor a snapshot in "
                            f"{repo} holds meta/info.json; download it first (LeRobot's "
                            f"`LeRobotDataset({repo_id!r})` online, or `huggingface-cli "
                            "download --repo-type dataset`), or pass `root=`.")


class DatasetInfo(dict):
    """``meta/info.json``: a dict that also reads (and writes) its keys as attributes,
    like LeRobot 0.6.1's ``DatasetInfo`` (``info.fps``, ``info["fps"]``)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(f"meta/info.json has no {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        self[name] = value

    def to_dict(self) -> dict:
        """A JSON-writable copy (features' shapes as lists), as LeRobot's ``to_dict``, for
        LeRobot's ``write_info``."""
        out = json.loads(json.dumps(self))  # tuples -> lists, nothing shared
        if out.get("tools") is None:
            out.pop("tools", None)
        return out


class EpisodeTable:
    """Per-episode metadata as a table, like the ``datasets.Dataset`` LeRobot's
    ``meta.episodes`` is: ``table["dataset_from_index"]`` a column (list, one value per
    episode, in episode order), ``table[i]`` the row of episode ``i`` (a dict), ``len``,
    iteration over rows, ``column_names``, ``num_rows``, ``filter``, ``select_columns``,
    ``to_pandas``."""

    def __init__(self, columns: dict[str, list]):
        self._columns = columns

    @property
    def column_names(self) -> list[str]:
        return list(self._columns)

    @property
    def num_rows(self) -> int:
        return len(next(iter(self._columns.values()), []))

    def __len__(self) -> int:
        return self.num_rows

    def __getitem__(self, key: str | int) -> list | dict:
        if isinstance(key, str):
            if key not in self._columns:
                raise KeyError(f"meta.episodes has no column {key!r}; columns: "
                               f"{self.column_names}.")
            return list(self._columns[key])
        i = int(key)
        if not -self.num_rows <= i < self.num_rows:
            raise IndexError(f"episode row {i} is out of range for {self.num_rows} episodes.")
        return {k: v[i] for k, v in self._columns.items()}

    def __iter__(self) -> Iterator[dict]:
        return (self[i] for i in range(self.num_rows))

    def filter(self, predicate: Callable[[dict], bool], **_: Any) -> EpisodeTable:
        """The rows for which ``predicate(row)`` is true (``datasets`` keyword arguments such
        as ``keep_in_memory`` are accepted and have no effect)."""
        keep = [i for i, row in enumerate(self) if predicate(row)]
        return EpisodeTable({k: [v[i] for i in keep] for k, v in self._columns.items()})

    def select_columns(self, column_names: str | list[str]) -> EpisodeTable:
        names = [column_names] if isinstance(column_names, str) else list(column_names)
        return EpisodeTable({k: self[k] for k in names})

    def to_pandas(self):
        pd = require("pandas", "lerobot", "LeRobot's meta tables")
        return pd.DataFrame(self._columns)

    def __repr__(self) -> str:
        return f"EpisodeTable(columns={self.column_names}, num_rows={self.num_rows})"


def _info(name: str, cast: Callable[[Any], Any] | None = None, default: Any = None) -> property:
    """A read-only attribute: ``meta/info.json``'s ``name`` (``default`` when absent; LeRobot's
    defaults), through ``cast``."""
    def get(self: LeRobotDatasetMetadata) -> Any:
        value = self.info.get(name, default)
        return value if cast is None or value is None else cast(value)

    return property(get, doc=f"``meta/info.json``'s ``{name}``.")


class LeRobotDatasetMetadata:
    """LeRobot 0.6.1's ``LeRobotDatasetMetadata`` for reading, from ``root/meta``.

    Args:
        repo_id: the dataset's name.
        root: its directory (default: found by :func:`find_root`, as LeRobot looks).
        revision: the Hub revision whose snapshot to read when ``root`` is None (default
            ``"v3.0"``); nothing is downloaded.
        force_cache_sync, metadata_buffer_size, repo_type, token: LeRobot's arguments for
            downloading and writing; accepted and unused (this class reads local files only).

    Attributes: ``info`` (:class:`DatasetInfo`), ``fps``, ``features`` (shapes as tuples),
    ``stats`` (``key -> {min, max, mean, std, count, q01, q10, q50, q90, q99}`` NumPy arrays
    from ``meta/stats.json``; ``{}`` without it), ``episodes`` (:class:`EpisodeTable`:
    ``episode_index``, ``tasks``, ``length``, ``dataset_from_index``, ``dataset_to_index``,
    the file indices...), ``tasks`` (pandas DataFrame indexed by task with a ``task_index``
    column), ``task_names``, ``total_frames``, ``total_episodes``, ``total_tasks``,
    ``camera_keys`` / ``image_keys`` / ``video_keys`` / ``depth_keys`` (in feature order),
    ``names``, ``shapes``, ``chunks_size``, ``revision``, ``root``, ``repo_id``.

    Raises:
        FileNotFoundError: no dataset at ``root`` (or where LeRobot keeps ``repo_id``).
        DataError: bad ``meta/info.json`` (version, fps).
    """

    def __init__(self, repo_id: str, root: str | Path | None = None,
                 revision: str | None = None, force_cache_sync: bool = False,
                 metadata_buffer_size: int = 10, *, repo_type: str = "dataset",
                 token: str | bool | None = None):
        from robocache.data.formats.lerobot import LeRobotSource

        if not isinstance(repo_id, str):
            raise TypeError(f"`repo_id` must be a str (e.g. 'lerobot/pusht'); got "
                            f"{type(repo_id).__name__}.")
        self.repo_id, self.repo_type = repo_id, repo_type
        self.revision = revision or CODEBASE_VERSION
        self.root = find_root(repo_id, root, revision)
        source = LeRobotSource(self.root)  # checks the version and meta/info.json's fps
        self.stream_specs = source.specs  # how RoboCache reads each feature
        self.info = DatasetInfo(source.info)
        self.info["features"] = {k: {**f, "shape": tuple(f["shape"])}
                                 for k, f in source.info["features"].items()}
        rows = source._episodes
        columns: dict[str, list] = {}
        start = 0
        for n, e in enumerate(sorted(rows)):
            row = {k: v for k, v in rows[e].items() if not k.startswith("stats/")}
            row.setdefault("dataset_from_index", start)
            row.setdefault("dataset_to_index", start + int(row["length"]))
            start = int(row["dataset_to_index"])
            for k, v in row.items():
                columns.setdefault(k, [None] * n).append(v)
            for k in set(columns) - set(row):
                columns[k].append(None)
        self.episodes = EpisodeTable(columns)
        self.task_names = [source._tasks[i] for i in sorted(source._tasks)]
        self.stats = self._stats(self.root)
        #: times the tasks or the video info were replaced (LeRobot's dataset tools do after
        #: rewriting files): a dataset serving this metadata compares its cache with the files
        #: again
        self.edits = 0

    @staticmethod
    def _stats(root: Path) -> dict[str, dict[str, np.ndarray]]:
        path = root / "meta" / "stats.json"
        if not path.exists():
            return {}
        return {k: {s: np.atleast_1d(np.array(v)) for s, v in d.items()}
                for k, d in json.loads(path.read_text()).items()}

    fps = _info("fps")
    features = _info("features")
    robot_type = _info("robot_type")
    total_frames = _info("total_frames", int)
    total_episodes = _info("total_episodes", int)
    chunks_size = _info("chunks_size", int, 1000)
    data_files_size_in_mb = _info("data_files_size_in_mb", int, 100)
    video_files_size_in_mb = _info("video_files_size_in_mb", int, 200)
    data_path = _info("data_path")
    video_path = _info("video_path")

    @property
    def total_tasks(self) -> int:
        return int(self.info.get("total_tasks", len(self.task_names)))

    @property
    def url_root(self) -> str:
        return f"hf://datasets/{self.repo_id}"

    @property
    def tasks(self):
        pd = require("pandas", "lerobot", "LeRobot's meta.tasks table")
        return pd.DataFrame({"task_index": range(len(self.task_names))},
                            index=pd.Index(self.task_names, name="task"))

    @tasks.setter
    def tasks(self, table) -> None:
        """Replace the tasks with LeRobot's table (indexed by task, with a ``task_index``
        column), as LeRobot's dataset tools do after rewriting ``meta/tasks.parquet``."""
        order = sorted(zip(table["task_index"].tolist(), table.index.tolist(), strict=True))
        self.task_names = [str(task) for _, task in order]
        self.edits += 1

    @property
    def image_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f["dtype"] == "image"]

    @property
    def video_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f["dtype"] == "video"]

    @property
    def camera_keys(self) -> list[str]:
        """Image and video keys, in feature order (as LeRobot)."""
        return [k for k, f in self.features.items() if f["dtype"] in ("video", "image")]

    @property
    def depth_keys(self) -> list[str]:
        """Camera keys whose feature ``info`` marks a depth map (``is_depth_map``, or the
        legacy ``video.is_depth_map`` in ``info`` or ``video_info``)."""
        def depth(f: dict) -> bool:
            info, video = f.get("info") or {}, f.get("video_info") or {}
            return bool(info.get("is_depth_map") or info.get("video.is_depth_map")
                        or video.get("video.is_depth_map"))

        return [k for k, f in self.features.items() if depth(f)]

    def rescale_depth_stats(self, output_unit: str) -> None:
        """Rescale the depth features' :attr:`stats` in place from the unit their frames are
        stored in (``info``'s ``depth_unit``) to ``output_unit`` (``"mm"`` or ``"m"``), as
        LeRobot does for the frames it serves in that unit (``count`` kept; a feature without
        a recorded unit kept as stored)."""
        for key in self.depth_keys:
            stored = (self.features[key].get("info") or {}).get("depth_unit")
            if stored is None or stored == output_unit or key not in self.stats:
                continue
            factor = 1000.0 if stored == "m" else 1.0 / 1000.0
            self.stats[key] = {s: v if s == "count" else v * factor
                               for s, v in self.stats[key].items()}

    def update_video_info(self, video_key: str | None = None, video_encoder: Any = None,
                          preserve_keys: Any = None) -> None:
        """LeRobot's ``update_video_info`` (the video features' ``info`` probed again from
        their first files, as LeRobot's dataset tools do after re-encoding them), run on this
        metadata where LeRobot is installed; a dataset serving it then compares its cache
        with the files again at its next item.

        Raises:
            ImportError: LeRobot is not installed (the message says what to do)."""
        lerobot = lerobot_part("lerobot.datasets.dataset_metadata", "LeRobotDatasetMetadata",
                               "update_video_info probes videos with LeRobot's own code")
        lerobot.update_video_info(self, video_key, video_encoder, preserve_keys)
        self.edits += 1

    @property
    def names(self) -> dict[str, Any]:
        return {k: f.get("names") for k, f in self.features.items()}

    @property
    def shapes(self) -> dict[str, tuple]:
        return {k: tuple(f["shape"]) for k, f in self.features.items()}

    @property
    def has_language_columns(self) -> bool:
        """Whether the dataset declares LeRobot's language columns (``language_persistent``,
        ``language_events``)."""
        return any(k in ("language_persistent", "language_events") for k in self.features)

    def get_task_index(self, task: str) -> int | None:
        """The index of ``task`` (a task string of the dataset), else None."""
        try:
            return self.task_names.index(task)
        except ValueError:
            return None

    def filter_episodes(self, predicate: Callable[[dict], bool],
                        candidates: list[int] | None = None) -> list[int]:
        """The sorted episode indices whose row of :attr:`episodes` satisfies ``predicate``
        (among ``candidates`` when given)."""
        keep = set(candidates) if candidates is not None else None
        return sorted(int(e["episode_index"]) for e in self.episodes
                      if (keep is None or e["episode_index"] in keep) and predicate(e))

    def _episode_row(self, ep_index: int) -> dict:
        if not 0 <= ep_index < len(self.episodes):
            raise IndexError(f"Episode index {ep_index} out of range. Episodes: "
                             f"{len(self.episodes)}")
        return self.episodes[ep_index]

    def get_data_file_path(self, ep_index: int) -> Path:
        """The parquet file (relative to :attr:`root`) holding episode ``ep_index``."""
        ep = self._episode_row(ep_index)
        if "data/chunk_index" not in ep:  # v2.1: one file per episode
            chunk = ep_index // self.chunks_size
            return Path(self.data_path.format(episode_chunk=chunk, episode_index=ep_index))
        return Path(self.data_path.format(chunk_index=ep["data/chunk_index"],
                                          file_index=ep["data/file_index"]))

    def get_video_file_path(self, ep_index: int, vid_key: str) -> Path:
        """The video file (relative to :attr:`root`) holding ``vid_key`` of ``ep_index``."""
        if self.video_path is None:
            raise DataError(f"{self.root} stores no videos (meta/info.json has no video_path).")
        ep = self._episode_row(ep_index)
        if f"videos/{vid_key}/chunk_index" not in ep:  # v2.1
            chunk = ep_index // self.chunks_size
            return Path(self.video_path.format(episode_chunk=chunk, video_key=vid_key,
                                               episode_index=ep_index))
        return Path(self.video_path.format(video_key=vid_key,
                                           chunk_index=ep[f"videos/{vid_key}/chunk_index"],
                                           file_index=ep[f"videos/{vid_key}/file_index"]))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(repo_id={self.repo_id!r}, "
                f"total_episodes={self.total_episodes}, total_frames={self.total_frames}, "
                f"features={list(self.features)})")
