"""JPEG encoding of camera frames at ingest: libjpeg-turbo on the CPU, nvJPEG on the GPU.

CPU (:func:`encode`, :func:`encode_batch`): libjpeg-turbo through simplejpeg, which releases
the GIL while it encodes (py-spy ``--gil`` on one thread encoding 480x640 frames at q95: 3 % of
its samples hold the GIL, against 91 % for Pillow's JPEG encoder and 7 % for PyTurboJPEG;
``benchmarks/results/jpeg-gil-cpu-2026-11-27.json``, ``benchmarks/profile_jpeg_gil.py``), and
ships libjpeg-turbo inside its wheel (PyTurboJPEG loads the system's libturbojpeg, 3.0 or later
for its 2.x releases).

GPU (:func:`encode_cuda`): ``torchvision.io.encode_jpeg`` on a list of CUDA tensors (nvJPEG).
torchvision's CUDA encoder always writes 4:4:4 chroma (it sets ``NVJPEG_CSS_444`` on every
image), so it serves the default chroma; other chroma choices encode on the CPU.

Chroma (``"444"``, ``"422"``, ``"420"``): the resolution the colour planes keep. 4:4:4 keeps
them whole: the stored frame stays within a few grey levels of the decoded source at colour
edges, where 4:2:0 (Pillow's default) smears a sharp edge over two pixels.
"""

from __future__ import annotations

import functools

import numpy as np

from robocache._optional import require
from robocache.errors import DataError

CHROMA = ("444", "422", "420")
# 4:4:4 at q95: >= 40 dB PSNR of the source's own decode on sharp-edged content (fiducials,
# text, colour edges; q90 fell to 38 dB there), about 1.2x the bytes of 4:2:0 at q95: see the
# table in docs/cameras.md
DEFAULT_QUALITY = 95
DEFAULT_CHROMA = "444"


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


@functools.cache
def gpu_available() -> bool:
    """Whether nvJPEG can encode here: a CUDA device and torchvision with ``encode_jpeg``."""
    import importlib.util

    import torch

    return torch.cuda.is_available() and importlib.util.find_spec("torchvision") is not None


def encode_cuda(frames, quality: int = DEFAULT_QUALITY) -> list[bytes]:
    """uint8 RGB frames on a CUDA device, ``[F, H, W, 3]`` (a tensor, or a list of ``[H, W,
    3]`` tensors), as 4:4:4 JPEG bytes: one ``torchvision.io.encode_jpeg`` call (nvJPEG) for
    the batch, the bytes copied to the host in one transfer."""
    import torch
    from torchvision.io import encode_jpeg

    if len(frames) == 0:
        return []
    if isinstance(frames, torch.Tensor):  # one kernel makes every frame planar
        chw = list(frames.permute(0, 3, 1, 2).contiguous().unbind(0))
    else:
        chw = [f.permute(2, 0, 1).contiguous() for f in frames]
    encoded = encode_jpeg(chw, quality=quality)
    sizes = [int(e.numel()) for e in encoded]
    flat = torch.cat(encoded).cpu().numpy()
    bounds = np.cumsum([0, *sizes])
    return [flat[a:b].tobytes() for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
