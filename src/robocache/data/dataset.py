"""Training samples from a cache: (episode, step) windows with ``_is_pad`` masks.

    >>> ds = RobotDataset("/tmp/panda.cache", history=2, horizon=16)
    >>> ds[0]["action"].shape, ds[0]["observation.state"].shape
    (torch.Size([16, 8]), torch.Size([2, 8]))

Serving is out of core. The served keys' numeric values sit in one packed matrix
(``[total, words]``: every key's values as raw int32 words, so each keeps its dtype bit for
bit, + episode offsets like FlashAttention's ``cu_seqlens``), memory-mapped from the machine's
served index (:mod:`robocache.data.served`: made once per machine, shared by every process
there through the page cache); camera frames stay in the cache and are read per batch, only
the frames the batch needs (:mod:`robocache.data.frames`), from a local directory or an
object store (``s3://``, ``gs://``, ``az://``). A window is a gather of each key's row offsets (rows
``t-(h-1)..t`` for observations, ``t..t+H-1`` for actions, or LeRobot's per-key
``delta_timestamps``) inside the episode, edge-padded, through :func:`robocache.key_windows` —
on the GPU when the dataset is moved there (:meth:`RobotDataset.to`), on the CPU in DataLoader
workers (which never touch CUDA). Every step of every episode is one sample, as in LeRobot.
"""

from __future__ import annotations

import copy
import io
import json
import math
import numbers
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robocache._memory import bound_heap
from robocache._optional import require
from robocache.data import snapshot, source_identity
from robocache.data.location import Location
from robocache.data.served import Column, Served, open_served
from robocache.errors import DataError
from robocache.ops._checks import check_fits

Batch = dict[str, torch.Tensor]


@dataclass(frozen=True)
class _Key:
    """Where one served key lives in the packed word matrix: its value words (``words`` int32
    columns from ``col`` holding ``dim`` values of ``dtype``, little-endian bytes), and the
    column of its 0/1 alignment-pad flag (``None`` when the cache has no padded step)."""

    col: int
    words: int
    dtype: torch.dtype
    dim: int
    pad_col: int | None

    def values(self, w: torch.Tensor) -> torch.Tensor:
        """The key's ``[..., dim]`` values from its gathered words ``[..., words]``."""
        nbytes = self.dim * self.dtype.itemsize
        raw = w.view(torch.uint8)
        raw = raw if raw.shape[-1] == nbytes else raw[..., :nbytes]
        if raw.storage_offset() % self.dtype.itemsize:  # a slice of a shared buffer (CUDA)
            raw = raw.clone(memory_format=torch.contiguous_format)
        return raw.view(self.dtype)


def seconds_to_steps(delta_timestamps: dict[str, Sequence[float]], rate_hz: float,
                     tolerance_s: float, keys: Sequence[str]) -> dict[str, list[int]]:
    """LeRobot's ``delta_timestamps`` (seconds) as row offsets at ``rate_hz``.

    Raises:
        DataError: a tolerance <= 0, an unknown key, an empty list, or an offset farther than
            ``tolerance_s`` from a multiple of ``1 / rate_hz`` (naming the nearest ones).
    """
    if not (isinstance(tolerance_s, (int, float)) and tolerance_s > 0):
        raise DataError(f"`tolerance_s` must be > 0 seconds; got {tolerance_s!r} (LeRobot's "
                        "default is 1e-4).")
    out = {}
    for key, offsets in delta_timestamps.items():
        if key not in keys:
            raise DataError(f"`delta_timestamps` names {key!r}, which is not a served key; "
                            f"served keys: {list(keys)}.")
        offsets = list(offsets)
        if not offsets:
            raise DataError(f"`delta_timestamps[{key!r}]` is empty; give at least one offset "
                            "in seconds, e.g. [0.0].")
        steps = []
        for o in offsets:
            k = round(float(o) * rate_hz)
            if abs(float(o) * rate_hz - k) / rate_hz > tolerance_s:
                lo, hi = math.floor(o * rate_hz), math.ceil(o * rate_hz)
                raise DataError(f"`delta_timestamps[{key!r}]` holds {float(o)!r} s, not a "
                                f"multiple of 1/{rate_hz:g} s within tolerance_s = "
                                f"{tolerance_s:g}; the nearest valid offsets are "
                                f"{float(lo / rate_hz)!r} and "
                                f"{float(hi / rate_hz)!r} s.")
            steps.append(k)
        out[key] = steps
    return out


