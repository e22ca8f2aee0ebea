"""Cheap host-side validation shared by the public ops.

Shape/dtype/device checks read tensor metadata only and always run. Data-dependent checks
(monotone timestamps, NaN, value ranges) cost a device sync; `wants_validation` decides when
they run: by default on CPU tensors, on CUDA only when asked (``validate=True`` or the
environment variable ``ROBOCACHE_VALIDATE=1``, read once at import), never while tracing.
"""

from __future__ import annotations

import os
from typing import NoReturn

import torch

from robocache.errors import DataError, DeviceError, DTypeError, ShapeError

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
TIME_DTYPES = (torch.float32, torch.float64)
INDEX_DTYPES = (torch.int32, torch.int64)

_VALIDATE_ON_CUDA = os.environ.get("ROBOCACHE_VALIDATE", "0").lower() in ("1", "true", "yes")


def fail(op: str, message: str, exc: type[Exception] = ShapeError) -> NoReturn:
    raise exc(f"{op}: {message}")


def wants_validation(validate: bool | None, tensor: torch.Tensor) -> bool:
    """Resolve the ``validate`` argument of an op for inputs living where ``tensor`` lives."""
    if torch.compiler.is_compiling():
        return False
    if validate is None:
        return tensor.device.type == "cpu" or _VALIDATE_ON_CUDA
    return validate


def validates_eager_cuda(validate: bool | None) -> bool:
    """`wants_validation` for an eager call on CUDA inputs (known not to be traced)."""
    return _VALIDATE_ON_CUDA if validate is None else validate


# Requests below this are left to the allocator: reading the limits costs tens of
# microseconds, more than small eager calls take.
CHECKED_BYTES = 1 << 26


def nbytes(shape, dtype: torch.dtype) -> int:
    """Bytes of a tensor of ``shape`` and ``dtype`` (Python ints: no overflow)."""
    n = dtype.itemsize
    for s in shape:
        n *= int(s)
    return n


def check_fits(op: str, what: str, need: int, device: torch.device, fix: str) -> None:
    """The one size check of every op that allocates from its arguments: refuse, before
    allocating, ``need`` bytes for ``what`` that exceed what this process may still use on
    ``device`` (:func:`robocache._memory.available_bytes`: rlimits, cgroup, physical memory,
    or the GPU's free memory). ``fix`` names the argument to shrink. Skipped while tracing (a
    traced call was checked when its graph first ran eagerly) and below
    :data:`CHECKED_BYTES`."""
    if need < CHECKED_BYTES or torch.compiler.is_compiling():
        return
    from robocache._memory import available_bytes

    have, limit = available_bytes(torch.device(device))
    if need > have:
        fail(op, f"{what} needs {need:,} bytes, more than the {have:,} bytes this process may "
             f"still use on {device} (limited by {limit}); {fix}", ShapeError)


