"""Pure-PyTorch trajectory augmentation: the CPU path and the oracle of the Triton kernels.

Randomness is counter-based: every random number is Triton's Philox-4x32-10
(``tl.randint4x``) of ``(seed, counter)``, reproduced here bit for bit on the integer side
(the float conversion of a uniform is exact too; Box-Muller's log/cos/sin round per device).
So a value depends only on the seed and its own index, never on the batch around it or on
the order of launches: sample i of a batch gets the same parameters whatever B is.

Offsets: the noise of an ``[N, D]`` array draws one Philox call per row and 4 columns
(`normals`); the parameters of variant i (= b * K + k) sit at
``PARAM_BASE + i * PARAM_STRIDE + slot`` (slots below).
"""

from __future__ import annotations

import math

import torch

MASK32 = 0xFFFFFFFF
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57

PARAM_BASE = 1 << 40   # parameter offsets never collide with element offsets below 2**40
PARAM_STRIDE = 256     # slots per variant
SLOT_AXIS, SLOT_ANGLE, SLOT_TRANS, SLOT_WARP, SLOT_CROP, SLOT_DROP = 0, 2, 3, 6, 14, 16
MAX_WARP_TERMS = SLOT_CROP - SLOT_WARP
MAX_STREAMS = PARAM_STRIDE - SLOT_DROP


def _mulhilo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) 32-bit halves of a * b for uint32 values held in int64 (no overflow)."""
    bl, bh = b & 0xFFFF, b >> 16
    p1, p2 = a * bl, a * bh
    return (p2 + (p1 >> 16)) >> 16, (p1 + ((p2 & 0xFFFF) << 16)) & MASK32


def philox(seed: int, offsets: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Four uint32 words (int64 tensors) of Triton's ``randint4x(seed, offsets)``."""
    off = offsets.long()
    c0, c1 = off & MASK32, (off >> 32) & MASK32
    c2 = torch.zeros_like(off)
    c3 = torch.zeros_like(off)
    seed &= (1 << 64) - 1
    k0, k1 = seed & MASK32, (seed >> 32) & MASK32
    for _ in range(10):
        hi_b, lo_b = _mulhilo(_ROUND_B, c2)
        hi_a, lo_a = _mulhilo(_ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + _KEY_A) & MASK32, (k1 + _KEY_B) & MASK32
    return c0, c1, c2, c3


def _uniform(word: torch.Tensor) -> torch.Tensor:
    """Triton's uint_to_uniform_float: [0, 1) float32."""
    x = torch.where(word >= 1 << 31, word - (1 << 32), word)
    x = torch.where(x < 0, -x - 1, x)
    return x.to(torch.float32) * torch.tensor(4.6566127342e-10, dtype=torch.float32)


def rand(seed: int, offsets: torch.Tensor) -> torch.Tensor:
    """``tl.rand(seed, offsets)``: uniform [0, 1) float32."""
    return _uniform(philox(seed, offsets)[0])