class RobotDataset(torch.utils.data.Dataset):
    """Windows over a RoboCache cache (see :func:`robocache.cache.build`).

    Args:
        cache: the cache: a directory, or a URI ``s3://bucket/prefix`` (``gs://``, ``az://``).
        history: observation steps per sample (rows ``t-(history-1)..t``), >= 1.
        horizon: action steps per sample (rows ``t..t+horizon-1``), >= 0.
        keys: streams to serve (default: every numeric and image stream of the cache).
        action_keys: which of ``keys`` are actions, windowed with ``horizon`` (default: keys
            starting with ``"action"``); the others are observations, windowed with ``history``.
            With ``horizon=0`` every key is windowed with ``history``.
        pad: ``"edge"`` (repeat the episode's first/last row, as LeRobot) or ``"zero"``.
        delta_timestamps: instead of history/horizon, per key offsets in seconds (LeRobot's
            ``delta_timestamps``, e.g. ``{"observation.state": [-1/30, 0], "action":
            [k/30 for k in range(50)]}``), each a multiple of ``1 / rate`` within
            ``tolerance_s``; keys not named are served at the current step only, without a
            window dimension (as LeRobot).
        delta_steps: the same in steps (row offsets) instead of seconds.
        tolerance_s: seconds within which a ``delta_timestamps`` offset counts as on the grid.
        episodes: serve only these cached episodes (default: all).
        keep_ranges: serve only the steps a keep-ranges file keeps (a path, or its parsed
            JSON): openpi's DROID ``keep_ranges`` format or RoboCache's
            (:mod:`robocache.data.filters`). Each kept range is windowed on its own: a window
            never crosses a removed range, it is padded at the cut as at an episode's end.
        episode_keys: the keep-ranges file's episode names to the cache's episode indices (a
            mapping or a JSON file of one), for files keyed by names (DROID's
            ``"<recording_folderpath>--<file_path>"``).
        audit: an audit report (``robocache audit --json``; a path or the dict): its flagged
            episodes are not served.
        drop_flags: with ``audit``, drop only episodes carrying one of these flags (default:
            any flag).
        version: serve this version of an edited cache (``robocache edit``; ``robocache
            inspect CACHE --versions`` lists them; default: the current one).
        split: serve one side of the cache's recorded train / validation split
            (``"train"`` or ``"val"``, ``robocache edit --split``).
        image_size: (height, width) camera frames are resized to (default: as stored).
        image_transforms: random crop / affine / colour jitter of camera frames
            (:class:`robocache.ImageTransformsConfig`), drawn per sample and camera from
            ``seed``; ``None``: none.
        image_dtype: camera frame dtype: float32 (default), bfloat16, float16 in [0, 1], or
            uint8.
        seed: seed of the camera transforms (the same seed and batch order give the same
            batches).
        storage_options: object-store settings for a URI ``cache`` (Lance's names, e.g.
            ``{"aws_region": "us-west-2", "aws_endpoint": "http://127.0.0.1:9000"}``;
            credentials otherwise from the standard environment variables, see
            :mod:`robocache.data.location`).
        in_memory: copy the served steps and every served camera frame into this process's
            memory at open (each process its own copy), instead of mapping the machine's
            served index and reading frames per batch. For small caches read many times by
            one process; the default serves any size with memory shared by the machine.
        relative_actions: action keys served relative to the sample's current state, e.g.
            ``{"action": {"mode": "joint", "state": "observation.state",
            "absolute_dims": [7]}}``; modes ``"joint"``, ``"ee"`` / ``"base"`` (SE(3)) and
            the fields are described in :mod:`robocache.data.relative`. Their statistics
            (:attr:`stats`) are those of the relative chunks, stored in the cache by
            :func:`robocache.data.stats.relative_action_stats` (``robocache stats CACHE
            --relative ...``); without them the key has no statistics and normalizing it is
            refused (:meth:`check_normalizable`).

    Items (``ds[i]``, or ``ds[list_of_i]`` for a batch with a leading ``B``): for each
    observation key ``[history, D]``, for each action key ``[horizon, D]`` (with per-key
    offsets: ``[len(offsets), D]``, or ``[D]`` for keys without), in the stream's own dtype
    (float32, int64, bool...), each with a ``<key>_is_pad`` bool mask (outside the episode, or
    the stream had no sample there); camera keys (image and video streams) give ``[K, C, H,
    W]`` frames as LeRobot (float32 in [0, 1] by default; depth stays uint16), decoded per
    batch (nvJPEG on a GPU); plus
    ``episode_index``, ``index`` (the global step) and ``timestamp`` (float64 seconds).

    While another process extends the cache (or after an interrupted extension), the last
    complete version is served, with a warning naming the writer (see
    :mod:`robocache.data.snapshot`).

    Pickling (DataLoader workers under ``fork``, ``spawn`` or ``forkserver``) carries the
    settings and the served index's folder, never the arrays: each process maps the same
    files and opens the cache's frame tables itself.

    Raises:
        FileNotFoundError: no cache at ``cache``.
        DataError: a cache never complete yet (naming its live writer), a key the cache
            lacks, a non-servable (event) key, bad history/horizon/pad, bad
            ``delta_timestamps`` (see :func:`seconds_to_steps`), an object store that fails
            (one line naming the URI and the fix), or a served index that cannot be made
            (see :func:`robocache.data.served.open_served`).
    """

    def __init__(self, cache: str | Path, *, history: int = 1, horizon: int = 0,
                 keys: Sequence[str] | None = None, action_keys: Sequence[str] | None = None,
                 pad: str = "edge", delta_timestamps: dict[str, Sequence[float]] | None = None,
                 delta_steps: dict[str, Sequence[int]] | None = None,
                 tolerance_s: float = 1e-4, episodes: Sequence[int] | None = None,
                 image_size: tuple[int, int] | None = None, image_transforms: Any = None,
                 image_dtype: torch.dtype = torch.float32, seed: int = 0,
                 storage_options: Mapping[str, Any] | None = None, in_memory: bool = False,
                 keep_ranges: str | Path | Mapping[str, Any] | None = None,
                 episode_keys: str | Path | Mapping[str, int] | None = None,
                 audit: str | Path | Mapping[str, Any] | None = None,
                 drop_flags: Sequence[str] | None = None, version: int | None = None,
                 split: str | None = None,
                 relative_actions: Mapping[str, Mapping[str, Any]] | None = None):
        from robocache.ops.normalize import Stats

        require("lance", "data", "The Lance cache", "pylance")
        self.location = Location(cache, storage_options)
        self.path = self.location.path  # None for a cache in an object store
        written = self.location.manifest()
        if not (isinstance(history, numbers.Integral) and isinstance(horizon, numbers.Integral)
                and history >= 1 and horizon >= 0):
            raise DataError(f"`history` must be an integer >= 1 and `horizon` an integer >= 0; "
                            f"got {history!r}, {horizon!r}.")
        history, horizon = int(history), int(horizon)
        # before the offset lists: windows of that many rows would not fit either
        check_fits("RobotDataset", f"windows of {history:,} + {horizon:,} rows",
                   OFFSET_BYTES * (history + horizon), torch.device("cpu"),
                   "pass a smaller `history` / `horizon` (or `delta_timestamps`).")
        if pad not in ("edge", "zero"):
            raise DataError(f"`pad` must be 'edge' or 'zero'; got {pad!r}.")
        # while another process extends the cache: its last complete version
        self.manifest = snapshot.servable(self.location, written)
        if version is not None:  # an older version of an edited cache
            from robocache.data.versions import manifest_at

            self.manifest = manifest_at(self.location, self.manifest, version)
        if split is not None:
            splits = self.manifest.get("splits") or {}
            if split not in splits:
                raise DataError(f"{self.location} has no split {split!r} (splits: "
                                f"{sorted(splits) or 'none'}; `robocache edit CACHE --split "
                                "0.1` records one).")
            chosen = set(splits[split])
            episodes = [e for e in (episodes if episodes is not None else
                                    [x["index"] for x in self.manifest["episodes"]])
                        if int(e) in chosen]
        if self.manifest is not written and episodes is None:
            episodes = [e["index"] for e in self.manifest["episodes"]]
        source_identity.warn_if_changed(self.location.uri, self.manifest)  # an edited source
        self.history, self.horizon, self.pad = history, horizon, pad
        streams = self.manifest["streams"]
        servable = [k for k, s in streams.items() if s["kind"] in ("numeric", "image", "video")]
        keys = list(keys) if keys is not None else servable
        bad = [k for k in keys if k not in servable]
        if bad:
            raise DataError(f"`keys` {bad} are not servable streams of {self.location}; "
                            f"servable: {servable}.")
        if delta_timestamps is not None and delta_steps is not None:
            raise DataError("pass `delta_timestamps` (seconds) or `delta_steps`, not both.")
        if delta_timestamps is not None:
            delta_steps = seconds_to_steps(delta_timestamps, self.manifest["rate_hz"],
                                           tolerance_s, keys)
        if delta_steps is not None:
            if (history, horizon, action_keys) != (1, 0, None):
                raise DataError("per-key offsets replace `history`/`horizon`/`action_keys`; "
                                "pass one or the other.")
            unknown = [k for k in delta_steps if k not in keys]
            if unknown or any(len(v) == 0 for v in delta_steps.values()):
                raise DataError(f"`delta_steps` must name served keys ({keys}) with at least "
                                f"one offset each; got {dict(delta_steps)}.")
            self.action_keys = [k for k in keys if k.startswith("action")]
            self.deltas = {k: [int(o) for o in delta_steps.get(k, [0])] for k in keys}
            self.squeezed = [k for k in keys if k not in delta_steps]
        else:
            acts = [k for k in keys if k.startswith("action")] if action_keys is None \
                else list(action_keys)
            if set(acts) - set(keys):
                raise DataError(f"`action_keys` {sorted(set(acts) - set(keys))} are not in "
                                "`keys`.")
            self.action_keys = [] if horizon == 0 else acts
            self.deltas = {k: list(range(horizon)) if k in self.action_keys
                           else list(range(1 - history, 1)) for k in keys}
            self.squeezed = []
        self.obs_keys = [k for k in keys if k not in self.action_keys]
        self.image_keys = [k for k in keys if streams[k]["kind"] in ("image", "video")]
        self.image_size, self.image_transforms = image_size, image_transforms
        self.image_dtype, self._rng = image_dtype, torch.Generator().manual_seed(seed)
        stats = self.manifest["stats"] if "stats" in self.manifest else \
            json.loads(self.location.read_text(self.manifest["stats_path"]))
        # stats normalize float streams; integer and bool streams are served as stored
        self.stats = {k: Stats.from_dict(v) for k, v in stats.items() if k in keys
                      and np.dtype(streams[k]["dtype"]).kind == "f"}
        self.absolute_stats = dict(self.stats)
        # relative actions: checked against the streams before anything is read
        fields = {k: (int(np.prod(streams[k]["shape"], dtype=np.int64)),
                      np.dtype(streams[k]["dtype"]).kind == "f", k in self.image_keys)
                  for k in keys}
        self._set_relative(relative_actions, fields)

        if not self.manifest["episodes"]:
            reasons = "; ".join(f"episode {q['index']}: {q['reason']}"
                                for q in self.manifest["quarantined"][:3])
            raise DataError(f"{self.location} holds no cached episodes "
                            f"({len(self.manifest['quarantined'])} quarantined: {reasons}).")
        if episodes is not None:
            cached = {e["index"] for e in self.manifest["episodes"]}
            missing = sorted(set(map(int, episodes)) - cached)
            if missing or not len(episodes):
                raise DataError(f"`episodes` must name cached episodes; {missing or 'none'} "
                                f"given are not in {self.location} (cached: {sorted(cached)}).")
        episodes, ranges = _filtered(self.manifest, episodes, keep_ranges, episode_keys, audit,
                                     drop_flags, self.location)
        self.kept_ranges = ranges
        columns = []
        for k in keys:
            col = streams[k]["column"]
            camera = k if k in self.image_keys else None
            columns.append(Column(k, f"{col}/frame" if camera else col, f"{col}_is_pad",
                                  camera))
        self._open(open_served(self.location, self.manifest, columns, episodes, ranges),
                   in_memory)

    def _open(self, served: Served, in_memory: bool = False) -> None:
        """Serve the served index ``served``: its arrays mapped (shared with this machine's
        other processes) and the camera frames read from the cache per batch, or, with
        ``in_memory``, everything copied into this process's memory."""
        from robocache.data.frames import LanceFrames, VideoFrames

        self.served, self.in_memory = served, in_memory
        # workers forked after this make their Lance calls through a reader process
        # (robocache.data.reader): pylance's warning at each fork does not apply to them
        warnings.filterwarnings("ignore", "lance is not fork-safe")
        self._maps: dict[str, torch.Tensor] = {}
        for name in _MAPPED:
            t = torch.from_numpy(served.array(name))
            setattr(self, name, t.clone() if in_memory else t)
            if not in_memory:
                self._maps[name] = t
        self.offsets = torch.from_numpy(np.array(served.array("offsets")))
        self.episode_ids = torch.from_numpy(np.array(served.array("episode_ids")))
        self.task_names: list[str] = served.meta["task_names"]  # each step's task: task_id
        self.layout = {k: _Key(c, w, _TORCH[np.dtype(t)], dim, pad)
                       for k, (c, w, t, dim, pad) in served.meta["layout"].items()}
        streams, versions = self.manifest["streams"], served.meta["versions"]
        self.frames: dict[str, Any] = {}
        for k in self.image_keys:
            spec = streams[k]
            args = (self.location, k, versions[k], served, served.camera_file(k, "addresses"),
                    np.array(served.array(served.camera_file(k, "offsets"))),
                    self.episode_ids.numpy(), spec["shape"], spec["dtype"], spec["codec"])
            frames = VideoFrames(*args, configs=served.meta["video"][k]) \
                if spec["codec"] == "video" else LanceFrames(*args)
            self.frames[k] = frames.load() if in_memory else frames
        self.set_windows()

    def __copy__(self) -> RobotDataset:
        """A shallow copy (:meth:`to`, :meth:`normalized`): the same arrays and frame stores,
        not a pickled round trip."""
        out = object.__new__(type(self))
        out.__dict__.update(self.__dict__)
        return out

    def __getstate__(self) -> dict[str, Any]:
        """Pickled (DataLoader workers, ``spawn`` included): arrays still mapped from the
        served index go by name and are mapped again where unpickled (never copied); the
        other tensors (offsets, stats) go by value inside the pickle, not as the
        shared-memory handles torch's multiprocessing pickler makes of tensors (a ``spawn``
        worker failed to map those: ``unable to resize file <filename not specified>``)."""
        state = self.__dict__.copy()
        maps = state.pop("_maps", {})
        for name, t in maps.items():
            if state.get(name) is t:
                state[name] = _Mapped(name)
        if "data" in maps and state["_host"][0] is maps["data"]:
            state["_host"] = (_Mapped("data"), *state["_host"][1:])
        buf = io.BytesIO()
        torch.save(state, buf)
        return {"saved": buf.getvalue()}

    def __setstate__(self, packed: dict[str, Any]) -> None:
        state = torch.load(io.BytesIO(packed["saved"]), weights_only=False)
        maps = {}
        for name, value in state.items():
            if isinstance(value, _Mapped):
                state[name] = maps[name] = torch.from_numpy(state["served"].array(name))
        if isinstance(state["_host"][0], _Mapped):
            data = maps.get("data")
            if data is None:
                data = maps["data"] = torch.from_numpy(state["served"].array("data"))
            state["_host"] = (data, *state["_host"][1:])
        self.__dict__.update(state)
        self._maps = maps

    def set_windows(self) -> None:
        """The `robocache.key_windows` columns and offsets of :attr:`layout` and
        :attr:`deltas` (each key's words, and its alignment-pad column where it has one)."""
        self._columns, self._offsets = {}, {}
        for k, key in self.layout.items():
            self._columns[k], self._offsets[k] = (key.col, key.words), self.deltas[k]
            if key.pad_col is not None:
                self._columns[f"{k}\0pad"] = (key.pad_col, 1)
                self._offsets[f"{k}\0pad"] = self.deltas[k]
        if self.relative is not None:  # the current state, in the same gather
            cols, offs = self.relative.columns(self.layout)
            self._columns.update(cols)
            self._offsets.update(offs)
        # where the camera keys' frame numbers are on the host (read ahead of the device)
        self._host = (self.data if self.data.device.type == "cpu" else self._host[0],
                      self.offsets.cpu(), {k: self._columns[k] for k in self.image_keys})

    @property
    def keys(self) -> list[str]:
        return self.obs_keys + self.action_keys

    @property
    def device(self) -> torch.device:
        return self.offsets.device

    def to(self, device: str | torch.device) -> RobotDataset:
        """A copy whose packed cache lives on ``device`` (e.g. to gather windows on the GPU);
        this dataset is unchanged."""
        out = copy.copy(self)
        out.data = self.data.to(device)
        for name in ("offsets", "episode_index", "step", "timestamp"):
            setattr(out, name, getattr(self, name).to(device))
        return out

    def _set_relative(self, spec: Mapping[str, Mapping[str, Any]] | None,
                      fields: Mapping[str, tuple[int, bool, bool]]) -> None:
        """Validate ``relative_actions`` (served keys' ``fields``: values per step, float?,
        camera?) and serve its keys with their relative statistics where the cache has them
        (:func:`robocache.data.stats.load_relative_stats`), else with none."""
        from robocache.data.relative import RelativeActions, parse
        from robocache.data.stats import load_relative_stats

        specs = parse(spec, fields, self.action_keys)
        old = self.relative.specs if getattr(self, "relative", None) is not None else {}
        stats = {k: v for k, v in self.stats.items() if k not in old}
        stats.update((k, self.absolute_stats[k]) for k in old if k in self.absolute_stats)
        for key, s in specs.items():
            stats.pop(key, None)
            found = load_relative_stats(self.location, self.manifest, key, s, self.deltas[key])
            if found is not None:
                stats[key] = found
        self.relative = RelativeActions(specs) if specs else None
        self.stats = stats

    def with_relative_actions(self, relative_actions: Mapping[str, Mapping[str, Any]] | None
                              ) -> RobotDataset:
        """A copy serving ``relative_actions`` (as the constructor's argument; None: every
        key absolute) instead of this dataset's; this dataset is unchanged.

        Raises:
            DataError: a bad entry (see :mod:`robocache.data.relative`).
        """
        out = copy.copy(self)
        fields = {k: (key.dim, key.dtype.is_floating_point, k in self.image_keys)
                  for k, key in self.layout.items()}
        out._set_relative(relative_actions, fields)
        out.set_windows()
        return out

    def check_normalizable(self, stats: Mapping[str, Any] | Sequence[str]) -> None:
        """Refuse to normalize a relative key (``stats``: the statistics a normalizer would use,
        or the keys it would normalize) without the statistics of its relative chunks: absolute
        statistics do not describe what the model sees.

        Raises:
            DataError: one line naming the key and the command (or function) that computes
                its statistics.
        """
        from robocache.data.stats import command_hint

        if self.relative is None:
            return
        for key, spec in self.relative.specs.items():
            if key not in stats:
                continue
            given = stats[key] if isinstance(stats, Mapping) else self.stats.get(key)
            tag = spec.tag(self.deltas[key])
            if given is None or getattr(given, "relative", None) != tag:
                what = f"{self.location} holds only its absolute statistics" if given is None \
                    else "the normalizer holds its absolute statistics" if given.relative is None \
                    else "the normalizer holds statistics of other chunks of it"
                raise DataError(
                    f"`{key}` is served relative ({spec.mode} against {spec.state!r}, chunks of "
                    f"{len(self.deltas[key])} steps) and {what}; "
                    f"compute those of its relative chunks with `{command_hint(self, key)}` "
                    "(or robocache.data.stats.relative_action_stats), or leave the key out of "
                    "`normalize`.")

    def normalized(self, normalizer) -> RobotDataset:
        """A copy whose packed float columns are normalized once, where they live (affine per
        dimension, so windows of normalized rows equal normalized windows; with
        ``pad="zero"`` the padding is zero in normalized units). Relative action keys and
        their state keys are normalized per batch instead, after the transform.

        Raises:
            DataError: ``normalizer`` holds statistics of a relative key that are not those
                of its relative chunks (see :meth:`check_normalizable`).
        """
        out = copy.copy(self)
        out.data = self.data.clone()
        deferred = set()
        if self.relative is not None:
            self.check_normalizable(normalizer.stats)
            deferred = self.relative.deferred() & set(normalizer.stats)
            if deferred:
                from robocache.ops.normalize import Normalizer

                out.relative = self.relative.with_post(Normalizer(
                    {k: normalizer.stats[k] for k in deferred},
                    {k: normalizer.modes[k] for k in deferred}, eps=normalizer.eps))
        for k in self.stats:  # every float dtype, in its own dtype (float64 in float64)
            if k in deferred:
                continue
            key = self.layout[k]
            cols = slice(key.col, key.col + key.words)
            normed = normalizer({k: key.values(self.data[:, cols])})[k].to(key.dtype)
            raw = normed.contiguous().view(torch.uint8).reshape(len(normed), -1)
            out.data[:, cols].view(torch.uint8)[:, :raw.shape[1]] = raw
        return out

    def renamed(self, names: Mapping[str, str]) -> RobotDataset:
        """A copy serving key ``k`` as ``names.get(k, k)`` (a mixture's common schema: every
        robot's camera, state and action under one name); this dataset is unchanged.

        Raises:
            DataError: a name that is not a served key, or two keys given one name.
        """
        unknown = sorted(set(names) - set(self.keys))
        new = [names.get(k, k) for k in self.keys]
        if unknown or len(set(new)) != len(new):
            raise DataError(f"`names` must rename served keys ({self.keys}) to distinct names; "
                            f"got {dict(names)}.")
        out = copy.copy(self)
        rename = lambda d: {names.get(k, k): v for k, v in d.items()}  # noqa: E731
        for attr in ("layout", "deltas", "stats", "frames"):
            setattr(out, attr, rename(getattr(self, attr)))
        for attr in ("obs_keys", "action_keys", "image_keys", "squeezed"):
            setattr(out, attr, [names.get(k, k) for k in getattr(self, attr)])
        out.set_windows()
        return out

    def replaced(self, key: str, values: torch.Tensor, stats, pad: torch.Tensor | None = None,
                 drop: Sequence[str] = ()) -> RobotDataset:
        """A copy serving ``values`` (``[len(self), D]``, one row per served step, any width
        and dtype) as ``key``, normalized with ``stats`` (a :class:`robocache.Stats`), e.g. a
        joint stream as the end-effector pose, or several streams joined into one; the packed
        matrix is copied into this process's memory with the new columns appended. This
        dataset is unchanged.

        Args:
            pad: bool ``[len(self)]``, the steps without a sample (default: ``key``'s own).
            drop: keys no longer served (the streams joined into ``key``).
        """
        old = self.layout[key]
        if values.dim() != 2 or values.shape[0] != len(self):
            raise DataError(f"`values` must be [{len(self)}, D] (one row per step); got "
                            f"{tuple(values.shape)}.")
        raw = values.to(self.device).contiguous().view(torch.uint8).reshape(len(self), -1)
        words = -(-raw.shape[1] // 4)
        raw = torch.nn.functional.pad(raw, (0, 4 * words - raw.shape[1]))
        blocks, pad_col = [self.data, raw.view(torch.int32)], old.pad_col
        if pad is not None:
            pad_col = self.data.shape[1] + words
            blocks.append(pad.to(self.device, torch.int32)[:, None])
        out = copy.copy(self)
        out.data = torch.cat(blocks, 1)
        out.layout = {**self.layout, key: _Key(self.data.shape[1], words, values.dtype,
                                               values.shape[1], pad_col)}
        out.stats = {**self.stats, key: stats}
        if drop:
            gone = set(drop) - {key}
            for attr in ("layout", "deltas", "stats", "frames"):
                setattr(out, attr, {k: v for k, v in getattr(out, attr).items()
                                    if k not in gone})
            for attr in ("obs_keys", "action_keys", "image_keys", "squeezed"):
                setattr(out, attr, [k for k in getattr(self, attr) if k not in gone])
        out.set_windows()
        return out

    def __len__(self) -> int:
        return int(self.episode_index.shape[0])

    def read_frames(self, indices: torch.Tensor) -> list[tuple[Any, torch.Tensor]]:
        """Stage 0, on the host (a thread or worker may run it ahead of the device): each
        camera key's encoded frames for the windows at global steps ``indices`` (int64
        ``[B]``), read from the cache (only the distinct frames the batch needs), with the
        windows' rows renumbered into them: ``[(EncodedFrames, rows [B, K])]`` in
        :attr:`image_keys` order, what :meth:`gather` takes as ``frames``."""
        import robocache

        if not self.image_keys:
            return []
        data, offsets, columns = self._host
        w = robocache.key_windows(data, offsets, indices.cpu(), columns,
                                  {k: self.deltas[k] for k in columns}, pad=self.pad)
        return [self.frames[k].read(self.layout[k].values(w[k])[..., 0])
                for k in self.image_keys]

    def gather(self, indices: torch.Tensor, frames: list | None = None) -> Batch:
        """Stage 1, where the packed cache lives (a DataLoader worker, or the GPU): the raw
        windows as few tensors — ``index``, the gathered words of every key (one
        :func:`robocache.key_windows` launch) and the decoded frames of camera keys (uint8
        ``[B, K, C, H, W]``; nvJPEG when the dataset lives on a GPU, else the CPU), read from
        the cache here unless ``frames`` holds :meth:`read_frames`' result for ``indices``."""
        import robocache
        from robocache.data.cameras import decode_all

        if self.image_keys and torch.utils.data.get_worker_info() is not None:
            bound_heap()  # a DataLoader worker: its batches' buffers given back when freed
        raw: Batch = {"index": indices}
        raw.update(robocache.key_windows(self.data, self.offsets, indices, self._columns,
                                         self._offsets, pad=self.pad))
        if frames is None:
            frames = [(self.frames[k], self.layout[k].values(raw[k])[..., 0])
                      for k in self.image_keys]
        raw.update((f"{k}\0frames", x) for k, x in
                   zip(self.image_keys, decode_all(frames, self.device), strict=True))
        return raw

    def finish(self, raw: Batch, episode_index: torch.Tensor | None = None,
               timestamp: torch.Tensor | None = None) -> Batch:
        """Stage 2, on the batch's device: view :meth:`gather`'s words as each key's dtype and
        merge the ``_is_pad`` masks; ``episode_index`` / ``timestamp`` (per global step)
        default to this dataset's, pass copies on the batch's device when it differs."""
        index = raw["index"]
        episode_index = self.episode_index if episode_index is None else episode_index
        timestamp = self.timestamp if timestamp is None else timestamp
        out: Batch = {"index": index, "episode_index": episode_index[index],
                      "timestamp": timestamp[index]}
        for k, key in self.layout.items():
            pad = raw[f"{k}_is_pad"]
            if key.pad_col is not None:
                pad = pad | (raw[f"{k}\0pad"][..., 0] != 0)
            value = self._camera(raw[f"{k}\0frames"]) if k in self.image_keys \
                else key.values(raw[k])
            if k in self.squeezed:
                value, pad = value[:, 0], pad[:, 0]
            out[k], out[f"{k}_is_pad"] = value, pad
        if self.relative is not None:  # chunks against the current state, where they are
            out.update(self.relative.run(out, raw, self))
        return out

    def camera_shape(self, key: str) -> tuple[tuple[int, int, int], torch.dtype]:
        """A camera key's served frame: ``(C, H, W)`` and dtype."""
        f = self.frames[key]
        h, w = f.frame_shape[:2]
        if f.channels == 3 and f.dtype == "uint8":
            return (3, *(self.image_size or (h, w))), self.image_dtype
        return (f.channels, h, w), getattr(torch, f.dtype)

    def _camera(self, frames: torch.Tensor) -> torch.Tensor:
        """Resize / transform / cast one camera's decoded ``[B, T, C, H, W]`` frames where
        they are; transforms are drawn per sample (shared by its T frames)."""
        from robocache.data.cameras import serve
        from robocache.ops.image import sample_image_transforms

        params = None
        if self.image_transforms is not None and frames.shape[2] == 3:
            b, t = frames.shape[:2]
            params = sample_image_transforms(b, tuple(frames.shape[-2:]), self.image_transforms,
                                             seed=self._rng)
            params = params.repeat_interleave(t).to(frames.device)
        return serve(frames, self.image_size, params, self.image_dtype)

    def fetch(self, indices: torch.Tensor, frames: list | None = None) -> Batch:
        """The batch of windows starting at global steps ``indices`` (int64 ``[B]``, on the
        dataset's device); ``frames``: :meth:`read_frames`' result for them, when read
        ahead."""
        return self.finish(self.gather(indices, frames))

    def __getitem__(self, index: int | Sequence[int] | torch.Tensor) -> Batch:
        if isinstance(index, (int, np.integer)):
            if not -len(self) <= index < len(self):
                raise IndexError(f"index {index} is out of range for {len(self)} samples.")
            batch = self.fetch(torch.tensor([index % len(self)], device=self.device))
            return {k: v[0] for k, v in batch.items()}
        idx = torch.as_tensor(index, dtype=torch.int64).to(self.device)
        return self.fetch(idx)

    def describe(self) -> dict[str, Any]:
        """Sizes for summaries: samples, episodes, rate, served keys, their dims and offsets."""
        return {"samples": len(self), "episodes": int(self.episode_ids.shape[0]),
                "rate_hz": self.manifest["rate_hz"], "history": self.history,
                "horizon": self.horizon,
                "dims": {k: key.dim for k, key in self.layout.items()},
                "offsets": dict(self.deltas),
                "relative": {k: s.canonical() for k, s in self.relative.specs.items()}
                if self.relative is not None else {}}


def _filtered(manifest: Mapping[str, Any], episodes: Sequence[int] | None, keep_ranges,
              episode_keys, audit, drop_flags, location) -> tuple[list[int] | None, dict | None]:
    """The episodes to serve and their kept step ranges, after the keep-ranges file and the
    audit report (``None``, ``None``: every episode of ``episodes`` whole)."""
    from robocache.data.filters import keep_ranges as read_ranges
    from robocache.data.filters import without_flagged

    if episode_keys is not None and keep_ranges is None:
        raise DataError("`episode_keys` names the episodes of a keep-ranges file; pass "
                        "`keep_ranges` too.")
    if drop_flags is not None and audit is None:
        raise DataError("`drop_flags` selects flags of an audit report; pass `audit` too.")
    if keep_ranges is None and audit is None:
        return (None if episodes is None else list(episodes)), None
    chosen = [int(e["index"]) for e in manifest["episodes"]] if episodes is None \
        else sorted(map(int, episodes))
    ranges = None
    if keep_ranges is not None:
        listed, ranges = read_ranges(keep_ranges, manifest, episode_keys)
        chosen = sorted(set(chosen) & set(listed))
    if audit is not None:
        chosen = without_flagged(chosen, audit, drop_flags)
    if not chosen:
        raise DataError(f"no episode of {location} is left to serve after the filters "
                        "(`episodes`, `keep_ranges`, `audit`); loosen them.")
    if ranges is not None:
        ranges = {e: r for e, r in ranges.items() if e in set(chosen)} or None
    return chosen, ranges


#: Host bytes an offset of a window costs (a Python int in the offset lists, its gathered
#: index and flag), what the size check of ``history`` / ``horizon`` counts.
OFFSET_BYTES = 64

#: The per-row arrays a dataset maps from its served index.
_MAPPED = ("data", "episode_index", "step", "timestamp", "task_id")


@dataclass(frozen=True)
class _Mapped:
    """A pickled dataset's placeholder for its mapped array ``name``."""

    name: str


_TORCH = {np.dtype(n): getattr(torch, n) for n in
          ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")}
