"""Camera streams: decoded once at ingest into per-frame JPEG/PNG, decoded per batch on serving.

Ingest (:func:`decode_videos`, :func:`frames_table`): a video stream's frames are decoded once with
PyAV (FFmpeg's own threads; AV1, H.264, HEVC, whatever the FFmpeg build reads), or with NVDEC
through PyNvVideoCodec (H.264 and HEVC, on a CUDA GPU; ``decoder="nvdec"``/``"auto"``, see
:func:`decode_video`), for the episode's span of the file (LeRobot v3.0 files hold many episodes:
``from_timestamp`` marks where this one starts), and every frame becomes one row of
``frames/<stream>.lance``: ``episode_index``, ``frame`` (row within the episode), ``source_frame``
(index in the source file or array), ``timestamp`` (seconds from the episode start) and ``encoded``
(the image; a source's own JPEG/PNG bytes, as RLDS stores them, are kept as they came).
RGB frames are stored as JPEG (``quality`` 95 by default: decoded, they are within 1 dB PSNR of
the source decode against the original frames; see docs) or PNG (``codec="png"``, lossless);
uint16 frames (depth) always as 16-bit PNG. Encoding runs on a thread pool (Pillow releases the
GIL). Camera streams are then aligned like any stream (``frame_index``).
:func:`robocache.data.cache.build` decodes and encodes several episodes at once on threads
(``decode_workers``): PyAV decodes and converts colours without the GIL.

Serving (:class:`EncodedFrames`, :func:`decode`): per batch, the distinct frames a batch needs
are decoded in one call per camera: ``torchvision.io.decode_jpeg(list, device="cuda")`` (nvJPEG)
when the frames go to a GPU, Pillow on the CPU (DataLoader workers, CPU-only machines).
"""

from __future__ import annotations

import functools
import io
import os
import threading
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from robocache._optional import require
from robocache.data.episode import Episode, Stream, StreamSpec
from robocache.errors import DataError
from robocache.observability import metrics

CODECS = ("jpeg", "png")
DEFAULT_QUALITY = 95
VIDEO_DECODERS = ("auto", "pyav", "nvdec")
# what NVDEC decodes here: an AV1 decoder is refused on the H100, so AV1 stays with PyAV
NVDEC_CODECS = ("h264", "hevc")
# frames per NVDEC call: bounds the decoded RGB frames held on the GPU (~1 MB each at 480x640)
NVDEC_BATCH = 32


def _threads() -> int:
    return max(1, min(16, os.cpu_count() or 1))


def _pil():
    return require("PIL.Image", "data", "Encoding camera frames", "pillow")


def is_camera(dtype, shape: tuple[int, ...]) -> bool:
    """Whether an array stream of this sample dtype and shape is a camera: uint8 ``[H, W, 3]``
    (RGB) or uint16 ``[H, W]`` / ``[H, W, 1]`` (depth)."""
    dtype = np.dtype(dtype)
    if dtype == np.uint8:
        return len(shape) == 3 and shape[-1] == 3
    return dtype == np.uint16 and (len(shape) == 2 or (len(shape) == 3 and shape[-1] == 1))


def decode_video(path, start_s: float, end_s: float, tolerance_s: float = 1e-4,
                 decoder: str = "pyav", gpu: int = 0):
    """Decode every frame of ``path`` shown in ``[start_s, end_s]`` (file seconds).

    Args:
        decoder: ``"pyav"`` (CPU), ``"nvdec"`` (NVDEC through PyNvVideoCodec for H.264/HEVC;
            PyAV for other codecs, or when NVDEC fails, with a warning) or ``"auto"`` (NVDEC
            when it is available and decodes the codec, else PyAV, silently). Either way the
            frames and timestamps are the same (PyAV reads the container's timestamps); pixel
            values differ slightly (colour conversion).
        gpu: CUDA device index NVDEC runs on.

    Returns:
        (uint8 ``[F, H, W, 3]`` frames, float64 ``[F]`` file timestamps, int64 ``[F]`` frame
        numbers in the file, at the stream's average rate).

    Raises:
        DataError: the file is missing, unreadable, truncated (no frame covers the span) or in
            a codec this FFmpeg build cannot decode.
    """
    return decode_video_with(path, start_s, end_s, tolerance_s, decoder, gpu)[:3]