def box_muller(w0: torch.Tensor, w1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Two standard normals (float32) from two Philox words, as ``tl.randn4x`` pairs them:
    ``r cos(2 pi u1), r sin(2 pi u1)`` with ``r = sqrt(-2 log max(u0, 1e-7))``."""
    r = torch.sqrt(-2.0 * torch.log(_uniform(w0).clamp_min(1.0e-7)))
    th = torch.tensor(6.283185307179586, dtype=torch.float32) * _uniform(w1)
    return r * torch.cos(th), r * torch.sin(th)


def normals(seed: int, rows: int, d: int, device=None) -> torch.Tensor:
    """Standard normals ``[rows, d]`` (float32) of the noise stream of an ``[rows, d]`` array.

    Element (r, c) is normal ``c % 4`` of Philox-4x32 at counter ``r * ceil(d / 4) + c // 4``:
    words (0, 1) give normals 0 and 1, words (2, 3) normals 2 and 3 (`box_muller`). One
    Philox call serves four columns, and a value depends only on (seed, r, c, d).
    """
    q = -(-d // 4)
    ctr = (torch.arange(rows, dtype=torch.int64, device=device)[:, None] * q
           + torch.arange(q, dtype=torch.int64, device=device))
    w0, w1, w2, w3 = philox(seed, ctr)
    n = torch.stack((*box_muller(w0, w1), *box_muller(w2, w3)), -1)
    return n.reshape(rows, 4 * q)[:, :d]


def param_uniforms(seed: int, variants: int, first: int, count: int, device=None) -> torch.Tensor:
    """Uniforms ``[variants, count]`` of parameter slots first..first+count-1 of variants 0..n-1."""
    i = torch.arange(variants, dtype=torch.int64, device=device)[:, None]
    slots = torch.arange(first, first + count, dtype=torch.int64, device=device)
    return rand(seed, PARAM_BASE + i * PARAM_STRIDE + slots)


def rigid_from_uniforms(u: torch.Tensor, max_translation: float, max_rotation: float):
    """(wxyz unit quaternion [..., 4], translation [..., 3]) from slot uniforms.

    Axis uniform on the sphere (z = 2u - 1, azimuth 2 pi u), angle uniform in
    [0, max_rotation] radians, translation uniform in the cube [-max_t, max_t]^3 metres.
    """
    z = 2 * u[..., SLOT_AXIS] - 1
    az = 2 * math.pi * u[..., SLOT_AXIS + 1]
    r = torch.sqrt((1 - z * z).clamp_min(0))
    half = 0.5 * max_rotation * u[..., SLOT_ANGLE]
    s = torch.sin(half)
    quat = torch.stack((torch.cos(half), s * r * torch.cos(az), s * r * torch.sin(az), s * z), -1)
    trans = (2 * u[..., SLOT_TRANS:SLOT_TRANS + 3] - 1) * max_translation
    return quat, trans


def warp_from_uniforms(u: torch.Tensor, strength: float, terms: int, max_crop: float):
    """(coefficients [..., terms], crop [..., 2]) of the time map `warp_phase`.

    ``a_m`` uniform in ``[-strength / terms, strength / terms]`` so ``sum |a_m| <= strength``;
    crop (start, end) each uniform in ``[0, max_crop]`` (zero keeps the endpoints).
    """
    coeffs = (2 * u[..., SLOT_WARP:SLOT_WARP + terms] - 1) * (strength / max(terms, 1))
    crop = u[..., SLOT_CROP:SLOT_CROP + 2] * max_crop
    return coeffs, crop


def warp_phase(u: torch.Tensor, coeffs: torch.Tensor, crop: torch.Tensor) -> torch.Tensor:
    """Smooth monotone map of normalized time u in [0, 1] (u [..., T], coeffs [..., M]).

    ``phi(u) = u + sum_m a_m sin(pi m u) / (pi m)``: ``phi(0) = 0``, ``phi(1) = 1`` and
    ``phi'(u) = 1 + sum_m a_m cos(pi m u) >= 1 - sum |a_m| > 0`` (strictly increasing for
    strength < 1). Then ``c0 + (1 - c0 - c1) phi`` crops (start, end) = crop.
    """
    m = torch.arange(1, coeffs.shape[-1] + 1, dtype=u.dtype, device=u.device) * math.pi
    phi = u + (coeffs[..., None, :] * torch.sin(u[..., None] * m) / m).sum(-1)
    c0, c1 = crop[..., :1], crop[..., 1:2]
    return c0 + (1 - c0 - c1) * phi


def gaussian_taps(sigma: float, radius: int) -> torch.Tensor:
    """Normalized Gaussian taps of length 2 radius + 1 (float64)."""
    x = torch.arange(-radius, radius + 1, dtype=torch.float64)
    w = torch.exp(-0.5 * (x / sigma) ** 2)
    return w / w.sum()


def savgol_taps(window: int, polyorder: int) -> torch.Tensor:
    """Savitzky-Golay smoothing taps (float64): the least-squares polynomial's value at the
    window centre, as a convolution (``scipy.signal.savgol_coeffs(window, polyorder)``)."""
    half = window // 2
    x = torch.arange(-half, half + 1, dtype=torch.float64)
    vander = x[:, None] ** torch.arange(polyorder + 1, dtype=torch.float64)
    return torch.linalg.pinv(vander)[0]


def smooth_reference(x: torch.Tensor, taps: torch.Tensor, dim: int) -> torch.Tensor:
    """Correlate `x` with symmetric `taps` along `dim`, edges extended ('nearest')."""
    acc = torch.promote_types(x.dtype, torch.float32)
    xt = x.to(acc).movedim(dim, -1)
    shape = xt.shape
    r = taps.shape[0] // 2
    flat = torch.nn.functional.pad(xt.reshape(-1, 1, shape[-1]), (r, r), mode="replicate")
    y = torch.nn.functional.conv1d(flat, taps.to(x.device, acc).view(1, 1, -1))
    return y.reshape(shape).movedim(-1, dim).to(x.dtype)
