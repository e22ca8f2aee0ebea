"""Triton kernel of the image transforms: crop/affine/resize sampling and the colour ops fused.

One program renders a block of output pixels of one image: it bilinearly samples the uint8
source at the pixel (and, when the batch sharpens, at its 8 neighbours: a ``[BLOCK, 16]``
tile whose first 9 columns are the 3x3 neighbourhood), runs the image's colour ops in slot
order, and writes the centre column. Contrast blends with the mean grey level of the image it
receives, so a batch with contrast runs the kernel twice: once stopping at each image's
contrast slot to sum grey levels per block (``MEAN``), once to render.

The op chain has no branch on the loaded op ids: each slot computes the ops that some image
of the batch has in that slot (``SLOT_OPS``, a compile-time bit set known on the host) and
selects the image's one with ``tl.where``. Reductions (the sharpen blur, the block sums) are
warp shuffles and barriers, which must not sit under control flow that depends on loaded
values: compiled for the GPU, such branches let a reduction run with a partial warp (the
interpreter, which runs programs one by one, cannot show it).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl

from robocache._plancache import PlanCache
from robocache.kernels._utils import CachedLaunch, cdiv
from robocache.reference.image import BRIGHTNESS, CONTRAST, GRAY, HUE, SATURATION, SHARPNESS

OP_BRIGHTNESS = tl.constexpr(BRIGHTNESS)
OP_CONTRAST = tl.constexpr(CONTRAST)
OP_SATURATION = tl.constexpr(SATURATION)
OP_HUE = tl.constexpr(HUE)
OP_SHARPNESS = tl.constexpr(SHARPNESS)
G_R = tl.constexpr(GRAY[0])
G_G = tl.constexpr(GRAY[1])
G_B = tl.constexpr(GRAY[2])


@triton.jit
def _clamp01(x):
    return tl.minimum(tl.maximum(x, 0.0), 1.0)


@triton.jit
def _frac(x):
    return x - tl.floor(x)


@triton.jit
def _hue(r, g, b, f):
    """torchvision's RGB -> HSV, hue + f (mod 1), HSV -> RGB."""
    maxc = tl.maximum(tl.maximum(r, g), b)
    minc = tl.minimum(tl.minimum(r, g), b)
    eqc = maxc == minc
    rng = maxc - minc
    s = rng / tl.where(eqc, 1.0, maxc)
    div = tl.where(eqc, 1.0, rng)
    rc = (maxc - r) / div
    gc = (maxc - g) / div
    bc = (maxc - b) / div
    h = tl.where(maxc == r, bc - gc, tl.where(maxc == g, 2.0 + rc - bc, 4.0 + gc - rc))
    h = _frac(_frac(h / 6.0 + 1.0) + f)
    h6 = h * 6.0
    i = tl.floor(h6)
    fr = h6 - i
    i = tl.where(i >= 6.0, i - 6.0, i)  # h < 1, but h * 6 may round up to 6
    p = _clamp01(maxc * (1.0 - s))
    q = _clamp01(maxc * (1.0 - s * fr))
    t = _clamp01(maxc * (1.0 - s + s * fr))
    v = maxc
    ro = tl.where(i == 0, v, tl.where(i == 1, q, tl.where(i == 2, p, tl.where(
        i == 3, p, tl.where(i == 4, t, v)))))
    go = tl.where(i == 0, t, tl.where(i == 1, v, tl.where(i == 2, v, tl.where(
        i == 3, q, tl.where(i == 4, p, p)))))
    bo = tl.where(i == 0, p, tl.where(i == 1, p, tl.where(i == 2, t, tl.where(
        i == 3, v, tl.where(i == 4, v, q)))))
    return ro, go, bo


@triton.jit
def _sharpen(v, f, j, border):
    """Blend the centre column with the 3x3 blur (weights 1, centre 5, /13); unchanged at
    the image border. Returns the result broadcast to every column."""
    w = tl.where(j == 4, 5.0 / 13.0, tl.where(j < 9, 1.0 / 13.0, 0.0))
    blurred = tl.sum(v * w[None, :], 1)
    c = tl.sum(tl.where(j[None, :] == 4, v, 0.0), 1)
    out = tl.where(border, c, _clamp01(c + (1.0 - f) * (blurred - c)))
    return tl.broadcast_to(out[:, None], v.shape)


