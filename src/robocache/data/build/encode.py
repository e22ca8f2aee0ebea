"""Stage 3, encode: how camera frames are stored (codec, quality, chroma, size). The frames
themselves are encoded by :mod:`robocache.data.cameras`.
"""

from __future__ import annotations

from typing import Any

from robocache.data.build.config import CacheConfig
from robocache.data.cameras import FrameFormat
from robocache.data.episode import StreamSpec


def stored_size(spec: StreamSpec, config: CacheConfig) -> tuple[int, int] | None:
    """The ``(height, width)`` a camera stream's frames are resized to at ingest: the
    ``camera_size`` of ``config`` for RGB uint8 frames, else ``None`` (stored as they come)."""
    if config.camera_size is None or spec.kind not in ("image", "video") or \
            spec.dtype != "uint8" or len(spec.shape) != 3 or spec.shape[2] != 3:
        return None
    return tuple(config.camera_size)


def frame_format(config: CacheConfig) -> FrameFormat:
    """How ``config`` stores camera frames."""
    return FrameFormat(config.camera_codec, config.camera_quality, config.camera_chroma)


def kept_as_video(spec: StreamSpec, codec: str) -> bool:
    """Whether camera ``spec`` is stored as video (``codec`` ``"video"``): an RGB video stream
    (its source's packets), or RGB raw frames of even size (encoded once, H.264:
    :func:`robocache.data.video_store.encoded_table`). Other cameras of such a build are
    stored as JPEG (a source's own JPEG/PNG bytes kept as they come)."""
    rgb = spec.dtype == "uint8" and len(spec.shape) == 3 and spec.shape[2] == 3
    raw = spec.kind == "image" and spec.encoding is None and rgb and \
        spec.shape[0] % 2 == 0 and spec.shape[1] % 2 == 0
    return codec == "video" and ((spec.kind == "video" and rgb) or raw)


def _camera_entry(spec: StreamSpec, config: CacheConfig) -> dict[str, Any]:
    """Manifest fields of a camera stream: how its frames are stored (and at which shape,
    when resized)."""
    if spec.kind not in ("image", "video"):
        return {}
    if kept_as_video(spec, config.camera_codec):
        from robocache.data.video_store import RAW_ENCODER

        return {"codec": "video", "quality": None} if spec.kind == "video" else \
            {"codec": "video", "quality": None, "encoder": RAW_ENCODER}
    size = stored_size(spec, config)
    kept = spec.encoding if size is None else None  # a source's own bytes, unless resized
    codec = kept or ("png" if spec.dtype == "uint16" else
                     "jpeg" if config.camera_codec == "video" else config.camera_codec)
    encoded = codec == "jpeg" and kept is None
    entry = {"codec": codec, "quality": config.camera_quality if encoded else None}
    if encoded:
        entry["chroma"] = config.camera_chroma
    if size is not None:
        entry.update(shape=[*size, 3], source_shape=list(spec.shape))
    return entry