def decode_video_with(path, start_s: float, end_s: float, tolerance_s: float = 1e-4,
                      decoder: str = "pyav", gpu: int = 0):
    """:func:`decode_video`, and the decoder that decoded the frames (``"pyav"`` or
    ``"nvdec"``) as a fourth element."""
    if decoder not in VIDEO_DECODERS:
        raise DataError(f"`video_decoder` (--video-decoder) must be one of {VIDEO_DECODERS}; "
                        f"got {decoder!r}.")
    if decoder != "pyav" and nvdec_available():
        try:
            return (*_decode_nvdec(path, start_s, end_s, tolerance_s, decoder, gpu), "nvdec")
        except DataError:  # missing, truncated, unreadable: PyAV says so in its own words
            pass
        except _NotForNvdec as e:
            if decoder == "nvdec":
                _warn_once(str(e).split(" ")[0], f"NVDEC does not decode {e}; PyAV decodes "
                           "it (and the other videos NVDEC does not decode).")
        except Exception as e:  # any NVDEC failure: PyAV decodes these frames instead
            _warn_once(type(e).__name__, f"NVDEC failed on {path} ({type(e).__name__}: {e}); "
                       "PyAV decodes the videos NVDEC fails on.")
    return (*_decode_pyav(path, start_s, end_s, tolerance_s), "pyav")


def _av():
    return require("av", "video", "Decoding video streams")


def _check_span(path, times: list[float], end_s: float, tolerance_s: float,
                rate: float | None) -> None:
    if not times or times[-1] < end_s - max(tolerance_s, 1.5 / (rate or 1e9)):
        got = f"up to {times[-1]:.4f} s" if times else "no frame"
        raise DataError(f"video {path}: truncated; frames are needed up to {end_s:.4f} s, the "
                        f"file decodes {got}.")


def _frame_numbers(t: np.ndarray, rate: float | None) -> np.ndarray:
    return np.rint(t * rate).astype(np.int64) if rate else np.arange(len(t), dtype=np.int64)


def video_frames(path, start_s: float, end_s: float, tolerance_s: float = 1e-4,
                 rates: list | None = None) -> Iterator[tuple[np.ndarray, float]]:
    """Decode the frames of ``path`` shown in ``[start_s, end_s]`` (file seconds) with PyAV,
    one at a time: yields (uint8 ``[H, W, 3]`` frame, file timestamp), so a caller holds only
    the frames it keeps. ``rates``: when given, the stream's average rate (or ``None``) is
    appended to it once the file is open.

    Raises:
        DataError: the file is missing, unreadable or in a codec this FFmpeg build cannot
            decode.
    """
    av = _av()
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            stream.thread_type = "AUTO"
            tb = float(stream.time_base)
            if rates is not None:
                rates.append(float(stream.average_rate or 0) or None)
            if start_s > 0:
                container.seek(int(start_s / tb), stream=stream, backward=True)
            for frame in container.decode(stream):
                if frame.pts is None:
                    continue
                t = frame.pts * tb
                if t < start_s - tolerance_s:
                    continue
                if t > end_s + tolerance_s:
                    break
                yield frame.to_ndarray(format="rgb24"), t
    except (av.error.FFmpegError, OSError, IndexError) as e:
        raise DataError(f"video {path}: cannot decode ({type(e).__name__}: {e}).") from e


