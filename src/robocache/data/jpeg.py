"""JPEG encoding of camera frames at ingest: libjpeg-turbo on the CPU, nvJPEG on the GPU.

CPU (:func:`encode`, :func:`encode_batch`): libjpeg-turbo through simplejpeg, which releases
the GIL while it encodes (py-spy ``--gil`` on one thread encoding 480x640 frames at q95: 3 % of
its samples hold the GIL, against 91 % for Pillow's JPEG encoder and 7 % for PyTurboJPEG;
``benchmarks/results/jpeg-gil-cpu-2026-11-27.json``, ``benchmarks/profile_jpeg_gil.py``), and
ships libjpeg-turbo inside its wheel (PyTurboJPEG loads the system's libturbojpeg, 3.0 or later
for its 2.x releases).

GPU (:func:`encode_cuda`, :func:`gpu_encoder` says which): nvImageCodec
(``nvidia-nvimgcodec-cu13`` / ``-cu12``, with the nvJPEG library of ``nvidia-nvjpeg`` or the
CUDA toolkit) where it imports and encodes on the device, else ``torchvision.io.encode_jpeg``.

- nvImageCodec: the CUDA tensors are wrapped without a copy (``nvimgcodec.as_images``, HWC
  RGB, ordered after the current torch stream's work), and one ``Encoder.encode`` call takes
  the whole list: its executor hands the frames to a pool of CPU threads, each running
  nvJPEG's CUDA encoder on its own CUDA stream, and returns when every frame's bytes are on
  the host. It writes 4:4:4, 4:2:2 and 4:2:0. Its backends are restricted to ``GPU_ONLY``,
  so a frame it cannot encode on the GPU fails loudly instead of going to its CPU codecs. One
  ``Encoder`` per device per process, used by one thread at a time (an encode call keeps its
  batch's state in the encoder), created on first use; :func:`gpu_encoder` tries it on a tiny
  frame first and falls back to torchvision, with one warning, where it fails (e.g. no
  ``libnvjpeg.so.13`` found).
- torchvision: nvJPEG one image at a time under torchvision's lock, with a stream
  synchronization per image; it always writes 4:4:4 (it sets ``NVJPEG_CSS_444`` on every
  image), so with it other chroma choices encode on the CPU.

Chroma (``"444"``, ``"422"``, ``"420"``): the resolution the colour planes keep. 4:4:4 keeps
them whole: the stored frame stays within a few grey levels of the decoded source at colour
edges, where 4:2:0 (Pillow's default) smears a sharp edge over two pixels.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import importlib
import logging
import os
import threading

import numpy as np

from robocache._optional import require
from robocache.errors import DataError

CHROMA = ("444", "422", "420")
# 4:4:4 at q95: >= 40 dB PSNR of the source's own decode on sharp-edged content (fiducials,
# text, colour edges; q90 fell to 38 dB there), about 1.2x the bytes of 4:2:0 at q95: see the
# table in docs/cameras.md
DEFAULT_QUALITY = 95
DEFAULT_CHROMA = "444"
GPU_ENCODERS = ("nvimgcodec", "torchvision")
# nvImageCodec's executor: CPU threads that each drive one frame's nvJPEG encode, and the CUDA
# streams they share round-robin (its default is one stream for all its threads)
NVIMGCODEC_THREADS = 8
NVIMGCODEC_STREAMS = 8

log = logging.getLogger(__name__)


def check(quality, chroma) -> None:
    """Validate the JPEG options of a cache build.

    Raises:
        DataError: ``quality`` is not an integer in [1, 100] or ``chroma`` not one of
            :data:`CHROMA`; the message names the option and the fix.
    """
    if isinstance(quality, bool) or not isinstance(quality, (int, np.integer)) or \
            not 1 <= quality <= 100:
        raise DataError(f"`camera_quality` (--camera-quality) must be an integer in [1, 100] "
                        f"(default {DEFAULT_QUALITY}); got {quality!r}.")
    if chroma not in CHROMA:
        raise DataError(f"`camera_chroma` (--camera-chroma) must be one of {CHROMA} (chroma "
                        f"subsampling; default {DEFAULT_CHROMA}, none); got {chroma!r}.")


def _simplejpeg():
    return require("simplejpeg", "data", "Encoding camera frames as JPEG")


def require_encoder() -> None:
    """Check that the CPU encoder imports.

    Raises:
        MissingDependencyError: simplejpeg is not installed (the message gives the pip
            command).
    """
    _simplejpeg()


def encode(frame: np.ndarray, quality: int = DEFAULT_QUALITY,
           chroma: str = DEFAULT_CHROMA) -> bytes:
    """One uint8 frame, RGB ``[H, W, 3]`` or grey ``[H, W]`` / ``[H, W, 1]``, as JPEG bytes
    (libjpeg-turbo, accurate DCT, the GIL released while it encodes)."""
    sj = _simplejpeg()
    frame = np.ascontiguousarray(frame)
    if frame.ndim == 3 and frame.shape[2] == 3:
        return sj.encode_jpeg(frame, quality, "RGB", chroma)
    return sj.encode_jpeg(frame.reshape(*frame.shape[:2], 1), quality, "GRAY", "Gray")


def encode_batch(frames, quality: int = DEFAULT_QUALITY,
                 chroma: str = DEFAULT_CHROMA) -> list[bytes]:
    """:func:`encode` of each frame of ``frames`` (uint8 ``[F, H, W, 3]`` or a sequence of
    frames), in order."""
    return [encode(f, quality, chroma) for f in frames]


_UNSET = object()
_module = _UNSET  # nvidia.nvimgcodec, or None, once imported
_import_text = ""  # what its import printed
_import_lock = threading.Lock()
_lock = threading.Lock()
_encoders: dict[int, tuple] = {}  # device -> (nvimgcodec.Encoder, the lock its callers take)
atexit.register(_encoders.clear)  # destroyed while CUDA and the interpreter are whole


def _nvimgcodec():
    """``nvidia.nvimgcodec``, or ``None`` where it is not installed. Its import prints to
    stderr the libraries it did not find (nvJPEG2000, nvTIFF: not used for JPEG); that text
    goes to this module's log at debug level instead, and into
    :func:`nvimgcodec_unavailable`'s reason when nvJPEG was the one missing."""
    global _module, _import_text
    with _import_lock:
        if _module is _UNSET:
            with _stderr_captured() as captured:
                try:
                    nvimgcodec = importlib.import_module("nvidia.nvimgcodec")
                except ImportError:
                    nvimgcodec = None
            _import_text = captured.get("text", "")
            if _import_text:
                log.debug("nvImageCodec at import: %s", _import_text)
            _module = nvimgcodec
        return _module


