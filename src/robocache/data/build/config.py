"""Options of a cache build (:class:`CacheConfig`, the flags of ``robocache ingest``) and
the names they give columns and methods.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from robocache._forkserver import WORKERS_PER_CORE, max_workers
from robocache.data.cameras import DEFAULT_CHROMA, DEFAULT_QUALITY
from robocache.data.episode import StreamSpec
from robocache.errors import DataError


@dataclass
class CacheConfig:
    """Options of :func:`build` (CLI flags of ``robocache ingest`` map onto these).

    Attributes:
        rate_hz: target rate in Hz of every stream in the cache, or ``"native"``: the source's
            declared fps, every frame stored exactly (see the module docstring).
        device: where alignment runs: ``"cuda"``, ``"cpu"`` or ``None`` (CUDA when available).
        keys: streams to cache (default: all the source declares).
        methods: stream -> alignment method overriding the defaults (see the module docstring).
        tolerance_s: steps farther than this from any source sample are padded (``None``: off).
        grid_tolerance_s: seconds within which a timestamp counts as on the ``1 / rate`` grid
            (LeRobot's ``tolerance_s``); > 0 and below half the grid's period (``0.5 /
            rate``; for ``"native"``, of the source's fps), so that a timestamp is near one
            grid instant at most (:func:`check_grid_tolerance`).
        episodes: source episode indices to ingest (default: all).
        source_options: reader options, e.g. ``{"fps": 10.0}`` for a ReplayBuffer (``fps``
            within [0.001, 100000] Hz, :func:`check_fps`).
        overwrite: delete the cache at the destination instead of resuming it (only the files
            and tables its manifest says the cache owns are deleted, see
            :mod:`robocache.data.owned`; anything else there stays).
        retry_quarantined: read again the episodes an earlier run quarantined (by default a
            resume leaves them quarantined, unless a source file they are read from changed).
        rebuild_changed: cache again the cached episodes whose source data changed since they
            were cached (by default a re-run refuses them, naming them; see
            :mod:`robocache.data.source_identity`).
        wait: when another process is writing the destination, wait for it to finish instead
            of failing with :class:`~robocache.errors.CacheBusyError`.
        shard: ``(i, n)`` or ``"i/n"``: cache only the episodes at positions ``p`` of the
            wanted list with ``p % n == i`` (see :func:`parse_shard`), so ``n`` independent
            jobs split a dataset; ``robocache merge`` joins their caches.
        camera_codec: how camera frames are stored
            (:func:`robocache.data.build.encode.stored_codec` decides per camera):
            ``"auto"`` (default): an RGB video camera's packets kept as they are (about the
            source's bytes, frames bit-identical to the source's decode), decoded per batch
            (NVDEC on a GPU for H.264/HEVC, CPU threads for AV1 and without a GPU; slower to
            serve than JPEG frames, :mod:`robocache.data.video_store`); a source's own
            JPEG/PNG bytes as they are; raw frames, and video cameras resized with
            ``camera_size``, as JPEG (:data:`robocache.data.build.encode.AUTO_RAW_CODEC`).
            ``"jpeg"``: every camera decoded once and stored as JPEG (the fastest to serve,
            nvJPEG on a GPU, at 33-43x a video source's bytes, lossy). ``"png"``: lossless
            frames. ``"video"``: as ``"auto"``, and raw RGB frames of even size encoded once
            to H.264 (``camera_size`` refused). uint16 (depth) frames are always PNG.
            With ``"auto"``, a video camera whose episodes do not each start on a keyframe
            (a file encoded in one piece, episodes cut from it; LeRobot's recordings encode
            each episode on its own) cannot be kept as video and is stored as JPEG; the build
            says so once (the manifest records each camera's codec). A cache at the
            destination that stores a camera otherwise (e.g. JPEG, built before ``"auto"``
            was the default) is extended alike, ``"auto"`` giving way for that camera.
        camera_codecs: camera stream -> ``camera_codec`` for that camera alone (the same
            values), e.g. ``{"observation.images.wrist": "jpeg"}``; the others follow
            ``camera_codec``.
        camera_quality: JPEG quality (1-100; default 95).
        camera_chroma: JPEG chroma subsampling: ``"444"`` (default: none; within 40 dB PSNR
            of the source's decode on sharp-edged content at quality 95), ``"422"`` or
            ``"420"`` (smaller, blurs colour edges); see docs/cameras.md for bytes against
            PSNR.
        camera_size: ``(height, width)`` (or ``"HEIGHTxWIDTH"``) to store RGB camera frames
            at, resized at ingest (antialiased bilinear), or ``None`` (default) for the
            source's size; each side at most :data:`MAX_CAMERA_SIDE` (8192) pixels. Training
            usually resizes to a fixed input anyway; stored at that size, each batch decodes
            that many fewer pixels. The cache's frames are then no
            longer the source's (not what LeRobot serves); depth frames keep their size.
        decode_workers: episodes read, video-decoded and JPEG-encoded at once (``None``: the
            machine's cores). On threads, their videos decoded and encoded in as many forked
            camera worker processes (none for 1: on the reading thread); or, with
            ``decode_processes``, in that many spawned processes, each decoding its videos
            itself. The cache is the same whatever the number. At most 4 per core
            (:func:`robocache._forkserver.max_workers`): more only adds processes and memory.
        video_decoder: who decodes video streams: ``"pyav"`` (default: the CPU decode
            LeRobot's reader does, so cached frames match LeRobot's within the JPEG
            tolerance), ``"auto"`` (NVDEC through PyNvVideoCodec for H.264/HEVC when a CUDA
            GPU and PyNvVideoCodec are present, else PyAV; a large build uses every GPU's
            NVDEC and the CPU workers together, each stream going to whichever has room) or
            ``"nvdec"`` (NVDEC required, on every GPU in a large build; AV1, or a video NVDEC
            fails on, still goes to PyAV, with a warning). Same frames and timestamps either
            way; NVDEC's pixel values differ slightly (its colour conversion), see
            docs/cameras.md.
        decode_processes: prepare episodes in ``decode_workers`` processes instead of threads
            (each opens the source once; with alignment on the CPU it aligns too, so every
            core does the whole per-episode work); with ``"auto"`` or ``"nvdec"``, read on
            threads and decode videos in a lane process per GPU and the camera worker
            processes instead of on the reading threads (where NVDEC is here; else as with
            ``"pyav"``). ``None`` (default): processes for a source given as a path (lanes
            for any source) with at least
            :data:`~robocache.data.build.read.PROCESS_EPISODES` episodes to do; threads
            otherwise (:func:`~robocache.data.build.read.preparation`). The cache is the
            same either way.
        batch_rows, batch_bytes: episodes are written and committed in batches of this many
            aligned rows or this many bytes (frames included), whichever comes first, or
            what :data:`~robocache.data.build.run.COMMIT_SECONDS` gathered: each Lance
            fragment holds many episodes. A killed build loses at most its last batch (redone
            on resume); each batch is held in memory until written.
    """

    rate_hz: float | str = "native"
    device: str | None = None
    keys: list[str] | None = None
    methods: dict[str, str] = field(default_factory=dict)
    tolerance_s: float | None = None
    grid_tolerance_s: float = 1e-4
    episodes: list[int] | None = None
    source_options: dict[str, Any] = field(default_factory=dict)
    overwrite: bool = False
    retry_quarantined: bool = False
    rebuild_changed: bool = False
    wait: bool = False
    shard: tuple[int, int] | str | None = None
    camera_codec: str = "auto"
    camera_codecs: dict[str, str] = field(default_factory=dict)
    camera_quality: int = DEFAULT_QUALITY
    camera_chroma: str = DEFAULT_CHROMA
    camera_size: tuple[int, int] | str | None = None
    decode_workers: int | None = None
    video_decoder: str = "pyav"
    decode_processes: bool | None = None
    batch_rows: int = 1 << 18
    batch_bytes: int = 64 << 20


# The largest side of a frame stored with ``camera_size``: 8192 px (an 8K frame; JPEG itself
# stops at 65535). An 8192x8192 RGB frame is 192 MiB decoded; a batch of them already fills a
# GPU, and 100000x100000 (28 GiB a frame) only fails later with a MemoryError.
MAX_CAMERA_SIDE = 8192
# The ``fps`` a source without timestamps may be given (Hz): from one frame every 1000 s (the
# slowest target rate a build takes, align.MIN_RATE_HZ) to one every 10 us. Beyond are unit
# mistakes: 1e-12 Hz makes a 30-frame episode last a million years, 1e6 Hz reads a kHz
# recording as a MHz one.
MIN_FPS, MAX_FPS = 1e-3, 100_000.0
# the values of ``camera_codec`` (--camera-codec): what each does, CacheConfig's docstring
CAMERA_CODECS = ("auto", "jpeg", "png", "video")


def validate(config: CacheConfig) -> CacheConfig:
    """Refuse bad options before anything is opened or created (every check names the option,
    the value and the fix); returns ``config`` with ``camera_size`` and ``shard`` parsed.
    :func:`~robocache.data.build.run.locked_run` calls it first; a driver that must refuse
    before its own set-up (``preprocess``: before Ray starts) calls it too. A native grid's
    ``grid_tolerance_s`` needs the source's fps: checked where the source is opened
    (:func:`~robocache.data.build.read.open_specs`).

    Raises:
        DataError: a bad option; DeviceError: ``video_decoder="nvdec"`` without NVDEC.
    """
    from robocache.data import cameras, jpeg

    native = config.rate_hz == "native"
    if not native and not (isinstance(config.rate_hz, (int, float))
                           and not isinstance(config.rate_hz, bool)
                           and config.rate_hz > 0 and math.isfinite(config.rate_hz)):
        raise DataError(f"`rate_hz` (--rate) must be a finite rate > 0 Hz or 'native'; got "
                        f"{config.rate_hz!r}.")
    if config.tolerance_s is not None and not (config.tolerance_s >= 0
                                               and math.isfinite(config.tolerance_s)):
        raise DataError(f"`tolerance_s` (--tolerance) must be >= 0 seconds; got "
                        f"{config.tolerance_s!r} (leave it unset to pad no frame).")
    check_grid_tolerance(config.grid_tolerance_s, None if native else float(config.rate_hz))
    check_decode_workers(config.decode_workers)
    check_fps((config.source_options or {}).get("fps"))
    if config.decode_processes not in (None, True, False):
        raise DataError(f"`decode_processes` must be True, False or None (automatic); got "
                        f"{config.decode_processes!r}.")
    for name in ("batch_rows", "batch_bytes"):
        value = getattr(config, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise DataError(f"`{name}` must be an integer >= 1; got {value!r}.")
    if config.video_decoder not in cameras.VIDEO_DECODERS:
        raise DataError(f"`video_decoder` (--video-decoder) must be one of "
                        f"{cameras.VIDEO_DECODERS}; got {config.video_decoder!r}.")
    if config.video_decoder == "nvdec" and not cameras.nvdec_available():
        from robocache.errors import DeviceError

        raise DeviceError("`video_decoder` (--video-decoder) is 'nvdec' but NVDEC is not "
                          "available: it needs a CUDA GPU and PyNvVideoCodec (`pip install "
                          "PyNvVideoCodec`); pass auto or pyav to decode on the CPU.")
    check_camera_codec(config.camera_codec, "`camera_codec` (--camera-codec)")
    if not isinstance(config.camera_codecs, dict):
        raise DataError(f"`camera_codecs` must be a dict of camera stream -> codec; got "
                        f"{config.camera_codecs!r}.")
    for name, codec in config.camera_codecs.items():
        check_camera_codec(codec, f"`camera_codecs[{name!r}]`")
    jpeg.check(config.camera_quality, config.camera_chroma)
    if config.camera_size is not None:
        if "video" in (config.camera_codec, *config.camera_codecs.values()):
            raise DataError("`camera_size` (--camera-size) resizes decoded frames, and "
                            "`camera_codec` (--camera-codec) 'video' keeps the source's video "
                            "as it is; leave one of them out.")
        config.camera_size = parse_size(config.camera_size)
    if config.shard is not None:
        config.shard = parse_shard(config.shard if isinstance(config.shard, str)
                                   else "/".join(map(str, config.shard)))
    return config


def check_camera_codec(codec: Any, name: str = "`camera_codec`") -> None:
    """Refuse a ``camera_codec`` other than :data:`CAMERA_CODECS` (``name``: how the
    caller's users spell the option).

    Raises:
        DataError: naming the option and the accepted values.
    """
    if codec not in CAMERA_CODECS:
        raise DataError(f"{name} must be one of {', '.join(map(repr, CAMERA_CODECS))}; got "
                        f"{codec!r} (auto keeps video cameras as video and stores raw frames "
                        "as JPEG; jpeg serves fastest at many times the bytes).")


def check_decode_workers(workers: int | None) -> None:
    """Refuse a ``decode_workers`` that is not an integer in [1, ``max_workers()``]
    (``None``: the machine's cores): :func:`robocache._forkserver.max_workers`, 4 per core.

    Raises:
        DataError: naming the option and the range.
    """
    if workers is None:
        return
    most = max_workers()
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise DataError(f"`decode_workers` (--decode-workers) must be an integer >= 1 (or "
                        f"unset: the machine's cores); got {workers!r}.")
    if workers > most:
        raise DataError(f"`decode_workers` (--decode-workers) is {workers}, more than "
                        f"{most} ({WORKERS_PER_CORE} per core; this machine has "
                        f"{os.cpu_count() or 1} cores); pass {most} or fewer, or leave it unset "
                        "for one per core.")


def check_fps(fps: Any) -> None:
    """Refuse an ``fps`` (of a source without timestamps) outside [:data:`MIN_FPS`,
    :data:`MAX_FPS`] Hz (``None``: not given).

    Raises:
        DataError: naming ``fps`` (--fps) and the range.
    """
    if fps is None:
        return
    try:
        ok = not isinstance(fps, bool) and MIN_FPS <= float(fps) <= MAX_FPS
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise DataError(f"`fps` (--fps) must be a rate in Hz within [{MIN_FPS:g}, "
                        f"{MAX_FPS:g}]; got {fps!r} (e.g. --fps 10 for a 10 Hz recording).")


def check_grid_tolerance(tolerance_s: Any, rate_hz: float | None = None) -> None:
    """Refuse a ``grid_tolerance_s`` that is not > 0 s, or (given the grid's ``rate_hz``) not
    below half its period: a timestamp would then be "on" two grid instants at once.

    Raises:
        DataError: naming ``grid_tolerance_s`` (--grid-tolerance) and the bound.
    """
    try:
        ok = not isinstance(tolerance_s, bool) and float(tolerance_s) > 0 and \
            math.isfinite(float(tolerance_s))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise DataError(f"`grid_tolerance_s` (--grid-tolerance) must be > 0 seconds; got "
                        f"{tolerance_s!r} (LeRobot's default is 1e-4).")
    if rate_hz is not None and not float(tolerance_s) < 0.5 / rate_hz:
        raise DataError(f"`grid_tolerance_s` (--grid-tolerance) is {float(tolerance_s):g} s, "
                        f"not below half the {1 / rate_hz:g} s period of the {rate_hz:g} Hz "
                        f"grid ({0.5 / rate_hz:g} s): a timestamp would be on two grid "
                        f"instants at once; pass a --grid-tolerance below {0.5 / rate_hz:g} s "
                        "(LeRobot's default is 1e-4), or a lower --rate.")


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` -> ``(i, n)`` with ``0 <= i < n``.

    Raises:
        DataError: anything else (the message shows the form expected).
    """
    i, sep, n = str(text).partition("/")
    if sep and i.strip().isdigit() and n.strip().isdigit() and int(i) < int(n):
        return int(i), int(n)
    raise DataError(f"`shard` (--shard) must be i/n with 0 <= i < n (shard i of n, e.g. 0/4); "
                    f"got {text!r}.")


def parse_size(size: tuple[int, int] | str) -> tuple[int, int]:
    """``camera_size`` as ``(height, width)``, from a pair or ``"HEIGHTxWIDTH"``."""
    try:
        hw = tuple(int(v) for v in size.lower().split("x")) if isinstance(size, str) \
            else tuple(size)
    except (TypeError, ValueError):
        hw = ()
    if len(hw) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1
                               for v in hw):
        raise DataError(f"`camera_size` (--camera-size) must be HEIGHTxWIDTH (or (height, "
                        f"width)), two integers >= 1, e.g. 224x224; got {size!r}.")
    if max(hw) > MAX_CAMERA_SIDE:
        raise DataError(f"`camera_size` (--camera-size) is {hw[0]}x{hw[1]}, but a side may be "
                        f"at most {MAX_CAMERA_SIDE} pixels; pass a training size such as "
                        "224x224, or leave it unset to keep the source's size.")
    return hw


def column_name(stream: str) -> str:
    """The Lance column of a stream (Lance reserves ``.`` for struct fields)."""
    return stream.replace(".", "/")


# A numeric stream slower than this fraction of the grid's rate is sparse (a command, or a
# state published on change: a gripper command seen 3-6 times in a 15 s episode).
SPARSE_FRACTION = 0.1


def sparse(spec: StreamSpec, rate_hz: float | None) -> bool:
    """Whether ``spec`` is a sparse numeric stream on a grid of ``rate_hz``: its nominal rate
    unknown or below :data:`SPARSE_FRACTION` of the grid's. A sparse stream is held between
    its messages (``previous``: padded before its first one, its latest value after) and
    leaves an episode's span to the other streams (interpolating a command between its
    messages, and cutting every episode to its first-to-last message, are both wrong)."""
    return spec.kind == "numeric" and rate_hz is not None and (
        spec.rate_hz is None or spec.rate_hz < SPARSE_FRACTION * rate_hz)


def default_method(spec: StreamSpec, rate_hz: float | None = None) -> str:
    """How ``spec`` is aligned to a grid of ``rate_hz`` unless the build names a method."""
    if spec.kind in ("image", "video"):
        return "frame_index"
    if spec.kind == "event" or sparse(spec, rate_hz):
        return "previous"
    if spec.quaternion:  # a resampled rotation stays a unit quaternion
        return "slerp"
    return "previous" if np.dtype(spec.dtype).kind in "biu" else "linear"


def decode_workers(config: CacheConfig) -> int:
    """The number of episodes :func:`build` prepares at once (``config.decode_workers``, or
    the machine's cores)."""
    return config.decode_workers or os.cpu_count() or 1


def _device(name: str | None):
    import torch

    from robocache.errors import DeviceError

    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise DeviceError(f"`device` (--device) {name!r} is not a device; pass cuda or cpu.") \
            from e
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DeviceError(f"`device` (--device) is {name!r} but no CUDA device is available; "
                          "pass cpu (or leave it unset).")
    if device.type not in ("cuda", "cpu"):
        raise DeviceError(f"`device` (--device) {name!r} is not supported; pass cuda or cpu.")
    return device
