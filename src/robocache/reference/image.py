"""Pure-PyTorch image transforms: the CPU path and the oracle of the fused kernel.

Semantics follow ``torchvision.transforms.v2.functional`` on float images in [0, 1]
(``adjust_brightness/contrast/saturation/hue/sharpness``, ``resized_crop`` with bilinear
interpolation and no antialias, ``affine`` with bilinear interpolation and fill 0), composed
as one sampling: output pixel -> crop box -> inverse affine -> bilinear source sample.
"""

from __future__ import annotations

import torch

# Colour op ids of the `ops` tensor (-1: empty slot).
BRIGHTNESS, CONTRAST, SATURATION, HUE, SHARPNESS = range(5)
OP_NAMES = ("brightness", "contrast", "saturation", "hue", "sharpness")
GRAY = (0.2989, 0.587, 0.114)


def _gray(x: torch.Tensor) -> torch.Tensor:
    return x[:, 0] * GRAY[0] + x[:, 1] * GRAY[1] + x[:, 2] * GRAY[2]


def _blend(x: torch.Tensor, y: torch.Tensor | float, f: torch.Tensor) -> torch.Tensor:
    return (f * x + (1.0 - f) * y).clamp(0.0, 1.0)


def _hue(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    r, g, b = x.unbind(1)
    maxc, minc = x.amax(1), x.amin(1)
    eqc = maxc == minc
    rng = maxc - minc
    s = rng / torch.where(eqc, torch.ones_like(maxc), maxc)
    div = torch.where(eqc, torch.ones_like(rng), rng)
    rc, gc, bc = (maxc - r) / div, (maxc - g) / div, (maxc - b) / div
    h = torch.where(maxc == r, bc - gc,
                    torch.where(maxc == g, 2.0 + rc - bc, 4.0 + gc - rc))
    h = torch.fmod(h / 6.0 + 1.0, 1.0)
    h = torch.remainder(h + f, 1.0)
    h6 = h * 6.0
    i = torch.floor(h6)
    fr = h6 - i
    i = torch.remainder(i, 6)
    v = maxc
    p = (v * (1.0 - s)).clamp(0.0, 1.0)
    q = (v * (1.0 - s * fr)).clamp(0.0, 1.0)
    t = (v * (1.0 - s + s * fr)).clamp(0.0, 1.0)
    sel = [(v, t, p), (q, v, p), (p, v, t), (p, q, v), (t, p, v), (v, p, q)]
    out = [torch.zeros_like(v) for _ in range(3)]
    for k, trio in enumerate(sel):
        m = i == k
        for c in range(3):
            out[c] = torch.where(m, trio[c], out[c])
    return torch.stack(out, 1)


def _sharpness(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    h, w = x.shape[-2:]
    if h <= 2 or w <= 2:
        return x
    k = torch.ones(3, 3, dtype=x.dtype, device=x.device)
    k[1, 1] = 5.0
    k = (k / 13.0).expand(3, 1, 3, 3)
    blurred = torch.nn.functional.conv2d(x, k, groups=3)
    out = x.clone()
    inner = out[..., 1:-1, 1:-1]
    out[..., 1:-1, 1:-1] = inner + (1.0 - f[..., None]) * (blurred - inner)
    return out.clamp(0.0, 1.0)


def color(x: torch.Tensor, ops: torch.Tensor, factors: torch.Tensor) -> torch.Tensor:
    """Apply each image's colour ops in slot order.

    Args:
        x: float ``[N, 3, H, W]`` in [0, 1].
        ops: int ``[N, K]`` op ids (``BRIGHTNESS``...; -1 = no op in that slot).
        factors: float ``[N, K]`` each op's factor (the hue shift for ``HUE``).

    Returns:
        float ``[N, 3, H, W]`` (a new tensor).
    """
    x = x.clone()
    for k in range(ops.shape[1]):
        for op in range(5):
            sel = torch.nonzero(ops[:, k] == op).flatten()
            if sel.numel() == 0:
                continue
            xs, f = x[sel], factors[sel, k].to(x.dtype).view(-1, 1, 1, 1)
            if op == BRIGHTNESS:
                y = _blend(xs, 0.0, f)
            elif op == CONTRAST:
                y = _blend(xs, _gray(xs).mean((-2, -1)).view(-1, 1, 1, 1), f)
            elif op == SATURATION:
                y = _blend(xs, _gray(xs)[:, None], f)
            elif op == HUE:
                y = _hue(xs, f.view(-1, 1, 1))
            else:
                y = _sharpness(xs, f.view(-1, 1, 1))
            x[sel] = y
    return x


def source_coords(crop: torch.Tensor, affine: torch.Tensor, src_hw: tuple[int, int],
                  out_hw: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Source pixel-index coordinates (x, y), each float32 ``[N, h, w]``, sampled by every output
    pixel (see :func:`robocache.ops.image.image_transform` for ``crop`` and ``affine``)."""
    (H, W), (h, w) = src_hw, out_hw
    dev = crop.device
    top, left, ch, cw = (crop[:, i].float().view(-1, 1, 1) for i in range(4))
    xo = torch.arange(w, device=dev, dtype=torch.float32).view(1, 1, w)
    yo = torch.arange(h, device=dev, dtype=torch.float32).view(1, h, 1)
    u = torch.minimum(torch.clamp((xo + 0.5) * (cw / w) - 0.5, min=0.0), cw - 1.0)
    v = torch.minimum(torch.clamp((yo + 0.5) * (ch / h) - 0.5, min=0.0), ch - 1.0)
    xc, yc = left + u + 0.5 - W / 2.0, top + v + 0.5 - H / 2.0
    a = [affine[:, i].float().view(-1, 1, 1) for i in range(6)]
    sx = a[0] * xc + a[1] * yc + a[2] + (W / 2.0 - 0.5)
    sy = a[3] * xc + a[4] * yc + a[5] + (H / 2.0 - 0.5)
    return sx, sy


def warp(frames: torch.Tensor, crop: torch.Tensor, affine: torch.Tensor,
         out_hw: tuple[int, int]) -> torch.Tensor:
    """Bilinear resample of uint8 ``[N, 3, H, W]`` frames to float ``[N, 3, h, w]`` in [0, 1];
    outside the source the value fades to 0 as torchvision's ``affine(fill=0)`` does (the
    zero-padded sample times the in-bounds weight)."""
    n, _, H, W = frames.shape
    sx, sy = source_coords(crop, affine, (H, W), out_hw)
    grid = torch.stack([(sx + 0.5) * (2.0 / W) - 1.0, (sy + 0.5) * (2.0 / H) - 1.0], -1)
    src = torch.cat([frames.float() / 255.0, frames.new_ones(n, 1, H, W, dtype=torch.float32)],
                    1)
    s = torch.nn.functional.grid_sample(src, grid, mode="bilinear", padding_mode="zeros",
                                        align_corners=False)
    return s[:, :3] * s[:, 3:]


def image_transform(frames: torch.Tensor, crop: torch.Tensor, affine: torch.Tensor,
                    ops: torch.Tensor, factors: torch.Tensor,
                    out_hw: tuple[int, int]) -> torch.Tensor:
    """Geometry (:func:`warp`) then colour (:func:`color`): float ``[N, 3, h, w]``."""
    return color(warp(frames, crop, affine, out_hw), ops, factors)