@contextlib.contextmanager
def _stderr_captured():
    """File descriptor 2 sent to a temporary file for the block; yields a dict that holds the
    text written (``"text"``) afterwards. Without a usable descriptor 2 nothing is captured."""
    import sys
    import tempfile

    out: dict[str, str] = {}
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError):
        yield out
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield out
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            out["text"] = tmp.read().decode(errors="replace").strip()


def _device(device) -> int:
    """A CUDA device's index (``None``, ``"cuda"``: the current device)."""
    import torch

    if isinstance(device, int):
        return device
    index = None if device is None else torch.device(device).index
    return torch.cuda.current_device() if index is None else index


def _nv_encoder(device: int):
    """This process's nvImageCodec encoder on CUDA device ``device`` and the lock its callers
    take (created on first use): ``GPU_ONLY`` backends, :data:`NVIMGCODEC_THREADS` threads at
    most (nvImageCodec caps them at the cores less one), :data:`NVIMGCODEC_STREAMS` CUDA
    streams at most (no more than the threads)."""
    from robocache._env import usable_cores

    nv = _nvimgcodec()
    with _lock:
        got = _encoders.get(device)
        if got is None:
            threads = max(1, min(NVIMGCODEC_THREADS, usable_cores() - 1))
            encoder = nv.Encoder(device_id=device, max_num_cpu_threads=threads,
                                 backends=[nv.Backend(nv.BackendKind.GPU_ONLY)],
                                 options=f":num_cuda_streams={min(NVIMGCODEC_STREAMS, threads)}")
            got = _encoders[device] = (encoder, threading.Lock())
        return got