def _decode_pyav(path, start_s: float, end_s: float, tolerance_s: float):
    rates: list = []
    decoded = list(video_frames(path, start_s, end_s, tolerance_s, rates))
    frames, times = [f for f, _ in decoded], [t for _, t in decoded]
    rate = rates[0] if rates else None
    _check_span(path, times, end_s, tolerance_s, rate)
    t = np.asarray(times, np.float64)
    return np.stack(frames), t, _frame_numbers(t, rate)


class _NotForNvdec(Exception):
    """A stream NVDEC is not used for (its codec): PyAV decodes it."""


# packets read past the span's end before the frames in it are known (B-frames come out of
# order: a frame shown inside the span may follow, in the file, one shown after it)
_REORDER_PACKETS = 32


def _scan(path, start_s: float, end_s: float, tolerance_s: float):
    """The span's frames, read from the container without decoding (PyAV demuxes): file
    seconds, the codec, whether it reorders frames (B-frames), the frame size, the rate and
    the display position of each frame (frame number from the stream's first)."""
    av = _av()
    pts = []
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            tb = float(stream.time_base)
            codec = stream.codec_context.name
            reordered = bool(stream.codec_context.has_b_frames)
            size = (stream.codec_context.height, stream.codec_context.width)
            rate = float(stream.average_rate or 0) or None
            first = (stream.start_time or 0) * tb
            if start_s > 0:
                container.seek(int(start_s / tb), stream=stream, backward=True)
            after = 0
            for packet in container.demux(stream):
                if packet.pts is None:
                    continue
                t = packet.pts * tb
                if t > end_s + tolerance_s:
                    after += 1
                    if after >= _REORDER_PACKETS:
                        break
                elif t >= start_s - tolerance_s:
                    pts.append(t)
    except (av.error.FFmpegError, OSError, IndexError) as e:
        raise DataError(f"video {path}: cannot decode ({type(e).__name__}: {e}).") from e
    times = sorted(set(pts))
    _check_span(path, times, end_s, tolerance_s, rate)
    t = np.asarray(times, np.float64)
    if rate is None:
        raise _NotForNvdec(f"{path}: a stream without an average frame rate")
    position = np.rint((t - first) * rate).astype(np.int64)
    return t, codec, reordered, size, rate, position


def video_times(path, start_s: float, end_s: float, tolerance_s: float = 1e-4) -> np.ndarray:
    """float64 ``[F]`` file seconds of the frames of ``path`` shown in ``[start_s, end_s]``,
    read from the container without decoding (decoded only for a stream without an average
    rate).

    Raises:
        DataError: the file is missing, unreadable or truncated.
    """
    try:
        return _scan(path, start_s, end_s, tolerance_s)[0]
    except _NotForNvdec:
        return np.asarray([t for _, t in video_frames(path, start_s, end_s, tolerance_s)],
                          np.float64)


def _decode_nvdec(path, start_s: float, end_s: float, tolerance_s: float, decoder: str,
                  gpu: int):
    """The frames of :func:`decode_video` decoded by NVDEC (PyNvVideoCodec's SimpleDecoder,
    RGB output, copied to the host in batches of :data:`NVDEC_BATCH`)."""
    import PyNvVideoCodec as nvc

    t, codec, reordered, (h, w), rate, position = _scan(path, start_s, end_s, tolerance_s)
    if codec not in NVDEC_CODECS:
        raise _NotForNvdec(f"{codec} ({path})")
    if reordered:  # H100, HEVC with B-frames: frames by index came one display position late
        raise _NotForNvdec(f"{codec}-with-B-frames ({path})")
    key = (str(path), gpu)
    if getattr(_nvdec_local, "key", None) != key:  # a file's episodes reuse its decoder
        _nvdec_local.key, _nvdec_local.decoder = None, None
        _nvdec_local.decoder = nvc.SimpleDecoder(str(path), gpu_id=gpu, use_device_memory=True,
                                                 output_color_type=nvc.OutputColorType.RGB)
        _nvdec_local.key = key
    dec = _nvdec_local.decoder
    try:
        if len(position) and int(position[-1]) >= len(dec):
            raise RuntimeError(f"frame {int(position[-1])} is past the {len(dec)} frames "
                               "NVDEC counts in the file")
        out = np.empty((len(t), h, w, 3), np.uint8)
        for a in range(0, len(t), NVDEC_BATCH):
            want = position[a:a + NVDEC_BATCH].tolist()
            got = dec.get_batch_frames_by_index(want)
            if len(got) != len(want):
                raise RuntimeError(f"asked for {len(want)} frames, got {len(got)}")
            # copied out before the next call: the decoder may reuse the frames' memory
            batch = torch.stack([_hwc(torch.from_dlpack(f)) for f in got])
            if tuple(batch.shape[1:]) != (h, w, 3):
                raise RuntimeError(f"frames of shape {tuple(batch.shape[1:])}, expected "
                                   f"{(h, w, 3)}")
            out[a:a + len(want)] = batch.cpu().numpy()
    except BaseException:
        _nvdec_local.key, _nvdec_local.decoder = None, None  # never reuse a failed decoder
        raise
    return out, t, _frame_numbers(t, rate)


