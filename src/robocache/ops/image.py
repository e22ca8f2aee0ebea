"""Camera frame transforms: crop / affine / resize and LeRobot-style colour jitter, fused.

    >>> cfg = ImageTransformsConfig(crop_scale=(0.8, 1.0))
    >>> params = sample_image_transforms(8, (480, 640), cfg, seed=7)
    >>> x = image_transform(frames, (224, 224), params)  # uint8 [8,3,480,640] -> [8,3,224,224]

Parameters are sampled on the host (:func:`sample_image_transforms`, LeRobot's
``ImageTransformsConfig`` semantics: each image gets ``max_num_transforms`` of the weighted
transforms, drawn without replacement, in the listed order unless ``random_order``) and applied
by :func:`image_transform`: geometry first (crop box, then the inverse affine, one bilinear
sample from the uint8 source), then the colour ops in their sampled order. On CUDA this is one
Triton kernel (two launches when a contrast op needs its image mean); on CPU the PyTorch
reference. Both follow ``torchvision.transforms.v2.functional`` (resized_crop without
antialias, affine with bilinear interpolation and fill 0, adjust_brightness / contrast /
saturation / hue / sharpness). Geometry comes first whatever the sampled order, so a colour op
sees the cropped image: contrast's mean is taken over the crop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from robocache._plancache import PlanCache
from robocache.errors import DTypeError
from robocache.observability import nvtx
from robocache.ops._checks import check_device, check_dtype, check_fits, fail
from robocache.ops._dispatch import Op, launches_directly
from robocache.reference import image as ref

__all__ = ["ImageTransformsConfig", "ImageTransformParams", "sample_image_transforms",
           "image_transform"]

COLOR_OPS = ref.OP_NAMES
OUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.uint8)


@dataclass
class ImageTransformsConfig:
    """Random image transforms, as LeRobot's ``ImageTransformsConfig`` (same defaults).

    Attributes:
        max_num_transforms: transforms applied per image, drawn without replacement with
            probability proportional to ``weights`` (LeRobot's ``RandomSubsetApply``).
        random_order: apply the drawn colour transforms in draw order instead of listed order.
        weights: transform name -> weight (``brightness``, ``contrast``, ``saturation``,
            ``hue``, ``sharpness``, ``affine``); weight 0 disables one.
        brightness, contrast, saturation, sharpness: factor ranges (uniform).
        hue: hue shift range, in turns (within [-0.5, 0.5]).
        affine_degrees: rotation range in degrees (counter-clockwise positive).
        affine_translate: maximum shift as a fraction of width and height (rounded to whole
            pixels, as torchvision's ``RandomAffine``).
        crop_scale: random crop side as a fraction of each source side, uniform in this range
            (``None``: the whole frame); the crop is resized to the output size.
    """

    max_num_transforms: int = 3
    random_order: bool = False
    weights: dict[str, float] = field(default_factory=lambda: dict.fromkeys(
        (*COLOR_OPS, "affine"), 1.0))
    brightness: tuple[float, float] = (0.8, 1.2)
    contrast: tuple[float, float] = (0.8, 1.2)
    saturation: tuple[float, float] = (0.5, 1.5)
    hue: tuple[float, float] = (-0.05, 0.05)
    sharpness: tuple[float, float] = (0.5, 1.5)
    affine_degrees: tuple[float, float] = (-5.0, 5.0)
    affine_translate: tuple[float, float] = (0.05, 0.05)
    crop_scale: tuple[float, float] | None = None


@dataclass(frozen=True)
class ImageTransformParams:
    """Per-image transform parameters (float32 / int32, one row per image).

    Attributes:
        crop: ``[N, 4]`` crop box (top, left, height, width) in source pixels.
        affine: ``[N, 6]`` inverse affine ``[a, b, c, d, e, f]``: an output position (x, y),
            relative to the source centre, samples the source at ``(a x + b y + c, d x + e y + f)``
            (torchvision's inverse affine matrix; identity ``[1, 0, 0, 0, 1, 0]``).
        ops: ``[N, K]`` colour op ids in application order (index into ``COLOR_OPS``; -1 none).
        factors: ``[N, K]`` the factor of each op (the shift in turns for hue).
        host_ops: a CPU copy of ``ops`` kept by :meth:`to`, so the launcher reads which ops
            the batch uses without a device sync.
    """

    crop: torch.Tensor
    affine: torch.Tensor
    ops: torch.Tensor
    factors: torch.Tensor
    host_ops: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> ImageTransformParams:
        host = self.ops if self.ops.device.type == "cpu" else self.host_ops
        return ImageTransformParams(*(t.to(device, non_blocking=True) for t in
                                      (self.crop, self.affine, self.ops, self.factors)), host)

    def repeat_interleave(self, repeats: int) -> ImageTransformParams:
        """Each image's parameters ``repeats`` times (one sample's frames share them)."""
        return ImageTransformParams(*(t.repeat_interleave(repeats, 0) for t in
                                      (self.crop, self.affine, self.ops, self.factors)))

    @staticmethod
    def identity(n: int, src_hw: tuple[int, int]) -> ImageTransformParams:
        """No transform: the whole frame, resized."""
        crop = torch.tensor([[0.0, 0.0, float(src_hw[0]), float(src_hw[1])]]).repeat(n, 1)
        affine = torch.tensor([[1.0, 0.0, 0.0, 0.0, 1.0, 0.0]]).repeat(n, 1)
        return ImageTransformParams(crop, affine, torch.full((n, 1), -1, dtype=torch.int32),
                                    torch.zeros(n, 1))


def _uniform(g: torch.Generator, n: int, lo_hi: tuple[float, float]) -> torch.Tensor:
    lo, hi = lo_hi
    return lo + (hi - lo) * torch.rand(n, generator=g, dtype=torch.float64)


def sample_image_transforms(n: int, src_hw: tuple[int, int],
                            config: ImageTransformsConfig | None = None, *,
                            seed: int | torch.Generator = 0) -> ImageTransformParams:
    """Draw the transforms of ``n`` images of size ``src_hw`` (CPU tensors).

    Args:
        n: images.
        src_hw: source (height, width) in pixels.
        config: what to draw (default: LeRobot's defaults).
        seed: an int or a ``torch.Generator``; the same seed gives the same parameters.

    Returns:
        :class:`ImageTransformParams`.

    Raises:
        ValueError: unknown transform names in ``weights``, negative weights, or
            ``max_num_transforms`` < 0.

    Example:
        >>> p = sample_image_transforms(4, (48, 64), seed=0); p.ops.shape
        torch.Size([4, 3])
    """
    config = config or ImageTransformsConfig()
    names = (*COLOR_OPS, "affine")
    bad = sorted(set(config.weights) - set(names))
    if bad or any(w < 0 for w in config.weights.values()):
        fail("sample_image_transforms", f"`weights` takes non-negative weights of {names}; got "
             f"{config.weights}.", ValueError)
    if config.max_num_transforms < 0:
        fail("sample_image_transforms", "`max_num_transforms` must be >= 0; got "
             f"{config.max_num_transforms}.", ValueError)
    g = seed if isinstance(seed, torch.Generator) else torch.Generator().manual_seed(int(seed))
    H, W = src_hw
    weights = torch.tensor([float(config.weights.get(k, 0.0)) for k in names], dtype=torch.float64)
    k = min(config.max_num_transforms, int((weights > 0).sum()))
    # Gumbel top-k: k draws without replacement, probability proportional to the weights
    gumbel = -torch.log(-torch.log(torch.rand(n, len(names), generator=g,
                                              dtype=torch.float64).clamp_min(1e-300)))
    keys = torch.where(weights > 0, weights.log() + gumbel, torch.tensor(-math.inf))
    chosen = keys.topk(k, dim=1).indices if k else torch.zeros(n, 0, dtype=torch.long)
    if not config.random_order:
        chosen = chosen.sort(1).values
    ranges = [config.brightness, config.contrast, config.saturation, config.hue,
              config.sharpness]
    draws = torch.stack([_uniform(g, n, r) for r in ranges], 1)  # [n, 5]
    is_color = chosen < len(COLOR_OPS)
    ops = torch.where(is_color, chosen, -1).to(torch.int32)
    factors = torch.where(is_color, draws.gather(1, chosen.clamp(max=len(COLOR_OPS) - 1)), 0.0)
    if k == 0:
        ops, factors = torch.full((n, 1), -1, dtype=torch.int32), torch.zeros(n, 1)

    crop = torch.tensor([[0.0, 0.0, float(H), float(W)]], dtype=torch.float64).repeat(n, 1)
    if config.crop_scale is not None:
        side = _uniform(g, n, config.crop_scale).clamp(0.0, 1.0)
        ch, cw = (side * H).round().clamp_min(1), (side * W).round().clamp_min(1)
        top = (torch.rand(n, generator=g, dtype=torch.float64) * (H - ch + 1)).floor()
        left = (torch.rand(n, generator=g, dtype=torch.float64) * (W - cw + 1)).floor()
        crop = torch.stack([top, left, ch, cw], 1)
    angle = _uniform(g, n, config.affine_degrees)
    tx = _uniform(g, n, (-config.affine_translate[0] * W, config.affine_translate[0] * W)).round()
    ty = _uniform(g, n, (-config.affine_translate[1] * H, config.affine_translate[1] * H)).round()
    use = (chosen == len(COLOR_OPS)).any(1)
    angle, tx, ty = angle * use, tx * use, ty * use
    rad = torch.deg2rad(angle)
    c, s = rad.cos(), rad.sin()
    affine = torch.stack([c, s, -c * tx - s * ty, -s, c, s * tx - c * ty], 1)
    return ImageTransformParams(crop.float(), affine.float(), ops, factors.float())


def _image_cpu(frames: torch.Tensor, crop: torch.Tensor, affine: torch.Tensor, ops: torch.Tensor,
               factors: torch.Tensor, h: int, w: int, slots: int,
               dtype: torch.dtype) -> torch.Tensor:
    y = ref.image_transform(frames, crop, affine, ops, factors, (h, w))
    return ((y * 255.0).round() if dtype == torch.uint8 else y).to(dtype)


def _image_cuda(frames: torch.Tensor, crop: torch.Tensor, affine: torch.Tensor,
                ops: torch.Tensor, factors: torch.Tensor, h: int, w: int, slots: int,
                dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """The CUDA implementation; an eager call may pass `out` (any strides) to write into."""
    from robocache.kernels.image import image_transform_cuda

    if out is None:
        out = frames.new_empty(frames.shape[0], 3, h, w, dtype=dtype)
    return image_transform_cuda(frames, crop, affine, ops, factors, out, slots=slots)


def _image_fake(frames, crop, affine, ops, factors, h, w, slots, dtype):
    return frames.new_empty(frames.shape[0], 3, h, w, dtype=dtype)


# ``slots``: the kernel's per-slot op set (`kernels.image.slot_ops`), host-known from the
# sampled parameters; 0 on CPU, where the reference does not use it.
_IMAGE_TRANSFORM = Op("image_transform", cpu=_image_cpu, cuda=_image_cuda, fake=_image_fake)


def image_transform(frames: torch.Tensor, size: tuple[int, int],
                    params: ImageTransformParams | None = None, *,
                    dtype: torch.dtype = torch.float32,
                    out: torch.Tensor | None = None) -> torch.Tensor:
    """Crop / affine / resize, then colour ops, of uint8 RGB frames.

    Args:
        frames: uint8 ``[N, 3, H, W]`` (channels first; any strides, e.g. a permuted
            ``[N, H, W, 3]``).
        size: output (height, width) in pixels.
        params: per-image parameters (:func:`sample_image_transforms`); ``None``: resize only.
        dtype: output dtype: float32, bfloat16 or float16 in [0, 1], or uint8 (rounded x 255).
        out: optional ``[N, 3, h, w]`` tensor of ``dtype`` to write into (any strides).

    Returns:
        ``[N, 3, h, w]`` of ``dtype`` on the frames' device.

    Raises:
        DTypeError: frames not uint8, or an unsupported ``dtype``.
        ShapeError: frames not ``[N, 3, H, W]``, parameters not of N rows, or ``out`` of the
            wrong shape.
        DeviceError: parameters or ``out`` on another device than the frames.

    Example:
        >>> x = image_transform(torch.zeros(2, 3, 48, 64, dtype=torch.uint8), (24, 24))
        >>> x.shape
        torch.Size([2, 3, 24, 24])
    """
    op = "image_transform"
    check_dtype(op, "frames", frames, (torch.uint8,), "Pass decoded uint8 RGB frames.")
    if frames.dim() != 4 or frames.shape[1] != 3:
        fail(op, f"`frames` must be [N, 3, H, W]; got {list(frames.shape)}. Permute [N, H, W, 3] "
             "frames with `.permute(0, 3, 1, 2)`.")
    if dtype not in OUT_DTYPES:
        fail(op, f"`dtype` must be one of {OUT_DTYPES}; got {dtype}.", DTypeError)
    h, w = (int(s) for s in size)
    if h < 1 or w < 1:
        fail(op, f"`size` must be positive (height, width); got {size}.", ValueError)
    n = frames.shape[0]
    if out is None:  # the frames at `size` and the reference's sampling grid
        check_fits(op, f"{n} frames of 3 x {h} x {w}", n * h * w * (3 * dtype.itemsize + 24),
                   frames.device, "pass a smaller `size` or fewer `frames` per call.")
    if params is None:  # resize only: cached identity parameters, no colour op in any slot
        params, slots = _identity_on(n, tuple(frames.shape[-2:]), frames.device), 0
    else:
        for name in ("crop", "affine", "ops", "factors"):
            t = getattr(params, name)
            if t.shape[0] != n:
                fail(op, f"`params.{name}` has {t.shape[0]} rows for {n} frames; sample one row "
                     "per frame (repeat_interleave for frames that share a sample).")
            check_device(op, f"params.{name}", t, frames.device, "frames")
        slots = _slots(params) if frames.is_cuda else 0
    if out is not None:
        if tuple(out.shape) != (n, 3, h, w) or out.dtype != dtype:
            fail(op, f"`out` must be [{n}, 3, {h}, {w}] of {dtype}; got {list(out.shape)} of "
                 f"{out.dtype}.")
        check_device(op, "out", out, frames.device, "frames")
    crop, affine = params.crop.float(), params.affine.float()
    ops, factors = params.ops.to(torch.int32), params.factors.float()
    with nvtx.range(op):
        if out is not None and launches_directly(frames):  # the kernel writes any strides
            return _IMAGE_TRANSFORM.cuda()(frames, crop, affine, ops, factors, h, w, slots,
                                           dtype, out)
        y = _IMAGE_TRANSFORM(frames, crop, affine, ops, factors, h, w, slots, dtype)
        return y if out is None else out.copy_(y)


_IDENTITY = PlanCache(64)


def _identity_on(n: int, src_hw: tuple[int, int], device: torch.device) -> ImageTransformParams:
    """`ImageTransformParams.identity` on `device`, made once per (n, size, device)."""
    key = (n, src_hw, device)
    hit = _IDENTITY.get(key)
    if hit is None:
        hit = _IDENTITY.put(key, ImageTransformParams.identity(n, src_hw).to(device))
    return hit


def _slots(params: ImageTransformParams) -> int:
    """The kernel's per-slot op set of a batch on CUDA (`kernels.image.slot_ops`); every op in
    every slot while tracing, where the op ids are not known."""
    if torch.compiler.is_compiling():
        return (1 << 5 * params.ops.shape[1]) - 1
    from robocache.kernels.image import slot_ops

    return slot_ops(params.host_ops if params.host_ops is not None else params.ops.cpu())