@functools.cache
def _nvimgcodec_reason(device: int) -> str | None:
    nv = _nvimgcodec()
    if nv is None:
        return "nvImageCodec is not installed (pip install nvidia-nvimgcodec-cu13 nvidia-nvjpeg)"
    import torch

    try:
        probe = torch.zeros((1, 16, 16, 3), dtype=torch.uint8, device=f"cuda:{device}")
        data = _encode_nvimgcodec(probe, 95, DEFAULT_CHROMA)
        if not data[0].startswith(b"\xff\xd8"):
            return "nvImageCodec's output is not a JPEG"
    except Exception as e:  # noqa: BLE001 - any failure means: use the other encoder
        hint = " (libnvjpeg not found: pip install nvidia-nvjpeg)" \
            if "nvjpeg library" in _import_text.lower() else ""
        return f"nvImageCodec did not encode on cuda:{device}: {e}{hint}"
    return None


def nvimgcodec_unavailable(device=None) -> str | None:
    """Why nvImageCodec cannot encode JPEG on CUDA ``device`` (default: the current one) in
    this process, or ``None`` where it can (it is installed and encoded a probe frame there).
    Needs a CUDA device."""
    return _nvimgcodec_reason(_device(device))


@functools.cache
def _gpu_encoder(device: int) -> str | None:
    import importlib.util

    reason = _nvimgcodec_reason(device)
    if reason is None:
        return "nvimgcodec"
    fallback = "torchvision" if importlib.util.find_spec("torchvision") is not None else None
    if _nvimgcodec() is not None:  # installed but not working here: say so once
        log.warning("GPU JPEG encode %s: %s", "falls back to torchvision" if fallback
                    else "is off (no torchvision either)", reason)
    return fallback


def gpu_encoder(device=None) -> str | None:
    """The JPEG encoder :func:`encode_cuda` uses on CUDA ``device`` (default: the current
    one) in this process: ``"nvimgcodec"`` where nvImageCodec encodes there, else
    ``"torchvision"`` where torchvision is installed, else ``None`` (also without a CUDA
    device)."""
    import torch

    if not torch.cuda.is_available():
        return None
    return _gpu_encoder(_device(device))


def gpu_chroma(device=None) -> tuple[str, ...]:
    """The chroma choices (of :data:`CHROMA`) the GPU encoder writes on ``device``: all of
    them with nvImageCodec, ``("444",)`` with torchvision, none without a GPU encoder."""
    return {"nvimgcodec": CHROMA, "torchvision": ("444",)}.get(gpu_encoder(device), ())


def gpu_available() -> bool:
    """Whether JPEG can be encoded on the GPU here: a CUDA device and nvImageCodec or
    torchvision (:func:`gpu_encoder`)."""
    return gpu_encoder() is not None


def encode_cuda(frames, quality: int = DEFAULT_QUALITY, chroma: str = DEFAULT_CHROMA,
                encoder: str | None = None) -> list[bytes]:
    """uint8 RGB frames on a CUDA device, ``[F, H, W, 3]`` (a tensor, or a list of ``[H, W,
    3]`` tensors on one device), as JPEG bytes in order, encoded on that device by ``encoder``
    (of :data:`GPU_ENCODERS`; default :func:`gpu_encoder`'s choice).

    Raises:
        DataError: ``chroma`` other than 4:4:4 with torchvision (it writes 4:4:4 only).
        RuntimeError: no GPU encoder here, ``encoder="nvimgcodec"`` where it cannot encode
            (the reason), or a frame nvImageCodec failed to encode.
    """
    if encoder is not None and encoder not in GPU_ENCODERS:
        raise DataError(f"encoder must be one of {GPU_ENCODERS} or None; got {encoder!r}.")
    if chroma not in CHROMA:
        raise DataError(f"chroma must be one of {CHROMA}; got {chroma!r}.")
    if len(frames) == 0:
        return []
    encoder = encoder or gpu_encoder(frames[0].device)
    if encoder == "nvimgcodec":
        reason = nvimgcodec_unavailable(frames[0].device)
        if reason is not None:
            raise RuntimeError(reason)
        return _encode_nvimgcodec(frames, quality, chroma)
    if encoder == "torchvision":
        if chroma != "444":
            raise DataError(f"torchvision's GPU JPEG encoder writes 4:4:4 only; chroma {chroma!r} "
                            "needs nvImageCodec (pip install nvidia-nvimgcodec-cu13 "
                            "nvidia-nvjpeg) or the CPU encoder.")
        return _encode_torchvision(frames, quality)
    raise RuntimeError("no GPU JPEG encoder here: encode_cuda needs a CUDA device and "
                       "nvImageCodec (pip install nvidia-nvimgcodec-cu13 nvidia-nvjpeg) or "
                       "torchvision.")


