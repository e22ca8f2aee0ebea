"""Stage 3, encode: how camera frames are stored (codec, quality, chroma, size). The frames
themselves are encoded by :mod:`robocache.data.cameras`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from robocache._optional import require
from robocache.data.build.config import CacheConfig
from robocache.data.cameras import FrameFormat
from robocache.data.episode import Source, StreamSpec
from robocache.errors import DataError


def stored_size(spec: StreamSpec, config: CacheConfig) -> tuple[int, int] | None:
    """The ``(height, width)`` a camera stream's frames are resized to at ingest: the
    ``camera_size`` of ``config`` for RGB uint8 frames, else ``None`` (stored as they come)."""
    if config.camera_size is None or spec.kind not in ("image", "video") or \
            spec.dtype != "uint8" or len(spec.shape) != 3 or spec.shape[2] != 3:
        return None
    return tuple(config.camera_size)


# How ``camera_codec="auto"`` stores a camera that is neither a video camera it keeps as video
# nor a source's own JPEG/PNG bytes (raw frames: zarr, robomimic, ROS 2 Image; a video camera
# resized with ``camera_size``): JPEG at ``camera_quality``/``camera_chroma``. Measured by what it
# costs a policy (LeRobot's ACT, same frames stored three ways, held-out action L1 over 2 seeds
# on an H200, benchmarks/results/policy-storage-h200-2026-12-02.json): JPEG q95 39.7 mm at
# 11.0 kB a frame, lossless 39.6 mm at 29.5 kB, H.264 CRF 18 42.2 mm at 2.8 kB (worse on both
# seeds); docs/cameras.md.
AUTO_RAW_CODEC = "jpeg"
# How ``"auto"`` stores a video camera it cannot keep as video (an episode starting inside a
# group of pictures): PNG, so that its frames stay exactly its decode's, as kept video's are
UNKEPT_VIDEO_CODEC = "png"


def _rgb(spec: StreamSpec) -> bool:
    return spec.dtype == "uint8" and len(spec.shape) == 3 and spec.shape[2] == 3


def stored_codec(spec: StreamSpec, codec: str, size: tuple[int, int] | None = None) -> str:
    """The codec camera ``spec`` is stored with when a build asks for ``codec``
    (``camera_codec``) and resizes it to ``size`` (``None``: its source's size):

    - ``"video"`` where it is kept as video: with ``"video"``, an RGB video stream (its
      source's packets) or RGB raw frames of even size (encoded once, H.264:
      :func:`robocache.data.video_store.encoded_table`); with ``"auto"``, an RGB video stream
      not resized (and raw frames as :data:`AUTO_RAW_CODEC` says);
    - else ``"jpeg"`` or ``"png"``: ``codec`` itself, ``"jpeg"`` for the other cameras of a
      ``"video"`` build and :data:`AUTO_RAW_CODEC` for those of an ``"auto"`` one. A
      source's own JPEG/PNG bytes are kept as they come (unless resized) and uint16 (depth)
      frames are PNG whatever this says (:func:`_camera_entry`).
    """
    if codec == "auto":
        if spec.kind == "video" and _rgb(spec) and size is None:
            return "video"
        codec = AUTO_RAW_CODEC
    if codec != "video":
        return codec
    raw = spec.kind == "image" and spec.encoding is None and _rgb(spec) and \
        spec.shape[0] % 2 == 0 and spec.shape[1] % 2 == 0
    return "video" if size is None and ((spec.kind == "video" and _rgb(spec)) or raw) \
        else "jpeg"


def camera_codec(config: CacheConfig, name: str) -> str:
    """The ``camera_codec`` camera stream ``name`` is built with: its ``camera_codecs``
    entry, else ``camera_codec``."""
    return config.camera_codecs.get(name, config.camera_codec)


def auto_codecs(src: Source, specs: dict[str, StreamSpec], config: CacheConfig,
                log: Callable[[str], None] | None = None) -> CacheConfig:
    """``config`` with ``camera_codecs["<camera>"] = UNKEPT_VIDEO_CODEC`` for each video camera
    that ``"auto"`` would keep as video but whose episodes do not each start on a keyframe
    of their file (:func:`keyframe_starts`): kept as video, those episodes would be
    quarantined (:func:`robocache.data.video_store.packet_table` needs whole GOPs). Every
    episode of the source is looked at, so that shards of one build decide alike; each
    camera so stored is said once to ``log``."""
    refs = getattr(src, "video_refs", None)
    changed = {}
    for name, spec in specs.items():
        if refs is None or camera_codec(config, name) != "auto" or \
                stored_codec(spec, "auto", stored_size(spec, config)) != "video":
            continue
        why = keyframe_starts(refs(name))
        if why is not None:
            changed[name] = UNKEPT_VIDEO_CODEC
            (log or logging.getLogger(__name__).warning)(
                f"camera {name!r} is stored as PNG (lossless: its decode's frames exactly), not "
                f"kept as video: {why}; pass camera_codec jpeg (--camera-codec jpeg) for "
                "smaller, lossy frames, or encode each episode on its own (as LeRobot records) "
                "to keep it as video.")
    return replace(config, camera_codecs={**config.camera_codecs, **changed}) if changed \
        else config


def resumed_codecs(manifest: dict[str, Any] | None, specs: dict[str, StreamSpec],
                   config: CacheConfig, log: Callable[[str], None] | None = None
                   ) -> CacheConfig:
    """``config`` with ``camera_codecs["<camera>"]`` set, for each camera left to ``"auto"``,
    to the codec the cache at the destination (its ``manifest``, ``None``: none) stores it
    with, where that differs from what ``"auto"`` gives (a cache built with ``"jpeg"`` or
    ``"png"``, e.g. before ``"auto"`` was the default): running the build again then adds
    episodes stored alike instead of refusing the cache as another one. Said once to
    ``log``."""
    streams = (manifest or {}).get("streams") or {}
    changed = {}
    for name, spec in specs.items():
        had = (streams.get(name) or {}).get("codec")
        if spec.kind not in ("image", "video") or camera_codec(config, name) != "auto" or \
                had not in ("jpeg", "png", "video"):
            continue
        if _camera_entry(spec, config, name).get("codec") != had:
            changed[name] = had
    if not changed:
        return config
    (log or logging.getLogger(__name__).warning)(
        "the cache at the destination stores " + ", ".join(
            f"camera {n!r} as {c}" for n, c in changed.items()) + "; it is extended alike "
        "(pass --camera-codec to choose, with --overwrite to build it again).")
    return replace(config, camera_codecs={**config.camera_codecs, **changed})


def keyframe_starts(refs: list[tuple[int, Any]]) -> str | None:
    """Why the episodes of ``refs`` (``(episode, VideoRef)`` each, in any order) do not each
    start on a keyframe of their video, or ``None`` when they do (or cannot be read here:
    a missing or unreadable file is the episode's own quarantine reason later): the packet
    a seek to each start lands on is a keyframe within half a frame of it. An MP4 answers
    from its sample table (:func:`robocache.data.video_store.seeked`), other files with one
    seek and one packet read an episode."""
    av = require("av", "video", "Reading video streams")
    by_file: dict[Any, list[tuple[int, float]]] = {}
    for episode, ref in refs:
        by_file.setdefault(ref.path, []).append((episode, float(ref.from_timestamp)))
    for path, starts in by_file.items():
        try:
            for episode, start, key, shown, half in _landings(path, sorted(
                    starts, key=lambda e: e[1])):
                if not key or abs(shown - start) >= half:
                    return (f"episode {episode} starts at {start:.6g} s of {path}, "
                            "which is not a keyframe")
        except (av.error.FFmpegError, OSError, IndexError, DataError):
            continue
    return None


def _landings(path, starts: list[tuple[int, float]]):
    """For each ``(episode, start)``: ``(episode, start, keyframe?, its time, half a frame)``
    of the packet a backward seek to half a frame past ``start`` lands on in ``path``."""
    from robocache.data import video_store

    src = video_store.source(path)
    half = 0.5 / (src.rate or 30.0)
    if src.track is not None:
        track, tb = src.track, src.time_base
        for episode, start in starts:
            k = video_store.seeked(track, start + half, tb)
            yield episode, start, bool(track.key[k]), float(track.pts[k] * tb), half
        return
    av = require("av", "video", "Reading video streams")
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        tb = float(stream.time_base)
        for episode, start in starts:
            container.seek(int((start + half) / tb), stream=stream, backward=True)
            key = next((p for p in container.demux(stream) if p.pts is not None), None)
            yield (episode, start, key is not None and bool(key.is_keyframe),
                   float("inf") if key is None else key.pts * tb, half)


def frame_format(config: CacheConfig) -> FrameFormat:
    """How ``config`` stores camera frames (a codec ``"auto"`` or ``"video"`` decided per
    camera by :func:`~robocache.data.cameras.camera_tables`, as :func:`stored_codec` says)."""
    return FrameFormat(config.camera_codec, config.camera_quality, config.camera_chroma)


def _camera_entry(spec: StreamSpec, config: CacheConfig, name: str) -> dict[str, Any]:
    """Manifest fields of camera stream ``name``: how its frames are stored (and at which
    shape, when resized)."""
    if spec.kind not in ("image", "video"):
        return {}
    size = stored_size(spec, config)
    codec = stored_codec(spec, camera_codec(config, name), size)
    if codec == "video":
        from robocache.data.video_store import RAW_ENCODER

        return {"codec": "video", "quality": None} if spec.kind == "video" else \
            {"codec": "video", "quality": None, "encoder": RAW_ENCODER}
    kept = spec.encoding if size is None else None  # a source's own bytes, unless resized
    codec = kept or ("png" if spec.dtype == "uint16" else codec)
    encoded = codec == "jpeg" and kept is None
    entry = {"codec": codec, "quality": config.camera_quality if encoded else None}
    if encoded:
        entry["chroma"] = config.camera_chroma
    if size is not None:
        entry.update(shape=[*size, 3], source_shape=list(spec.shape))
    return entry
