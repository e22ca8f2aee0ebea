"""Camera streams: decoded once at ingest into per-frame JPEG/PNG, decoded per batch on serving.

Ingest (:func:`camera_tables`, :func:`frames_table`): every camera stream of an episode becomes
the rows of ``frames/<stream>.lance``: ``episode_index``, ``frame`` (row within the episode),
``source_frame`` (index in the source file or array), ``timestamp`` (seconds from the episode
start) and ``encoded`` (the image).

- A source's own JPEG/PNG bytes (RLDS, LeRobot image features, encoded zarr/robomimic frames)
  are kept as they came, unless a resize is asked for.
- A video stream is decoded over the episode's span of its file (LeRobot v3.0 files hold many
  episodes: ``from_timestamp`` marks where this one starts) and encoded as it decodes, one
  frame at a time: with PyAV in a worker process (:func:`worker_pool`; one decoder per stream,
  each process with its own interpreter and GIL; the encoded frames handed back through a
  shared-memory file), or, with ``decoder="nvdec"``/``"auto"``, with NVDEC through
  PyNvVideoCodec on the calling thread (H.264 and HEVC; one decoder per thread, moved from
  file to file), the frames then JPEG-encoded on the same GPU by nvJPEG in batches
  (:func:`robocache.data.jpeg.encode_cuda`) and only the bytes copied to the host; in a
  large build, on the threads of one lane process per GPU (:mod:`robocache.data.lanes`),
  beside the PyAV worker processes with ``"auto"``.
- Frames stored at another size (``sizes``) are resized in the colour conversion's swscale
  pass (video) or by Pillow (arrays, a source's own image bytes).
- RGB frames are stored as JPEG (:class:`FrameFormat`: quality 95 and 4:4:4 chroma by default,
  within 40 dB PSNR of the source's own decode on sharp-edged content, see docs/cameras.md;
  libjpeg-turbo on the CPU, :mod:`robocache.data.jpeg`) or PNG (``codec="png"``, lossless);
  uint16 frames (depth) always as 16-bit PNG.

Camera streams are then aligned like any stream (``frame_index``).

Serving (:class:`EncodedFrames`, :func:`decode`): per batch, the distinct frames a batch needs
are decoded in one call per camera: ``torchvision.io.decode_jpeg(list, device="cuda")`` (nvJPEG)
when the frames go to a GPU; on the CPU (DataLoader workers, CPU-only machines) libjpeg-turbo
through simplejpeg for JPEG, Pillow for PNG.
"""

from __future__ import annotations

import contextlib
import functools
import io
import logging
import os
import select
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from robocache._optional import require
from robocache.data import jpeg
from robocache.data.episode import Episode, Stream, StreamSpec
from robocache.data.frames import EncodedFrames, StackedRead
from robocache.errors import DataError
from robocache.observability import metrics

if TYPE_CHECKING:
    from robocache.data.lanes import Lane

CODECS = ("jpeg", "png", "video")
DEFAULT_QUALITY = jpeg.DEFAULT_QUALITY
DEFAULT_CHROMA = jpeg.DEFAULT_CHROMA
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
                      decoder: str = "pyav", gpu: int = 0, gray: bool = False):
    """:func:`decode_video`, and the decoder that decoded the frames (``"pyav"`` or
    ``"nvdec"``) as a fourth element. ``gray``: a 12-bit grey video (LeRobot's depth videos),
    decoded by PyAV as uint16 ``[F, H, W, 1]`` codes."""
    _check_decoder(decoder)
    got = None if gray else _nvdec_attempt(path, start_s, end_s, tolerance_s, decoder, gpu)
    if got is not None:
        return np.stack(got[0]), got[1], got[2], "nvdec"
    frames, t, index = _decode_pyav(path, start_s, end_s, tolerance_s, gray=gray)
    return np.stack(frames), t, index, "pyav"


def _check_decoder(decoder: str) -> None:
    if decoder not in VIDEO_DECODERS:
        raise DataError(f"`video_decoder` (--video-decoder) must be one of {VIDEO_DECODERS}; "
                        f"got {decoder!r}.")


def _nvdec_attempt(path, start_s: float, end_s: float, tolerance_s: float, decoder: str,
                   gpu: int, each=None):
    """:func:`_decode_nvdec` where ``decoder`` asks for NVDEC and it is available, else (or
    where NVDEC is not used for the stream, or fails on it: warned once per kind, as
    :func:`decode_video` says) ``None``: PyAV decodes the span."""
    if decoder == "pyav" or not nvdec_available():
        return None
    try:
        return _decode_nvdec(path, start_s, end_s, tolerance_s, gpu, each)
    except DataError:  # missing, truncated, unreadable, a bad frame: PyAV says so in its words
        return None
    except _NotForNvdec as e:
        if decoder == "nvdec":
            _warn_once(str(e).split(" ")[0], f"NVDEC does not decode {e}; PyAV decodes "
                       "it (and the other videos NVDEC does not decode).")
    except Exception as e:  # any NVDEC failure: PyAV decodes these frames instead
        _warn_once(type(e).__name__, f"NVDEC failed on {path} ({type(e).__name__}: {e}); "
                   "PyAV decodes the videos NVDEC fails on.")
    return None


def _av():
    return require("av", "video", "Decoding video streams")


def _covered(times: list[float], end_s: float, tolerance_s: float, rate: float | None) -> bool:
    return bool(times) and times[-1] >= end_s - max(tolerance_s, 1.5 / (rate or 1e9))


def _check_span(path, times: list[float], end_s: float, tolerance_s: float,
                rate: float | None, later: float | None = None) -> None:
    """Refuse a span whose frames stop before ``end_s``: a truncated file, or (``later``: the
    time of a frame after the span) one whose timestamps jump past the span's end."""
    if _covered(times, end_s, tolerance_s, rate):
        return
    if later is not None:
        last = f"{times[-1]:.4f} s" if times else "the span's start"
        raise DataError(f"video {path}: frames are needed up to {end_s:.4f} s, but the file's "
                        f"timestamps jump from {last} to {later:.4f} s (missing frames or a "
                        "timestamp jump).")
    got = f"up to {times[-1]:.4f} s" if times else "no frame"
    raise DataError(f"video {path}: truncated; frames are needed up to {end_s:.4f} s, the "
                    f"file decodes {got}.")


def _frame_numbers(t: np.ndarray, rate: float | None) -> np.ndarray:
    return np.rint(t * rate).astype(np.int64) if rate else np.arange(len(t), dtype=np.int64)


