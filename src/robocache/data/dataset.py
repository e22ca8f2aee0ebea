"""Training samples from a cache: (episode, step) windows with ``_is_pad`` masks.

    >>> ds = RobotDataset("/tmp/panda.cache", history=2, horizon=16)
    >>> ds[0]["action"].shape, ds[0]["observation.state"].shape
    (torch.Size([16, 8]), torch.Size([2, 8]))

The cache's streams are loaded once into packed CPU tensors (``[total, D]`` + episode offsets,
like FlashAttention's ``cu_seqlens``); a window is a gather of rows ``t-(h-1)..t`` (observations)
or ``t..t+H-1`` (actions) inside the episode, edge-padded, through :func:`robocache.windows` —
on the GPU when the dataset is moved there (:meth:`RobotDataset.to`), on the CPU in DataLoader
workers (which never touch CUDA). Every step of every episode is one sample, as in LeRobot.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robocache.errors import DataError

Batch = dict[str, torch.Tensor]


@dataclass
class _Group:
    """Keys windowed together: one packed ``[total, sum(D) + keys]`` matrix (values, then one
    0/1 alignment-pad column per key) so a batch is one :func:`robocache.windows` call."""

    keys: list[str]
    dims: list[int]
    data: torch.Tensor

    def column(self, key: str) -> int:
        """Index of the first value column of ``key``."""
        i = self.keys.index(key)
        return sum(self.dims[:i])

    def split(self, w: torch.Tensor, window_pad: torch.Tensor) -> Batch:
        out, at = {}, 0
        pads = w[..., sum(self.dims):] > 0.5
        for i, (k, d) in enumerate(zip(self.keys, self.dims, strict=True)):
            out[k] = w[..., at:at + d]
            out[f"{k}_is_pad"] = window_pad | pads[..., i]
            at += d
        return out


class RobotDataset(torch.utils.data.Dataset):
    """Windows over a RoboCache cache (see :func:`robocache.cache.build`).

    Args:
        cache: cache directory.
        history: observation steps per sample (rows ``t-(history-1)..t``), >= 1.
        horizon: action steps per sample (rows ``t..t+horizon-1``), >= 0.
        keys: streams to serve (default: every numeric and image stream of the cache).
        action_keys: which of ``keys`` are actions, windowed with ``horizon`` (default: keys
            starting with ``"action"``); the others are observations, windowed with ``history``.
            With ``horizon=0`` every key is windowed with ``history``.
        pad: ``"edge"`` (repeat the episode's first/last row, as LeRobot) or ``"zero"``.
        image_size: (height, width) camera frames are resized to (default: as stored).
        image_transforms: random crop / affine / colour jitter of camera frames
            (:class:`robocache.ImageTransformsConfig`), drawn per sample and camera from
            ``seed``; ``None``: none.
        image_dtype: camera frame dtype: float32 (default), bfloat16, float16 in [0, 1], or
            uint8.
        seed: seed of the camera transforms (the same seed and batch order give the same
            batches).

    Items (``ds[i]``, or ``ds[list_of_i]`` for a batch with a leading ``B``): for each
    observation key ``[history, D]`` float32, for each action key ``[horizon, D]``, each with a
    ``<key>_is_pad`` bool mask (outside the episode, or the stream had no sample there); camera
    keys (image and video streams) give ``[history, C, H, W]`` frames as LeRobot (float32 in
    [0, 1] by default; depth stays uint16), decoded per batch (nvJPEG on a GPU); plus
    ``episode_index``, ``index`` (the global step) and ``timestamp`` (float64 seconds).

    Raises:
        FileNotFoundError: no cache at ``cache``.
        DataError: an unfinished cache, a key the cache lacks, a non-servable (event) key, or
            bad history/horizon/pad.
    """

    def __init__(self, cache: str | Path, *, history: int = 1, horizon: int = 0,
                 keys: Sequence[str] | None = None, action_keys: Sequence[str] | None = None,
                 pad: str = "edge", image_size: tuple[int, int] | None = None,
                 image_transforms: Any = None, image_dtype: torch.dtype = torch.float32,
                 seed: int = 0):
        import lance

        from robocache.ops.normalize import Stats

        self.path = Path(cache)
        manifest_path = self.path / "manifest.json"
        if not manifest_path.exists():
            raise FileNotFoundError(f"{self.path} is not a RoboCache cache (no manifest.json); "
                                    "build one with `robocache ingest SOURCE DEST`.")
        if history < 1 or horizon < 0:
            raise DataError(f"`history` must be >= 1 and `horizon` >= 0; got {history}, "
                            f"{horizon}.")
        if pad not in ("edge", "zero"):
            raise DataError(f"`pad` must be 'edge' or 'zero'; got {pad!r}.")
        self.manifest = json.loads(manifest_path.read_text())
        if self.manifest.get("status") != "complete":
            raise DataError(f"{self.path}: the cache build did not finish; re-run `robocache "
                            "ingest` with the same arguments to resume it.")
        self.history, self.horizon, self.pad = history, horizon, pad
        streams = self.manifest["streams"]
        servable = [k for k, s in streams.items() if s["kind"] in ("numeric", "image", "video")]
        keys = list(keys) if keys is not None else servable
        bad = [k for k in keys if k not in servable]
        if bad:
            raise DataError(f"`keys` {bad} are not servable streams of {self.path}; servable: "
                            f"{servable}.")
        acts = [k for k in keys if k.startswith("action")] if action_keys is None \
            else list(action_keys)
        if set(acts) - set(keys):
            raise DataError(f"`action_keys` {sorted(set(acts) - set(keys))} are not in `keys`.")
        if horizon == 0 and acts:
            acts = []
        self.action_keys = acts
        self.obs_keys = [k for k in keys if k not in acts]
        self.image_keys = [k for k in self.obs_keys if streams[k]["kind"] in ("image", "video")]
        self.image_size, self.image_transforms = image_size, image_transforms
        self.image_dtype, self._rng = image_dtype, torch.Generator().manual_seed(seed)
        stats = json.loads((self.path / self.manifest["stats_path"]).read_text())
        self.stats = {k: Stats.from_dict(v) for k, v in stats.items() if k in keys}

        if not (self.path / "data.lance").exists():
            reasons = "; ".join(f"episode {q['index']}: {q['reason']}"
                                for q in self.manifest["quarantined"][:3])
            raise DataError(f"{self.path} holds no cached episodes "
                            f"({len(self.manifest['quarantined'])} quarantined: {reasons}).")
        ds = lance.dataset(str(self.path / "data.lance"))
        columns = ["episode_index", "step", "timestamp"]
        for k in keys:
            col = streams[k]["column"]
            columns += [f"{col}/frame" if k in self.image_keys else col, f"{col}_is_pad"]
        table = ds.to_table(columns=columns)
        ep = table.column("episode_index").to_numpy()
        order = np.lexsort((table.column("step").to_numpy(), ep))
        ep = ep[order]
        starts = np.flatnonzero(np.r_[True, ep[1:] != ep[:-1]])
        self.episode_ids = torch.from_numpy(ep[starts].copy())
        self.offsets = torch.from_numpy(np.r_[starts, len(ep)].astype(np.int64))
        self.episode_index = torch.from_numpy(ep.copy())
        self.timestamp = torch.from_numpy(table.column("timestamp").to_numpy()[order].copy())
        self.frames: dict[str, Any] = {}

        def column(k: str) -> tuple[np.ndarray, np.ndarray]:
            col = streams[k]["column"]
            pad_col = table.column(f"{col}_is_pad").to_numpy(zero_copy_only=False)[order]
            if k in self.image_keys:
                return self._frame_rows(k, ep, table.column(f"{col}/frame").to_numpy()[order],
                                        pad_col), pad_col
            values = table.column(col).combine_chunks().flatten().to_numpy()
            return values.reshape(len(order), -1)[order], pad_col

        self.groups = {}
        for name, group_keys in (("obs", self.obs_keys), ("act", self.action_keys)):
            if not group_keys:
                continue
            parts = [column(k) for k in group_keys]
            data = np.concatenate([p[0] for p in parts] + [p[1][:, None] for p in parts], 1)
            self.groups[name] = _Group(group_keys, [p[0].shape[1] for p in parts],
                                       torch.from_numpy(data.astype(np.float32)))

    def _frame_rows(self, key: str, ep: np.ndarray, frame: np.ndarray,
                    pad: np.ndarray) -> np.ndarray:
        """Load the key's encoded frames (:class:`~robocache.data.cameras.EncodedFrames`);
        return each step's global frame row (as a float32 column, exact below 2**24 frames)."""
        import lance

        from robocache.data.cameras import EncodedFrames

        table = lance.dataset(str(self.path / "frames" / f"{key}.lance")).to_table()
        fep = table.column("episode_index").to_numpy()
        order = np.lexsort((table.column("frame").to_numpy(), fep))
        spec = self.manifest["streams"][key]
        self.frames[key] = EncodedFrames.from_table(table.take(order), spec["shape"],
                                                    spec["dtype"], spec["codec"])
        fep = fep[order]
        first = {int(e): int(i) for e, i in zip(*np.unique(fep, return_index=True), strict=True)}
        base = np.array([first.get(int(e), 0) for e in ep], np.int64)
        return np.where(pad, 0, base + np.maximum(frame, 0)).astype(np.float32)[:, None]

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
        out.groups = {n: _Group(g.keys, g.dims, g.data.to(device))
                      for n, g in self.groups.items()}
        out.offsets = self.offsets.to(device)
        out.episode_index = self.episode_index.to(device)
        out.timestamp = self.timestamp.to(device)
        return out

    def normalized(self, normalizer) -> RobotDataset:
        """A copy whose packed numeric columns are normalized once, where they live (affine
        per dimension, so windows of normalized rows equal normalized windows; with
        ``pad="zero"`` the padding is zero in normalized units)."""
        out = copy.copy(self)
        out.groups = {}
        for n, g in self.groups.items():
            data, at = g.data.clone(), 0
            for k, d in zip(g.keys, g.dims, strict=True):
                if k in self.stats:
                    data[:, at:at + d] = normalizer({k: data[:, at:at + d]})[k]
                at += d
            out.groups[n] = _Group(g.keys, g.dims, data)
        return out

    def __len__(self) -> int:
        return int(self.episode_index.shape[0])

    def gather(self, indices: torch.Tensor) -> Batch:
        """Stage 1, where the packed cache lives (a DataLoader worker, or the GPU): the raw
        windows as few tensors — ``index``, one ``[B, K, C + 1]`` float32 tensor per group
        (``"obs"``: K = history, ``"act"``: K = horizon; the value and alignment-pad columns,
        then the window-pad flag) and the decoded frames of camera keys (uint8 ``[B, K, C, H,
        W]``; nvJPEG when the dataset lives on a GPU, else the CPU)."""
        import robocache
        from robocache.data.cameras import decode

        raw: Batch = {"index": indices}
        for name, g in self.groups.items():
            history, horizon = (self.history, 0) if name == "obs" else (0, self.horizon)
            w = robocache.windows(g.data, self.offsets, indices, history=history,
                                  horizon=horizon, pad=self.pad)
            values, pad = (w.history, w.history_is_pad) if name == "obs" else \
                (w.horizon, w.horizon_is_pad)
            raw[name] = torch.cat([values, pad[..., None].to(values.dtype)], -1)
        for k in self.image_keys:
            rows = raw["obs"][..., self.groups["obs"].column(k)].long()
            raw[k] = decode(self.frames[k], rows, self.device)
        return raw

    def finish(self, raw: Batch, episode_index: torch.Tensor | None = None,
               timestamp: torch.Tensor | None = None) -> Batch:
        """Stage 2, on the batch's device: split :meth:`gather`'s tensors into keys and
        ``_is_pad`` masks; ``episode_index`` / ``timestamp`` (per global step) default to this
        dataset's, pass copies on the batch's device when it differs."""
        index = raw["index"]
        episode_index = self.episode_index if episode_index is None else episode_index
        timestamp = self.timestamp if timestamp is None else timestamp
        out: Batch = {"index": index, "episode_index": episode_index[index],
                      "timestamp": timestamp[index]}
        for name, g in self.groups.items():
            w = raw[name]
            out.update(g.split(w[..., :-1], w[..., -1] > 0.5))
        for k in self.image_keys:
            out[k] = self._camera(raw[k])
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

    def fetch(self, indices: torch.Tensor) -> Batch:
        """The batch of windows starting at global steps ``indices`` (int64 ``[B]``, on the
        dataset's device)."""
        return self.finish(self.gather(indices))

    def __getitem__(self, index: int | Sequence[int] | torch.Tensor) -> Batch:
        if isinstance(index, (int, np.integer)):
            if not -len(self) <= index < len(self):
                raise IndexError(f"index {index} is out of range for {len(self)} samples.")
            batch = self.fetch(torch.tensor([index % len(self)], device=self.device))
            return {k: v[0] for k, v in batch.items()}
        idx = torch.as_tensor(index, dtype=torch.int64).to(self.device)
        return self.fetch(idx)

    def describe(self) -> dict[str, Any]:
        """Sizes for summaries: samples, episodes, rate, served keys and their dims."""
        dims = {k: d for g in self.groups.values() for k, d in zip(g.keys, g.dims, strict=True)}
        return {"samples": len(self), "episodes": int(self.episode_ids.shape[0]),
                "rate_hz": self.manifest["rate_hz"], "history": self.history,
                "horizon": self.horizon, "dims": dims}