# each decode worker thread's NVDEC decoder and the (file, GPU) it is open on
_nvdec_local = threading.local()


def _hwc(frame: torch.Tensor) -> torch.Tensor:
    """An RGB frame as ``[H, W, 3]`` (PyNvVideoCodec's RGB output is interleaved; planar
    ``[3, H, W]`` is accepted too)."""
    if frame.ndim == 3 and frame.shape[0] == 3 and frame.shape[-1] != 3:
        return frame.permute(1, 2, 0)
    return frame


@functools.cache
def nvdec_available() -> bool:
    """Whether NVDEC can decode at ingest: a CUDA device and PyNvVideoCodec importable."""
    import importlib.util

    return torch.cuda.is_available() and importlib.util.find_spec("PyNvVideoCodec") is not None


_warned: set[str] = set()


def _warn_once(key: str, message: str) -> None:
    """Warn with ``message`` the first time ``key`` comes (one warning per kind of fallback,
    not one per episode)."""
    if key not in _warned:
        _warned.add(key)
        warnings.warn(message, stacklevel=4)


def decode_videos(episode: Episode, specs: dict[str, StreamSpec],
                  tolerance_s: float = 1e-4, decoder: str = "pyav", gpu: int = 0) -> None:
    """Replace each video stream of ``episode`` by its decoded frames (in place): the frames
    covering the episode's steps, timed from the episode start, with their source frame
    numbers in ``episode.meta["source_frame"][name]`` and the decoder that decoded them
    (``"pyav"``/``"nvdec"``) in ``episode.meta["video_decoder"][name]`` (``decoder``: see
    :func:`decode_video`)."""
    for name, spec in specs.items():
        s = episode.streams.get(name)
        if spec.kind != "video" or s is None or s.video is None:
            continue
        if len(s) == 0:
            raise DataError(f"episode {episode.index}: stream {name!r} has no samples.")
        start = s.video.from_timestamp
        frames, t, index, used = decode_video_with(
            s.video.path, start + float(s.times[0]), start + float(s.times[-1]), tolerance_s,
            decoder, gpu)
        episode.streams[name] = Stream(spec, t - start, frames, s.video)
        episode.meta.setdefault("source_frame", {})[name] = index
        episode.meta.setdefault("video_decoder", {})[name] = used


def encode(frame: np.ndarray, codec: str, quality: int) -> bytes:
    """One frame (uint8 ``[H, W, 3]`` or ``[H, W]``, uint16 ``[H, W]``/``[H, W, 1]``) as
    JPEG or PNG bytes (uint16 always PNG, lossless)."""
    Image = _pil()
    buf = io.BytesIO()
    if frame.dtype == np.uint16:
        Image.fromarray(np.ascontiguousarray(frame.reshape(frame.shape[:2]))).save(buf, "PNG")
    elif codec == "png":
        Image.fromarray(np.ascontiguousarray(frame.squeeze())).save(buf, "PNG", compress_level=1)
    else:
        Image.fromarray(np.ascontiguousarray(frame.squeeze())).save(buf, "JPEG",
                                                                    quality=quality)
    return buf.getvalue()