def video_frames(path, start_s: float, end_s: float, tolerance_s: float = 1e-4,
                 info: dict | None = None, threads: int = 0,
                 size: tuple[int, int] | None = None,
                 gray: bool = False) -> Iterator[tuple[np.ndarray, float]]:
    """Decode the frames of ``path`` shown in ``[start_s, end_s]`` (file seconds) with PyAV,
    one at a time: yields (uint8 ``[H, W, 3]`` frame, file timestamp), so a caller holds only
    the frames it keeps. ``info``: when given, ``info["rate"]`` is set to the stream's average
    rate (or ``None``) once the file is open, ``info["later"]`` to the time of the first frame
    after the span when one is met, and ``info["shape"]`` to each frame's decoded
    ``(H, W, 3)`` before it is yielded. ``threads``: FFmpeg's decoder threads (0: its own
    choice, frame and slice threads over the cores). ``size``: ``(height, width)`` the frames
    are converted to in the same swscale pass as the colour conversion (bilinear, antialiased
    when shrinking, as Pillow's resize: 40.9-41.4 dB of it at 224x224 on the benchmark's
    frames, 0.46-0.49 against 1.83-1.88 ms a 480x640 frame for the conversion then Pillow's
    resize; benchmarks/results/cameras-profile-cpu-2026-11-27.json). ``gray``: the frames
    as 12-bit grey codes, uint16 ``[H, W, 1]`` (LeRobot's depth videos, as LeRobot decodes
    them; ``size`` not applied).

    Raises:
        DataError: the file is missing, unreadable or in a codec this FFmpeg build cannot
            decode.
    """
    av = _av()
    from av.video.reformatter import VideoReformatter

    # one colour converter for the span: frame.to_ndarray(format=...) sets up swscale anew for
    # every frame (480x640 H.264: 0.36 against 0.18 ms a frame, same pixels)
    rgb = VideoReformatter()
    times: list[float] = []
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            if threads != 1:
                stream.thread_type = "AUTO"
            stream.codec_context.thread_count = threads
            tb = float(stream.time_base)
            rate = float(stream.average_rate or 0) or None
            if info is not None:
                info["rate"] = rate
            if start_s > 0:
                container.seek(int(start_s / tb), stream=stream, backward=True)
            scale = {} if size is None else {"height": size[0], "width": size[1],
                                             "interpolation": "BILINEAR"}
            try:
                for frame in container.decode(stream):
                    if frame.pts is None:
                        continue
                    t = frame.pts * tb
                    if t < start_s - tolerance_s:
                        continue
                    if t > end_s + tolerance_s:
                        if info is not None:
                            info["later"] = t
                        break
                    times.append(t)
                    if info is not None:
                        info["shape"] = (frame.height, frame.width, 1 if gray else 3)
                    if gray:
                        yield frame.to_ndarray(format="gray12le")[..., None], t
                        continue
                    yield rgb.reformat(frame, format="rgb24", **scale).to_ndarray(), t
            except (av.error.FFmpegError, OSError) as e:
                # a corrupt packet after the span's last frame (a truncated file's next
                # episode, met while looking for the end) does not concern this span
                if not _covered(times, end_s, tolerance_s, rate):
                    raise
                logging.getLogger(__name__).debug("video %s: %s after %.4f s", path, e, end_s)
    except (av.error.FFmpegError, OSError, IndexError) as e:
        raise DataError(f"video {path}: cannot decode ({type(e).__name__}: {e}).") from e


def _decode_pyav(path, start_s: float, end_s: float, tolerance_s: float, each=None,
                 threads: int = 0, size: tuple[int, int] | None = None,
                 info: dict | None = None, gray: bool = False):
    """The span's frames decoded by PyAV (:func:`video_frames`, its ``info``, ``threads``,
    ``size`` and ``gray``): (``each(frame)`` of every rgb24 frame (grey codes with ``gray``)
    as it is decoded, the frame itself by default; file seconds; frame numbers)."""
    info = {} if info is None else info
    kept, times = [], []
    for image, t in video_frames(path, start_s, end_s, tolerance_s, info, threads, size,
                                 gray):
        kept.append(image if each is None else each(image))
        times.append(t)
    rate = info.get("rate")
    _check_span(path, times, end_s, tolerance_s, rate, info.get("later"))
    t = np.asarray(times, np.float64)
    return kept, t, _frame_numbers(t, rate)


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
            after, later = 0, None
            for packet in container.demux(stream):
                if packet.pts is None:
                    continue
                t = packet.pts * tb
                if t > end_s + tolerance_s:
                    later = t if later is None else min(later, t)
                    after += 1
                    if after >= _REORDER_PACKETS:
                        break
                elif t >= start_s - tolerance_s:
                    pts.append(t)
    except (av.error.FFmpegError, OSError, IndexError) as e:
        raise DataError(f"video {path}: cannot decode ({type(e).__name__}: {e}).") from e
    times = sorted(set(pts))
    _check_span(path, times, end_s, tolerance_s, rate, later)
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


def _decode_nvdec(path, start_s: float, end_s: float, tolerance_s: float, gpu: int,
                  each=None):
    """The span's frames decoded by NVDEC (PyNvVideoCodec's SimpleDecoder, RGB output, in
    batches of :data:`NVDEC_BATCH` frames on GPU ``gpu``): (what ``each(batch)`` returns for
    every uint8 ``[n, H, W, 3]`` CUDA batch, concatenated, by default the frames copied to
    the host; file seconds; frame numbers)."""
    import PyNvVideoCodec as nvc

    t, codec, reordered, (h, w), rate, position = _scan(path, start_s, end_s, tolerance_s)
    if codec not in NVDEC_CODECS:
        raise _NotForNvdec(f"{codec} ({path})")
    if reordered:  # H100, HEVC with B-frames: frames by index came one display position late
        raise _NotForNvdec(f"{codec}-with-B-frames ({path})")
    kept = []
    try:
        dec = _nvdec_decoder(nvc, str(path), gpu)
        if len(position) and int(position[-1]) >= len(dec):
            raise RuntimeError(f"frame {int(position[-1])} is past the {len(dec)} frames "
                               "NVDEC counts in the file")
        for a in range(0, len(t), NVDEC_BATCH):
            want = position[a:a + NVDEC_BATCH].tolist()
            got = dec.get_batch_frames_by_index(want)
            if len(got) != len(want):
                raise RuntimeError(f"asked for {len(want)} frames, got {len(got)}")
            # used before the next call: the decoder may reuse the frames' memory
            batch = torch.stack([_hwc(torch.from_dlpack(f)) for f in got])
            if tuple(batch.shape[1:]) != (h, w, 3):
                raise RuntimeError(f"frames of shape {tuple(batch.shape[1:])}, expected "
                                   f"{(h, w, 3)}")
            kept.extend(list(batch.cpu().numpy()) if each is None else each(batch))
    except BaseException:
        _nvdec_local.decoder = None  # never reuse a failed decoder
        raise
    return kept, t, _frame_numbers(t, rate)


# each decode worker thread's NVDEC decoder, the GPU it runs on and the file it is open on
_nvdec_local = threading.local()


def _nvdec_decoder(nvc, path: str, gpu: int):
    """This thread's NVDEC decoder (PyNvVideoCodec's SimpleDecoder, RGB frames in device
    memory) open on ``path``: created once per thread and GPU, then moved from file to file by
    ``reconfigure_decoder``, which reuses PyNvVideoCodec's cached decoder sessions instead of
    creating one per file (a LeRobot v2.1 dataset has one short file per episode and camera;
    PyNvVideoCodec's own cached-decoder benchmark reuses decoders this way for short clips).
    A file's episodes reuse the decoder as it is."""
    local = _nvdec_local
    if getattr(local, "decoder", None) is None or local.gpu != gpu:
        local.decoder = None
        local.decoder = nvc.SimpleDecoder(path, gpu_id=gpu, use_device_memory=True,
                                          output_color_type=nvc.OutputColorType.RGB)
        local.gpu, local.path = gpu, path
    elif local.path != path:
        torch.cuda.current_stream(gpu).synchronize()  # the last frames' memory is reused
        local.path = None
        local.decoder.reconfigure_decoder(path)
        local.path = path
    return local.decoder


def _hwc(frame: torch.Tensor) -> torch.Tensor:
    """An RGB frame as ``[H, W, 3]`` (PyNvVideoCodec's RGB output is interleaved; planar
    ``[3, H, W]`` is accepted too)."""
    if frame.ndim == 3 and frame.shape[0] == 3 and frame.shape[-1] != 3:
        return frame.permute(1, 2, 0)
    return frame


@functools.cache
def nvdec_available() -> bool:
    """Whether NVDEC can decode here: a CUDA device and PyNvVideoCodec importable."""
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
            decoder, gpu, gray=_gray(spec))
        episode.streams[name] = Stream(spec, t - start, frames, s.video)
        episode.meta.setdefault("source_frame", {})[name] = index
        episode.meta.setdefault("video_decoder", {})[name] = used


def encode(frame: np.ndarray, codec: str, quality: int = DEFAULT_QUALITY,
           chroma: str = DEFAULT_CHROMA) -> bytes:
    """One frame (uint8 ``[H, W, 3]`` or ``[H, W]``, uint16 ``[H, W]``/``[H, W, 1]``) as
    JPEG (libjpeg-turbo, ``quality``, ``chroma`` subsampling) or PNG bytes (uint16 always PNG,
    lossless); with ``codec="tiff"`` (or a float32 ``[H, W, 1]`` depth map) as raw TIFF."""
    if frame.dtype == np.uint8 and codec == "jpeg":
        return jpeg.encode(frame, quality, chroma)
    Image = _pil()
    buf = io.BytesIO()
    if codec == "tiff" or frame.dtype == np.float32:  # a LeRobot depth map's own format
        Image.fromarray(np.ascontiguousarray(frame.reshape(frame.shape[:2]))).save(
            buf, "TIFF", compression="raw")
    elif frame.dtype == np.uint16:
        Image.fromarray(np.ascontiguousarray(frame.reshape(frame.shape[:2]))).save(buf, "PNG")
    else:
        Image.fromarray(np.ascontiguousarray(frame.squeeze())).save(buf, "PNG", compress_level=1)
    return buf.getvalue()