def check_choice(op: str, name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        fail(op, f"`{name}` must be one of {', '.join(map(repr, choices))}; got {value!r}.",
             ValueError)


def check_dtype(op: str, name: str, t: torch.Tensor, allowed: tuple, hint: str) -> None:
    if t.dtype not in allowed:
        names = ", ".join(str(d).removeprefix("torch.") for d in allowed)
        got = str(t.dtype).removeprefix("torch.")
        fail(op, f"`{name}` must have dtype in ({names}); got {got}. {hint}", DTypeError)


def check_device(op: str, name: str, t: torch.Tensor, device: torch.device, ref: str) -> None:
    if t.device != device:
        fail(op, f"`{name}` is on {t.device} but `{ref}` is on {device}; move both to one device "
             f"(e.g. `{name}.to({ref}.device)`).", DeviceError)


def check_timestamps(op: str, name: str, times: torch.Tensor, lengths: torch.Tensor | None) -> None:
    """Data-dependent: valid timestamps [B, S] are finite and non-decreasing (one sync)."""
    t = times if times.dim() == 2 else times.unsqueeze(0)
    if lengths is None:
        valid = torch.ones_like(t, dtype=torch.bool)
    else:
        valid = torch.arange(t.shape[1], device=t.device) < lengths.reshape(-1, 1)
    bad_value = valid & ~torch.isfinite(t)
    steps = valid[:, 1:] & (t[:, 1:] < t[:, :-1])
    if bool(bad_value.any()):
        row, col = (int(v) for v in bad_value.nonzero()[0])
        fail(op, f"`{name}` has a NaN or infinite timestamp at row {row}, sample {col}; drop or "
             "repair the sample before resampling.", DataError)
    if bool(steps.any()):
        row, col = (int(v) for v in steps.nonzero()[0])
        fail(op, f"`{name}` decreases at row {row}, between samples {col} and {col + 1} "
             f"({float(t[row, col])!r} > {float(t[row, col + 1])!r}); timestamps must be "
             "non-decreasing: sort each row (and its data) by time.", DataError)


def check_lengths(op: str, lengths: torch.Tensor, batch: int, size: int, device: torch.device,
                  *, values: bool, name: str = "lengths") -> None:
    """`lengths` is an integer [B] tensor; with ``values`` also checks 1 <= lengths <= size."""
    if not isinstance(lengths, torch.Tensor):
        fail(op, f"`{name}` must be an integer torch.Tensor [B]; got {type(lengths).__name__}.",
             TypeError)
    check_dtype(op, name, lengths, INDEX_DTYPES, "Pass integer lengths, e.g. lengths.long().")
    check_device(op, name, lengths, device, "data")
    if lengths.shape != (batch,):
        fail(op, f"`{name}` must have shape [B] = [{batch}]; got {list(lengths.shape)}.")
    if values and batch and (bool((lengths < 1).any()) or bool((lengths > size).any())):
        lo, hi = int(lengths.min()), int(lengths.max())
        fail(op, f"`{name}` must lie in [1, S] = [1, {size}]; got values in [{lo}, {hi}]. A row "
             "needs at least one valid sample.", DataError)


def check_series(op: str, where: str, data: torch.Tensor | None, times, target,
                 lengths, *, batch: int | None) -> None:
    """Metadata checks of one time series against its targets (no sync).

    `where` prefixes argument names (e.g. "streams['tactile']."); `batch` is the batch size
    (None for unbatched data); `data` may be None (frame_index streams).
    """
    for name, t in (("times", times), ("target_times", target)) + (
            (("data", data),) if data is not None else ()):
        if not isinstance(t, torch.Tensor):
            fail(op, f"`{where}{name}` must be a torch.Tensor; got {type(t).__name__}.",
                 TypeError)
    dev = target.device
    if data is not None:
        if data.dim() != (2 if batch is None else 3):
            want = "[S, D] (unbatched)" if batch is None else f"[B, S, D] with B = {batch}"
            fail(op, f"`{where}data` must be {want}; got shape {list(data.shape)}.")
        if batch is not None and data.shape[0] != batch:
            fail(op, f"`{where}data` has batch size {data.shape[0]} but the batch is {batch}; "
                 "every stream and the targets need the same B.")
        if data.dtype not in FLOAT_DTYPES:
            check_dtype(op, f"{where}data", data, FLOAT_DTYPES,
                        "Convert with .float() (integer states: cast before resampling).")
        if data.device != dev:
            check_device(op, f"{where}data", data, dev, "target_times")
    if times.dtype not in TIME_DTYPES:
        check_dtype(op, f"{where}times", times, TIME_DTYPES,
                    "Pass seconds as float64 (e.g. nanoseconds * 1e-9 in float64).")
    if target.dtype not in TIME_DTYPES:
        check_dtype(op, "target_times", target, TIME_DTYPES, "Pass seconds as float32 or float64.")
    if times.device != dev:
        check_device(op, f"{where}times", times, dev, "target_times")
    S = times.shape[-1] if times.dim() else 0
    if data is not None and data.shape[-2] != S:
        fail(op, f"`{where}times` has {S} samples but `{where}data` has {data.shape[-2]}; "
             "they must match.")
    if not (times.dim() == 1 or (batch is not None and times.shape == (batch, S))):
        want = f"[{batch}, S] or [S]" if batch is not None else "[S] (unbatched data)"
        fail(op, f"`{where}times` must have shape {want}; got {list(times.shape)}.")
    if S == 0:
        fail(op, f"`{where}times` has S == 0 samples; every row needs at least one sample.")
    if not (target.dim() == 1 or (batch is not None and target.dim() == 2
                                  and target.shape[0] == batch)):
        want = f"[{batch}, T] or [T]" if batch is not None else "[T] (unbatched data)"
        fail(op, f"`target_times` must have shape {want}; got {list(target.shape)}.")
    if lengths is not None:
        check_lengths(op, lengths, 1 if batch is None else batch, S, dev, values=False)


def check_nonneg(op: str, name: str, value: float, upper: float | None = None) -> None:
    """`value` >= 0 (and < `upper` when given)."""
    if not value >= 0 or (upper is not None and not value < upper):
        rng = f"[0, {upper})" if upper is not None else ">= 0"
        fail(op, f"`{name}` must be {rng}; got {value!r}.", ValueError)


def check_streams(op: str, streams, d: int) -> None:
    """Column ranges ``(start, stop)`` inside ``[0, d]``."""
    for s, (a, b) in enumerate(streams):
        if not 0 <= a < b <= d:
            fail(op, f"stream {s} = ({a}, {b}) must be a column range with 0 <= start < stop "
                 f"<= D = {d}.", ShapeError)
