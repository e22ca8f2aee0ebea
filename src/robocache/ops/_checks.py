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
                  *, values: bool) -> None:
    """`lengths` is an integer [B] tensor; with ``values`` also checks 1 <= lengths <= size."""
    check_dtype(op, "lengths", lengths, INDEX_DTYPES, "Pass integer lengths, e.g. lengths.long().")
    check_device(op, "lengths", lengths, device, "data")
    if lengths.shape != (batch,):
        fail(op, f"`lengths` must have shape [B] = [{batch}]; got {list(lengths.shape)}.")
    if values and batch and (bool((lengths < 1).any()) or bool((lengths > size).any())):
        lo, hi = int(lengths.min()), int(lengths.max())
        fail(op, f"`lengths` must lie in [1, S] = [1, {size}]; got values in [{lo}, {hi}]. A row "
             "needs at least one valid sample.", DataError)