def resize(frame: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """An RGB uint8 ``[H, W, 3]`` frame at ``size`` ``(height, width)``: Pillow's bilinear
    filter, antialiased when shrinking (what ``torchvision.transforms.v2.Resize`` with
    ``antialias=True`` approximates)."""
    if frame.shape[:2] == tuple(size):
        return frame
    image = _pil().fromarray(np.ascontiguousarray(frame))
    return np.asarray(image.resize((size[1], size[0]), _pil().Resampling.BILINEAR))


def frames_table(episode: Episode, name: str, spec: StreamSpec, codec: str = "jpeg",
                 quality: int = DEFAULT_QUALITY, threads: int | None = None,
                 size: tuple[int, int] | None = None):
    """The Lance rows of one camera stream of one episode (see the module docstring), encoded
    on ``threads`` threads (default: the cores, at most 16); RGB frames resized to ``size``
    ``(height, width)`` first when given (antialiased bilinear, as Pillow resizes)."""
    pa = require("pyarrow", "data", "Arrow tables")

    s = episode.streams[name]
    n = len(s)
    if spec.encoding is not None and size is None:  # the source's own JPEG/PNG bytes: kept
        data = list(s.data)
    else:
        def one(frame) -> bytes:
            if spec.encoding is not None:  # the source's bytes, decoded to be resized
                frame = np.asarray(_pil().open(io.BytesIO(bytes(frame))).convert("RGB"))
            if size is not None:
                frame = resize(frame, size)
            return encode(frame, codec, quality)

        if (threads or _threads()) == 1:
            data = [one(f) for f in s.data]
        else:
            with ThreadPoolExecutor(threads or _threads()) as pool:
                data = list(pool.map(one, s.data))
    source = episode.meta.get("source_frame", {}).get(name, np.arange(n, dtype=np.int64))
    return pa.table({"episode_index": np.full(n, episode.index, np.int64),
                     "frame": np.arange(n, dtype=np.int64), "source_frame": source,
                     "timestamp": s.times, "encoded": pa.array(data, pa.binary())})


@dataclass
class EncodedFrames:
    """One camera's encoded frames, packed: ``data`` uint8 ``[bytes]`` and ``offsets`` int64
    ``[F + 1]`` (frame i is ``data[offsets[i]:offsets[i+1]]``), in (episode, frame) order;
    ``frame_shape`` is a decoded frame's (``[H, W, C]`` or ``[H, W]``)."""

    data: torch.Tensor
    offsets: torch.Tensor
    frame_shape: tuple[int, ...]
    dtype: str
    codec: str = "jpeg"

    @property
    def shape(self) -> tuple[int, ...]:
        """``(frames, *frame_shape)``, as the decoded frames would be."""
        return (len(self), *self.frame_shape)

    @property
    def channels(self) -> int:
        return self.frame_shape[2] if len(self.frame_shape) == 3 else 1

    @staticmethod
    def cat(parts: list[EncodedFrames], blank: bool = False) -> EncodedFrames:
        """Frames of several caches one after the other (plus one all-zero frame at the end
        when ``blank``, for rows whose source lacks the camera).

        Raises:
            DataError: the parts differ in frame shape, dtype or codec.
        """
        first = parts[0]
        if any((p.frame_shape, p.dtype, p.codec) != (first.frame_shape, first.dtype, first.codec)
               for p in parts):
            raise DataError("camera frames differ in shape, dtype or codec between caches "
                            f"({sorted({(p.frame_shape, p.dtype, p.codec) for p in parts})}); "
                            "ingest them with the same --camera-codec and frame size.")
        datas = [p.data for p in parts]
        if blank:
            zero = np.zeros(first.frame_shape, np.dtype(first.dtype))
            datas.append(torch.frombuffer(bytearray(encode(zero, first.codec, DEFAULT_QUALITY)),
                                          dtype=torch.uint8))
        sizes = torch.tensor([0] + [d.numel() for d in datas]).cumsum(0)
        offsets = [p.offsets[:-1] + sizes[i] for i, p in enumerate(parts)]
        if blank:
            offsets.append(sizes[-2:-1])
        return EncodedFrames(torch.cat(datas), torch.cat([*offsets, sizes[-1:]]),
                             first.frame_shape, first.dtype, first.codec)

    @classmethod
    def from_table(cls, table, shape, dtype: str, codec: str) -> EncodedFrames:
        pa = require("pyarrow", "data", "Arrow tables")

        col = table.column("encoded").combine_chunks().cast(pa.large_binary())
        offsets = np.frombuffer(col.buffers()[1], np.int64)[col.offset:col.offset + len(col) + 1]
        values = np.frombuffer(col.buffers()[2], np.uint8)[offsets[0]:offsets[-1]]
        return cls(torch.from_numpy(values.copy()), torch.from_numpy(offsets - offsets[0]),
                   tuple(shape), dtype, codec)

    def __len__(self) -> int:
        return int(self.offsets.shape[0]) - 1

    @property
    def nbytes(self) -> int:
        return int(self.data.numel())

    def slices(self, rows: torch.Tensor) -> list[torch.Tensor]:
        """Frame ``i``'s bytes for each ``i`` of ``rows`` (int ``[F]``), as views of ``data``."""
        rows = rows.cpu()
        off, end = self.offsets[rows].tolist(), self.offsets[rows + 1].tolist()
        return [self.data[a:b] for a, b in zip(off, end, strict=True)]


def decode(frames: EncodedFrames, rows: torch.Tensor, device: torch.device | str = "cpu"
           ) -> torch.Tensor:
    """Decode the frames at ``rows`` (int ``[...]``): uint8 ``[..., C, H, W]`` (uint16 for
    depth) on ``device``: one nvJPEG batch on CUDA (``torchvision.io.decode_jpeg``; without
    torchvision, or for PNG, Pillow then a copy), Pillow on a thread pool on the CPU."""
    return decode_all([(frames, rows)], device)[0]


def decode_all(cameras: list[tuple[EncodedFrames, torch.Tensor]],
               device: torch.device | str = "cpu") -> list[torch.Tensor]:
    """:func:`decode` of several cameras' ``(frames, rows)``: the rows come to the host in
    one copy (one sync when they live on the GPU), and on CUDA the RGB JPEG cameras' frames
    are decoded in one nvJPEG batch. Each distinct frame of a camera is decoded once (rows
    repeat at padded steps, in overlapping windows, and at a mixture's blank frame for the
    sources without the camera), then gathered back to its rows on ``device``."""
    device = torch.device(device)
    if not cameras:
        return []
    flat = [r.reshape(-1) for _, r in cameras]
    host = torch.cat(flat).cpu().split([r.numel() for r in flat])
    distinct = [torch.unique(r, return_inverse=True) for r in host]
    inverse = torch.cat([inv for _, inv in distinct])
    if device.type == "cuda":  # pinned: the copy waits for nothing queued on the stream
        inverse = inverse.pin_memory()
    inverse = inverse.to(device, non_blocking=True).split([r.numel() for r in flat])
    out: list[torch.Tensor | None] = [None] * len(cameras)
    batch = [i for i, (f, _) in enumerate(cameras) if device.type == "cuda" and
             f.codec == "jpeg" and f.channels == 3]
    decode_jpeg = _nvjpeg() if batch else None
    if decode_jpeg is not None:
        from torchvision.io import ImageReadMode

        parts = [p for i in batch for p in cameras[i][0].slices(distinct[i][0])]
        frames = decode_jpeg(parts, mode=ImageReadMode.RGB, device=device) if parts else []
        metrics.count_frames("nvjpeg", len(parts))
        for i in batch:  # each camera stacked, its per-frame tensors freed
            f, n = cameras[i][0], distinct[i][0].numel()
            h, w = f.frame_shape[:2]
            out[i] = torch.stack(frames[:n]) if n else \
                torch.empty(0, 3, h, w, dtype=torch.uint8, device=device)
            del frames[:n]
    for i, (f, _) in enumerate(cameras):
        if out[i] is None:
            out[i] = _decode_pil(f, distinct[i][0], device)
            metrics.count_frames("cpu", distinct[i][0].numel())
    return [o[inv].reshape(*rows.shape, *o.shape[1:])
            for o, inv, (_, rows) in zip(out, inverse, cameras, strict=True)]


def _decode_pil(frames: EncodedFrames, rows: torch.Tensor, device: torch.device
                ) -> torch.Tensor:
    """The frames at ``rows`` (int ``[N]``) decoded by Pillow: ``[N, C, H, W]`` on
    ``device``."""
    parts = frames.slices(rows)
    h, w, c = frames.frame_shape[0], frames.frame_shape[1], frames.channels
    Image = _pil()
    out = np.empty((len(parts), h, w, c), np.uint16 if frames.dtype == "uint16" else np.uint8)

    def one(i: int) -> None:
        with Image.open(io.BytesIO(parts[i].numpy().tobytes())) as im:
            out[i] = np.asarray(im.convert("RGB") if c == 3 else im).reshape(h, w, c)

    with ThreadPoolExecutor(_threads()) as pool:  # Pillow decodes without the GIL
        list(pool.map(one, range(len(parts))))
    return torch.from_numpy(out).permute(0, 3, 1, 2).to(device)


@functools.cache
def _nvjpeg():
    """``torchvision.io.decode_jpeg``, or None (with a warning, once) without torchvision."""
    try:
        from torchvision.io import decode_jpeg
    except ImportError:
        warnings.warn("torchvision is not installed: camera frames are decoded on the CPU and "
                      "copied to the GPU; `pip install torchvision` decodes them with nvJPEG.",
                      stacklevel=3)
        return None
    return decode_jpeg


def serve(frames: torch.Tensor, size: tuple[int, int] | None, params, dtype: torch.dtype
          ) -> torch.Tensor:
    """Decoded uint8 ``[B, T, 3, H, W]`` frames -> ``[B, T, 3, h, w]`` of ``dtype`` in [0, 1]
    (uint8 kept as is), resized to ``size`` and transformed with ``params`` (one row per
    frame; ``None``: none). Other frames (depth) are returned unchanged."""
    from robocache.ops.image import image_transform

    b, t, c, H, W = frames.shape
    h, w = size or (H, W)
    if c != 3 or frames.dtype != torch.uint8:
        return frames
    if params is None and (h, w) == (H, W):
        if dtype == torch.uint8:
            return frames
        # x / 255 exactly as LeRobot computes it: the divisor is a tensor on the frames' device,
        # since CUDA divides by a Python number as a multiply by its reciprocal (one ulp off)
        return (frames.float() / frames.new_tensor(255.0, dtype=torch.float32)).to(dtype)
    flat = frames.reshape(b * t, c, H, W)
    return image_transform(flat, (h, w), params, dtype=dtype).reshape(b, t, 3, h, w)


def write_video(path, frames, fps: float, codec: str = "libsvtav1",
                options: dict[str, str] | None = None) -> list[int]:
    """Encode uint8 ``[F, H, W, 3]`` frames (or an iterable of such arrays, written one after
    another without holding them all) as an mp4 the way LeRobot records cameras (PyAV,
    yuv420p, keyframe every 2 frames, CRF 30; ``codec`` ``"libsvtav1"`` (AV1, LeRobot's
    default), ``"libx264"`` or ``"libx265"``). Returns the frame count of each array."""
    from fractions import Fraction

    av = require("av", "video", "Writing video streams")
    chunks = [frames] if isinstance(frames, np.ndarray) else frames
    opts = {"g": "2", "crf": "30", **({"preset": "12"} if codec == "libsvtav1" else {}),
            **(options or {})}
    counts = []
    with av.open(str(path), "w") as out:
        stream = None
        for chunk in chunks:
            if stream is None:
                stream = out.add_stream(codec, Fraction(fps).limit_denominator(1001),
                                        options=opts)
                stream.pix_fmt = "yuv420p"
                stream.height, stream.width = chunk.shape[1:3]
            for f in chunk:
                out.mux(stream.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(f),
                                                                 format="rgb24")))
            counts.append(len(chunk))
        if stream is not None:
            out.mux(stream.encode())
    return counts


