"""A drop-in for LeRobot's ``LeRobotDataset``, served from a RoboCache cache.

    # from lerobot.datasets.lerobot_dataset import LeRobotDataset
    from robocache import LeRobotDataset

    ds = LeRobotDataset("user/pusht", root="data/pusht",
                        delta_timestamps={"observation.state": [-1/10, 0],
                                          "action": [k / 10 for k in range(16)]})
    item = ds[0]     # LeRobot's keys, dtypes and shapes; "task" a string

The first use of a dataset directory (LeRobot v3.0 or v2.1, or v3.0 in LeRobot's Lance layout)
ingests the episodes asked for at their native rate (every frame bit-exact, see
:mod:`robocache.data.cache`) into a cache directory next to nothing of the source's (default
``$ROBOCACHE_HOME`` or ``~/.cache/robocache``, one sub-directory per source path); later uses reuse
it and add the episodes it lacks. Items follow LeRobot 0.6.1's ``__getitem__``: every feature (per
``delta_timestamps`` key a window ``[K, ...]`` and ``<key>_is_pad``, the current frame otherwise),
features of shape ``[1]`` as scalars, floats as float32, integers as int64, bools as bool, image
and video features as float32 ``[C, H, W]`` in [0, 1] (video features uint8 with
``return_uint8=True``; image features keep their PNG bytes; RGB videos keep their packets by
default, ``camera_codec="auto"``: about the videos' bytes, each batch's frames decoded from them,
exactly LeRobot's frames; ``camera_codec="jpeg"`` decodes them once when the cache is built and
stores JPEG frames, the fastest to serve at many times the bytes, ``"png"`` lossless frames;
depth features float32 ``[1, H, W]`` in ``depth_output_unit``; a video key's window of one
offset ``[C, H, W]``),
``string`` features and language columns as LeRobot serves them (read from the data files), plus
``timestamp`` (float32), ``frame_index``, ``episode_index``, ``index``, ``task_index`` (int64) and
``task`` (str).

``LeRobotDataset.create`` / ``resume`` record through LeRobot's own writer (where LeRobot is
installed); after ``finalize()`` the dataset serves what was saved.

``__getitem__`` serves ``torch.utils.data.DataLoader`` one item at a time; ``__getitems__``
(what a DataLoader calls with a batch of indices) gathers the whole batch at once, and
:meth:`LeRobotDataset.batches` gathers whole batches where the cache lives (on the GPU: one
kernel launch for every key's window), returning the same keys with a leading batch dimension
(``task``: a list of strings).

Pickling (DataLoader workers, ``spawn`` included) carries the settings only: each process opens
the cache itself on first use.
"""

from __future__ import annotations

import bisect
import functools
import hashlib
import json
import math
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robocache._optional import require
from robocache.data.build.config import check_camera_codec
from robocache.data.dataset import RobotDataset
from robocache.data.jpeg import DEFAULT_CHROMA, DEFAULT_QUALITY
from robocache.data.jpeg import check as check_jpeg
from robocache.data.lerobot_meta import LeRobotDatasetMetadata, lerobot_part
from robocache.errors import DataError

Batch = dict[str, Any]

#: LeRobot's per-frame columns that every item carries and ``delta_timestamps`` may name.
FRAME_KEYS = ("timestamp", "frame_index", "episode_index", "index", "task_index")
_SAID: set[str] = set()


def _say_once(what: str, message: str) -> None:
    """Warn ``message`` (at the caller of the dataset) the first time ``what`` comes up in
    this process."""
    if what not in _SAID:
        _SAID.add(what)
        warnings.warn(message, UserWarning, stacklevel=4)


def default_cache_dir(root: Path, camera_codec: str = "auto",
                      camera_quality: int = DEFAULT_QUALITY,
                      camera_chroma: str = DEFAULT_CHROMA) -> Path:
    """Where the cache of the dataset at ``root`` goes: ``$ROBOCACHE_HOME`` (default
    ``~/.cache/robocache``) / ``<name>-<hash of the resolved path>``, then ``-<codec>`` for
    every ``camera_codec`` but ``"jpeg"`` (``-auto``, ``-video``, ``-png``: a JPEG cache keeps
    the name it had when JPEG was the default) and, where frames may be stored as JPEG (all
    but ``"png"``), ``-q<quality>-<chroma>`` for JPEG other than the default."""
    home = Path(os.environ.get("ROBOCACHE_HOME", Path.home() / ".cache" / "robocache"))
    digest = hashlib.sha1(str(root.resolve()).encode()).hexdigest()[:12]
    suffix = "" if camera_codec == "jpeg" else f"-{camera_codec}"
    if camera_codec != "png" and (camera_quality, camera_chroma) != (DEFAULT_QUALITY,
                                                                       DEFAULT_CHROMA):
        suffix += f"-q{camera_quality}-{camera_chroma}"
    return home / f"{root.name}-{digest}{suffix}"


def delta_indices(delta_timestamps: dict[str, Sequence[float]], fps: float,
                  tolerance_s: float, keys: Sequence[str] | None = None) -> dict[str, list[int]]:
    """LeRobot's ``delta_timestamps`` (seconds) as frame offsets, checked as LeRobot 0.6.1
    checks them: every offset ``ts`` with ``|ts * fps - round(ts * fps)| / fps <= tolerance_s``
    (so ``tolerance_s = 0`` takes exact multiples of ``1 / fps`` only, and a negative one
    none), offsets ``round(ts * fps)``.

    Raises:
        DataError: a key not in ``keys`` (when given), an empty list, or offsets off the grid
            (all of them named, with the nearest valid offsets of the first).
    """
    out, outside = {}, {}
    for key, offsets in delta_timestamps.items():
        if keys is not None and key not in keys:
            raise DataError(f"`delta_timestamps` names {key!r}, which is not a served key; "
                            f"served keys: {list(keys)}.")
        offsets = [float(o) for o in offsets]
        if not offsets:
            raise DataError(f"`delta_timestamps[{key!r}]` is empty; give at least one offset "
                            "in seconds, e.g. [0.0].")
        bad = [o for o in offsets if not abs(o * fps - round(o * fps)) / fps <= tolerance_s]
        if bad:
            outside[key] = bad
        out[key] = [round(o * fps) for o in offsets]
    if outside:
        key, (o, *_) = next(iter(outside.items()))
        lo, hi = np.floor(o * fps) / fps, np.ceil(o * fps) / fps
        raise DataError(f"`delta_timestamps` offsets are not multiples of 1/{fps:g} s within "
                        f"tolerance_s = {tolerance_s:g}: {outside}; e.g. for {key!r} the nearest "
                        f"valid offsets to {o!r} s are {lo!r} and {hi!r} s.")
    return out