@dataclass(frozen=True)
class FrameFormat:
    """How a cache stores camera frames: ``codec`` ``"jpeg"`` or ``"png"``, and for JPEG the
    ``quality`` (1-100) and ``chroma`` subsampling (``"444"``: none, ``"422"``, ``"420"``)."""

    codec: str = "jpeg"
    quality: int = DEFAULT_QUALITY
    chroma: str = DEFAULT_CHROMA

    def encode(self, frame: np.ndarray) -> bytes:
        """One frame as :func:`encode` stores it."""
        return encode(frame, self.codec, self.quality, self.chroma)


def resize(frame: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """An RGB uint8 ``[H, W, 3]`` frame at ``size`` ``(height, width)``: Pillow's bilinear
    filter, antialiased when shrinking (what ``torchvision.transforms.v2.Resize`` with
    ``antialias=True`` approximates)."""
    if frame.shape[:2] == tuple(size):
        return frame
    image = _pil().fromarray(np.ascontiguousarray(frame))
    return np.asarray(image.resize((size[1], size[0]), _pil().Resampling.BILINEAR))


def frames_table(episode: Episode, name: str, spec: StreamSpec,
                 fmt: FrameFormat = FrameFormat(), size: tuple[int, int] | None = None):
    """The Lance rows of one camera stream of one episode whose frames it holds (see the
    module docstring): a source's own JPEG/PNG bytes kept as they came, other frames encoded
    as ``fmt`` says, in order on this thread (libjpeg-turbo releases the GIL while it
    encodes); RGB frames resized to ``size`` ``(height, width)`` first when given
    (antialiased bilinear, as Pillow resizes; a source's bytes are then decoded first)."""
    s = episode.streams[name]
    if spec.encoding is not None and size is None:  # the source's own JPEG/PNG bytes: kept
        data = list(s.data)
    else:
        data = [fmt.encode(_stored(frame, spec, size)) for frame in s.data]
    source = episode.meta.get("source_frame", {}).get(name, np.arange(len(s), dtype=np.int64))
    return _table(episode.index, source, s.times, data)


def _stored(frame, spec: StreamSpec, size: tuple[int, int] | None) -> np.ndarray:
    """A frame as it is encoded: a source's bytes decoded, resized to ``size`` if given."""
    if spec.encoding is not None:
        frame = np.asarray(_pil().open(io.BytesIO(bytes(frame))).convert("RGB"))
    return frame if size is None else resize(frame, size)


def _table(episode: int, source: np.ndarray, times: np.ndarray, data):
    """The frames table; ``data``: the frames' bytes, a list or :func:`_pack`'s pair."""
    pa = require("pyarrow", "data", "Arrow tables")

    encoded = _binary(data)
    n = len(encoded)
    return pa.table({"episode_index": np.full(n, episode, np.int64),
                     "frame": np.arange(n, dtype=np.int64), "source_frame": source,
                     "timestamp": times, "encoded": encoded})


def _pack(frames: list[bytes]) -> tuple[bytes, np.ndarray]:
    """Encoded frames as one byte string and int64 offsets ``[F + 1]``."""
    return b"".join(frames), np.cumsum([0, *map(len, frames)], dtype=np.int64)


# Where a worker process leaves a stream's encoded frames for the parent: a file in shared
# memory (Linux tmpfs). Through the result pipe, the parent spent 82 us of CPU a 88 KB frame
# receiving and unpickling, holding its GIL, against 23 through the file
# (benchmarks/results/cameras-profile-cpu-2026-11-27.json): at 32 workers, up to a core.
_SHM_DIR = "/dev/shm"
_shipped = iter(range(1 << 62))


def _ship(frames: list[bytes]) -> tuple:
    """A worker's encoded frames, for :func:`_received` in the parent: ``(name, offsets)`` of a
    shared-memory file written in gathered writes (no joined copy, no pickling), registered
    with multiprocessing's resource tracker so that it is removed even if the parent is
    killed before reading it; :func:`_pack`'s pair where there is no ``/dev/shm`` or no room
    in it (the space is reserved before anything is written: a full tmpfs fails here, not
    with SIGBUS later)."""
    from multiprocessing import resource_tracker

    offsets = np.cumsum([0, *map(len, frames)], dtype=np.int64)
    name = f"robocache-frames-{os.getpid()}-{next(_shipped)}"
    try:
        fd = os.open(os.path.join(_SHM_DIR, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except OSError:
        return _pack(frames)
    resource_tracker.register("/" + name, "shared_memory")
    try:
        if offsets[-1]:
            os.posix_fallocate(fd, 0, int(offsets[-1]))
        for a in range(0, len(frames), 512):  # within IOV_MAX
            chunk = frames[a:a + 512]
            if os.writev(fd, chunk) != sum(map(len, chunk)):
                raise OSError("short write")
    except OSError:
        os.close(fd)
        _unlink(name)
        return _pack(frames)
    os.close(fd)
    return name, offsets


def _unlink(name: str) -> None:
    from multiprocessing import resource_tracker

    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(_SHM_DIR, name))
    resource_tracker.unregister("/" + name, "shared_memory")


def _received(data: tuple) -> tuple:
    """:func:`_ship`'s result as :func:`_pack`'s pair, the bytes a read-only uint8 array
    mapped from the shared-memory file (no copy; the file is removed at once, its memory freed
    with the array)."""
    import mmap

    name, offsets = data
    if not isinstance(name, str):
        return data
    path = os.path.join(_SHM_DIR, name)
    try:
        if not offsets[-1]:
            return np.empty(0, np.uint8), offsets
        with open(path, "rb") as f:
            mapped = mmap.mmap(f.fileno(), int(offsets[-1]), prot=mmap.PROT_READ)
    except (OSError, ValueError) as e:  # removed by someone else, or cut short
        raise DataError(f"the frames a camera worker left in {path} cannot be read "
                        f"({type(e).__name__}: {e}); run the ingest again with "
                        "--retry-quarantined to read the episode again.") from e
    finally:
        _unlink(name)
    return np.frombuffer(mapped, np.uint8), offsets


def _discard(future) -> None:
    """Remove the shared-memory file of a worker's result nobody will read (a done future)."""
    if not future.cancelled() and future.exception() is None and future.result() is not None:
        data = future.result()[0]
        if isinstance(data[0], str):
            _unlink(data[0])


def _binary(data):
    """An Arrow binary array of a list of byte strings or of :func:`_pack`'s pair (its buffers
    used as they are when the offsets fit Arrow's binary type)."""
    pa = require("pyarrow", "data", "Arrow tables")

    if isinstance(data, tuple):
        packed, offsets = data
        if offsets[-1] < 2**31:
            return pa.Array.from_buffers(pa.binary(), len(offsets) - 1, [
                None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(packed)])
        view = memoryview(packed)
        data = [bytes(view[a:b]) for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
    return pa.array(data, pa.binary())


def camera_tables(episode: Episode, specs: dict[str, StreamSpec], fmt: FrameFormat,
                  sizes: dict[str, tuple[int, int] | None] | None = None, *,
                  decoder: str = "pyav", gpu: int = 0, workers: CameraWorkers | None = None,
                  threads: int = 0, codecs: dict[str, str] | None = None) -> dict[str, object]:
    """The Lance rows (:func:`frames_table`) of every camera stream of ``episode`` (stream ->
    table), frames stored as ``fmt`` says (``codecs[name]``, where given, in place of its
    codec; ``"auto"`` and ``"video"``: each camera as
    :func:`robocache.data.build.encode.stored_codec` decides), resized to ``sizes[name]``
    where given.

    Video streams whose frames are still in their files are decoded and encoded here, frame
    by frame (never the whole episode's pixels at once): with NVDEC (``decoder`` ``"nvdec"``
    or ``"auto"``, as :func:`decode_video` says) on GPU ``gpu``, the frames JPEG-encoded by
    nvJPEG on that GPU when ``fmt`` is JPEG 4:4:4 at the source's size, else on the CPU; with
    PyAV in ``workers``' processes (one task per stream, the streams of an episode at once),
    or on this thread without ``workers`` (with ``threads`` FFmpeg threads, 0: FFmpeg's
    choice; 1 where every core already runs an episode); where ``workers`` has GPU lanes
    and ``decoder`` asks for NVDEC, in whichever lane (NVDEC and nvJPEG on its GPU) or
    process has room first (:meth:`CameraWorkers.submit_stream`). Each such stream is then left in
    ``episode`` as its frames' timestamps (from the episode start) without pixels, its frame
    numbers in the file in ``episode.meta["source_frame"]`` and its decoder in
    ``episode.meta["video_decoder"]``, as :func:`decode_videos` leaves them.

    Raises:
        DataError: a video that is missing, unreadable, truncated or in a codec FFmpeg cannot
            decode, a stream without samples, or frames of another shape than ``specs`` says
            (the message is the episode's quarantine reason).
    """
    from robocache.data.build.encode import stored_codec
    from robocache.data.video_store import encoded_table, packet_table

    sizes = sizes or {}
    tables, pending = {}, {}
    asked = fmt
    for name, spec in specs.items():
        s = episode.streams.get(name)
        if spec.kind not in ("image", "video") or s is None:
            continue
        codec = stored_codec(spec, (codecs or {}).get(name, asked.codec), sizes.get(name))
        video = codec == "video"
        fmt = FrameFormat(codec, asked.quality, asked.chroma)
        if not (spec.kind == "video" and s.video is not None and s.data is None):
            if video:  # raw frames encoded once, H.264
                if len(s) == 0:
                    raise DataError(f"episode {episode.index}: stream {name!r} has no "
                                    "samples.")
                source = episode.meta.get("source_frame", {}).get(
                    name, np.arange(len(s), dtype=np.int64))
                tables[name] = encoded_table(episode.index, np.asarray(s.data), s.times,
                                             source, spec.rate_hz,
                                             f"episode {episode.index}: stream {name!r}")
                continue
            tables[name] = frames_table(episode, name, spec, fmt, sizes.get(name))
            continue
        if len(s) == 0:
            raise DataError(f"episode {episode.index}: stream {name!r} has no samples.")
        start = s.video.from_timestamp
        task = (s.video.path, start + float(s.times[0]), start + float(s.times[-1]), 1e-4, fmt,
                sizes.get(name), spec.shape, f"episode {episode.index}: stream {name!r}")
        if video:  # its packets, demuxed here: no decode
            table, t, index = packet_table(episode.index, *task[:4], spec.shape, task[7])
            _keep_times(episode, name, "copy", t, index)
            tables[name] = table
            continue
        if workers is not None and workers.lanes and decoder != "pyav" and not _gray(spec):
            pending[name] = (workers.submit_stream(task, decoder), "lane")
            continue
        got = None if _gray(spec) else _nvdec_stream(*task, decoder, gpu)
        if got is not None:
            pending[name] = (got, "nvdec")
        elif workers is None:
            data, t, index = _pyav_stream(*task, threads=threads)
            pending[name] = ((_pack(data), t, index), "pyav")
        else:
            pending[name] = (workers.submit(_pyav_shipped, *task), "pyav")
    waiting = [got for got, used in pending.values() if used != "nvdec" and workers is not None]
    try:
        for name, (got, used) in pending.items():  # in the specs' order: the first error wins
            waiting = [h for h in waiting if h is not got]
            if used == "lane":
                data, t, index, used = workers.stream_result(got)
            elif used == "nvdec" or workers is None:
                data, t, index = got
            else:
                data, t, index = workers.result(got)
                data = _received(data)
            _add_table(episode, name, used, data, t, index, tables)
    finally:
        for handle in waiting:  # after an error: the other streams' results, when they come
            handle[-1].add_done_callback(_discard)
    return {name: tables[name] for name in specs if name in tables}


def _add_table(episode: Episode, name: str, used: str, data, t: np.ndarray, index: np.ndarray,
               tables: dict) -> None:
    """Leave a decoded video stream in ``episode`` as :func:`camera_tables` says and add its
    frames' table to ``tables``."""
    _keep_times(episode, name, used, t, index)
    tables[name] = _table(episode.index, index, episode.streams[name].times, data)


def _keep_times(episode: Episode, name: str, used: str, t: np.ndarray, index: np.ndarray
                ) -> None:
    """Leave video stream ``name`` of ``episode`` as its frames' timestamps (``t``: file
    seconds), frame numbers ``index`` and decoder ``used`` (:func:`camera_tables`)."""
    s = episode.streams[name]
    episode.streams[name] = Stream(s.spec, t - s.video.from_timestamp, None, s.video)
    episode.meta.setdefault("source_frame", {})[name] = index
    episode.meta.setdefault("video_decoder", {})[name] = used


def _gray(spec: StreamSpec) -> bool:
    """Whether a video stream's frames are 12-bit grey codes (uint16 ``[H, W, 1]``: LeRobot's
    depth videos), which PyAV decodes."""
    return spec.dtype == "uint16" and len(spec.shape) == 3 and spec.shape[2] == 1


def _check_shape(got: tuple[int, ...], shape: tuple[int, ...], where: str) -> None:
    if tuple(got) != tuple(shape):
        raise DataError(f"{where} samples have shape {tuple(got)}, expected {tuple(shape)}.")


def _pyav_stream(path, start_s: float, end_s: float, tolerance_s: float, fmt: FrameFormat,
                 size: tuple[int, int] | None, shape: tuple[int, ...], where: str,
                 threads: int = 0):
    """One stream's span decoded by PyAV and encoded frame by frame, resized to ``size`` in
    the colour conversion's swscale pass (:func:`video_frames`): (encoded frames; file
    seconds; frame numbers). ``where`` names the stream in errors."""
    info: dict = {}

    def each(frame: np.ndarray) -> bytes:
        _check_shape(info["shape"], shape, where)
        return fmt.encode(frame)

    if size is not None and tuple(size) == tuple(shape[:2]):
        size = None
    gray = len(shape) == 3 and shape[2] == 1  # a depth video's grey codes (see _gray)
    return _decode_pyav(path, start_s, end_s, tolerance_s, each, threads, size, info, gray)


def _pyav_shipped(*task, threads: int = 0):
    """:func:`_pyav_stream` as a worker process's task, its frames :func:`_ship`ped."""
    data, t, index = _pyav_stream(*task, threads=threads)
    return _ship(data), t, index


def _nvdec_stream(path, start_s: float, end_s: float, tolerance_s: float, fmt: FrameFormat,
                  size: tuple[int, int] | None, shape: tuple[int, ...], where: str,
                  decoder: str, gpu: int):
    """:func:`_pyav_stream`'s result decoded by NVDEC (and nvJPEG-encoded on the GPU where
    ``fmt`` allows), or ``None`` where PyAV decodes the stream (see :func:`_nvdec_attempt`)."""
    on_gpu = fmt.codec == "jpeg" and fmt.chroma == "444" and size is None and \
        jpeg.gpu_available()

    def each(batch: torch.Tensor) -> list[bytes]:
        _check_shape(tuple(batch.shape[1:]), shape, where)
        if on_gpu:
            return jpeg.encode_cuda(batch, fmt.quality)
        return [fmt.encode(f if size is None else resize(f, size)) for f in batch.cpu().numpy()]

    return _nvdec_attempt(path, start_s, end_s, tolerance_s, decoder, gpu, each)


def _nvdec_shipped(*task):
    """:func:`_nvdec_stream` as a lane's task (``task``: its arguments), its frames
    :func:`_ship`ped; ``None`` where PyAV decodes the stream."""
    got = _nvdec_stream(*task)
    if got is None:
        return None
    data, t, index = got
    return _ship(data), t, index


def _lane_init() -> None:
    """A GPU lane's start-up: import what its streams use (PyNvVideoCodec, torchvision's
    encoder: seconds of imports, else paid by its first stream) and make its CUDA context."""
    import importlib

    for name in ("PyNvVideoCodec", "torchvision.io"):
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    torch.zeros(1, device="cuda")


# streams a GPU lane decodes and encodes at once (8 a process measured best on the H100)
GPU_STREAMS = 8
# cores left to each GPU lane when the CPU processes share the streams ("auto")
LANE_CORES = 2
# seconds a lane has to start (fork, select its GPU)
LANE_START_S = 120.0


class CameraWorkers:
    """Worker processes that decode (PyAV) and encode camera streams, one stream per task.

    Processes, not threads: each worker has its own interpreter, so no part of a frame's path
    (PyAV's Python between its codec calls, the encoder) waits on another stream's GIL. The
    processes are forked, all at once, when the pool starts
    (:func:`worker_pool` starts it on the calling thread), so they share this process's
    imported modules and need no ``if __name__ == "__main__"`` guard in the caller's script
    (a spawned or fork-server process imports the caller's main module again); they run only
    PyAV, NumPy, libjpeg-turbo and Pillow, never CUDA. Each decodes with
    ``threads`` FFmpeg threads (default ``cores // processes``: one per stream when there are
    as many processes as cores).

    With ``gpus``, a :class:`~robocache.data.lanes.Lane` on each of them decodes with NVDEC
    and encodes with nvJPEG ``streams`` streams at once (:meth:`submit_stream`), beside the
    processes.
    """

    def __init__(self, processes: int, threads: int | None = None, gpus=(),
                 streams: int = GPU_STREAMS):
        self.processes = processes
        self.threads = threads or max(1, (os.cpu_count() or 1) // processes)
        self.gpus, self.streams = tuple(gpus), streams
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self.lanes: dict[int, Lane] = {}  # GPU -> its lane, once started
        self._free: dict = {}  # free stream slots: GPU -> of its lane, "cpu" -> of the pool
        self._slots = threading.Condition()

    def start(self) -> CameraWorkers:
        """Fork the worker processes now, on this thread (else the first task does), and
        start the GPU lanes, waiting until each is ready (one that fails to start is warned
        about and left out: the other lanes and the processes decode its share)."""
        self._executor()
        if self.gpus and not self.lanes:
            from robocache.data.lanes import Lane

            started = {g: Lane(self.streams, g, _lane_init).start() for g in self.gpus}
            for g, lane in started.items():
                try:
                    lane.wait_ready(LANE_START_S)
                except Exception as e:
                    _warn_once(f"lane-{g}", f"the NVDEC lane of GPU {g} did not start "
                               f"({type(e).__name__}: {e}); the other lanes and the CPU "
                               "workers decode its share.")
                    lane.close(0)
                    continue
                self.lanes[g] = lane
            with self._slots:
                self._free = {**dict.fromkeys(self.lanes, self.streams), "cpu": self.processes}
        return self

    def _executor(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                import multiprocessing
                from multiprocessing import resource_tracker

                # started before the fork, so the workers register their shared-memory
                # results (:func:`_ship`) with this process's tracker, which outlives a kill
                resource_tracker.ensure_running()
                pool = ProcessPoolExecutor(
                    self.processes, mp_context=multiprocessing.get_context("fork"),
                    initializer=die_with_parent, initargs=(os.getpid(),))
                try:
                    with warnings.catch_warnings():  # the workers never call Lance
                        warnings.filterwarnings("ignore", "lance is not fork-safe")
                        pool.submit(int).result()  # the first task forks every process
                except BaseException:
                    _kill(pool)
                    raise
                self._pool = pool
            return self._pool

    def _run(self, fn, args):
        pool = self._executor()
        try:
            return pool, pool.submit(fn, *args, threads=self.threads)
        except BrokenProcessPool:
            self._replace(pool)
            pool = self._executor()
            return pool, pool.submit(fn, *args, threads=self.threads)

    def submit(self, fn, *args):
        """Run ``fn(*args, threads=...)`` in a worker; returns a handle for :meth:`result`."""
        return (fn, args, *self._run(fn, args))

    def result(self, handle):
        """The result of :meth:`submit`'s task. A task whose worker died (the pool breaks
        for every task in flight) runs once more in a fresh pool; dying again raises
        :class:`DataError` (that stream's episode is quarantined, the others proceed)."""
        fn, args, pool, future = handle
        try:
            return future.result()
        except BrokenProcessPool:
            self._replace(pool)
        pool, future = self._run(fn, args)
        try:
            return future.result()
        except BrokenProcessPool as e:
            self._replace(pool)
            raise DataError(f"{args[-1]}: a camera worker process died decoding {args[0]} "
                            f"({e}).") from e

    def _replace(self, broken: ProcessPoolExecutor) -> None:
        """Drop a broken pool (once: the tasks that saw it break all call this)."""
        with self._lock:
            if self._pool is broken:
                self._pool = None
        broken.shutdown(wait=False, cancel_futures=True)

    def submit_stream(self, task: tuple, decoder: str):
        """Send one video stream (:func:`camera_tables`' task) to whichever of the GPU lanes
        (NVDEC, nvJPEG) and, with ``decoder`` ``"auto"``, the CPU processes (PyAV,
        libjpeg-turbo) has a free slot first: each lane takes :attr:`streams` streams at once,
        the processes one each; this blocks until one is free. ``"nvdec"`` uses the lanes
        only (the processes once none is left). Returns a handle for :meth:`stream_result`,
        its last element the task's future."""
        with self._slots:
            while True:
                options = [g for g, lane in self.lanes.items() if lane.alive]
                if decoder == "auto" or not options:
                    options.append("cpu")
                free = [k for k in options if self._free.get(k, 1) > 0]
                if free:  # a lane before the processes, the freest lane first
                    slot = max(free, key=lambda k: (k != "cpu", self._free.get(k, 1)))
                    break
                self._slots.wait(1.0)  # a lane that dies frees nothing: look again
            if slot in self._free:
                self._free[slot] -= 1
        if slot == "cpu":
            handle = self.submit(_pyav_shipped, *task)
            future = handle[-1]
        else:
            handle = task
            future = self.lanes[slot].submit(_nvdec_shipped, *task, decoder, slot)
        future.add_done_callback(functools.partial(self._release, slot))
        return slot, handle, future

    def episodes_at_once(self, workers: int) -> int:
        """Episodes a build preparing ``workers`` at once reads at once with these workers:
        with lanes, at least as many as the processes and the lanes take streams (a reading
        thread waits for its episode's streams, so with fewer, threads waiting on a slow lane
        would leave processes idle)."""
        if not self.lanes:
            return workers
        return max(workers, self.processes + len(self.lanes) * self.streams)

    def _release(self, slot, _future=None) -> None:
        with self._slots:
            if slot in self._free:
                self._free[slot] += 1
            self._slots.notify_all()  # a waiter for the lanes only may not take this slot

    def stream_result(self, handle) -> tuple:
        """:meth:`submit_stream`'s result: (the encoded frames as :func:`_pack`'s pair, file
        seconds, frame numbers, ``"nvdec"`` or ``"pyav"``). A stream a lane does not decode
        (its codec, an NVDEC failure: warned once per kind), or whose lane died, is decoded by
        the processes."""
        slot, inner, future = handle
        if slot != "cpu":  # inner: the stream's task; else the pool's handle
            try:
                got = future.result()
            except BrokenProcessPool as e:
                _warn_once(f"lane-{slot}", f"the NVDEC lane of GPU {slot} stopped ({e}); the "
                           "other lanes and the CPU workers decode its streams.")
                got = None
            if got is not None:
                data, t, index = got
                return _received(data), t, index, "nvdec"
            inner = self.submit(_pyav_shipped, *inner)
        data, t, index = self.result(inner)
        return _received(data), t, index, "pyav"

    def close(self) -> None:
        """Stop the worker processes and the lanes (a later :meth:`submit` starts new
        processes; :meth:`start` new lanes)."""
        with self._lock:
            pool, self._pool = self._pool, None
        lanes, self.lanes = self.lanes, {}
        for lane in lanes.values():
            lane.close()
        if pool is not None:
            pool.shutdown(wait=True, cancel_futures=True)


def _kill(pool: ProcessPoolExecutor) -> None:
    """Stop a pool that failed to start: a Ctrl-C while it forked its processes (the first
    task forks them all, before the thread that would stop them starts) left processes no one
    stops, which the interpreter's exit then waits for (Python 3.14 has
    ``terminate_workers``)."""
    for process in list((getattr(pool, "_processes", None) or {}).values()):
        process.kill()
    pool.shutdown(wait=False, cancel_futures=True)


def die_with_parent(parent: int) -> None:
    """Worker start-up (camera and build workers): be killed when the process that started
    this one dies (Linux ``PR_SET_PDEATHSIG``), so that a killed ingest leaves no worker
    holding the files it had open, the cache's lock among them, or its memory (tested with
    kill -9). ``parent``: that process; a fork server's child is killed when the server
    dies, which it does when ``parent`` does.

    Ctrl-C (SIGINT, sent to the whole foreground process group) and SIGTERM (a job's stop,
    sent to its process group) end a worker quietly, as their defaults do: a forked worker
    inherits the command's handlers, which raise (a traceback per worker on every stop); the
    command itself stops with one line. (Ignoring them instead would leave a worker the
    command never got to stop waiting for work, and the command's exit waiting for it.)"""
    import ctypes
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # a fork server's child inherits the server's mask, SIGINT blocked while it started
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: workers end when their queue closes
        return
    if os.getppid() == parent:
        return
    # a fork server's child: the server lives on while its children do (each holds the
    # pipe whose end it waits for), so watch ``parent`` itself, on a thread
    try:
        fd = os.pidfd_open(parent)
    except ProcessLookupError:
        os._exit(1)
    except (AttributeError, OSError):  # no pidfd (Linux < 5.3): poll
        fd = None
    threading.Thread(target=_exit_with, args=(parent, fd), daemon=True,
                     name="robocache-parent-watch").start()


def _exit_with(parent: int, fd: int | None) -> None:
    """End this process when process ``parent`` ends (``fd``: its pidfd, else polled)."""
    if fd is not None:
        select.select([fd], [], [])  # readable once the process has ended
    else:
        while True:
            time.sleep(0.5)
            try:
                os.kill(parent, 0)
            except ProcessLookupError:
                break
    os._exit(1)


_workers: dict[str, CameraWorkers] = {}


def worker_pool(processes: int, gpus=()) -> CameraWorkers | None:
    """This process's :class:`CameraWorkers` of ``processes`` processes and a lane on each of
    ``gpus``, started (on this thread) and shared by its cache builds; a build asking for
    another count or other GPUs replaces it. ``None`` in a daemonic process (e.g. a
    ``multiprocessing.Pool`` worker), which may not have children: its videos decode on the
    reading threads."""
    import multiprocessing

    if multiprocessing.current_process().daemon:
        return None
    current = _workers.get("pool")
    if current is None or (current.processes, current.gpus) != (processes, tuple(gpus)):
        if current is not None:
            current.close()
        current = _workers["pool"] = CameraWorkers(processes, gpus=gpus)
    return current.start()


def node_workers(workers: int, decoder: str) -> tuple[int, tuple[int, ...]]:
    """How a build preparing ``workers`` episodes at once with ``decoder`` splits its camera
    work: (CPU worker processes, GPUs given a lane). With ``"auto"`` or ``"nvdec"`` and NVDEC
    here, every visible GPU gets a lane; ``"auto"`` leaves :data:`LANE_CORES` cores to each
    lane and gives the CPU processes the rest, ``"nvdec"`` keeps the processes for what NVDEC
    does not decode."""
    if decoder == "pyav" or not nvdec_available():
        return workers, ()
    gpus = tuple(range(torch.cuda.device_count()))
    if decoder == "nvdec":
        return workers, gpus
    return max(1, workers - LANE_CORES * len(gpus)), gpus


def decode(frames, rows: torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
    """Decode the frames at ``rows`` (int ``[...]``): uint8 ``[..., C, H, W]`` (uint16 or
    float32 for depth) on ``device``: one nvJPEG batch on CUDA (``torchvision.io.decode_jpeg``;
    without torchvision, or for PNG, Pillow then a copy), Pillow on a thread pool on the CPU."""
    return decode_all([(frames, rows)], device)[0]


def decode_all(cameras: list[tuple[Any, torch.Tensor]],
               device: torch.device | str = "cpu") -> list[torch.Tensor]:
    """:func:`decode` of several cameras' ``(frames, rows)`` (``frames`` any store of
    :mod:`robocache.data.frames`; one not in memory reads the rows' frames first): the rows
    come to the host in
    one copy (one sync when they live on the GPU), and on CUDA the RGB JPEG cameras' frames
    are decoded in one nvJPEG batch. Each distinct frame of a camera is decoded once (rows
    repeat at padded steps, in overlapping windows, and at a mixture's blank frame for the
    sources without the camera), then gathered back to its rows on ``device``. A mixture's
    camera (:class:`~robocache.data.frames.StackedRead`) is decoded source by source, each
    source's frames with the other cameras' of their kind (JPEGs in the nvJPEG batch, video
    GOPs in one :func:`~robocache.data.video_store.decode_packs`), its blank frame as zeros."""
    device = torch.device(device)
    if not cameras:
        return []
    # a store that is not in memory (the cache's frame table) reads the frames asked for
    cameras = [(f, r) if isinstance(f, EncodedFrames) else f.read(r) for f, r in cameras]
    flat = [r.reshape(-1) for _, r in cameras]
    host = torch.cat(flat).cpu().split([r.numel() for r in flat])
    # each distinct frame and where each row's is; rows that are already 0, 1, ... (every row
    # its own frame, in order: an online window) need neither (no gather, no index copied)
    distinct = [(r, None) if torch.equal(r, torch.arange(r.numel(), dtype=r.dtype))
                else torch.unique(r, return_inverse=True) for r in host]
    inverse: list[torch.Tensor | None] = [inv for _, inv in distinct]  # on ``device``
    gathered = [i for i, inv in enumerate(inverse) if inv is not None]
    if gathered:  # one copy for every camera that gathers
        index = torch.cat([inverse[i] for i in gathered])
        if device.type == "cuda":  # pinned: the copy waits for nothing queued on the stream
            index = index.pin_memory()
        parts = index.to(device, non_blocking=True).split([inverse[i].numel() for i in gathered])
        for i, part in zip(gathered, parts, strict=True):
            inverse[i] = part
    # what is decoded: each camera's frames, a mixture's source by source; then joined back
    units: list[tuple[Any, torch.Tensor]] = []
    joins: list[tuple[list[int], int]] = []  # per camera: its units, its blank frames
    for (f, _), (rows, _) in zip(cameras, distinct, strict=True):
        pieces, blanks = f.split(rows) if isinstance(f, StackedRead) else ([(f, rows)], 0)
        joins.append((list(range(len(units), len(units) + len(pieces))), blanks))
        units += pieces
    got = _decode_units(units, device)
    out = []
    for (f, _), (mine, blanks) in zip(cameras, joins, strict=True):
        frames = [got[u] for u in mine]
        if blanks or not frames:  # the blank frame: zeros, never decoded
            h, w = f.frame_shape[:2]
            frames.append(torch.zeros(blanks, f.channels, h, w, dtype=getattr(torch, f.dtype),
                                      device=device))
        out.append(frames[0] if len(frames) == 1 else torch.cat(frames))
    return [(o if inv is None else o[inv]).reshape(*rows.shape, *o.shape[1:])
            for o, inv, (_, rows) in zip(out, inverse, cameras, strict=True)]


def _decode_units(units: list[tuple[Any, torch.Tensor]], device: torch.device
                  ) -> list[torch.Tensor]:
    """Each ``(frames, rows)`` of ``units`` (an :class:`EncodedFrames` or a
    :class:`~robocache.data.video_store.VideoPackets`, distinct rows) decoded: ``[N, C, H,
    W]`` on ``device``; the RGB JPEGs of all in one nvJPEG batch on CUDA, the video GOPs of
    all at once."""
    out: list[torch.Tensor | None] = [None] * len(units)
    batch = [i for i, (f, _) in enumerate(units) if device.type == "cuda" and
             f.codec == "jpeg" and f.channels == 3]
    decode_jpeg = _nvjpeg() if batch else None
    if decode_jpeg is not None:
        parts = [p for i in batch for p in units[i][0].slices(units[i][1])]
        try:
            frames = decode_jpeg(parts, mode="RGB", device=device) if parts else []
        except RuntimeError:  # name the frame: the CPU decoder says which one it is
            for i in batch:
                _decode_cpu(units[i][0], units[i][1], torch.device("cpu"))
            raise
        metrics.count_frames("nvjpeg", len(parts))
        for i in batch:  # each unit stacked, its per-frame tensors freed
            f, n = units[i][0], units[i][1].numel()
            h, w = f.frame_shape[:2]
            out[i] = torch.stack(frames[:n]) if n else \
                torch.empty(0, 3, h, w, dtype=torch.uint8, device=device)
            del frames[:n]
    video = [i for i, (f, _) in enumerate(units) if f.codec == "video"]
    if video:  # the GOPs' packets, read: every camera's GOPs decoded at once
        from robocache.data.video_store import decode_packs

        got = decode_packs([units[i] for i in video], device)
        for i, frames in zip(video, got, strict=True):
            out[i] = frames
    for i, (f, rows) in enumerate(units):
        if out[i] is None:
            out[i] = _decode_cpu(f, rows, device)
            metrics.count_frames("cpu", rows.numel())
    return out


def _decode_cpu(frames: EncodedFrames, rows: torch.Tensor, device: torch.device
                ) -> torch.Tensor:
    """The frames at ``rows`` (int ``[N]``) decoded on the CPU: ``[N, C, H, W]`` on ``device``.
    RGB JPEGs by libjpeg-turbo through simplejpeg where it is installed (the same pixels as
    Pillow's decode, tested; a 480x640 frame in 1.47 against 1.89 ms, holding the GIL 1 % of
    that time against Pillow's 18 %: ``benchmarks/results/jpeg-gil-cpu-2026-11-27-decode.json``);
    any other frame, a CMYK or YCCK JPEG (whose conversion to RGB differs) or one simplejpeg
    refuses, by Pillow; on a thread pool."""
    parts = frames.slices(rows)
    h, w, c = frames.frame_shape[0], frames.frame_shape[1], frames.channels
    out = np.empty((len(parts), h, w, c), np.dtype(frames.dtype))
    sj = _simplejpeg() if frames.codec == "jpeg" and c == 3 and frames.dtype == "uint8" \
        else None

    def one(i: int) -> None:
        data = parts[i].numpy()
        if sj is not None:
            try:  # YCbCr and grey only: CMYK/YCCK convert to RGB otherwise than Pillow's
                if sj.decode_jpeg_header(data)[2] in ("YCbCr", "Gray"):
                    out[i] = sj.decode_jpeg(data, colorspace="RGB").reshape(h, w, c)
                    return
            except ValueError:  # a JPEG libjpeg-turbo's TurboJPEG API does not read
                pass
        try:
            with _pil().open(io.BytesIO(data.tobytes())) as im:
                out[i] = np.asarray(im.convert("RGB") if c == 3 else im).reshape(h, w, c)
        except (OSError, ValueError, SyntaxError) as e:  # Pillow's errors for bad images
            raise DataError(f"{frames.describe(int(rows[i]))}: the stored frame cannot be "
                            f"decoded as a {h}x{w}x{c} {frames.codec.upper()} image "
                            f"({type(e).__name__}: {e}); rebuild the cache's episode (`robocache "
                            "ingest ... --rebuild-changed` after repairing the source), or "
                            "leave the episode out (`episodes=`).") from e

    with ThreadPoolExecutor(_threads()) as pool:
        list(pool.map(one, range(len(parts))))
    return torch.from_numpy(out).permute(0, 3, 1, 2).to(device)


@functools.cache
def _simplejpeg():
    """simplejpeg, or None where it is not installed (Pillow decodes then)."""
    try:
        import simplejpeg
    except ImportError:
        return None
    return simplejpeg


# torchvision's image decoders are deprecated from this version on, for TorchCodec's (0.16 and
# later), which decode a list of JPEGs on CUDA in one nvJPEG call the same way
TORCHVISION_IMAGE_IO_DEPRECATED = (0, 29)
TORCHCODEC_IMAGE_IO = (0, 16)


def _version(package: str) -> tuple[int, int] | None:
    """``(major, minor)`` of an installed package, or None."""
    from importlib import metadata

    try:
        major, minor = metadata.version(package).split(".")[:2]
        return int(major), int("".join(c for c in minor if c.isdigit()) or 0)
    except (metadata.PackageNotFoundError, ValueError):
        return None


@functools.cache
def _nvjpeg():
    """The batched nvJPEG decoder, called as ``decode_jpeg(list, mode="RGB", device=...)``:
    torchvision's before 0.29; from torchvision 0.29 on, TorchCodec's when TorchCodec 0.16 or
    later is installed (torchvision's, deprecated, otherwise); or None (with a warning, once)
    without either (see docs/cameras.md)."""
    import importlib

    vision, codec = _version("torchvision"), _version("torchcodec")
    use_codec = codec is not None and codec >= TORCHCODEC_IMAGE_IO and (
        vision is None or vision >= TORCHVISION_IMAGE_IO_DEPRECATED)
    try:
        if use_codec or vision is not None:
            module = "torchcodec.decoders" if use_codec else "torchvision.io"
            return importlib.import_module(module).decode_jpeg
    except ImportError:  # installed but broken (e.g. built for another torch): as if absent
        pass
    warnings.warn("neither torchvision nor TorchCodec is installed: camera frames are decoded "
                  "on the CPU and copied to the GPU; `pip install torchvision` (the build "
                  "matching your torch) decodes them with nvJPEG.", stacklevel=3)
    return None


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


# LeRobot's recording settings: a keyframe every 2 frames, CRF 30
VIDEO_OPTIONS = {"g": "2", "crf": "30"}


def write_video(path, frames, fps: float, codec: str = "libsvtav1",
                options: dict[str, str] | None = None) -> list[int]:
    """Encode uint8 ``[F, H, W, 3]`` frames (or an iterable of such arrays, written one after
    another without holding them all) as an mp4 the way LeRobot records cameras (PyAV,
    yuv420p, keyframe every 2 frames, CRF 30; ``codec`` ``"libsvtav1"`` (AV1, LeRobot's
    default), ``"libx264"`` or ``"libx265"``). Each array starts on a keyframe of its own, a
    closed group of pictures, as in LeRobot's files (each episode encoded on its own), so an
    episode's span can be kept as video (:mod:`robocache.data.video_store`). Returns the
    frame count of each array."""
    from fractions import Fraction

    av = require("av", "video", "Writing video streams")
    chunks = [frames] if isinstance(frames, np.ndarray) else frames
    quiet()
    opts = {**VIDEO_OPTIONS, **({"preset": "12"} if codec == "libsvtav1" else {}),
            **({"x265-params": "log-level=error:open-gop=0"} if codec == "libx265" else {}),
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
            for i, f in enumerate(chunk):
                frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")
                if i == 0:  # each array's first frame a keyframe
                    frame.pict_type = av.video.frame.PictureType.I
                if stream.codec_context.is_open:
                    out.mux(stream.encode(frame))
                    continue
                try:  # the encoder opens on its first frame
                    out.mux(stream.encode(frame))
                except av.error.FFmpegError as e:
                    h, w = chunk.shape[1:3]
                    raise DataError(
                        f"{codec} cannot encode {h}x{w} frames in yuv420p ({e.strerror}); "
                        "pass --vcodec libsvtav1 (any size), or --cameras image.") from e
            counts.append(len(chunk))
        if stream is not None:
            out.mux(stream.encode())
    return counts


def quiet() -> None:
    """Keep the encoders' banners off stderr: SVT-AV1 prints 24 lines of settings and
    warnings per video it encodes, from the library itself (``SVT_LOG``: 1, errors only, read
    when the process's first encoder starts; a value set by the user stays). x265's are
    turned off by :func:`write_video`'s ``x265-params``; x264 and FFmpeg print nothing through
    PyAV."""
    os.environ.setdefault("SVT_LOG", "1")


def lerobot_codec(codec: str) -> str:
    """The codec name LeRobot writes in ``info.json`` (``video.codec``) for the encoder
    ``codec``: FFmpeg's name of the format, ``av1`` for ``libsvtav1``, ``h264`` for
    ``libx264``, ``hevc`` for ``libx265``."""
    av = require("av", "video", "Writing video streams")
    try:
        return av.codec.Codec(codec, "w").canonical_name
    except Exception:  # not an encoder here: write_video has said so already
        return codec.removeprefix("lib")


def add_video_feature(root, key: str, frames, *, fps: float | None = None,
                      codec: str = "libsvtav1", options: dict[str, str] | None = None) -> None:
    """Add a camera to a LeRobot v3.0 dataset directory as LeRobot stores one: every
    episode's frames (uint8 ``[F_e, H, W, 3]`` at ``fps``, default the dataset's, the first at
    the episode's start; a list, or any iterable of them, encoded as they come) concatenated in
    ``videos/<key>/chunk-000/file-000.mp4``, each episode's ``from_timestamp`` /
    ``to_timestamp`` in the episode metadata, the feature in ``meta/info.json``. ``options``:
    encoder options over :func:`write_video`'s (e.g. ``{"bf": "0"}``: no B-frames)."""
    add_video_features(root, {key: frames}, fps=fps, codec=codec, options=options)


# What a written video keeps of each frame: PSNR at least this against the frame as yuv420p
# can hold it (its chroma halved: the loss of the pixel format, which no codec setting changes).
VIDEO_BUDGET_DB = 30.0
# CRF steps tried, after the requested CRF, until every frame is within the budget
CRF_STEP, CRF_FLOOR = 7, 2


@dataclass
class VideoCheck:
    """How a written video's frames compare with the frames it was given: the lowest PSNR
    (dB, against each frame in yuv420p) and where (episode position, step); ``nearer``: a
    step whose frame the decoded one is nearer than its own (None: every frame nearest its
    own)."""
    min_psnr_db: float
    episode: int
    step: int
    nearer: int | None

    def within(self, budget_db: float) -> bool:
        return self.nearer is None and self.min_psnr_db >= budget_db


def _yuv420(frames: np.ndarray) -> np.ndarray:
    """uint8 ``[F, H, W, 3]`` frames as an RGB encoder sees them in yuv420p (and a decoder
    gives them back without codec loss), through FFmpeg's own conversion."""
    av = require("av", "video", "Writing video streams")
    return np.stack([av.VideoFrame.from_ndarray(np.ascontiguousarray(f), format="rgb24")
                     .reformat(format="yuv420p").to_ndarray(format="rgb24") for f in frames])


def check_video(path, frames, window: int = 4) -> VideoCheck:
    """Decode the video at ``path`` and compare every frame with the one it was written from
    (``frames``: its episodes' uint8 ``[F_e, H, W, 3]`` arrays, in order): the PSNR against
    the frame in yuv420p, and whether the decoded frame is nearer (mean squared error) any
    other different frame of its episode within ``window`` steps than its own."""
    av = require("av", "video", "Reading video streams")
    worst = VideoCheck(float("inf"), -1, -1, None)
    with av.open(str(path)) as container:
        decoded = container.decode(video=0)
        for e, clip in enumerate(frames):
            want = _yuv420(clip).astype(np.float32)
            got = np.stack([next(decoded).to_ndarray(format="rgb24") for _ in clip]
                           ).astype(np.float32)
            mse = ((got - want) ** 2).mean(axis=(1, 2, 3))
            psnr = np.where(mse > 0, 10 * np.log10(255.0 ** 2 / np.maximum(mse, 1e-12)), np.inf)
            for t in range(len(clip)):
                for u in range(max(t - window, 0), min(t + window + 1, len(clip))):
                    if u != t and not np.array_equal(clip[u], clip[t]) and \
                            ((got[t] - want[u]) ** 2).mean() < mse[t]:
                        return VideoCheck(float(psnr[t]), e, t, u)
            t = int(np.argmin(psnr))
            if psnr[t] < worst.min_psnr_db:
                worst = VideoCheck(float(psnr[t]), e, t, None)
    return worst


def add_video_features(root, cameras: dict, *, fps: float | None = None,
                       codec: str = "libsvtav1", options: dict[str, str] | None = None,
                       budget_db: float | None = None) -> dict[str, dict]:
    """:func:`add_video_feature` of several cameras (key -> its episodes' frames), their
    videos encoded at once on threads (PyAV encodes without the GIL), the metadata written
    once they are all done.

    With ``budget_db`` (e.g. :data:`VIDEO_BUDGET_DB`), each camera's value is a callable
    giving its episodes' frames afresh, and every written video is decoded and checked with
    :func:`check_video`: a frame below the budget, or nearer another step's frame than its
    own, re-encodes the camera at a CRF lower by 7 (down to 2), and failing that raises
    :class:`DataError` naming the camera, episode and step. Returns per camera the CRF used
    and the check (``{}`` without a budget)."""
    import json
    from pathlib import Path

    pa = require("pyarrow", "data", "Arrow tables")
    pq = require("pyarrow.parquet", "data", "Parquet files")

    root = Path(root)
    info = json.loads((root / "meta" / "info.json").read_text())
    if info.get("codebase_version") != "v3.0":
        raise DataError(f"{root}: add_video_feature writes LeRobot v3.0 datasets only.")
    fps = float(fps or info["fps"])
    checks: dict[str, dict] = {}

    def one(key: str):
        rel = info["video_path"].format(video_key=key, chunk_index=0, file_index=0)
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        opts = {**VIDEO_OPTIONS, **(options or {})}
        crf = int(opts["crf"])
        while True:
            shape = []
            frames = cameras[key]() if budget_db is not None else cameras[key]
            try:
                lengths = write_video(root / rel, (shape.append(f.shape[1:3]) or f
                                                   for f in frames), fps, codec,
                                      {**opts, "crf": str(crf)})
            except DataError as e:
                raise DataError(f"{key}: {e}") from e
            if budget_db is None:
                return shape[0], lengths
            got = check_video(root / rel, cameras[key](), window=2 * int(opts["g"]))
            checks[key] = {"crf": crf, "min_psnr_db": got.min_psnr_db}
            if got.within(budget_db):
                return shape[0], lengths
            if crf <= CRF_FLOOR:
                why = (f"nearer step {got.nearer}'s frame than its own" if got.nearer is not None
                       else f"{got.min_psnr_db:.1f} dB, below {budget_db:g} dB")
                raise DataError(
                    f"{key}: {codec} at CRF {crf} cannot keep the frame of episode "
                    f"{got.episode}, step {got.step} ({why}); pass another --vcodec, or "
                    "--cameras image (lossless).")
            crf = max(crf - CRF_STEP, CRF_FLOOR)

    with ThreadPoolExecutor(len(cameras)) as pool:
        written = dict(zip(cameras, pool.map(one, cameras), strict=True))
    meta = root / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
    table = pq.read_table(meta)
    for key, ((h, w), lengths) in written.items():
        info["features"][key] = {
            "dtype": "video", "shape": [h, w, 3], "names": ["height", "width", "channels"],
            "info": {"video.height": h, "video.width": w,
                     "video.codec": lerobot_codec(codec), "video.pix_fmt": "yuv420p",
                     "video.is_depth_map": False, "video.fps": fps, "video.channels": 3,
                     "has_audio": False}}
        bounds = np.cumsum([0] + lengths) / fps
        n = len(lengths)
        for name, values in (("chunk_index", [0] * n), ("file_index", [0] * n),
                             ("from_timestamp", bounds[:-1]), ("to_timestamp", bounds[1:])):
            table = table.append_column(f"videos/{key}/{name}", pa.array(values))
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=2) + "\n")
    pq.write_table(table, meta)
    return checks