def add_video_feature(root, key: str, frames, *, fps: float | None = None,
                      codec: str = "libsvtav1", options: dict[str, str] | None = None) -> None:
    """Add a camera to a LeRobot v3.0 dataset directory as LeRobot stores one: every
    episode's frames (uint8 ``[F_e, H, W, 3]`` at ``fps``, default the dataset's, the first at
    the episode's start; a list, or any iterable of them, encoded as they come) concatenated in
    ``videos/<key>/chunk-000/file-000.mp4``, each episode's ``from_timestamp`` /
    ``to_timestamp`` in the episode metadata, the feature in ``meta/info.json``. ``options``:
    encoder options over :func:`write_video`'s (e.g. ``{"bf": "0"}``: no B-frames)."""
    add_video_features(root, {key: frames}, fps=fps, codec=codec, options=options)


def add_video_features(root, cameras: dict, *, fps: float | None = None,
                       codec: str = "libsvtav1", options: dict[str, str] | None = None) -> None:
    """:func:`add_video_feature` of several cameras (key -> its episodes' frames), their
    videos encoded at once on threads (PyAV encodes without the GIL), the metadata written
    once they are all done."""
    import json
    from pathlib import Path

    pa = require("pyarrow", "data", "Arrow tables")
    pq = require("pyarrow.parquet", "data", "Parquet files")

    root = Path(root)
    info = json.loads((root / "meta" / "info.json").read_text())
    if info.get("codebase_version") != "v3.0":
        raise DataError(f"{root}: add_video_feature writes LeRobot v3.0 datasets only.")
    fps = float(fps or info["fps"])

    def one(key: str):
        rel = info["video_path"].format(video_key=key, chunk_index=0, file_index=0)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        shape = []
        lengths = write_video(root / rel, (shape.append(f.shape[1:3]) or f
                                           for f in cameras[key]), fps, codec, options)
        return shape[0], lengths

    with ThreadPoolExecutor(len(cameras)) as pool:
        written = dict(zip(cameras, pool.map(one, cameras), strict=True))
    meta = root / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
    table = pq.read_table(meta)
    for key, ((h, w), lengths) in written.items():
        info["features"][key] = {
            "dtype": "video", "shape": [h, w, 3], "names": ["height", "width", "channels"],
            "info": {"video.height": h, "video.width": w,
                     "video.codec": codec.removeprefix("lib"), "video.pix_fmt": "yuv420p",
                     "video.is_depth_map": False, "video.fps": fps, "video.channels": 3,
                     "has_audio": False}}
        bounds = np.cumsum([0] + lengths) / fps
        n = len(lengths)
        for name, values in (("chunk_index", [0] * n), ("file_index", [0] * n),
                             ("from_timestamp", bounds[:-1]), ("to_timestamp", bounds[1:])):
            table = table.append_column(f"videos/{key}/{name}", pa.array(values))
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=2) + "\n")
    pq.write_table(table, meta)