class LeRobotDataset(torch.utils.data.Dataset):
    """LeRobot's ``LeRobotDataset`` over a RoboCache cache (see the module docstring).

    Args:
        repo_id: the dataset's name.
        root: the LeRobot dataset directory (v3.0 or v2.1, or v3.0 in LeRobot's Lance
            layout: ``"storage_format": "lance"``, see
            :mod:`robocache.data.formats.lerobot`), never written. Default: where
            LeRobot 0.6.1 keeps ``repo_id`` (``$HF_LEROBOT_HOME/<repo_id>``, or its Hub snapshot
            under ``$HF_LEROBOT_HOME/hub``, see :func:`robocache.data.lerobot_meta.find_root`).
        episodes: serve only these episodes (indices are then relative to them, in episode
            order, and :attr:`absolute_to_relative_idx` maps LeRobot's ``index`` to them);
            only these are ingested into the cache.
        episode_filter: keep the episodes whose row of ``meta.episodes`` it accepts (among
            ``episodes`` when given), as LeRobot.
        image_transforms: a callable applied to each camera key (depth excepted) of each item,
            on ``[C, H, W]`` (``[K, C, H, W]`` for a ``delta_timestamps`` key), as LeRobot; in
            batches, per sample.
        delta_timestamps: per key offsets in seconds, checked as LeRobot checks them
            (:func:`delta_indices`); any served feature and LeRobot's per-frame columns
            (``timestamp``, ``frame_index``, ``episode_index``, ``index``, ``task_index``); a
            key that is not served raises ``KeyError`` at the first item, as LeRobot's.
            A video key's window of one offset is served as the frame itself, ``[C, H, W]``,
            as LeRobot serves it.
        tolerance_s: LeRobot's tolerance: for ``delta_timestamps`` and, when > 0, for the
            frames' timestamps when the cache is built (else the cache's default, 1e-4 s).
        revision: the Hub revision whose snapshot to read when ``root`` is None.
        force_cache_sync: rebuild the RoboCache cache (and, where LeRobot is installed, let
            LeRobot sync the dataset's files with the Hub first, as its own does).
        return_uint8: serve video features as uint8 ``[C, H, W]`` (LeRobot's fast path; image
            features stay float32, as LeRobot).
        depth_output_unit: ``"mm"`` or ``"m"``: depth features (LeRobot's depth images,
            uint16 or float32 TIFF, and depth videos, 12-bit codes dequantized as LeRobot
            does: :func:`dequantize_depth`) are served as LeRobot serves them, float32
            ``[1, H, W]`` in this unit (converted from the ``depth_unit`` recorded in their
            ``info``; as stored where none is), their ``meta.stats`` rescaled to it.
        download_videos, video_backend, token: LeRobot's download and decode arguments:
            RoboCache downloads nothing itself (where LeRobot is installed and the dataset is
            not on disk, files of the served episodes are missing, or ``force_cache_sync``,
            LeRobot fetches them with these arguments as on its own first read: with
            ``root=None`` into its Hub snapshot cache, which is then read), and videos are
            decoded by RoboCache (PyAV's frames, bit for bit, from the kept packets per batch
            or once when the cache is built, as ``camera_codec`` says; LeRobot's ``"pyav"``
            and ``"torchcodec"`` give the same frames; any other value, ``token`` and
            ``download_videos=False`` are said once per process).
        cache: the cache directory (default :func:`default_cache_dir`).
        device: where the cache is gathered: ``"cpu"`` (default) or ``"cuda"``.
        camera_codec: how video frames are stored in the cache
            (:class:`~robocache.data.build.config.CacheConfig`): ``"auto"`` (default) keeps
            an RGB video's packets as they are (about the video's bytes; each batch's frames
            decoded from them: NVDEC on a GPU for H.264/HEVC, CPU threads for AV1 and without
            a GPU; exactly the frames LeRobot decodes), slower to serve than JPEG frames;
            ``"video"`` the same here (LeRobot's image features keep their PNG bytes either
            way); ``"jpeg"`` decodes every video once when the cache is built and stores
            JPEG q95 frames: the fastest to serve (nvJPEG on a GPU) at many times the
            bytes (33-43x on 480x640 videos written with LeRobot's settings), lossy;
            ``"png"`` stores the decoded frames losslessly.
        camera_quality, camera_chroma: for JPEG frames, the quality (1-100, default 95) and
            chroma subsampling (``"444"``, default; ``"422"``, ``"420"``) of the stored video
            frames: ``camera_chroma="420"`` with a lower quality makes the smallest cache
            (bytes against PSNR: docs/lerobot.md).
        build_timeout_s: when another process is building the cache (the other ranks of a
            ``torchrun`` job constructing the same dataset), seconds to wait for it (its
            progress is logged at INFO) before failing; then the finished cache is opened.

    Recording (:meth:`create`, :meth:`resume`) goes through LeRobot's own writer where LeRobot
    is installed; after ``finalize()`` the dataset serves what was saved. On a dataset opened
    for reading, ``add_frame``, ``save_episode`` and ``clear_episode_buffer`` raise LeRobot's
    ``RuntimeError``. ``push_to_hub`` and ``StreamingLeRobotDataset`` stay LeRobot's.

    Raises:
        FileNotFoundError: no dataset at ``root`` (or where LeRobot keeps ``repo_id``).
        DataError: bad ``meta/info.json`` (version, fps), bad ``delta_timestamps`` (see
            :func:`delta_indices`), episodes not in the dataset, bad ``depth_output_unit`` or
            ``camera_codec``, or requested episodes (all by default) quarantined while caching
            (the reason names the row and offset).
        CacheBusyError: another process still builds the cache after ``build_timeout_s``.
        ValueError: ``episode_filter`` matched no episode (LeRobot's message).
    """

    def __init__(self, repo_id: str, root: str | Path | None = None,
                 episodes: list[int] | None = None,
                 episode_filter: Callable[[dict], bool] | None = None,
                 image_transforms: Callable | None = None,
                 delta_timestamps: dict[str, list[float]] | None = None,
                 tolerance_s: float = 1e-4, revision: str | None = None,
                 force_cache_sync: bool = False, download_videos: bool = True,
                 video_backend: str | None = None, return_uint8: bool = False,
                 depth_output_unit: str = "mm", *, token: str | bool | None = None,
                 cache: str | Path | None = None, device: str | torch.device = "cpu",
                 camera_codec: str = "auto", camera_quality: int = DEFAULT_QUALITY,
                 camera_chroma: str = DEFAULT_CHROMA, build_timeout_s: float = 3600.0):
        self._blank()
        if image_transforms is not None and not callable(image_transforms):
            raise TypeError("`image_transforms` must be callable or None.")
        if depth_output_unit not in ("mm", "m"):
            raise DataError(f"`depth_output_unit` must be 'mm' or 'm'; got "
                            f"{depth_output_unit!r}.")
        check_camera_codec(camera_codec)
        check_jpeg(camera_quality, camera_chroma)
        self._requested_root = None if root is None else Path(root)  # LeRobot's _download
        fetch = {"revision": revision, "download_videos": download_videos, "token": token}
        fetched = force_cache_sync or not _on_disk(repo_id, root, revision)
        if fetched:  # LeRobot fetches it, where installed, and its root is read
            root = _lerobot_fetch(repo_id, root, episodes=episodes,
                                  force_cache_sync=force_cache_sync, **fetch) or root
        self.meta = LeRobotDatasetMetadata(repo_id, root, revision)
        self.repo_id, self.root, self.revision = repo_id, self.meta.root, self.meta.revision
        total = self.meta.total_episodes
        if episodes is not None:
            episodes = [int(e) for e in episodes]
            bad = sorted({e for e in episodes if not 0 <= e < total})
            if bad or not episodes:
                raise DataError(f"`episodes` must name episodes of {self.root} (0..{total - 1}); "
                                f"got {bad or 'none'}.")
        if episode_filter is not None:
            episodes = self.meta.filter_episodes(episode_filter, candidates=episodes)
            if not episodes:
                raise ValueError("The episode filter did not match any episode. Make sure the "
                                 "filter and episodes list are valid and compatible "
                                 "(`episode_filter` is given each row of `meta.episodes`).")
        self.episodes = episodes
        self.image_transforms, self.tolerance_s = image_transforms, tolerance_s
        self._delta_timestamps, self.return_uint8 = delta_timestamps, return_uint8
        self.depth_output_unit, self.video_backend = depth_output_unit, video_backend
        self.camera_codec, self.device = camera_codec, torch.device(device)
        self.camera_quality, self.camera_chroma = camera_quality, camera_chroma
        self._say_ignored(download_videos, video_backend, token)
        # checked before caching; a key that is not served fails at the first item, as LeRobot
        self.delta_indices = None if delta_timestamps is None else delta_indices(
            delta_timestamps, float(self.meta.fps), tolerance_s)
        self.cache = Path(cache) if cache is not None else default_cache_dir(
            self.root, camera_codec, camera_quality, camera_chroma)
        self.build_timeout_s = build_timeout_s
        self._reader = None  # made again for these settings
        if not fetched:
            self._fetch_missing(fetch)
        manifest = self._ensure_cache(force_cache_sync, build_timeout_s)
        streams = manifest["streams"]
        if not self.meta.stats:  # no meta/stats.json: the cache's, in LeRobot's layout
            stats = json.loads((self.cache / "stats.json").read_text())
            self.meta.stats = {k: {s: np.array(d[s]) for s in ("min", "max", "mean", "std",
                                                               "count", "q01", "q99")}
                               for k, d in stats.items()}
        self.meta.rescale_depth_stats(depth_output_unit)  # as the frames are served
        # served from the cache: numeric and camera features (string features and language
        # columns come from the data files' rows: _read_rows)
        self.feature_keys = [k for k in self.meta.features if k in streams and k not in FRAME_KEYS
                             and streams[k]["kind"] in ("numeric", "image", "video")]
        self._cameras = [k for k in self.feature_keys if streams[k]["kind"] in ("image", "video")]
        self._unserved = [k for k in self.delta_indices or {}
                          if k not in self.feature_keys and k not in FRAME_KEYS]
        served = set(self.episodes) if self.episodes is not None else None
        self._len = sum(e["rows"] for e in manifest["episodes"]
                        if served is None or e["index"] in served)
        # Opened on first use: forked DataLoader workers inherit it (their frame reads go
        # through a reader process when this process has called Lance, as building did: see
        # robocache.data.reader); a pickled copy (spawn workers) drops it and opens the cache
        # in its own process on first use.
        self._ds: RobotDataset | None = None
        self._served  # noqa: B018

    # ── the cache ─────────────────────────────────────────────────────

    def _say_ignored(self, download_videos: bool, video_backend: str | None, token) -> None:
        if video_backend not in (None, "pyav", "torchcodec"):  # LeRobot's decoders: the same
            _say_once("video_backend", f"robocache.LeRobotDataset: video_backend="
                      f"{video_backend!r} is not used: RoboCache decodes videos itself (PyAV's "
                      "frames, bit for bit).")
        if not download_videos or token is not None:
            _say_once("download", "robocache.LeRobotDataset: download_videos / token are "
                      "used only to fetch missing data files through LeRobot, where it is "
                      "installed: RoboCache itself downloads nothing.")

    def _fetch_missing(self, fetch: dict[str, Any]) -> None:
        """Where files of the served episodes are not on disk, let LeRobot fetch them
        (:func:`_lerobot_fetch` with the same ``root``, ``episodes`` and ``fetch``
        arguments); without LeRobot, or when it fails (said once), the missing files fail
        their episodes. LeRobot does not read Lance-stored datasets: nothing is fetched
        for them."""
        from robocache.data.formats.lerobot import LeRobotSource

        source = LeRobotSource(self.root)
        if source.lance:
            return
        wanted = self.episodes if self.episodes is not None else source.episode_indices()
        files = dict.fromkeys(f for e in wanted for f in source.files(e))  # v3.0: shared
        missing = [f for f in files if not f.exists()
                   and (fetch["download_videos"] or f.suffix != ".mp4")]
        if missing:
            _lerobot_fetch(self.repo_id, self.root, episodes=self.episodes,
                           missing=f"{len(missing)} files of {self.root} are missing (e.g. "
                           f"{missing[0]})", **fetch)

    def _ensure_cache(self, force: bool, timeout_s: float) -> dict[str, Any]:
        """Build (or extend) the cache with the served episodes, once for all the processes
        constructing this dataset at once; return its manifest."""
        from robocache.data.cache import build
        from robocache.data.lock import build_once

        manifest_path = self.cache / "manifest.json"
        wanted = self.episodes if self.episodes is not None else \
            list(self.meta.episodes["episode_index"])
        force = force or self._read_otherwise(manifest_path)
        if force or not self._reusable(manifest_path, wanted):
            grid = self.tolerance_s if self.tolerance_s > 0 else 1e-4

            def build_now() -> None:
                t0 = time.perf_counter()
                m = build(self.root, self.cache, rate_hz="native", grid_tolerance_s=grid,
                          episodes=wanted, progress=False, overwrite=force,
                          rebuild_changed=True, camera_codec=self.camera_codec,
                          camera_quality=self.camera_quality, camera_chroma=self.camera_chroma)
                c = m["counts"]
                if c["cached"] > c["skipped"]:  # one line: where the first use's time went
                    decoded = any(m["streams"][k].get("codec") != "video"
                                  for k in self.meta.video_keys if k in m["streams"])
                    videos = "" if not self.meta.video_keys else \
                        f"videos decoded once, on {os.cpu_count()} cores; " if decoded else \
                        "video packets kept as they are; "
                    print(f"robocache: cached {c['cached'] - c['skipped']} episodes of "
                          f"{self.root} into {self.cache} in {time.perf_counter() - t0:.1f} s "
                          f"({c['rows']} frames in all; {videos}later uses open the cache)",
                          file=sys.stderr, flush=True)

            build_once(self.cache, build_now, lambda: self._reusable(manifest_path, wanted),
                       timeout_s=timeout_s, fix="pass a larger build_timeout_s")
        m = json.loads(manifest_path.read_text())
        asked = set(wanted)
        bad = [q for q in m["quarantined"] if q["index"] in asked]
        if bad:
            raise DataError(f"{self.root}: {len(bad)} requested episodes could not be cached; "
                            f"episode {bad[0]['index']}: {bad[0]['reason']}; repair them, or "
                            "pass `episodes` naming the others to serve those.")
        return m

    def _read_otherwise(self, manifest: Path) -> bool:
        """Whether the cache at ``manifest`` holds a camera stream read otherwise than the
        dataset's reader reads it now (another dtype or shape: a cache made before depth
        maps were read as such): it is then built again."""
        try:
            streams = json.loads(manifest.read_text())["streams"]
        except (OSError, ValueError, KeyError):
            return False
        return any(k in streams and (streams[k]["dtype"], list(streams[k]["shape"])) !=
                   (spec.dtype, list(spec.shape))
                   for k, spec in self.meta.stream_specs.items()
                   if spec.kind in ("image", "video"))

    def _reusable(self, manifest: Path, wanted: list[int]) -> bool:
        """The cache at ``manifest`` is a finished native-rate cache of this dataset that read
        every episode of ``wanted`` (cached or quarantined) from its files as they are
        (otherwise :func:`robocache.cache.build` adds the missing ones and caches again what
        changed, or refuses a cache of another source)."""
        from robocache.data.source_identity import changed_since

        if not manifest.exists():
            return False
        m = json.loads(manifest.read_text())
        cached = {e["index"] for e in m.get("episodes", [])}
        return (m.get("status") == "complete" and m.get("native") is True
                and m["source"]["path"] == str(self.root.resolve())
                and set(wanted) <= cached | {q["index"] for q in m.get("quarantined", [])}
                and not changed_since(m))

    @property
    def _served(self) -> RobotDataset:
        """The cache, opened in this process on first use (after unpickling too), and again
        once ``meta``'s tasks were replaced (LeRobot's dataset tools rewrite the data files
        first: the episodes they changed are cached again)."""
        if self._ds is not None and self._seen != self.meta.edits:
            self._ensure_cache(False, self.build_timeout_s)
            self._ds = None
        if self._ds is None:
            steps = {k: v for k, v in (self.delta_indices or {}).items()
                     if k in self.feature_keys}
            # a dataset of strings only: its cache's frame_index stream times the rows
            keys = self.feature_keys or None
            ds = RobotDataset(self.cache, keys=keys, episodes=self.episodes,
                              delta_steps=steps, image_dtype=torch.uint8)
            self._open(ds.to(self.device))
        return self._ds

    def _open(self, ds: RobotDataset) -> None:
        """Serve ``ds``: with each episode's first ``index`` and each row's task index."""
        eps = self.meta.episodes
        from_index = torch.zeros(max(eps["episode_index"]) + 1, dtype=torch.int64)
        from_index[torch.tensor(eps["episode_index"])] = torch.tensor(eps["dataset_from_index"])
        ids = {t: i for i, t in enumerate(self.meta.task_names)}
        lut = torch.tensor([ids.get(t, 0) for t in ds.task_names], dtype=torch.int64)
        dev = ds.device
        self._ds, self._from_index, self._task_index = ds, from_index.to(dev), lut[ds.task_id]
        self._seen = self.meta.edits
        self._task_index = self._task_index.to(dev)
        self._language = self._read_rows()

    @property
    def _row_keys(self) -> dict[str, str]:
        """The features served from the data files' rows, not the cache: LeRobot's language
        columns (``dtype: "language"``) and ``string`` features -> their dtype."""
        return {k: f["dtype"] for k, f in self.meta.features.items()
                if f.get("dtype") in ("language", "string")}

    def _read_rows(self) -> dict[str, dict[int, Any]]:
        """The served episodes' language columns and ``string`` features from the dataset's
        data files: per key, LeRobot's ``index`` -> the frame's value as LeRobot serves it (a
        string; a language column's list of message rows, a row's ``timestamp`` as the
        float32 its schema stores and its ``tool_calls`` parsed from JSON)."""
        keys = self._row_keys
        if not keys:
            return {}
        from robocache.data.formats.lerobot import LeRobotSource

        source = LeRobotSource(self.root)
        wanted = self.episodes if self.episodes is not None else source.episode_indices()
        table = source.data_table(wanted, list(keys))
        index = table.column("index").to_pylist()
        out: dict[str, dict[int, Any]] = {}
        for k, dtype in keys.items():
            rows = table.column(k).to_pylist() if k in table.column_names else \
                [None] * len(index)
            if dtype == "language":
                rows = map(_language_rows, rows)
            out[k] = dict(zip(index, rows, strict=True))
        return out

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        for name in ("_ds", "_from_index", "_task_index", "_language", "_reader"):
            state.pop(name, None)
        state["_ds"] = None
        return state

    # ── LeRobot's attributes ──────────────────────────────────────────

    @property
    def delta_timestamps(self) -> dict[str, list[float]] | None:
        if self._recording is not None:
            return self._recording.delta_timestamps
        return self._delta_timestamps

    @delta_timestamps.setter
    def delta_timestamps(self, value: dict[str, list[float]] | None) -> None:
        """New windows (checked as the constructor checks them), served from the next item
        on, as LeRobot's reader takes them when it is made."""
        if self._recording is not None:
            self._recording.delta_timestamps = value
            return
        steps = None if value is None else delta_indices(value, float(self.meta.fps),
                                                         self.tolerance_s)
        self._delta_timestamps, self.delta_indices = value, steps
        self._unserved = [k for k in steps or {}
                          if k not in self.feature_keys and k not in FRAME_KEYS]
        self._ds = None  # the cache opened again with these windows

    @property
    def fps(self) -> int:
        return self.meta.fps

    @property
    def features(self) -> dict[str, dict]:
        return self.meta.features

    @property
    def num_frames(self) -> int:
        if self._recording is not None:
            return self._recording.num_frames
        return self._len

    @property
    def num_episodes(self) -> int:
        if self._recording is not None:
            return self._recording.num_episodes
        return len(self.episodes) if self.episodes is not None else self.meta.total_episodes

    @property
    def absolute_to_relative_idx(self) -> dict[int, int] | None:
        """LeRobot's ``index`` -> item position, for an ``episodes`` subset (else None), as
        LeRobot's ``EpisodeAwareSampler`` takes it."""
        if self.episodes is None:
            return None
        rows = [self.meta.episodes[e] for e in sorted(set(self.episodes))]  # the items' order
        absolute = [i for r in rows for i in range(r["dataset_from_index"],
                                                   r["dataset_to_index"])]
        return dict(zip(absolute, range(len(absolute)), strict=True))

    @property
    def hf_dataset(self):
        """The served episodes' rows as stored in the dataset's parquet files, as a
        ``datasets.Dataset`` (``pip install "robocache[lerobot]"``) giving rows as LeRobot's
        does (:func:`hf_to_torch`): image features decoded to float32 ``[C, H, W]``, other
        values as tensors, language columns and strings as they are."""
        datasets = require("datasets", "lerobot", "LeRobotDataset.hf_dataset")
        from robocache.data.formats.lerobot import LeRobotSource

        source = LeRobotSource(self.root)
        wanted = self.episodes if self.episodes is not None else source.episode_indices()
        table = source.data_table(wanted)
        # image structs decoded as images (a Lance frames table does not say they are)
        features = datasets.Features.from_arrow_schema(table.schema)
        for k in self.meta.image_keys:
            if k in features:
                features[k] = datasets.Image()
        return datasets.Dataset(datasets.table.InMemoryTable(table),
                                info=datasets.DatasetInfo(features=features)
                                ).with_transform(hf_to_torch)

    def get_raw_item(self, idx: int) -> dict:
        """Row ``idx`` of :attr:`hf_dataset`: no windows, decoding or transforms."""
        return self.hf_dataset[idx]

    def select_columns(self, column_names: str | list[str]):
        """:attr:`hf_dataset` with only ``column_names``."""
        return self.hf_dataset.select_columns(column_names)

    def set_image_transforms(self, image_transforms: Callable | None) -> None:
        """Replace the transform applied to camera keys."""
        if image_transforms is not None and not callable(image_transforms):
            raise TypeError("`image_transforms` must be callable or None.")
        self.image_transforms = image_transforms

    def clear_image_transforms(self) -> None:
        """Remove the transform applied to camera keys."""
        self.image_transforms = None

    # ── recording: LeRobot's writer ───────────────────────────────────

    #: LeRobot's dataset recording through this one (:meth:`create`, :meth:`resume`) until
    #: :meth:`finalize`; None on a dataset opened for reading.
    _recording = None
    _reader = None  # LeRobot's DatasetReader (:attr:`reader`), made on first use

    @classmethod
    def create(cls, repo_id: str, fps: int, features: dict, root: str | Path | None = None,
               *args: Any, **kwargs: Any) -> LeRobotDataset:
        """A new dataset recorded by LeRobot's own writer (LeRobot 0.6.1's
        ``LeRobotDataset.create``, the same arguments): ``add_frame``, ``save_episode``,
        ``clear_episode_buffer``, ``meta``, ``num_frames``... are LeRobot's while it records;
        after :meth:`finalize` this dataset serves what was saved, as one opened with
        ``LeRobotDataset(repo_id, root=root)``.

        Raises:
            ImportError: LeRobot is not installed (it records; RoboCache reads).
        """
        lerobot = _lerobot_class("create")
        return cls._record(lerobot.create(repo_id, fps, features, root, *args, **kwargs))

    @classmethod
    def resume(cls, repo_id: str, root: str | Path | None = None, *args: Any,
               **kwargs: Any) -> LeRobotDataset:
        """An existing dataset to record more episodes into with LeRobot's own writer
        (LeRobot 0.6.1's ``LeRobotDataset.resume``, the same arguments), as :meth:`create`.

        Raises:
            ImportError: LeRobot is not installed.
        """
        lerobot = _lerobot_class("resume")
        return cls._record(lerobot.resume(repo_id, root, *args, **kwargs))

    @classmethod
    def _record(cls, recording) -> LeRobotDataset:
        self = cls.__new__(cls)
        self._blank(recording)
        return self

    def _blank(self, recording=None) -> None:
        """Set every instance attribute of this class: the constructor's empty (it fills them
        in), or, for a dataset recording through LeRobot's ``recording``, LeRobot's values of
        those its dataset has (``meta``, ``root``...) and nothing served. A recording dataset
        thus has the attributes of one opened for reading, as LeRobot's own have."""
        self.__dict__.update(dict.fromkeys((
            "_requested_root", "meta", "repo_id", "root", "revision", "episodes",
            "image_transforms", "tolerance_s", "_delta_timestamps", "return_uint8",
            "depth_output_unit", "video_backend", "camera_codec", "device", "camera_quality",
            "camera_chroma", "delta_indices", "cache", "build_timeout_s", "_reader",
            "feature_keys", "_cameras", "_unserved", "_len", "_ds", "_from_index",
            "_task_index", "_seen", "_language")), _recording=recording)
        if recording is not None:  # LeRobot's, read here (its writer keeps them as they are)
            for name in ("_requested_root", "meta", "repo_id", "root", "revision", "episodes",
                         "image_transforms", "tolerance_s", "depth_output_unit"):
                setattr(self, name, getattr(recording, name))

    def __getattr__(self, name: str) -> Any:
        """While LeRobot records (:meth:`create`, :meth:`resume`), its dataset's attributes
        (``meta``, ``root``, ``repo_id``, ``writer``...)."""
        recording = self.__dict__.get("_recording")
        if recording is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(recording, name)

    @property
    def reader(self):
        """LeRobot's own ``DatasetReader`` over this dataset's files and episodes, made on
        first use where LeRobot is installed (LeRobot's while recording), for code that
        reaches into LeRobot's internals; this class's items and batches never use it."""
        if self._recording is not None:
            return self._recording.reader
        if self._reader is None:
            self._reader = _lerobot_reader(self)
        return self._reader

    @reader.setter
    def reader(self, value) -> None:
        self._reader = value

    def _download(self, download_videos: bool = True, *,
                  token: str | bool | None = None) -> None:
        """LeRobot's ``_download`` (its Hub snapshot of ``repo_id`` at ``revision``: the
        served episodes' files, or all) run on this dataset, where LeRobot is installed."""
        _lerobot_class("_download")._download(self, download_videos, token=token)

    @property
    def writer(self):
        """LeRobot's writer while recording; None on a dataset opened for reading, as
        LeRobot's."""
        return None if self._recording is None else self._recording.writer

    def _require_writer(self, method_name: str) -> None:
        if self._recording is None:
            raise RuntimeError(f"Cannot call '{method_name}()' on a read-only dataset. Use "
                               "LeRobotDataset.create() for new recording or "
                               "LeRobotDataset.resume() for resume recording.")

    def _require_reader(self) -> None:
        if self._recording is not None:
            raise RuntimeError("Cannot read from a dataset that is being recorded. Call "
                               "finalize() first, then access items.")

    def add_frame(self, frame: dict) -> None:
        """LeRobot's recording call (:meth:`create`); raises LeRobot's ``RuntimeError`` on a
        dataset opened for reading."""
        self._require_writer("add_frame")
        self._recording.add_frame(frame)

    def save_episode(self, episode_data: dict | None = None,
                     parallel_encoding: bool = True) -> None:
        """LeRobot's recording call (:meth:`create`); raises LeRobot's ``RuntimeError`` on a
        dataset opened for reading."""
        self._require_writer("save_episode")
        self._recording.save_episode(episode_data, parallel_encoding)

    def clear_episode_buffer(self, delete_images: bool = True) -> None:
        """LeRobot's recording call (:meth:`create`); raises LeRobot's ``RuntimeError`` on a
        dataset opened for reading."""
        self._require_writer("clear_episode_buffer")
        self._recording.clear_episode_buffer(delete_images)

    def has_pending_frames(self) -> bool:
        """Whether frames wait to be saved (never, on a dataset opened for reading)."""
        return self._recording is not None and self._recording.has_pending_frames()

    def finalize(self) -> None:
        """End a recording (LeRobot's ``finalize``), then serve what it saved through the
        cache; nothing to do on a dataset opened for reading (LeRobot's is a no-op too)."""
        recording = self._recording
        if recording is None:
            return
        recording.finalize()
        if not recording.meta.total_episodes:  # nothing saved: nothing to serve
            return
        LeRobotDataset.__init__(self, recording.repo_id, root=recording.root,
                                episodes=self.episodes, image_transforms=self.image_transforms,
                                delta_timestamps=recording.delta_timestamps,
                                tolerance_s=self.tolerance_s)

    # ── items and batches ─────────────────────────────────────────────

    def __len__(self) -> int:
        return self.num_frames

    def __getitem__(self, idx: int | slice) -> Batch | list[Batch]:
        self._require_reader()
        if isinstance(idx, slice):
            return [self[i] for i in range(*idx.indices(len(self)))]
        if not isinstance(idx, (int, np.integer)) and not (
                isinstance(idx, torch.Tensor) and idx.ndim == 0 and not idx.is_floating_point()):
            raise TypeError(f"index with an int or a slice; got {type(idx).__name__} (batches: "
                            "`get_batch(indices)` or `batches(batch_size)`).")
        idx = int(idx)
        if not -len(self) <= idx < len(self):
            raise IndexError(f"index {idx} is out of range for {len(self)} frames.")
        return self.__getitems__([idx % len(self)])[0]

    def __getitems__(self, indices: Sequence[int]) -> list[Batch]:
        """Items ``indices`` (what a DataLoader asks for one batch) gathered at once. Each
        item's camera frames are its own tensors (converted item by item: no copy more than
        the batch's conversion, and an item pickles or saves its own frames only); its other
        tensors are views of its batch's (small), so splitting a batch costs no copy."""
        self._require_reader()
        self._check_served()
        batch = self._lerobot(self._served.fetch(torch.as_tensor(
            [int(i) for i in indices], dtype=torch.int64).to(self._served.device)),
            per_item=True)
        split = {k: v if isinstance(v, list) else v.unbind(0) for k, v in batch.items()}
        items = [dict(zip(split, values, strict=True)) for values in zip(*split.values(),
                                                                        strict=True)]
        if self.image_transforms is not None:
            for item in items:
                for k in self._transformed:
                    item[k] = self.image_transforms(item[k])
        return items

    @property
    def _transformed(self) -> list[str]:
        depth = set(self.meta.depth_keys)
        return [k for k in self.meta.camera_keys if k in self._cameras and k not in depth]

    def get_batch(self, indices: torch.Tensor | Sequence[int]) -> Batch:
        """Items ``indices`` (int ``[B]``, relative to the served episodes) as one batch: the
        item keys with a leading ``B`` (``task``: a list of ``B`` strings); ``image_transforms``
        applied per sample."""
        self._require_reader()
        self._check_served()
        idx = torch.as_tensor(indices, dtype=torch.int64).to(self._served.device)
        batch = self._lerobot(self._served.fetch(idx))
        if self.image_transforms is not None:
            for k in self._transformed:
                batch[k] = torch.stack([self.image_transforms(v) for v in batch[k]])
        return batch

    def batches(self, batch_size: int, *, shuffle: bool = True, drop_last: bool = False,
                seed: int | None = None) -> Iterator[Batch]:
        """One epoch of batches of LeRobot items, gathered where the cache lives (the fast
        path: ``LeRobotDataset(..., device="cuda").batches(256)``).

        Args:
            batch_size: items per batch (>= 1).
            shuffle: a new random order each call (each epoch).
            drop_last: drop the last batch when it is smaller than ``batch_size`` (default
                False: the last batch may be smaller, as a DataLoader's default).
            seed: the order of epoch ``e`` (the ``e``-th call) is drawn from ``seed + e``, so
                a run replays; None (default): drawn from torch's global generator, as a
                DataLoader's shuffle.
        """
        if batch_size < 1:
            raise DataError(f"`batch_size` must be >= 1; got {batch_size}.")
        n = len(self)
        epoch = self.__dict__.setdefault("_epoch", 0)
        self._epoch = epoch + 1
        if not shuffle:
            order = torch.arange(n)
        elif seed is None:
            order = torch.randperm(n)
        else:
            order = torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))
        order = order.to(self._served.device)
        stop = n - n % batch_size if drop_last else n
        for b in range(0, stop, batch_size):
            yield self.get_batch(order[b:b + batch_size])

    def _check_served(self) -> None:
        """A ``delta_timestamps`` key that is not served fails the item, as LeRobot's."""
        if self._unserved:
            raise KeyError(f"`delta_timestamps` names {self._unserved[0]!r}, which is not a "
                           f"feature served by {self.root}; served: "
                           f"{[*self.feature_keys, *FRAME_KEYS]}.")

    def _lerobot(self, batch: Batch, per_item: bool = False) -> Batch:
        """RobotDataset's batch in LeRobot's keys, dtypes and shapes (every tensor its own);
        ``per_item``: camera keys as lists of each item's own frames."""
        rows = batch["index"]
        ds = self._served
        out: Batch = {}
        video = set(self.meta.video_keys)
        for k in self.feature_keys:
            f = self.meta.features[k]
            v = batch[k]
            if k in self._cameras:
                one = k in video and len((self.delta_indices or {}).get(k, ())) == 1
                if per_item:
                    v = [self._frames(k, x[0] if one else x, own=True) for x in v.unbind(0)]
                else:  # LeRobot's video windows of one offset: the frame itself
                    v = self._frames(k, v[:, 0] if one else v)
            else:
                lead = v.shape[:-1]
                shape = () if tuple(f["shape"]) == (1,) else tuple(f["shape"])
                v = v.reshape(*lead, *shape).to(_item_dtype(f["dtype"]), copy=True)
            out[k] = v
            if self.delta_indices is not None and k in self.delta_indices:
                out[f"{k}_is_pad"] = batch[f"{k}_is_pad"].clone()
        episode = batch["episode_index"]
        frame = ds.step[rows]
        out["timestamp"] = batch["timestamp"].to(torch.float32)
        out["frame_index"] = frame
        out["episode_index"] = episode
        out["index"] = self._from_index[episode] + frame
        out["task_index"] = self._task_index[rows]
        for k, offsets in (self.delta_indices or {}).items():
            if k in FRAME_KEYS:
                out[k], out[f"{k}_is_pad"] = self._frame_window(k, rows, offsets)
        out["task"] = [self.meta.task_names[int(i)] for i in self._task_index[rows].tolist()]
        if self._language:
            index = out["index"].tolist()
            for k, values in self._language.items():
                empty = [] if self._row_keys[k] == "language" else None
                out[k] = [values.get(i, empty) for i in index]
        return out

    def _frames(self, key: str, v: torch.Tensor, own: bool = False) -> torch.Tensor:
        """A camera's decoded frames (``[..., C, H, W]``) as LeRobot's items carry them: in a
        tensor of their own, except ``return_uint8`` frames without ``own`` (views of the
        decoded ``[..., H, W, C]``, no reordering copy)."""
        if key in self._depth:
            return self._depth_map(key, v)
        if v.dtype == torch.uint8 and not (self.return_uint8 and key in self._video_keys):
            # x / 255 as LeRobot computes it (a tensor divisor: CUDA would multiply by the
            # reciprocal of a Python number, one ulp off), into contiguous [..., C, H, W] as
            # LeRobot's (decoded frames are channels-last views; converting and reordering in
            # one copy costs no more than converting)
            return v.to(torch.float32, memory_format=torch.contiguous_format).div_(
                v.new_tensor(255.0, dtype=torch.float32))
        if v.dtype != torch.uint8:  # 16-bit frames: float32 in their own values
            return v.to(torch.float32, memory_format=torch.contiguous_format)
        return v.clone(memory_format=torch.contiguous_format) if own else v

    @functools.cached_property
    def _video_keys(self) -> frozenset[str]:
        return frozenset(self.meta.video_keys)

    @functools.cached_property
    def _depth(self) -> dict[str, str | None]:
        """Depth camera keys served -> the unit their frames are stored in (``info``'s
        ``depth_unit``; None: unknown, served as stored)."""
        return {k: (self.meta.features[k].get("info") or {}).get("depth_unit")
                for k in self.meta.depth_keys if k in self._cameras}

    def _depth_map(self, key: str, v: torch.Tensor) -> torch.Tensor:
        """A depth camera's frames as LeRobot serves them: float32 ``[..., 1, H, W]`` in
        ``depth_output_unit``: a depth video's 12-bit codes dequantized
        (:func:`dequantize_depth`), a depth image converted from the unit stored as LeRobot
        converts (metres times 1000, millimetres over 1000; as stored where the unit is not
        recorded)."""
        if key in self._video_keys:
            return dequantize_depth(v, self.meta.features[key].get("info") or {},
                                    self.depth_output_unit)
        v = v.to(torch.float32, memory_format=torch.contiguous_format)
        stored = self._depth[key]
        if stored is None or stored == self.depth_output_unit:
            return v
        factor = v.new_tensor(1000.0)  # a tensor: CUDA divides by a number as a multiply
        return v.mul_(factor) if stored == "m" else v.div_(factor)

    def _frame_window(self, key: str, rows: torch.Tensor, offsets: list[int]
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """LeRobot's window of a per-frame column (``[B, K]``, clamped to the episode) and
        its ``_is_pad`` mask, for served rows ``rows``."""
        ds = self._served
        pos = torch.searchsorted(ds.offsets, rows, right=True) - 1
        start, end = ds.offsets[pos][:, None], ds.offsets[pos + 1][:, None]
        want = rows[:, None] + torch.tensor(offsets, device=rows.device)
        q = torch.minimum(torch.maximum(want, start), end - 1)
        pad = (want < start) | (want >= end)
        episode = ds.episode_index[q]
        value = {"timestamp": lambda: ds.timestamp[q].to(torch.float32),
                 "frame_index": lambda: ds.step[q], "episode_index": lambda: episode,
                 "index": lambda: self._from_index[episode] + ds.step[q],
                 "task_index": lambda: self._task_index[q]}[key]()
        return value, pad

    def __repr__(self) -> str:
        if self._recording is not None:
            return (f"{type(self).__name__}(repo_id={self.repo_id!r}, root={str(self.root)!r}, "
                    f"recording through LeRobot's writer, frames={self.num_frames})")
        return (f"{type(self).__name__}(repo_id={self.repo_id!r}, root={str(self.root)!r}, "
                f"frames={len(self)}, episodes={self.num_episodes}, fps={self.fps}, "
                f"cache={str(self.cache)!r})")


def _lerobot_class(call: str):
    """LeRobot's own ``LeRobotDataset`` class, which records.

    Raises:
        ImportError: LeRobot is not installed (the message says what to do)."""
    return lerobot_part("lerobot.datasets.lerobot_dataset", "LeRobotDataset",
                        f"robocache.LeRobotDataset.{call}() records through LeRobot's own "
                        "writer", ", or record with LeRobot elsewhere and read the dataset with "
                        "robocache.LeRobotDataset(repo_id, root=...)")


def _on_disk(repo_id: str, root: str | Path | None, revision: str | None) -> bool:
    """Whether a local copy of the dataset is found (:func:`find_root`)."""
    from robocache.data.lerobot_meta import find_root

    try:
        find_root(repo_id, root, revision)
    except FileNotFoundError:
        return False
    return True


def _lerobot_fetch(repo_id: str, root: str | Path | None, missing: str | None = None,
                   **kwargs: Any) -> Path | None:
    """LeRobot's own ``LeRobotDataset(repo_id, root=root, **kwargs)`` made, which fetches
    from the Hub what its first read needs (all of it with ``force_cache_sync=True``; with
    ``root=None`` into its snapshot cache): its root, or None without LeRobot or when it
    fails (said once, with ``missing``, what is missing, where given)."""
    try:
        lerobot = _lerobot_class("fetch")
    except ImportError:
        return None
    try:
        return Path(lerobot(repo_id, root=root, **kwargs).root)
    except Exception as e:  # noqa: BLE001 (LeRobot's or the Hub's, whatever they are)
        what = missing or f"{repo_id!r} (root={root})"
        _say_once("fetch", f"robocache.LeRobotDataset: {what}, and LeRobot could not fetch "
                  f"it ({type(e).__name__}: {e}).")
        return None


def _lerobot_reader(ds: LeRobotDataset):
    """LeRobot's ``DatasetReader`` for ``ds`` (its metadata, root, episodes and reading
    settings), its rows loaded where its data files are on disk.

    Raises:
        ImportError: LeRobot is not installed (the message says what to do)."""
    why = "robocache.LeRobotDataset.reader is LeRobot's own DatasetReader"
    instead = ", or read items through the dataset itself"
    metadata = lerobot_part("lerobot.datasets.dataset_metadata", "LeRobotDatasetMetadata",
                            why, instead)
    dataset_reader = lerobot_part("lerobot.datasets.dataset_reader", "DatasetReader", why,
                                  instead)
    default_backend = lerobot_part("lerobot.utils.import_utils",
                                   "get_safe_default_video_backend", why, instead)
    reader = dataset_reader(
        meta=metadata(ds.repo_id, root=ds.root, revision=ds.revision), root=ds.root,
        episodes=ds.episodes, tolerance_s=ds.tolerance_s,
        video_backend=ds.video_backend or default_backend(),
        delta_timestamps=ds.delta_timestamps, image_transforms=ds.image_transforms,
        return_uint8=ds.return_uint8, depth_output_unit=ds.depth_output_unit)
    reader.try_load()
    return reader


# LeRobot's depth video quantizer: 12-bit codes, and its defaults where a feature's ``info``
# records no ``video.depth_min`` / ``video.depth_max`` / ``video.shift`` / ``video.use_log``
DEPTH_QMAX = 4095
DEPTH_DEFAULTS = {"depth_min": 0.01, "depth_max": 10.0, "shift": 3.5, "use_log": True}


def dequantize_depth(codes: torch.Tensor, info: dict, unit: str) -> torch.Tensor:
    """A depth video's 12-bit codes (``[..., 1, H, W]``) as depth, float32 ``[..., 1, H, W]``
    in ``unit`` (``"m"``; ``"mm"``: rounded, within [0, 65535]), with the quantizer settings
    its ``info`` records, computed in the order LeRobot 0.6.1 computes them (the same float32
    operations: bit for bit on the CPU): codes times the step plus the lower end (in log
    space, then ``exp`` minus the shift, when logarithmic), clamped to the range."""
    q = {k: info.get(f"video.{k}", d) for k, d in DEPTH_DEFAULTS.items()}
    lo, hi, shift = float(q["depth_min"]), float(q["depth_max"]), float(q["shift"])
    if q["use_log"]:
        if lo + shift <= 0:
            raise DataError(f"depth video quantizer: depth_min + shift must be > 0 for its "
                            f"logarithmic codes; got {lo} + {shift}.")
        offset = math.log(lo + shift)
        scale = (math.log(hi + shift) - offset) / DEPTH_QMAX
    else:
        offset, scale = lo, (hi - lo) / DEPTH_QMAX
    out = codes.to(dtype=torch.float32, copy=True)
    out.mul_(scale).add_(offset)
    if q["use_log"]:
        out.exp_().sub_(shift)
    out.clamp_(lo, hi)
    if unit == "mm":
        out.mul_(1000.0).round_().clamp_(0.0, 65535.0)
    return out


def hf_to_torch(rows: dict[str, list]) -> dict[str, list]:
    """A ``datasets`` batch (column -> values) as LeRobot 0.6.1's rows give it: images (PIL)
    as float32 ``[C, H, W]`` (8-bit ones divided by 255, 16-bit and float depth maps in their
    own values), other values through ``torch.tensor``; strings, dicts and missing values
    as they are, the language columns' rows as LeRobot's schema reads them."""
    for key, values in rows.items():
        if key in ("language_persistent", "language_events"):  # as LeRobot's schema reads them
            rows[key] = [_language_rows(v) for v in values]
            continue
        if not values:
            continue
        first = values[0]
        if hasattr(first, "mode") and hasattr(first, "getbands"):  # a PIL image
            rows[key] = [_pil_to_chw(v) for v in values]
        elif first is not None and not isinstance(first, dict):
            rows[key] = [v if isinstance(v, str) else torch.tensor(v) for v in values]
    return rows


def _pil_to_chw(image) -> torch.Tensor:
    """A PIL image as ``torchvision``'s ``ToTensor`` (LeRobot's decode) gives it, float32
    ``[C, H, W]`` (16-bit depth maps as float32 in their own values)."""
    if image.mode in ("I;16", "I;16L", "I;16B"):
        return torch.from_numpy(np.array(image, dtype=np.float32))[None]
    array = np.array(image)
    frame = torch.from_numpy(array if array.ndim == 3 else array[..., None])
    frame = frame.permute(2, 0, 1).contiguous()
    return frame.to(torch.float32).div(255) if frame.dtype == torch.uint8 else frame


def _language_rows(rows: list[dict] | None) -> list[dict]:
    """One frame's language message rows as LeRobot's items carry them: LeRobot's schema
    stores ``timestamp`` as float32 and ``tool_calls`` as JSON, decoded."""
    out = []
    for row in rows or []:
        row = dict(row)
        if isinstance(row.get("timestamp"), float):
            row["timestamp"] = float(np.float32(row["timestamp"]))
        if isinstance(row.get("tool_calls"), list):
            row["tool_calls"] = [json.loads(c) if isinstance(c, str) else c
                                 for c in row["tool_calls"]]
        out.append(row)
    return out


def _item_dtype(dtype: str) -> torch.dtype:
    """The dtype LeRobot's items carry for a feature dtype."""
    if dtype in ("image", "video") or dtype.startswith("float"):
        return torch.float32
    return torch.bool if dtype == "bool" else torch.int64


class MultiLeRobotDataset(torch.utils.data.Dataset):
    """LeRobot's ``MultiLeRobotDataset``: several datasets served as one, each item with a
    ``dataset_index`` (int64) naming its dataset; only the features every dataset has are
    served (the others are dropped, as LeRobot).

    Args:
        repo_ids: the datasets' names.
        root: a directory holding one sub-directory per ``repo_id`` (default: where LeRobot
            keeps each).
        episodes: ``repo_id -> episodes`` to serve (default: all).
        tolerances_s: ``repo_id -> tolerance_s`` (default 1e-4 each).
        image_transforms, delta_timestamps, download_videos, video_backend, token: as
            :class:`LeRobotDataset`, for each dataset; other keyword arguments go to each
            :class:`LeRobotDataset` (``cache`` excepted: each dataset has its own).
    """

    def __init__(self, repo_ids: list[str], root: str | Path | None = None,
                 episodes: dict[str, list[int]] | None = None,
                 image_transforms: Callable | None = None,
                 delta_timestamps: dict[str, list[float]] | None = None,
                 tolerances_s: dict[str, float] | None = None, download_videos: bool = True,
                 video_backend: str | None = None, *, token: str | bool | None = None,
                 **kwargs: Any):
        self.repo_ids = list(repo_ids)
        self.root = Path(root) if root is not None else None
        self.tolerances_s = tolerances_s or dict.fromkeys(self.repo_ids, 1e-4)
        self._datasets = [
            LeRobotDataset(r, root=self.root / r if self.root is not None else None,
                           episodes=(episodes or {}).get(r), image_transforms=image_transforms,
                           delta_timestamps=delta_timestamps, tolerance_s=self.tolerances_s[r],
                           download_videos=download_videos, video_backend=video_backend,
                           token=token, **kwargs)
            for r in self.repo_ids]
        self.image_transforms = image_transforms
        common = set.intersection(*(set(d.features) for d in self._datasets))
        self.disabled_features = set().union(*(set(d.features) for d in self._datasets)) - common
        self._ends = np.cumsum([len(d) for d in self._datasets]).tolist()

    def set_image_transforms(self, image_transforms: Callable | None) -> None:
        """Replace the transform applied to camera keys, in every dataset."""
        if image_transforms is not None and not callable(image_transforms):
            raise TypeError("`image_transforms` must be callable or None.")
        self.image_transforms = image_transforms
        for d in self._datasets:
            d.set_image_transforms(image_transforms)

    def clear_image_transforms(self) -> None:
        """Remove the transform applied to camera keys, in every dataset."""
        self.set_image_transforms(None)

    @property
    def repo_id_to_index(self) -> dict[str, int]:
        return {r: i for i, r in enumerate(self.repo_ids)}

    @property
    def repo_index_to_id(self) -> dict[int, str]:
        return dict(enumerate(self.repo_ids))

    @property
    def fps(self) -> int:
        return self._datasets[0].fps

    @property
    def features(self) -> dict[str, dict]:
        return {k: f for k, f in self._datasets[0].features.items()
                if k not in self.disabled_features}

    @property
    def camera_keys(self) -> list[str]:
        return [k for k, f in self.features.items() if f["dtype"] in ("image", "video")]

    @property
    def num_frames(self) -> int:
        return sum(d.num_frames for d in self._datasets)

    @property
    def num_episodes(self) -> int:
        return sum(d.num_episodes for d in self._datasets)

    def __len__(self) -> int:
        return self.num_frames

    def __getitem__(self, idx: int) -> Batch:
        if not -len(self) <= idx < len(self):
            raise IndexError(f"index {idx} is out of range for {len(self)} frames.")
        idx %= len(self)
        which = bisect.bisect_right(self._ends, idx)
        start = self._ends[which - 1] if which else 0
        item = self._datasets[which][idx - start]
        item = {k: v for k, v in item.items() if k not in self.disabled_features}
        item["dataset_index"] = torch.tensor(which)
        return item

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(repo_ids={self.repo_ids}, frames={len(self)}, "
                f"episodes={self.num_episodes})")
