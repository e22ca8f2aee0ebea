"""NV12 frames to RGB with the arithmetic of FFmpeg's swscale (its x86 SIMD path), so a frame
decoded by NVDEC converts to exactly the pixels PyAV's ``to_ndarray``/``reformat(format=
"rgb24")`` gives for the same YUV frame: the CPU path's (and LeRobot's PyAV decode's).

swscale converts 8-bit 4:2:0 to RGB with 16-bit fixed point: each chroma sample covers its
2x2 block of luma (no interpolation); ``y' = ((Y << 3) - yo) * yc >> 16``,
``c' = (C << 3) - 1024`` for U and V, and ``R = y' + (v' * vr >> 16)``, ``G = y' + (u' * ug
>> 16) + (v' * vg >> 16)``, ``B = y' + (u' * ub >> 16)``, saturated to 0..255 (``>> 16`` rounds
towards minus infinity). The coefficients come from the frame's matrix and range
(:func:`coefficients`); tested equal to PyAV's conversion pixel for pixel.
"""

from __future__ import annotations

import torch

# swscale's inverse matrices (crv, cbu, cgu, cgv) in 16.16 fixed point, by FFmpeg's colorspace
# number (AVColorSpace): BT.709 (1), BT.601 for unspecified and the 601 variants (2, 5, 6),
# FCC (4), SMPTE 240M (7), BT.2020 (9, 10)
_MATRICES = {1: (117489, 138438, 13975, 34925), 4: (104448, 132798, 24759, 53109),
             7: (117579, 136230, 16907, 35559), 9: (110013, 140363, 12277, 42626),
             10: (110013, 140363, 12277, 42626)}
_BT601 = (104597, 132201, 25675, 53279)


def coefficients(colorspace: int, full_range: bool) -> tuple[int, int, int, int, int, int]:
    """The six integer coefficients ``(yc, yo, vr, ub, ug, vg)`` swscale derives for a frame
    of FFmpeg colorspace number ``colorspace`` and range (``full_range``: JPEG range 0..255,
    else MPEG range 16..235)."""
    crv, cbu, cgu, cgv = _MATRICES.get(int(colorspace), _BT601)
    cy, oy = 1 << 16, 0
    if full_range:
        crv, cbu, cgu, cgv = (c * 224 // 255 for c in (crv, cbu, cgu, cgv))
    else:
        cy, oy = cy * 255 // 219, 16 << 16

    def q(x: int) -> int:  # swscale's roundToInt16 of x * 2^13, from 16.16 to 3.13
        return (x * (1 << 13) + (1 << 15)) >> 16

    return q(cy), (oy * 8 + (1 << 15)) >> 16, q(crv), q(cbu), q(-cgu), q(-cgv)


def nv12_to_rgb(nv12: torch.Tensor, height: int, width: int, coeffs: torch.Tensor
                ) -> torch.Tensor:
    """uint8 ``[N, H * W * 3 / 2]`` NV12 frames (luma, then interleaved U/V at half size; even
    ``H``, ``W``) and int ``[N, 6]`` coefficients (:func:`coefficients`, one row per frame):
    uint8 ``[N, 3, H, W]`` RGB."""
    n, h, w = nv12.shape[0], height, width
    y = nv12[:, :h * w].reshape(n, h, w).to(torch.int32)
    uv = nv12[:, h * w:].reshape(n, h // 2, w // 2, 2).to(torch.int32)
    uv = uv.repeat_interleave(2, 1).repeat_interleave(2, 2)
    c = coeffs.to(torch.int32).reshape(n, 6, 1, 1)
    yc, yo, vr, ub, ug, vg = c.unbind(1)
    luma = (((y << 3) - yo) * yc) >> 16
    u, v = (uv[..., 0] << 3) - 1024, (uv[..., 1] << 3) - 1024
    r = luma + ((v * vr) >> 16)
    g = luma + ((u * ug) >> 16) + ((v * vg) >> 16)
    b = luma + ((u * ub) >> 16)
    return torch.stack([r, g, b], 1).clamp_(0, 255).to(torch.uint8)