@triton.jit
def _image_kernel(src, out, crop, affine, ops, factors, mean, partial,
                  H, W, h, w, s_n, s_c, s_y, s_x, o_n, o_c, o_y, o_x, n_blocks,
                  K: tl.constexpr, NB: tl.constexpr, BLOCK: tl.constexpr, MEAN: tl.constexpr,
                  OUT_U8: tl.constexpr, SLOT_OPS: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    pid = tl.program_id(1)
    pix = pid * BLOCK + tl.arange(0, BLOCK)
    valid = pix < h * w
    yo = pix // w
    xo = pix % w
    j = tl.arange(0, NB)
    if NB > 1:
        dy = tl.where(j < 9, j // 3 - 1, 0)
        dx = tl.where(j < 9, j % 3 - 1, 0)
        cen = 4
    else:
        dy = j * 0
        dx = j * 0
        cen = 0
    # the output pixel (or neighbour) -> crop box -> inverse affine -> source index coordinates
    top = tl.load(crop + n * 4)
    left = tl.load(crop + n * 4 + 1)
    ch = tl.load(crop + n * 4 + 2)
    cw = tl.load(crop + n * 4 + 3)
    xq = (xo[:, None] + dx[None, :]).to(tl.float32)
    yq = (yo[:, None] + dy[None, :]).to(tl.float32)
    u = tl.minimum(tl.maximum((xq + 0.5) * (cw / w) - 0.5, 0.0), cw - 1.0)
    v = tl.minimum(tl.maximum((yq + 0.5) * (ch / h) - 0.5, 0.0), ch - 1.0)
    xc = left + u + 0.5 - W * 0.5
    yc = top + v + 0.5 - H * 0.5
    a0 = tl.load(affine + n * 6)
    a1 = tl.load(affine + n * 6 + 1)
    a2 = tl.load(affine + n * 6 + 2)
    a3 = tl.load(affine + n * 6 + 3)
    a4 = tl.load(affine + n * 6 + 4)
    a5 = tl.load(affine + n * 6 + 5)
    sx = a0 * xc + a1 * yc + a2 + (W * 0.5 - 0.5)
    sy = a3 * xc + a4 * yc + a5 + (H * 0.5 - 0.5)
    # bilinear, zero outside, times the in-bounds weight (torchvision's affine with fill 0)
    x0f = tl.floor(sx)
    y0f = tl.floor(sy)
    fx = sx - x0f
    fy = sy - y0f
    x0 = x0f.to(tl.int32)
    y0 = y0f.to(tl.int32)
    r = tl.zeros([BLOCK, NB], tl.float32)
    g = tl.zeros([BLOCK, NB], tl.float32)
    b = tl.zeros([BLOCK, NB], tl.float32)
    wsum = tl.zeros([BLOCK, NB], tl.float32)
    base = src + n * s_n
    for corner in tl.static_range(4):
        xi = x0 + (corner % 2)
        yi = y0 + (corner // 2)
        wx = fx if corner % 2 == 1 else 1.0 - fx
        wy = fy if corner // 2 == 1 else 1.0 - fy
        wgt = wx * wy
        inb = (xi >= 0) & (xi < W) & (yi >= 0) & (yi < H) & valid[:, None]
        off = yi.to(tl.int64) * s_y + xi.to(tl.int64) * s_x
        r += wgt * tl.load(base + off, mask=inb, other=0).to(tl.float32)
        g += wgt * tl.load(base + off + s_c, mask=inb, other=0).to(tl.float32)
        b += wgt * tl.load(base + off + 2 * s_c, mask=inb, other=0).to(tl.float32)
        wsum += tl.where(inb, wgt, 0.0)
    scale = wsum / 255.0
    r = r * scale
    g = g * scale
    b = b * scale
    border = (yo == 0) | (yo == h - 1) | (xo == 0) | (xo == w - 1) | (h <= 2) | (w <= 2)
    live = pid == pid  # a scalar true: false from an image's contrast slot on, in MEAN
    # SLOT_OPS bit 5 k + id: some image has op id (brightness 0 ... sharpness 4) in slot k
    for k in tl.static_range(K):
        op = tl.load(ops + n * K + k)
        f = tl.load(factors + n * K + k)
        if MEAN:
            live = live & (op != OP_CONTRAST)
        if (SLOT_OPS >> (k * 5 + 0)) & 1:
            on = live & (op == OP_BRIGHTNESS)
            r = tl.where(on, _clamp01(r * f), r)
            g = tl.where(on, _clamp01(g * f), g)
            b = tl.where(on, _clamp01(b * f), b)
        if (SLOT_OPS >> (k * 5 + 1)) & 1:
            on = live & (op == OP_CONTRAST)
            m = (1.0 - f) * tl.load(mean + n)
            r = tl.where(on, _clamp01(f * r + m), r)
            g = tl.where(on, _clamp01(f * g + m), g)
            b = tl.where(on, _clamp01(f * b + m), b)
        if (SLOT_OPS >> (k * 5 + 2)) & 1:
            on = live & (op == OP_SATURATION)
            m = (1.0 - f) * (G_R * r + G_G * g + G_B * b)
            r = tl.where(on, _clamp01(f * r + m), r)
            g = tl.where(on, _clamp01(f * g + m), g)
            b = tl.where(on, _clamp01(f * b + m), b)
        if (SLOT_OPS >> (k * 5 + 3)) & 1:
            on = live & (op == OP_HUE)
            hr, hg, hb = _hue(r, g, b, f)
            r = tl.where(on, hr, r)
            g = tl.where(on, hg, g)
            b = tl.where(on, hb, b)
        if (SLOT_OPS >> (k * 5 + 4)) & 1:
            on = live & (op == OP_SHARPNESS)
            r = tl.where(on, _sharpen(r, f, j, border), r)
            g = tl.where(on, _sharpen(g, f, j, border), g)
            b = tl.where(on, _sharpen(b, f, j, border), b)
    rc = tl.sum(tl.where(j[None, :] == cen, r, 0.0), 1)
    gc = tl.sum(tl.where(j[None, :] == cen, g, 0.0), 1)
    bc = tl.sum(tl.where(j[None, :] == cen, b, 0.0), 1)
    if MEAN:
        gray = tl.where(valid, G_R * rc + G_G * gc + G_B * bc, 0.0)
        tl.store(partial + n * n_blocks + pid, tl.sum(gray, 0))
    else:
        dst = out + n * o_n + yo.to(tl.int64) * o_y + xo.to(tl.int64) * o_x
        for c in tl.static_range(3):
            val = rc if c == 0 else (gc if c == 1 else bc)
            if OUT_U8:
                val = tl.floor(val * 255.0 + 0.5)
            tl.store(dst + c * o_c, val.to(out.dtype.element_ty), mask=valid)


def slot_ops(ops: torch.Tensor) -> int:
    """The kernel's ``SLOT_OPS``: bit ``5 k + op`` set when some image has ``op`` in slot ``k``
    (``ops``: the host copy of the int ``[N, K]`` op ids)."""
    ids = ops.numpy().astype(np.int64)
    bits = (ids + 5 * np.arange(ids.shape[1]))[ids >= 0]
    return sum(1 << int(b) for b in np.unique(bits))


# Eager calls relaunch a CachedLaunch per (geometry, strides, output dtype, op set, device).
_PLANS = PlanCache(256)


def image_transform_cuda(frames: torch.Tensor, crop: torch.Tensor, affine: torch.Tensor,
                         ops: torch.Tensor, factors: torch.Tensor, out: torch.Tensor,
                         *, slots: int) -> torch.Tensor:
    """Launch the transform into ``out`` ``[N, 3, h, w]`` (any strides). ``slots``:
    :func:`slot_ops` of the batch's op ids (host-known from the sampled parameters), which
    picks the ops compiled per slot, the 16-column tile (sharpness) and the mean pass
    (contrast)."""
    n = frames.shape[0]
    if n == 0:
        return out
    crop, affine, ops, factors = crop.contiguous(), affine.contiguous(), ops.contiguous(), \
        factors.contiguous()
    key = (frames.shape, out.shape, frames.stride(), out.stride(), out.dtype, ops.shape[1],
           slots, frames.device)
    plan = _PLANS.get(key) or _PLANS.put(key, _ImagePlan(frames, out, ops.shape[1], slots))
    plan.launch(frames, out, crop, affine, ops, factors)
    return out


class _ImagePlan:
    """Grid and cached launches of one transform geometry (sizes, strides, op set)."""

    __slots__ = ("n", "blocks", "hw", "ints", "mean_pass", "render")

    def __init__(self, frames: torch.Tensor, out: torch.Tensor, k: int, slots: int):
        n = frames.shape[0]
        h, w = out.shape[-2:]
        used = {op for op in range(5) for s in range(k) if slots >> (5 * s + op) & 1}
        nb = 16 if SHARPNESS in used else 1
        # 128 pixels x 16 neighbours (2048 values per live tensor) or 1024 pixels per program
        block = 128 if nb > 1 else 1024
        self.n, self.blocks, self.hw = n, cdiv(h * w, block), h * w
        self.ints = (*frames.shape[-2:], h, w, *frames.stride(), *out.stride(), self.blocks)
        grid, u8 = (n, self.blocks), out.dtype == torch.uint8
        self.render = CachedLaunch(_image_kernel, grid, (k, nb, block, False, u8, slots))
        self.mean_pass = CachedLaunch(_image_kernel, grid, (k, nb, block, True, u8, slots)) \
            if CONTRAST in used else None

    def launch(self, frames, out, crop, affine, ops, factors) -> None:
        ints = self.ints
        if self.mean_pass is None:  # no contrast: the kernel reads neither mean nor partial
            self.render((frames, out, crop, affine, ops, factors, factors, factors, *ints),
                        (frames, out, crop, affine, ops, factors))
            return
        mean = torch.zeros(self.n, device=frames.device, dtype=torch.float32)
        partial = torch.empty(self.n, self.blocks, device=frames.device, dtype=torch.float32)
        tensors = (frames, out, crop, affine, ops, factors, mean, partial)
        self.mean_pass((*tensors, *ints), tensors)
        torch.div(partial.sum(1), self.hw, out=mean)
        self.render((frames, out, crop, affine, ops, factors, mean, mean, *ints), tensors[:7])