def _encode_nvimgcodec(frames, quality: int, chroma: str) -> list[bytes]:
    """:func:`encode_cuda` by nvImageCodec: one ``Encoder.encode`` call for the list."""
    import torch

    if isinstance(frames, torch.Tensor):
        frames = list(frames.contiguous().unbind(0))
    else:
        frames = [f.contiguous() for f in frames]
    device = _device(frames[0].device)
    encoder, lock = _nv_encoder(device)
    return _nv_encode(encoder, lock, frames, quality, chroma,
                      torch.cuda.current_stream(device).cuda_stream)


def _nv_encode(encoder, lock: threading.Lock, frames: list, quality: int, chroma: str,
               stream: int) -> list[bytes]:
    """``frames`` (HWC uint8 RGB arrays: ``__cuda_array_interface__`` or, for an encoder
    with CPU backends, ``__array_interface__``) as JPEG bytes by an nvImageCodec ``encoder``
    under ``lock``, in one call; the frames are read after the work queued on the CUDA
    ``stream`` (0: the legacy default stream), and are done with when this returns."""
    nv = _nvimgcodec()
    params = nv.EncodeParams(
        quality_type=nv.QualityType.QUALITY, quality_value=float(quality),
        chroma_subsampling=getattr(nv.ChromaSubsampling, f"CSS_{chroma}"),
        jpeg_encode_params=nv.JpegEncodeParams(progressive=False, optimized_huffman=False))
    with lock:
        images = nv.as_images(frames, stream)
        out = encoder.encode(images, "jpeg", params=params, cuda_stream=stream)
    failed = [i for i, c in enumerate(out) if c is None]
    if failed:
        first = frames[failed[0]]
        raise RuntimeError(f"nvImageCodec did not encode {len(failed)} of {len(out)} frames "
                           f"(the first: #{failed[0]}, shape {tuple(first.shape)}, "
                           f"{first.dtype}).")
    return [bytes(c) for c in out]


def _forget() -> None:
    """Drop what this module learned about the GPU encoders (tests)."""
    global _module, _import_text
    with _import_lock:
        _module, _import_text = _UNSET, ""
    with _lock:
        _encoders.clear()
    _nvimgcodec_reason.cache_clear()
    _gpu_encoder.cache_clear()


def _encode_torchvision(frames, quality: int) -> list[bytes]:
    """:func:`encode_cuda` by torchvision (4:4:4): one ``encode_jpeg`` call for the list, the
    bytes copied to the host in one transfer."""
    import torch
    from torchvision.io import encode_jpeg

    if isinstance(frames, torch.Tensor):  # one kernel makes every frame planar
        chw = list(frames.permute(0, 3, 1, 2).contiguous().unbind(0))
    else:
        chw = [f.permute(2, 0, 1).contiguous() for f in frames]
    encoded = encode_jpeg(chw, quality=quality)
    sizes = [int(e.numel()) for e in encoded]
    flat = torch.cat(encoded).cpu().numpy()
    bounds = np.cumsum([0, *sizes])
    return [flat[a:b].tobytes() for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
