"""`robocache.resample`: robot trajectories recorded at irregular rates, onto target times."""

from __future__ import annotations

import torch

from robocache._plancache import PlanCache
from robocache.observability import nvtx
from robocache.ops import _checks as C
from robocache.ops._dispatch import Op, launches_directly
from robocache.reference.interp import interp_ref

_OP = "resample"
METHODS = ("linear", "nearest", "previous")
OUT_OF_RANGE = ("clamp", "nan", "extrapolate")


@nvtx.annotate("robocache.resample")
def resample(
    data: torch.Tensor,
    times: torch.Tensor,
    target_times: torch.Tensor,
    *,
    lengths: torch.Tensor | None = None,
    method: str = "linear",
    out_of_range: str = "clamp",
    return_mask: bool = False,
    validate: bool | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Resample trajectories sampled at ``times`` onto ``target_times``, per row.

    Args:
        data: ``[B, S, D]`` (or ``[S, D]``, returned unbatched) float16/bfloat16/float32/
            float64 samples. Arithmetic runs in float32 (float64 for float64 data).
        times: ``[B, S]``, or ``[S]`` shared by all rows: float32/float64 seconds,
            non-decreasing within each row's valid prefix. float64 epoch seconds (~1.7e9)
            are exact on every path: differences are taken in float64 before any float32
            arithmetic.
        target_times: ``[B, T]``, or ``[T]`` shared by all rows: float32/float64 seconds,
            any order.
        lengths: int ``[B]`` in ``[1, S]``: row b uses only its first ``lengths[b]`` samples;
            the padding after them is never read.
        method: ``"linear"`` (inside the range equals ``numpy.interp`` per column),
            ``"nearest"`` (ties go to the earlier sample, as ``scipy.interpolate.interp1d(
            kind="nearest")``) or ``"previous"`` (zero-order hold: the last sample at or
            before t, as ``interp1d(kind="previous")`` — for gripper states and annotations).
        out_of_range: targets before the first or after the last valid sample get
            ``"clamp"`` (the edge value, as ``numpy.interp``), ``"nan"``, or
            ``"extrapolate"`` (linear: the first/last segment extended; nearest/previous:
            the edge value, as with clamp).
        return_mask: also return ``is_pad`` bool ``[B, T]``: True where the target lies
            outside ``[times[0], times[length-1]]`` or is NaN.
        validate: run data-dependent checks (finite, non-decreasing timestamps; lengths in
            range), which synchronize with the device. Default: on for CPU tensors, off for
            CUDA unless ``ROBOCACHE_VALIDATE=1``; never while compiling.
        out: optional ``[B, T, D]`` tensor of data's dtype to write into.

    Returns:
        ``[B, T, D]`` (``[T, D]`` for unbatched data) in data's dtype, and ``is_pad`` when
        ``return_mask``. Repeated timestamps: at the shared instant the later sample wins;
        no interval of zero length is ever divided by. NaN targets give NaN rows (and
        ``is_pad``). CUDA tensors run one Triton kernel; CPU tensors the PyTorch reference.

    Raises:
        ShapeError: ranks or sizes disagree, or ``S == 0``.
        DTypeError: integer/complex data, non-float timestamps, non-integer lengths.
        DeviceError: tensors on different devices.
        DataError: (when validating) NaN/decreasing timestamps, lengths outside ``[1, S]``.
        ValueError: unknown ``method`` or ``out_of_range``.

    Example:
        >>> data = torch.randn(4, 100, 7)
        >>> t = torch.linspace(0, 1, 100, dtype=torch.float64)
        >>> robocache.resample(data, t, torch.linspace(0, 1, 50)).shape
        torch.Size([4, 50, 7])
    """
    try:
        key = _key(data, times, target_times, lengths, method, out_of_range, return_mask, out)
        plan = _PLANS.get(key)
    except (AttributeError, TypeError):  # not tensors: let _check name the argument
        key, plan = None, None
    if plan is None:
        # Metadata checks are a pure function of the key: run once per geometry.
        _check(data, times, target_times, lengths, method, out_of_range, out)
        plan = _Plan(data, target_times)
    if C.wants_validation(validate, data):
        if lengths is not None:
            C.check_lengths(_OP, lengths, plan.B, data.shape[-2], data.device, values=True)
        C.check_timestamps(_OP, "times", times, lengths)
        if bool(torch.isnan(target_times).any()):
            C.fail(_OP, "`target_times` contains NaN; pass finite target times.", C.DataError)
    if launches_directly(data):
        # eager CUDA: the cached plan's launch, written straight into `out`
        res, mask = _launch(plan, key, data, times, target_times, lengths, method, out_of_range,
                            return_mask, out)
    else:
        res, mask = _RESAMPLE(_batched(data, plan.batched), times, target_times, lengths, method,
                              out_of_range, return_mask)
        if not plan.batched:
            res, mask = res[0], mask[0] if return_mask else mask
        if out is not None:
            res = out.copy_(res)
        if key is not None and not torch.compiler.is_compiling():
            _PLANS.put(key, plan)
    return (res, mask) if return_mask else res


class _Plan:
    """Per-geometry facts (and, on CUDA, the kernel's launch plan) cached by metadata key."""

    __slots__ = ("batched", "B", "T", "out_shape", "mask_shape", "launch")

    def __init__(self, data: torch.Tensor, target: torch.Tensor):
        self.batched = data.dim() == 3
        self.B = data.shape[0] if self.batched else 1
        self.T = target.shape[-1]
        self.out_shape = (*data.shape[:-2], self.T, data.shape[-1])
        self.mask_shape = self.out_shape[:-1]
        self.launch = None


_PLANS = PlanCache()


def _key(data, times, target, lengths, method, out_of_range, return_mask, out) -> tuple:
    """The metadata a plan depends on."""
    return (data.shape, data.stride(), data.dtype, data.device, times.shape, times.stride(),
            times.dtype, times.device, target.shape, target.stride(), target.dtype, target.device,
            None if lengths is None else (lengths.shape, lengths.dtype, lengths.device),
            method, out_of_range, return_mask,
            None if out is None else (out.shape, out.stride(), out.dtype, out.device))


def _check(data, times, target, lengths, method, out_of_range, out) -> None:
    """Host-side metadata checks (no sync)."""
    if not isinstance(data, torch.Tensor):
        C.fail(_OP, f"`data` must be a torch.Tensor; got {type(data).__name__}.", TypeError)
    if method not in METHODS:
        C.check_choice(_OP, "method", method, METHODS)
    if out_of_range not in OUT_OF_RANGE:
        C.check_choice(_OP, "out_of_range", out_of_range, OUT_OF_RANGE)
    if data.dim() not in (2, 3):
        C.fail(_OP, f"`data` must be [B, S, D] or [S, D]; got shape {list(data.shape)}.")
    if data.shape[-2] == 0:
        C.fail(_OP, "`data` has S == 0 samples; every row needs at least one sample.")
    C.check_series(_OP, "", data, times, target, lengths,
                   batch=data.shape[0] if data.dim() == 3 else None)
    B, T, D = data.shape[0] if data.dim() == 3 else 1, target.shape[-1], data.shape[-1]
    # the output, its mask and the reference's per-target bracket indices and weights
    C.check_fits(_OP, f"the output [B, T, D] = [{B}, {T}, {D}]",
                 C.nbytes((B, T, D), data.dtype) + B * T * 25, data.device,
                 "pass fewer `target_times` (T) or a smaller batch of `data` (B).")
    if out is not None:
        shape = (*data.shape[:-2], target.shape[-1], data.shape[-1])
        if tuple(out.shape) != shape or out.dtype != data.dtype or out.device != data.device:
            C.fail(_OP, f"`out` must be a {str(data.dtype).removeprefix('torch.')} tensor of "
                   f"shape {list(shape)} on {data.device}; got "
                   f"{str(out.dtype).removeprefix('torch.')} {list(out.shape)} on {out.device}.")


def _batched(data: torch.Tensor, batched: bool) -> torch.Tensor:
    return data if batched else data.unsqueeze(0)


def _launch(plan, key, data, times, target, lengths, method, out_of_range, want_mask, out):
    """One launch of the geometry's cached plan (made and cached on first use)."""
    if out is None:
        out = torch.empty(plan.out_shape, dtype=data.dtype, device=data.device)
    mask = torch.empty(plan.mask_shape, dtype=torch.bool, device=data.device) \
        if want_mask else None
    if plan.launch is None:
        plan.launch = _cuda_plan(data, times, target, lengths, method, out_of_range, out, mask,
                                 plan)
        if key is not None:
            _PLANS.put(key, plan)
    plan.launch.launch(target, (data,), (times,), (target if lengths is None else lengths,),
                       (out if plan.batched else out[None],),
                       (target if mask is None else mask,), (target,), (target,))
    return out, mask


def _cuda_plan(data, times, target, lengths, method, out_of_range, out, mask, plan):
    from robocache.kernels import interp as K

    stream = K.StreamLaunch(data, times, lengths, out if plan.batched else out[None], mask,
                            None, K.METHOD_CODES[method], K.OOR_CODES[out_of_range])
    return K.InterpPlan([stream], target, plan.B)


def _resample_cpu(data: torch.Tensor, times: torch.Tensor, target_times: torch.Tensor,
                  lengths: torch.Tensor | None, method: str, out_of_range: str,
                  return_mask: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The PyTorch reference on batched data ``[B, S, D]``."""
    B = data.shape[0]
    t2 = times.expand(B, -1) if times.dim() == 1 else times
    x2 = target_times.expand(B, -1) if target_times.dim() == 1 else target_times
    res, pad, _ = interp_ref(data, t2, x2, lengths, method, out_of_range)
    return res, pad if return_mask else _no_mask(data)


def _resample_cuda(data: torch.Tensor, times: torch.Tensor, target_times: torch.Tensor,
                   lengths: torch.Tensor | None, method: str, out_of_range: str,
                   return_mask: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The Triton kernel on batched data, through the geometry's cached plan."""
    key = _key(data, times, target_times, lengths, method, out_of_range, return_mask, None)
    plan = _PLANS.get(key) or _Plan(data, target_times)
    res, mask = _launch(plan, key, data, times, target_times, lengths, method, out_of_range,
                        return_mask, None)
    return res, mask if return_mask else _no_mask(data)


def _no_mask(data: torch.Tensor) -> torch.Tensor:
    return data.new_empty((0,), dtype=torch.bool)


def _resample_fake(data, times, target_times, lengths, method, out_of_range, return_mask):
    B, T = data.shape[0], target_times.shape[-1]
    mask_shape = (B, T) if return_mask else (0,)
    return data.new_empty((B, T, data.shape[-1])), data.new_empty(mask_shape, dtype=torch.bool)


_RESAMPLE = Op("resample", cpu=_resample_cpu, cuda=_resample_cuda, fake=_resample_fake)
