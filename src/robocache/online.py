"""Online observations: the training-time observation of a cache, built at every control tick.

    >>> obs = robocache.Observer.from_cache("/tmp/panda.cache", history=2, normalize="mean_std")
    >>> obs.push("observation.state", t, joints)          # as each message arrives
    >>> batch = obs.observation(t_tick)                   # the RobotDataset item of that step
    >>> batch["observation.state"].shape, batch["observation.state_is_pad"].shape
    (torch.Size([2, 8]), torch.Size([2]))

An :class:`Observer` holds, per stream, a ring buffer of the latest messages (sized from the
history the observation needs, the stream's rate and how far ahead of the tick messages come),
and at each tick aligns them onto the cache's grid with the cache's own semantics:

- The grid is ``t0 + k / rate`` (``rate``: the cache's), ``t0`` the first tick (or
  :meth:`Observer.start`), computed as :func:`robocache.data.cache.target_times` computes it;
  ``observation(t)`` serves the latest step at or before ``t`` (within the cache's grid
  tolerance), its history at the steps before, edge-padded (or zero-padded) before ``t0``.
- Message times are snapped onto grid instants by ingest's rule
  (:func:`robocache.data.cache.snap_times`; here :func:`snap_instants`): every sample of
  ``previous``/``nearest`` numeric streams; the samples of the other streams while every
  sample seen so far is within the tolerance of an instant (ingest decides this over the
  whole episode, which a live stream cannot know in advance).
- Values come from :func:`robocache.reference.interp.interp_ref`, the implementation
  :func:`robocache.align` runs on the CPU and tests its kernel against: interpolated streams on
  float32 rows rounded back to the stream's dtype, ``previous``/``nearest`` streams as the
  sample itself (bit for bit), cameras as the nearest frame (``frame_index``), decoded and
  served as :class:`~robocache.RobotDataset` serves them; streams stored frame by frame at a
  native-rate cache's fps are the sample on the step, padded on steps without one.
- Normalization is the training loader's (:class:`robocache.Normalizer` with the cache's stats,
  float32 streams only), applied by the same reference affine map.

Staleness is explicit: a step not yet final (an interpolated stream needs a message at or
after it; a nearest stream or camera that, or the tick's time at least as far after the step
as its latest message is before it), before a stream's oldest kept message, or farther than a
camera's tolerance from every frame is padded and flagged in ``<key>_is_pad``; ``previous`` streams
also report ``<key>_age`` (seconds since the sample held) and, with ``stale_s``, are padded
when older. Time going backwards (more than ``late_s``), NaN and unknown streams raise
:class:`~robocache.errors.DataError` naming the stream.

The per-tick numeric work is one module (:class:`ObservationCore`, plain PyTorch): the
reference, exportable with ``torch.export`` (:meth:`Observer.export`) and runnable as an
AOTInductor package in a process without RoboCache. On the CPU, where every stream is
``linear`` float32, ``previous``, ``nearest`` or a camera, the tick runs it without torch
operators (Python floats rounded as float32, a few NumPy calls; bit for bit the core's).
On a GPU the tick is one captured CUDA graph: the arena's copy and one Triton launch
(:mod:`robocache.kernels.online`, tested against the core) where every stream is
``linear``, ``previous``, ``nearest`` or a camera, the core otherwise. See docs/online.md.
"""

from __future__ import annotations

import json
import math
from array import array
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robocache.errors import DataError
from robocache.reference.interp import interp_ref
from robocache.reference.normalize import affine_reference

_INTERPOLATED = ("linear", "pchip", "slerp")
_INDEXED = ("previous", "nearest", "frame_index")
# samples an interpolated method needs at or after the step before the step is final
_AHEAD = {"linear": 1, "slerp": 1, "pchip": 2, "nearest": 1, "frame_index": 1, "previous": 0}
_ALIGN = 8  # byte alignment of the arrays in the state arena


def _finite(v: np.ndarray, ring: np.dtype) -> bool:
    """Whether every element of the float array ``v`` is finite, and stays so stored in a
    ring of dtype ``ring``. Up to 4-byte floats into as wide a ring: their sum as Python
    floats, which cannot overflow and is finite iff every element is (one call instead of a
    ufunc and a reduction); otherwise element by element, against the ring's largest
    value."""
    r = v.reshape(-1)
    if r.dtype.itemsize <= 4 and r.dtype.itemsize <= ring.itemsize:
        return math.isfinite(sum(r.tolist()))
    a = np.abs(r)
    return bool(np.isfinite(a).all()) and (ring.kind != "f" or
                                           float(a.max()) <= float(np.finfo(ring).max))


def _seconds(name: str, value: Any, optional: bool = False, positive: bool = False
             ) -> float | None:
    """``value`` as a finite number of seconds ``>= 0`` (``> 0`` with ``positive``; ``None``
    passes with ``optional``), else a DataError naming the argument."""
    if value is None and optional:
        return None
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
    if not (ok and math.isfinite(value) and (value > 0 if positive else value >= 0)):
        raise DataError(f"`{name}` must be a finite number of seconds {'>' if positive else '>='}"
                        f" 0{' or None' if optional else ''}; got {value!r}.")
    return float(value)


def _device(device: Any) -> torch.device:
    """``device`` as a CPU or an available CUDA device, else a DataError saying why."""
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise DataError(f"`device` must be 'cpu', 'cuda' or 'cuda:N'; got {device!r}.") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise DataError(f"`device` {device!r}: no CUDA GPU is usable here (torch "
                            f"{torch.__version__}, CUDA build {torch.version.cuda}); pass "
                            "device='cpu'.")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise DataError(f"`device` {device!r}: this machine has "
                            f"{torch.cuda.device_count()} CUDA device(s).")
    elif dev.type != "cpu":
        raise DataError(f"`device` must be 'cpu', 'cuda' or 'cuda:N'; got {device!r}.")
    return dev


def _seconds_of(what: str, t: Any) -> float:
    """A message or tick time as a Python float (a DataError naming ``what`` otherwise)."""
    try:
        if isinstance(t, (str, bytes)):
            raise TypeError
        return float(t)
    except (TypeError, ValueError):
        raise DataError(f"{what}: a time must be a number of seconds; got "
                        f"{type(t).__name__} {t!r:.60}.") from None


def _image_header(data: bytes | bytearray) -> tuple[str, int, int] | str:
    """``(codec, height, width)`` of an encoded JPEG or PNG image from its header (a few
    marker reads; no decode), or why the bytes are not one."""
    if data[:3] == b"\xff\xd8\xff":
        i, n = 2, len(data)
        while i + 4 <= n:
            if data[i] != 0xFF:
                return f"a corrupt JPEG marker at byte {i}"
            m = data[i + 1]
            if m == 0xFF:  # fill byte
                i += 1
            elif m == 0x01 or 0xD0 <= m <= 0xD8:  # markers without a length
                i += 2
            elif 0xC0 <= m <= 0xCF and m not in (0xC4, 0xC8, 0xCC):  # a start of frame
                if i + 9 > n:
                    break
                if data.rfind(b"\xff\xd9", i) < 0:
                    return "a truncated JPEG: no end-of-image marker"
                return ("jpeg", int.from_bytes(data[i + 5:i + 7], "big"),
                        int.from_bytes(data[i + 7:i + 9], "big"))
            elif m in (0xD9, 0xDA):
                return "a JPEG without a frame header"
            else:
                i += 2 + int.from_bytes(data[i + 2:i + 4], "big")
        return "a truncated JPEG header"
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        if len(data) < 24 or data[12:16] != b"IHDR":
            return "a truncated PNG header"
        return ("png", int.from_bytes(data[20:24], "big"), int.from_bytes(data[16:20], "big"))
    return f"{len(data)} bytes starting {bytes(data[:8])!r}"


def snap_instants(times: list[float], t0: float, rate: float, tolerance_s: float
                  ) -> tuple[list[float], bool]:
    """:func:`robocache.data.cache.snap_times` of a few samples onto the grid ``t0 + k / rate``
    (``k >= 0``), in Python floats (the same float64 operations, without NumPy's per-call
    cost, which dominates for the few messages of one tick): each sample between the grid's
    instant before it and the one at or after it moves to the nearer (ties to the earlier)
    where within ``tolerance_s``. Returns the samples and whether every one moved."""
    out, close_all = [], True
    for x in times:
        k = max(math.floor((x - t0) * rate), 0)
        lo = t0 + k / rate
        while k > 0 and lo >= x:  # lo: the last instant before x (the first, at most)
            k -= 1
            lo = t0 + k / rate
        hi = t0 + (k + 1) / rate
        while hi < x:  # hi: the first instant at or after x
            k += 1
            lo, hi = hi, t0 + (k + 1) / rate
        near = lo if abs(x - lo) <= abs(hi - x) else hi
        if abs(x - near) <= tolerance_s:
            out.append(near)
        else:
            out.append(x)
            close_all = False
    return out, close_all


@dataclass
class _StreamSpec:
    """One stream of an :class:`Observer`: where its ring lives and how it is aligned.

    ``group``/``row``: its alignment group (one ``interp_ref`` call per method and tolerance)
    and row there; ``exact``: stored frame by frame at a native-rate cache's fps (padded on
    steps without a sample); ``snap``: ``"each"`` (every sample near an instant) or ``"all"``
    (only while every sample is)."""

    name: str
    kind: str  # "numeric" or "camera"
    method: str
    dtype: np.dtype
    shape: tuple[int, ...]
    cap: int
    tolerance_s: float | None
    exact: bool
    snap: str
    late_s: float
    group: int = 0
    row: int = 0
    dim: int = 1
    full: bool = True  # the value rows are the stream's own width
    # the stream's ring in the host arena: times [2cap], the group's heads, value rows
    # ([2cap, D]: the group's float32 rows or the stream's own; None for cameras)
    times: np.ndarray | None = None
    heads: np.ndarray | None = None
    values: np.ndarray | None = None
    # the ring's state on the host: its head (mirrored into ``heads``), the latest message's
    # time, the trailing samples not snapped yet, whether every sample so far was on the grid
    head: int = 0
    last: float = -math.inf
    fresh: int = 0
    on_grid: bool = True
    ring: int = 0  # 2 * cap
    fast: np.dtype | None = None  # a value of this dtype takes push's short path

    def __post_init__(self):
        self.dim = int(np.prod(self.shape)) if self.shape else 1


def _wide(s: _StreamSpec) -> bool:
    """An interpolated float64 stream (aligned in float64)."""
    return s.method in _INTERPOLATED and s.dtype == np.float64


class _Arena:
    """Named numpy arrays laid out in one uint8 buffer (one host-to-device copy per tick)."""

    def __init__(self):
        self.layout: dict[str, tuple[int, np.dtype, tuple[int, ...]]] = {}
        self.size = 0

    def add(self, name: str, dtype, shape: tuple[int, ...]) -> None:
        dtype = np.dtype(dtype)
        self.layout[name] = (self.size, dtype, shape)
        nbytes = dtype.itemsize * int(np.prod(shape))
        self.size += -(-nbytes // _ALIGN) * _ALIGN

    def views(self, buf: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each array as a typed tensor view of ``buf`` (uint8 ``[size]``, any device)."""
        out = {}
        for name, (at, dtype, shape) in self.layout.items():
            n = dtype.itemsize * int(np.prod(shape))
            out[name] = buf[at:at + n].view(_TORCH[dtype]).view(shape)
        return out


@dataclass(frozen=True)
class _CoreStream:
    """What :class:`ObservationCore` needs of a stream (``dtype``: the torch dtype)."""

    kind: str
    method: str
    exact: bool
    dim: int
    dtype: torch.dtype
    integer: bool


class ObservationCore(torch.nn.Module):
    """The numeric work of one tick, plain PyTorch (CUDA-graph capturable, ``torch.export``-able).

    ``forward(target, pre, *state)``: ``target`` float64 ``[U]`` grid instants (oldest first),
    ``pre`` bool ``[U]`` (instants before the first tick, edge rows), ``horizon`` float64 ``[1]``
    (the tick's time: every message before it has come), ``state`` the ring
    arrays in :attr:`inputs` order. Returns a flat tuple in :attr:`outputs` order: per served
    key its values (``[U, D]`` in the stream's dtype, normalized float32 where asked; cameras:
    int64 ``[U]`` ring slots) and bool ``[U]`` pad mask, then float32 ``[U]`` ages of
    ``previous`` streams."""

    def __init__(self, streams: list[_StreamSpec], groups: list[tuple[str, float | None,
                                                                     list[str]]],
                 norm: dict[str, tuple[torch.Tensor, torch.Tensor, bool]], zero_pad: bool,
                 inputs: list[str]):
        super().__init__()
        # plain constants only (no numpy objects: torch.compile traces this forward)
        self.streams = {s.name: _CoreStream(s.kind, s.method, s.exact, s.dim,
                                            _TORCH[s.dtype], s.dtype.kind in "biu")
                        for s in streams}
        self.groups, self.zero_pad, self.inputs = groups, zero_pad, inputs
        self.norm_keys = list(norm)
        self.clip = {k: c for k, (_, _, c) in norm.items()}
        for i, (o, s, _) in enumerate(norm.values()):
            self.register_buffer(f"offset{i}", o)
            self.register_buffer(f"scale{i}", s)
        self.outputs = [f for s in streams for f in (s.name, f"{s.name}_is_pad")] + \
            [f"{s.name}_age" for s in streams if s.method == "previous"]

    def forward(self, target: torch.Tensor, pre: torch.Tensor, horizon: torch.Tensor,
                *state: torch.Tensor):
        st = dict(zip(self.inputs, state, strict=True))
        vals, pads, ages = {}, {}, {}
        u = target.shape[0]
        for g, (method, tol, names) in enumerate(self.groups):
            times, head = st[f"g{g}.times"], st[f"g{g}.head"]
            b, cap = times.shape[0], times.shape[1] // 2
            start = (head - cap).clamp(min=0)
            idx = start[:, None] + torch.arange(cap, device=times.device)
            lengths = (head - start).clamp(min=1)
            t = times.gather(1, idx)
            x = target[None, :].expand(b, u)
            if method in _INTERPOLATED:
                data = st[f"g{g}.data"]
                d = data.gather(1, idx[..., None].expand(-1, -1, data.shape[-1]))
                v, pad, aux = interp_ref(d, t, x, lengths, method, count=True)
            else:  # sample slots, as ingest aligns sample ids and gathers
                ids = idx.to(torch.float64)[..., None]
                v, pad, aux = interp_ref(None if method == "frame_index" else ids, t, x,
                                         lengths, method, tolerance_s=tol, count=True)
                if method != "previous" and tol is None:
                    # past the latest sample, the nearest one is final once the horizon (the
                    # tick's time: every earlier message has come) is at least as far away
                    t_last = t.gather(1, lengths[:, None] - 1)
                    final = (x > t_last) & (x - t_last <= horizon - x) & (x >= t[:, :1])
                    pad = pad & ~final
                # ring slots: the frame's window position mapped back, the sample ids rounded
                v = idx.gather(1, v) if method == "frame_index" else \
                    v[..., 0].round().to(torch.int64)
            pad_only = (head == start)[:, None] | pre[None, :]
            pad = pad | pad_only
            for row, name in enumerate(names):
                s = self.streams[name]
                if method in _INTERPOLATED:
                    value = v[row, :, :s.dim]
                    if s.integer:
                        value = value.round()
                    vals[name] = value.to(s.dtype)
                elif method == "frame_index":
                    vals[name] = v[row]
                else:
                    vals[name] = st[f"{name}.values"][v[row]]
                p = pad[row]
                if method == "previous":
                    # a held sample is never padded for being the latest one (ingest's streams
                    # always go on past the grid): only before the first sample, where the
                    # age is negative; at a native rate only the sample on the step counts
                    ages[name] = aux[row]
                    edge = pad_only[row]
                    p = edge | ((aux[row] != 0) if s.exact else (aux[row] < 0))
                pads[name] = p
        out = []
        for name, s in self.streams.items():
            v = vals[name]
            if name in self.norm_keys:
                i = self.norm_keys.index(name)
                v = affine_reference(v, getattr(self, f"offset{i}"), getattr(self, f"scale{i}"),
                                     self.clip[name], False)
            if self.zero_pad and s.kind == "numeric":
                v = torch.where(pre[:, None], torch.zeros_like(v), v)
            out += [v, pads[name]]
        out += [ages[n] for n, s in self.streams.items() if s.method == "previous"]
        return tuple(out)


def _f32(xs: list[float]) -> list[float]:
    """Python floats rounded to float32 (one C cast each; a float32 sum, product or quotient
    of float32 values computed in float64 and rounded so is the float32 operation's result)."""
    return array("f", xs).tolist()


class _HostTick:
    """The tick's numeric work on the CPU without torch operators, where every stream is
    ``linear`` float32, ``previous``, ``nearest`` or a camera (the usual case; the core runs
    otherwise). Each stream's window is found with ``bisect`` and weighed in Python floats
    rounded as the core's float32 arithmetic rounds; the rows of a group of linear streams
    are gathered, mixed and normalized together in a few NumPy calls, into preallocated
    arrays that the served tensors view. For a handful of values a torch operator costs
    microseconds (one eager core call makes ~180), a Python float operation tens of
    nanoseconds. The outputs are the core's bit for bit (tested tick after tick)."""

    @staticmethod
    def covers(obs: Observer) -> bool:
        return all(s.method in ("previous", "nearest", "frame_index") or (
            s.method == "linear" and s.dtype == np.float32) for s in obs.streams.values()) \
            and all(obs.streams[k].dtype == np.float32 for k in obs.core.norm_keys)

    def __init__(self, obs: Observer):
        core, u = obs.core, len(obs._offset_list)
        arrays: dict[str, np.ndarray] = {}
        self.linear, self.indexed = [], []
        for g, (method, _, names) in enumerate(obs._groups):
            specs = [obs.streams[n] for n in names]
            if method != "linear":
                for s in specs:
                    camera = s.kind == "camera"
                    value = np.zeros(u, np.int64) if camera else np.zeros((u, s.dim), s.dtype)
                    pad = np.zeros(u, np.bool_)
                    arrays[s.name], arrays[f"{s.name}_is_pad"] = value, pad
                    age = None
                    if s.method == "previous":
                        age = arrays[f"{s.name}_age"] = np.zeros(u, np.float32)
                    tol = None if s.tolerance_s is None else float(np.float32(s.tolerance_s))
                    norm = None
                    if s.name in core.norm_keys:
                        j = core.norm_keys.index(s.name)
                        norm = (getattr(core, f"offset{j}").numpy(),
                                getattr(core, f"scale{j}").numpy(), bool(core.clip[s.name]))
                    self.indexed.append((s, value, pad, age, tol, norm,
                                         core.zero_pad and not camera))
                continue
            data = obs._host[f"g{g}.data"]  # [B, 2 cap, D] float32, the group's rings
            b, ring, dim = data.shape
            value = np.zeros((b, u, dim), np.float32)
            pad = np.zeros((b, u), np.bool_)
            offset = np.zeros((b, 1, dim), np.float32)  # (x - 0) * 1 is x, bit for bit
            scale = np.ones((b, 1, dim), np.float32)
            lo, hi = np.full((b, 1, 1), -np.inf, np.float32), np.full((b, 1, 1), np.inf,
                                                                     np.float32)
            for r, s in enumerate(specs):
                arrays[s.name] = value[r, :, :s.dim]
                arrays[f"{s.name}_is_pad"] = pad[r]
                if s.name in core.norm_keys:
                    j = core.norm_keys.index(s.name)
                    offset[r, 0, :s.dim] = getattr(core, f"offset{j}").numpy()
                    scale[r, 0, :s.dim] = getattr(core, f"scale{j}").numpy()
                    if core.clip[s.name]:
                        lo[r], hi[r] = -1.0, 1.0
            normed = any(s.name in core.norm_keys for s in specs)
            clipped = bool((hi < np.inf).any())
            # per tick, for the two samples around each instant: their slots, rows and
            # weights (each pair of arrays filled and used in one NumPy call)
            self.linear.append((specs, data.reshape(b * ring, dim), ring, value,
                                value.reshape(b * u, dim), pad.reshape(-1),
                                np.zeros(2 * b * u, np.intp), np.zeros((2, b * u, dim),
                                                                       np.float32),
                                np.zeros((2, b * u, 1), np.float32),
                                (offset, scale) if normed else None,
                                (lo, hi) if clipped else None, core.zero_pad))
        # the served tensors: views of these arrays, refilled each tick
        self.outputs = tuple(torch.from_numpy(arrays[n]) for n in core.outputs)

    @staticmethod
    def _window(s: _StreamSpec) -> tuple[int, int, list[float]]:
        """The stream's kept samples as the core reads them: first slot, count (an empty
        ring: one padded sample) and times."""
        head, cap = s.head, s.cap
        start = head - cap if head > cap else 0
        n = head - start or 1
        return start, n, s.times[start:start + n].tolist()

    def __call__(self, target: list[float], pre: list[bool] | None, horizon: float) -> None:
        for specs, rows, ring, value, flat, pad, index, pair, weights, norm, clip, zero \
                in self.linear:
            slots, slots1, h, d, pads = [], [], [], [], []
            for r, s in enumerate(specs):
                start, n, tl = self._window(s)
                base, last, empty = r * ring + start, tl[-1], s.head == 0
                for j, x in enumerate(target):
                    cnt = bisect_right(tl, x)
                    seg = cnt - 1 if cnt > 1 else 0
                    if seg > n - 2:
                        seg = n - 2 if n > 2 else 0
                    seg1 = seg + 1 if seg + 1 < n else n - 1
                    slots.append(base + seg)
                    slots1.append(base + seg1)
                    h.append(tl[seg1] - tl[seg])
                    d.append(x - tl[seg])
                    pads.append(empty or cnt == 0 or x > last or (
                        pre is not None and pre[j]))
            h = _f32(h)
            w = _f32([a / b if b > 0 else 0.0 for a, b in zip(_f32(d), h, strict=True)])
            w = [0.0 if a < 0 else 1.0 if a > 1 else a for a in w]
            # (1 - w) y0 + w y1, each product and the sum rounded to float32 as the core's
            weights.reshape(-1)[:] = [1.0 - a for a in w] + w  # (stored: float32-rounded)
            index[:] = slots + slots1
            rows.take(index, 0, pair.reshape(-1, pair.shape[-1]))
            np.multiply(pair, weights, out=pair)
            np.add(pair[0], pair[1], out=flat)
            pad[:] = pads
            if norm is not None:
                np.subtract(value, norm[0], out=value)
                np.multiply(value, norm[1], out=value)
                if clip is not None:
                    np.clip(value, clip[0], clip[1], out=value)
            if zero and pre is not None:
                value[:, pre] = 0
        for s, value, pad, age, tol, norm, zero in self.indexed:
            start, n, tl = self._window(s)
            first, last, method, empty = tl[0], tl[-1], s.method, s.head == 0
            slots, d, pads = [], [], []
            for j, x in enumerate(target):
                cnt = bisect_right(tl, x)
                p = empty or (pre is not None and pre[j])
                if method == "previous":
                    at = cnt - 1 if cnt > 0 else 0
                    d.append(x - tl[at])
                else:  # nearest, frame_index: the nearer of the samples around x, ties earlier
                    seg = cnt - 1 if cnt > 1 else 0
                    if seg > n - 2:
                        seg = n - 2 if n > 2 else 0
                    seg1 = seg + 1 if seg + 1 < n else n - 1
                    at = seg1 if tl[seg1] - x < x - tl[seg] else seg
                    if tol is not None:
                        d.append(abs(tl[at] - x))
                    else:
                        # outside the samples, unless past the latest with the horizon (the
                        # tick's time) at least as far away: no nearer message can come
                        p = p or ((cnt == 0 or x > last) and not (
                            x > last and x - last <= horizon - x and x >= first))
                slots.append(start + at)
                pads.append(p)
            if method == "previous":
                ages = _f32(d)
                age[:] = ages
                pads = [p or (a != 0 if s.exact else a < 0) for p, a in zip(pads, ages,
                                                                             strict=True)]
            elif tol is not None:
                pads = [p or not a <= tol for p, a in zip(pads, _f32(d), strict=True)]
            pad[:] = pads
            if s.kind == "camera":
                value[:] = slots
            else:
                np.take(s.values, slots, axis=0, out=value)
                if norm is not None:
                    np.subtract(value, norm[0], out=value)
                    np.multiply(value, norm[1], out=value)
                    if norm[2]:
                        np.clip(value, -1.0, 1.0, out=value)
                if zero and pre is not None:
                    value[pre] = 0


class Observer:
    """The training-time observation of a cache, built online from live messages.

    Make one with :meth:`from_cache`; :meth:`push` messages as they arrive (any stream order,
    each stream in time order up to ``late_s``), then :meth:`observation` at each tick.
    The module docstring gives the semantics; docs/online.md a control loop.
    """

    def __init__(self, manifest: dict[str, Any], streams: list[_StreamSpec],
                 deltas: dict[str, list[int]], squeezed: list[str], norm: dict[str, Any],
                 *, pad: str, image_size, image_dtype: torch.dtype, device: torch.device,
                 stale_s: float | None, tolerance_s: float, task: str | None,
                 future_s: float = 10.0, compile: bool = False,
                 package: str | Path | None = None):
        self.manifest, self.rate = manifest, float(manifest["rate_hz"])
        self.grid_tolerance_s = tolerance_s
        self.streams = {s.name: s for s in streams}
        self.keys = list(self.streams)
        self.deltas, self.squeezed = deltas, squeezed
        self.image_size, self.image_dtype = image_size, image_dtype
        self.device, self.stale_s, self.task = device, stale_s, task
        offsets = sorted({d for v in deltas.values() for d in v})
        self._offset_list = offsets  # steps relative to the tick, oldest first
        self._pre_set = False  # whether the arena's ``pre`` holds a True
        # each key's rows of the union of offsets: None (all), a slice (a view) or indices
        self._rows: dict[str, Any] = {}
        for k, v in deltas.items():
            rows = [offsets.index(d) for d in v]
            self._rows[k] = None if v == offsets else \
                slice(rows[0], rows[-1] + 1) if rows == list(range(rows[0], rows[-1] + 1)) \
                else torch.tensor(rows, device=device)
        # every served tensor a view of the core's outputs: on a GPU the served dict of the
        # graph's static outputs is made once
        self._views_only = stale_s is None and not any(
            s.kind == "camera" for s in streams) and not any(
            isinstance(r, torch.Tensor) for r in self._rows.values())
        self._served: dict[str, torch.Tensor] | None = None
        # alignment groups: one interp_ref call per (method, tolerance), interpolated float64
        # streams apart (in float64, as ingest interpolates them)
        groups: dict[tuple[str, float | None, bool], list[str]] = {}
        for s in streams:
            groups.setdefault((s.method, s.tolerance_s, _wide(s)), []).append(s.name)
        self._groups = [(m, tol, names) for (m, tol, _), names in groups.items()]
        arena = _Arena()
        arena.add("target", np.float64, (len(offsets),))
        arena.add("pre", np.bool_, (len(offsets),))
        arena.add("horizon", np.float64, (1,))
        inputs = []
        for g, (method, _, names) in enumerate(self._groups):
            cap = max(self.streams[n].cap for n in names)
            for row, n in enumerate(names):
                self.streams[n].group, self.streams[n].row = g, row
                self.streams[n].cap = cap
            arena.add(f"g{g}.times", np.float64, (len(names), 2 * cap))
            arena.add(f"g{g}.head", np.int64, (len(names),))
            inputs += [f"g{g}.times", f"g{g}.head"]
            if method in _INTERPOLATED:
                dim = max(self.streams[n].dim for n in names)
                arena.add(f"g{g}.data", np.float64 if _wide(self.streams[names[0]])
                          else np.float32, (len(names), 2 * cap, dim))
                inputs.append(f"g{g}.data")
        for s in streams:
            if s.kind == "numeric" and s.method in _INDEXED:
                arena.add(f"{s.name}.values", s.dtype, (2 * s.cap, s.dim))
                inputs.append(f"{s.name}.values")
        self._arena = arena
        self._host_buf = torch.zeros(arena.size, dtype=torch.uint8)
        self._host = {k: v.numpy() for k, v in arena.views(self._host_buf).items()}
        for s in streams:
            h, g = self._host, f"g{s.group}"
            s.times, s.heads = h[f"{g}.times"][s.row], h[f"{g}.head"]
            s.values = h[f"{g}.data"][s.row] if f"{g}.data" in h else h.get(f"{s.name}.values")
            s.full = s.values is not None and s.values.shape[1] == s.dim
            s.ring = 2 * s.cap
            if s.values is not None and (s.values.dtype.kind != "f" or
                                         s.values.dtype.itemsize <= 4):
                s.fast = s.values.dtype
        self._views = self._arena.views(self._host_buf)
        self._frames = {s.name: [None] * (2 * s.cap) for s in streams if s.kind == "camera"}
        # the frames the last tick decoded (per camera, in time order) and their served tensors
        self._served_frames: tuple[list, list] = ([], [])
        # the observer's clock: its latest message or tick; messages more than future_s
        # after it are refused (``_limit``: the latest time accepted)
        self.future_s = future_s
        self._latest, self._limit = -math.inf, math.inf
        self.core = ObservationCore(streams, self._groups, norm, pad == "zero", inputs).to(device)
        self._args = ["target", "pre", "horizon", *inputs]
        self._compile, self._package = compile, package
        self._core = None  # made at the first tick (see _make_core)
        self._graph = None
        # the CPU tick without torch operators, where it covers the streams (a package given
        # runs instead); its last (target, pre, horizon), for example_inputs()
        self._host_tick: _HostTick | None = None
        self._inputs = None
        if device.type == "cpu" and package is None and _HostTick.covers(self):
            self._host_tick = _HostTick(self)
            self._static_out = self._host_tick.outputs
            self._step = (torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.int64))
            self._step_np = tuple(x.numpy() for x in self._step)
        self.t0: float | None = None

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_cache(cls, path: str | Path, *, history: int = 1, keys: Sequence[str] | None = None,
                   pad: str = "edge", delta_timestamps: Mapping[str, Sequence[float]] | None = None,
                   delta_steps: Mapping[str, Sequence[int]] | None = None,
                   tolerance_s: float = 1e-4, image_size: tuple[int, int] | None = None,
                   image_dtype: torch.dtype = torch.float32,
                   normalize: str | Mapping[str, str] | None = None,
                   device: str | torch.device = "cpu",
                   capacity: int | Mapping[str, int] | None = None,
                   late_s: float | None = None, stale_s: float | None = None,
                   lookahead_s: float = 0.1, camera_tolerance_s: float | None = None,
                   future_s: float = 10.0, task: str | None = None, compile: bool = False,
                   package: str | Path | None = None) -> Observer:
        """An observer serving the observations a :class:`~robocache.RobotDataset` over the
        cache at ``path`` would, with the same keyword arguments.

        Args:
            path: cache directory (from ``robocache ingest``).
            history, keys, pad, delta_timestamps, delta_steps, tolerance_s, image_size,
                image_dtype: as :class:`~robocache.RobotDataset` (``keys`` default: every
                servable stream that is not an action; offsets must be <= 0: the
                observation cannot see the future). ``tolerance_s`` is also the grid
                tolerance the cache was built with (``--grid-tolerance``, default 1e-4).
            normalize: ``None`` (raw values), a mode for every float32 stream with stats
                (``"mean_std"``, ``"min_max"``, ``"quantile"``), or key -> mode: what
                :class:`~robocache.RobotLoader`'s ``normalize`` does in training.
            device: where the tick runs (``"cpu"`` or a CUDA device: one captured CUDA graph).
            capacity: messages kept per stream (int for all, or key -> int); default: what the
                history span plus ``lookahead_s`` holds at the stream's rate, plus 4 (16 for
                streams without a rate).
            late_s: a message may come this many seconds before the stream's latest one and
                is inserted in order (default: the cache's grid tolerance); earlier ones raise.
            stale_s: ``previous`` (hold) streams whose held sample is older than this are
                padded (default: held as in training, the age is reported).
            lookahead_s: how far ahead of the tick messages may already be buffered (sizes
                the rings).
            camera_tolerance_s: the cache's ``tolerance_s`` (``--tolerance``): camera steps
                farther than this from every frame are padded (default: off, as ingest's).
            future_s: a message more than this many seconds after the observer's clock (the
                latest message of any stream, or the latest tick, whichever is later) is
                refused: a time that far ahead is a wrong clock, and accepting it would make
                every later message of its stream "go backwards" until :meth:`reset`.
            task: the task string served as ``"task"`` (settable later, :attr:`task`).
            compile: compile the core on the first tick (static shapes): on the CPU into an
                AOTInductor package loaded in this process (a minute or more: gcc), on a GPU
                with ``torch.compile`` (then captured in the CUDA graph) where the fused
                kernel does not cover the streams (:meth:`fused`; where it does, the kernel
                is the tick, compiled or not). On one CPU core a
                4-stream tick took 74 us (p50; p99 197 us) compiled against 550 us eager
                (benchmarks/results/online-cpu-idle-2026-11-27.json); on an H100 108 us
                against 236 us (benchmarks/results/online-h100-2026-11-27-17d991a.json).
            package: a package :meth:`save_package` wrote for an observer of the same cache
                and arguments (CPU): loaded instead of compiling.

        Raises:
            FileNotFoundError: no cache at ``path``.
            DataError: an unfinished cache, unknown or action keys, a method that needs the
                whole episode (``cubic``), future offsets, bad sizes, an argument of the wrong
                type or range, a CUDA device on a machine without one (messages name the
                argument and the fix).
        """
        from robocache.data.cache import native_streams
        from robocache.data.dataset import OFFSET_BYTES, seconds_to_steps
        from robocache.data.episode import StreamSpec
        from robocache.ops._checks import check_fits
        from robocache.ops.normalize import Normalizer, Stats

        path = Path(path)
        mpath = path / "manifest.json"
        if not mpath.exists():
            raise FileNotFoundError(f"{path} is not a RoboCache cache (no manifest.json); "
                                    "build one with `robocache ingest SOURCE DEST`.")
        manifest = json.loads(mpath.read_text())
        if manifest.get("status") != "complete":
            raise DataError(f"{path}: the cache build did not finish; re-run `robocache "
                            "ingest` with the same arguments to resume it.")
        if not (isinstance(history, int) and history >= 1):
            raise DataError(f"`history` must be an integer >= 1; got {history!r}.")
        if not (isinstance(lookahead_s, (int, float)) and 0 <= lookahead_s < math.inf):
            raise DataError(f"`lookahead_s` must be a finite number of seconds >= 0; got "
                            f"{lookahead_s!r}.")
        # before any list or buffer of that size: an offset a step, a slot a message
        check_fits("Observer", f"a history of {history:,} steps", OFFSET_BYTES * history,
                   torch.device("cpu"), "pass a smaller `history`.")
        if pad not in ("edge", "zero"):
            raise DataError(f"`pad` must be 'edge' or 'zero'; got {pad!r}.")
        device = _device(device)
        tolerance_s = _seconds("tolerance_s", tolerance_s, positive=True)
        late_s = _seconds("late_s", late_s, optional=True)
        stale_s = _seconds("stale_s", stale_s, optional=True)
        camera_tolerance_s = _seconds("camera_tolerance_s", camera_tolerance_s, optional=True)
        future_s = _seconds("future_s", future_s, positive=True)
        if image_size is not None and not (
                isinstance(image_size, (tuple, list)) and len(image_size) == 2 and all(
                    isinstance(x, int) and not isinstance(x, bool) and x > 0
                    for x in image_size)):
            raise DataError(f"`image_size` must be None or (height, width) in pixels, two "
                            f"integers > 0; got {image_size!r}.")
        if not isinstance(image_dtype, torch.dtype):
            raise DataError(f"`image_dtype` must be a torch dtype (e.g. torch.float32); got "
                            f"{image_dtype!r}.")
        if not isinstance(compile, bool):
            raise DataError(f"`compile` must be True or False; got {compile!r}.")
        if task is not None and not isinstance(task, str):
            raise DataError(f"`task` must be a string or None; got {type(task).__name__}.")
        if isinstance(keys, str):
            raise DataError(f"`keys` must be a list of stream names; got the string {keys!r} "
                            f"(pass [{keys!r}]).")
        specs = manifest["streams"]
        servable = [k for k, s in specs.items() if s["kind"] in ("numeric", "image", "video")]
        keys = list(keys) if keys is not None else \
            [k for k in servable if not k.startswith("action")]
        bad = [k for k in keys if k not in servable]
        if bad:
            raise DataError(f"`keys` {bad} are not servable streams of {path}; servable: "
                            f"{servable}.")
        acts = [k for k in keys if k.startswith("action")]
        if acts:
            raise DataError(f"`keys` {acts} are actions: the policy predicts them, an observer "
                            "serves observations; leave them out of `keys`.")
        rate = float(manifest["rate_hz"])
        if delta_timestamps is not None and delta_steps is not None:
            raise DataError("pass `delta_timestamps` (seconds) or `delta_steps`, not both.")
        if delta_timestamps is not None:
            try:
                delta_steps = seconds_to_steps(dict(delta_timestamps), rate, tolerance_s, keys)
            except (TypeError, ValueError) as e:
                raise DataError(f"`delta_timestamps` must map keys to lists of seconds; got "
                                f"{dict(delta_timestamps)!r} ({e}).") from None
        squeezed: list[str] = []
        if delta_steps is not None:
            if history != 1:
                raise DataError("per-key offsets replace `history`; pass one or the other.")
            unknown = [k for k in delta_steps if k not in keys]
            if unknown or any(len(v) == 0 or not all(
                    isinstance(o, (int, np.integer)) and not isinstance(o, bool) for o in v)
                    for v in delta_steps.values()):
                raise DataError(f"`delta_steps` must name served keys ({keys}) with at least "
                                f"one integer offset each; got {dict(delta_steps)}.")
            deltas = {k: [int(o) for o in delta_steps.get(k, [0])] for k in keys}
            squeezed = [k for k in keys if k not in delta_steps]
        else:
            deltas = {k: list(range(1 - history, 1)) for k in keys}
        future = {k: v for k, v in deltas.items() if max(v) > 0}
        if future:
            raise DataError(f"offsets after the current step {future} cannot be observed "
                            "online; serve them from the dataset (actions) or drop them.")
        native = set()
        if manifest.get("native"):
            declared = {n: StreamSpec(n, s["kind"], s["dtype"], tuple(s["shape"]),
                                      s.get("source_rate_hz")) for n, s in specs.items()}
            native = set(native_streams(declared, rate))
        span = (-min(min(v) for v in deltas.values())) / rate + lookahead_s
        streams = []
        for k in keys:
            s = specs[k]
            method = s["method"]
            if method not in _INTERPOLATED + _INDEXED:
                raise DataError(f"stream {k!r} is aligned with {method!r} in {path}, which "
                                "needs the whole episode; online alignment supports "
                                f"{_INTERPOLATED + _INDEXED} (re-ingest with --method).")
            camera = s["kind"] in ("image", "video")
            exact = k in native and method != "frame_index" and (
                s["kind"] == "numeric" or method == "previous")
            cap = capacity.get(k) if isinstance(capacity, Mapping) else capacity
            if cap is None:
                src = s.get("source_rate_hz")
                cap = 16 if not src else math.ceil(src * span) + 4
            if not (isinstance(cap, int) and cap >= 2):
                raise DataError(f"`capacity` of stream {k!r} must be an integer >= 2; got "
                                f"{cap!r}.")
            tol = camera_tolerance_s if method == "frame_index" else None
            streams.append(_StreamSpec(
                k, "camera" if camera else "numeric", "previous" if exact else method,
                np.dtype("int64" if camera else s["dtype"]),
                tuple(s["shape"]) if not camera else (), cap, tol, exact,
                "each" if (s["kind"] == "numeric" and method in ("previous", "nearest"))
                or exact else "all",
                tolerance_s if late_s is None else late_s))
        need = sum(2 * st.cap * (8 + st.dtype.itemsize * max(1, math.prod(st.shape))
                                 + (math.prod(specs[st.name]["shape"])
                                    if st.kind == "camera" else 0)) for st in streams)
        check_fits("Observer", f"message buffers of {[st.cap for st in streams]} slots", need,
                   device, "pass a smaller `capacity` (or `lookahead_s`, "
                   "`history`).")
        if package is not None and device.type == "cuda":
            raise DataError("`package` is for CPU observers; on a GPU pass compile=True "
                            "(torch.compile inside the CUDA graph).")
        stats = json.loads((path / manifest["stats_path"]).read_text())
        norm: dict[str, Any] = {}
        if normalize is not None:
            floats = {k: Stats.from_dict(stats[k]) for k in keys if k in stats
                      and specs[k]["kind"] == "numeric"
                      and np.dtype(specs[k]["dtype"]).kind == "f"}
            modes = normalize if isinstance(normalize, str) else \
                {k: m for k, m in normalize.items() if k in floats}
            try:
                normalizer = Normalizer(floats, modes)
            except ValueError as e:
                raise DataError(str(e)) from None
            # every float stream, in the arithmetic training normalizes it in (float64 for
            # float64: RobotLoader's normalizer)
            norm = {k: normalizer.params(k, torch.device("cpu"), _TORCH[np.dtype(
                specs[k]["dtype"])]) for k in floats}
        return cls(manifest, streams, deltas, squeezed, norm, pad=pad, image_size=image_size,
                   image_dtype=image_dtype, device=device, stale_s=stale_s,
                   tolerance_s=tolerance_s, future_s=future_s, task=task, compile=compile,
                   package=package)

    # ------------------------------------------------------------------ messages
    def _spec(self, stream: str) -> _StreamSpec:
        s = self.streams.get(stream)
        if s is None:
            raise DataError(f"unknown stream {stream!r}; this observer serves {self.keys}.")
        return s

    def push(self, stream: str, t: float, value: Any) -> None:
        """One message: ``value`` of ``stream`` at ``t`` (seconds, the cache's clock).

        ``value``: numeric streams an array-like of the stream's shape (any real numeric
        dtype that the stream's store holds exactly, stored in the stream's); cameras the
        frame's encoded JPEG/PNG ``bytes`` (as the cache stores them; video cameras: decoded
        frames) or an array of the camera's ``[H, W, C]`` shape and dtype.

        Raises:
            DataError: an unknown stream; a time that is not a number, NaN, infinite, earlier
                than the stream's latest by more than ``late_s``, or later than the observer's
                clock by more than ``future_s``; a value that is not real numbers (complex,
                strings, ragged lists), of the wrong size, NaN or infinite, past the range of
                the stream's store, or not an integer an integer stream can hold; a camera
                frame that is not a JPEG/PNG image or an array of the camera's size (bytes are
                checked by their header: a frame whose header fits but whose data is corrupt
                still fails at the tick that decodes it).
        """
        s = self.streams.get(stream) or self._spec(stream)
        if type(t) is not float:
            t = _seconds_of(f"stream {stream!r}", t)
        if not s.last - s.late_s <= t <= self._limit:  # also NaN
            self._refuse_time(s, t)
        if s.kind == "camera":
            self._insert(s, t, self._checked_frame(s, t, value))
        else:
            # the usual message (an array of the store's dtype, 4-byte floats at most): its
            # size, and finite iff the sum of its elements as Python floats is (one call)
            if type(value) is np.ndarray and value.dtype is s.fast and value.size == s.dim:
                v = value if value.ndim == 1 else value.reshape(-1)
                if s.fast.kind == "f" and not math.isfinite(sum(v.tolist())):
                    raise DataError(f"stream {stream!r}: value at t = {t!r} s holds NaN or "
                                    "infinite elements.")
            else:
                v = self._value(s, t, value)
            head = s.head
            if t < s.last or head == s.ring:  # late, or the ring wraps
                self._insert(s, t, v)
            else:  # in order with room: a few NumPy stores into the ring
                s.times[head] = t
                if s.full:
                    s.values[head] = v
                else:
                    s.values[head, :s.dim] = v
                s.head = head + 1
                s.heads[s.row] = head + 1
                s.last = t
                s.fresh += 1
        if t > self._latest:
            self._latest, self._limit = t, t + self.future_s

    def _refuse_time(self, s: _StreamSpec, t: float) -> None:
        if not math.isfinite(t):
            raise DataError(f"stream {s.name!r}: message time {t!r} is not finite.")
        if t > self._limit:
            raise DataError(f"stream {s.name!r}: message time {t!r} s is more than future_s = "
                            f"{self.future_s:g} s after the observer's clock ({self._latest!r} s: "
                            "its latest message or tick); fix the sender's clock, or pass a "
                            "larger `future_s` (or reset() for a new episode).")
        raise DataError(f"stream {s.name!r}: time went backwards: {t!r} s after a message at "
                        f"{s.last!r} s (late_s = {s.late_s:g}).")

    def _value(self, s: _StreamSpec, t: float, value: Any) -> np.ndarray:
        """A numeric message's value, checked: a 1-D array of the stream's size that its
        store holds (the general case of :meth:`push`)."""
        where = f"stream {s.name!r}: value at t = {t!r} s"
        if isinstance(value, torch.Tensor):
            value = value.detach().cpu()
            value = (value.float() if value.dtype == torch.bfloat16 else value).numpy()
        try:
            v = np.asarray(value)
        except (TypeError, ValueError) as e:  # ragged lists
            raise DataError(f"{where} is not an array of numbers ({e}).") from None
        kind = v.dtype.kind
        if kind == "c":
            raise DataError(f"{where} is complex ({v.dtype}); the stream stores real "
                            f"{s.dtype} values: pass the real part (or the magnitude).")
        if kind not in "biuf":
            raise DataError(f"{where} is not numeric (dtype {v.dtype}); pass numbers of shape "
                            f"{list(s.shape)}.")
        if v.size != s.dim:  # (a value is written as a row: any shape of that size)
            raise DataError(f"{where} has {v.size} elements, expected {s.dim} (shape "
                            f"{list(s.shape)}).")
        v = v.reshape(-1)
        store = s.values.dtype
        if kind == "f" and not _finite(v, store):
            raise DataError(f"{where} holds NaN or infinite elements, or elements past "
                            f"{store}'s range (the stream's store).")
        if store.kind in "biu" and v.dtype != store:
            bad = [x for x in v.tolist() if not (x in (0, 1) if store.kind == "b" else (
                x == int(x) and np.iinfo(store).min <= x <= np.iinfo(store).max))]
            if bad:
                raise DataError(f"{where} holds {bad[0]!r}, which the stream's {store} store "
                                "cannot hold exactly.")
        return v

    def _checked_frame(self, s: _StreamSpec, t: float, frame: Any) -> Any:
        """A camera message, checked against the camera's spec: encoded bytes by their
        header (codec and size), arrays and tensors by shape and dtype."""
        spec = self.manifest["streams"][s.name]
        (h, w, c), dtype = (tuple(spec["shape"]) + (1,))[:3], spec["dtype"]
        codec = spec.get("codec", "jpeg")
        where = f"stream {s.name!r}: the frame at t = {t!r} s"
        if isinstance(frame, (bytes, bytearray)):
            if codec not in ("jpeg", "png"):
                raise DataError(f"{where} is encoded bytes, but this camera is kept as "
                                f"{codec}: push decoded {dtype} [{h}, {w}, {c}] arrays.")
            head = _image_header(frame)
            if isinstance(head, str):
                raise DataError(f"{where} is not a JPEG or PNG image ({head}).")
            if head[0] != codec or head[1:] != (h, w):
                raise DataError(f"{where} is a {head[1]}x{head[2]} {head[0].upper()} image; "
                                f"this camera's frames are {h}x{w} {codec.upper()} images.")
            return frame
        if isinstance(frame, (np.ndarray, torch.Tensor)):
            got = str(frame.dtype).replace("torch.", "")
            if got != dtype or tuple(frame.shape) not in ((h, w, c), (h, w) if c == 1 else ()):
                raise DataError(f"{where} is a {got} array of shape {list(frame.shape)}; this "
                                f"camera's frames are {dtype} [{h}, {w}, {c}].")
            return frame
        raise DataError(f"stream {s.name!r}: a camera frame must be encoded bytes or a "
                        f"{dtype} [{h}, {w}, {c}] array; got {type(frame).__name__}.")

    def push_many(self, stream: str, times: Sequence[float] | np.ndarray,
                  values: Sequence[Any] | np.ndarray) -> None:
        """Several messages of one stream (``times [N]``, ``values [N, ...]``), as :meth:`push`
        one by one, checked at once."""
        s = self.streams.get(stream) or self._spec(stream)
        try:
            times = np.asarray(times, np.float64).reshape(-1)
        except (TypeError, ValueError):
            raise DataError(f"stream {stream!r}: `times` must be numbers of seconds; got "
                            f"{times!r:.80}.") from None
        n = len(times)
        if s.kind == "camera" or n < 2:
            if not isinstance(values, np.ndarray):
                values = list(values)
            if len(values) != n:
                raise DataError(f"stream {stream!r}: {n} times but {len(values)} values.")
            for t, v in zip(times.tolist(), values, strict=True):
                self.push(stream, t, v)
            return
        try:
            v = np.asarray(values)
        except (TypeError, ValueError) as e:
            raise DataError(f"stream {stream!r}: `values` are not an array of numbers ({e})."
                            ) from None
        if v.dtype.kind not in "biuf":
            hint = " (complex: pass the real part)" if v.dtype.kind == "c" else ""
            raise DataError(f"stream {stream!r}: `values` must be real numbers; got dtype "
                            f"{v.dtype}{hint}.")
        if v.size != n * s.dim:
            raise DataError(f"stream {stream!r}: {n} messages need {n} x {s.dim} values "
                            f"(shape {list(s.shape)} each); got {v.size} ({list(v.shape)}).")
        v = v.reshape(n, s.dim)
        # few NumPy calls (each costs about a microsecond): the times as Python floats, in
        # order iff sorted; their sum is finite iff every one is (seconds cannot overflow)
        tl = times.tolist()
        if not (math.isfinite(sum(tl)) and (v.dtype.kind != "f" or
                                            _finite(v, s.values.dtype))):
            raise DataError(f"stream {stream!r}: NaN or infinite times or values, or values "
                            f"past {s.values.dtype}'s range (the stream's store).")
        if tl != sorted(tl) or tl[0] < s.last - s.late_s:
            raise DataError(f"stream {stream!r}: time went backwards within the messages "
                            "(push_many takes them in time order).")
        if tl[-1] > self._limit:
            self._refuse_time(s, tl[-1])
        if s.values.dtype.kind in "biu" and v.dtype != s.values.dtype:
            for t, row in zip(tl, v, strict=True):  # each checked as push checks it
                self._value(s, t, row)
        head, ring = s.head, s.ring
        if tl[0] < s.last or n > s.cap + 1:  # late, or more than a ring keeps: one by one
            for t, row in zip(tl, v, strict=True):
                self._insert(s, t, row)
        else:
            if head + n > ring:  # the ring wraps: the latest cap - 1 to the front, as push does
                keep = s.cap - 1
                s.times[:keep] = s.times[head - keep:head]
                s.values[:keep] = s.values[head - keep:head]
                head = keep
            # one slice store per array (what n pushes store one by one)
            s.times[head:head + n] = times
            s.values[head:head + n, :s.dim] = v
            s.head = head + n
            s.heads[s.row] = head + n
            s.last = tl[-1]
            s.fresh = min(s.fresh + n, head + n)
        if tl[-1] > self._latest:
            self._latest, self._limit = tl[-1], tl[-1] + self.future_s

    def _insert(self, s: _StreamSpec, t: float, value: Any) -> None:
        cap, times, vals = s.cap, s.times, s.values
        head = s.head
        if head == 2 * cap:  # keep the latest cap - 1 at the front
            times[:cap - 1] = times[cap + 1:]
            if vals is not None:
                vals[:cap - 1] = vals[cap + 1:]
            else:
                f = self._frames[s.name]
                f[:cap - 1] = f[cap + 1:]
            head = cap - 1
        at = head
        if t < s.last:  # late: insert in order among the kept samples
            start = max(head - cap, 0)
            at = start + int(np.searchsorted(times[start:head], t, side="right"))
            times[at + 1:head + 1] = times[at:head].copy()
            if vals is not None:
                vals[at + 1:head + 1] = vals[at:head].copy()
            else:
                f = self._frames[s.name]
                f[at + 1:head + 1] = f[at:head]
        else:
            s.last = t
        times[at] = t
        if vals is None:
            self._frames[s.name][at] = value
        elif s.full:
            vals[at] = value
        else:
            vals[at, :s.dim] = value
        s.head = head + 1
        s.heads[s.row] = head + 1
        s.fresh = max(s.fresh + 1, head + 1 - at)

    # ------------------------------------------------------------------ ticks
    def start(self, t0: float) -> None:
        """Anchor the grid at ``t0`` (step 0, the episode's first step); by default the first
        :meth:`observation` does."""
        t0 = _seconds_of("`t0`", t0)
        if not math.isfinite(t0):
            raise DataError(f"`t0` must be a finite time in seconds; got {t0!r}.")
        self.t0 = t0
        if t0 > self._latest:  # the grid's start advances the clock that bounds messages
            self._latest, self._limit = t0, t0 + self.future_s

    def reset(self) -> None:
        """Forget every message and the grid (a new episode)."""
        self._host_buf.zero_()
        for n in self._frames:
            self._frames[n] = [None] * len(self._frames[n])
        self._served_frames = ([], [])
        for st in self.streams.values():
            st.head, st.last, st.fresh, st.on_grid = 0, -math.inf, 0, True
        self._latest, self._limit = -math.inf, math.inf
        self.t0, self._pre_set = None, False

    def step(self, t: float) -> int:
        """The grid step :meth:`observation` serves at ``t``: the latest at or before it
        (within the grid tolerance)."""
        t = _seconds_of("`t`", t)
        if not math.isfinite(t):
            raise DataError(f"`t` must be a finite time in seconds; got {t!r}.")
        return self._step_at(t)

    def _step_at(self, t: float) -> int:
        if self.t0 is None:
            self.start(t)
        return int(math.floor((t - self.t0 + self.grid_tolerance_s) * self.rate))

    def instant(self, k: int) -> float:
        """Grid step ``k``'s time, as ingest computes it (``t0 + k / rate`` in float64)."""
        return float(self.t0 + np.float64(k) / self.rate)

    def ready(self, t: float) -> bool:
        """Whether, at time ``t`` (every earlier message has come), every stream has what the
        step at ``t`` needs to be final: an interpolated stream a message at or after the step
        (pchip: two); a nearest / camera stream that, or a latest message no farther before
        the step than ``t`` is after it."""
        t = _seconds_of("`t`", t)
        x = self.instant(self.step(t))
        for s in self.streams.values():
            need = _AHEAD[s.method]
            head = s.head
            if not need:
                continue
            if head < need:
                return False
            latest = s.times[head - need]
            if latest < x and not (s.method in ("nearest", "frame_index") and s.tolerance_s
                                   is None and x - latest <= t - x):
                return False
        return True

    def _snap(self) -> None:
        """Snap the samples that came since the last tick onto the grid (ingest's rule)."""
        t0, rate, tol = self.t0, self.rate, self.grid_tolerance_s
        for s in self.streams.values():
            n = s.fresh
            if not n:
                continue
            s.fresh = 0
            if s.snap == "all" and not s.on_grid:
                continue
            head = s.head
            n = min(n, head)
            snapped, close = snap_instants(s.times[head - n:head].tolist(), t0, rate, tol)
            if s.snap == "all" and not close:
                s.on_grid = False
            else:
                s.times[head - n:head] = snapped

    def observation(self, t: float) -> dict[str, Any]:
        """The observation of the grid step at ``t`` (see :meth:`step`): what the
        :class:`~robocache.RobotDataset` item of that step holds for the observer's keys
        (``<key>`` and ``<key>_is_pad``, ``timestamp`` float64, ``index``: the step since
        ``t0``), plus ``<key>_age`` (float32 seconds) of ``previous`` streams and ``task``
        when set. Tensors live on the observer's device; on a GPU they are the CUDA graph's
        outputs, on the CPU (where the tick runs without torch operators, see
        :class:`_HostTick`) views of the tick's arrays, and ``timestamp``/``index`` host
        tensors: refilled by every tick, read or clone them before the next one.

        Raises:
            DataError: ``t`` is not a number, NaN, or before the first tick.
        """
        if type(t) is not float:
            t = _seconds_of("`t`", t)
        if not math.isfinite(t):
            raise DataError(f"`t` must be a finite time in seconds; got {t!r}.")
        k = self._step_at(t)
        if k < 0:
            raise DataError(f"`t` = {t!r} s is before the first tick (t0 = {self.t0!r} s); "
                            "call reset() to start a new episode.")
        if t > self._latest:  # the tick advances the clock that bounds message times
            self._latest, self._limit = t, t + self.future_s
        self._snap()
        # the window's instants as ingest computes them (t0 + k / rate in float64: Python
        # floats are the same doubles), a few stores into the host arena
        t0, rate, offsets = self.t0, self.rate, self._offset_list
        target = [t0 + (k + o if k + o > 0 else 0) / rate for o in offsets]
        pre = [k + o < 0 for o in offsets] if k + offsets[0] < 0 else None
        if self._host_tick is not None:  # (the arena's copies are written when asked for)
            self._host_tick(target, pre, t)
            self._inputs = (target, pre, t)
            outs = self._static_out
        else:
            self._write_inputs(target, pre, t)
            outs = self._run()
        return self._assemble(outs, k, target[-1] if self._offset_list[-1] == 0
                              else self.instant(k))

    def _write_inputs(self, target: list[float], pre: list[bool] | None, horizon: float
                      ) -> None:
        """The tick's instants, pad rows and time into the host arena (a few stores)."""
        h = self._host
        h["target"][:] = target
        if self._pre_set or pre is not None:  # (else still all False)
            h["pre"][:] = pre or False
            self._pre_set = pre is not None
        h["horizon"][0] = horizon

    def _run(self) -> tuple[torch.Tensor, ...]:
        if self.device.type != "cuda":
            if self._core is None:
                self._core = self._make_core()
            v = self._views
            # one intra-op thread for the core's tiny operators: a pool of threads woken for
            # each of them costs more than it shares (on 2 cores with 16 threads the eager
            # core's tick took p50 1,101 us against 776 us with one); 0.3 us to set and restore
            threads = torch.get_num_threads()
            if threads == 1:
                return self._core(*(v[n] for n in self._args))
            torch.set_num_threads(1)
            try:
                return self._core(*(v[n] for n in self._args))
            finally:
                torch.set_num_threads(threads)
        if self._graph is None:
            self._capture()
        # the graph copies the pinned stage to the device first: the previous replay must
        # have read it before it is refilled (it has, unless the caller never waited)
        self._replayed.synchronize()
        np.copyto(self._stage_np, self._host_np)  # one memcpy of the arena
        self._graph.replay()
        self._replayed.record()
        return self._static_out

    def _make_core(self):
        """The callable each tick runs: the eager core, a loaded AOTInductor package (CPU:
        ``package``, or ``compile``), or the torch.compile'd core (GPU ``compile``)."""
        if self._package is not None or (self._compile and self.device.type != "cuda"):
            if self._package is None:
                import tempfile

                self._tmp = tempfile.TemporaryDirectory(prefix="robocache-online-")
                self._package = self.save_package(Path(self._tmp.name) / "core.pt2")
            package = torch._inductor.aoti_load_package(str(self._package))
            # flat tensors in and out: the loader's own call, without the package call's
            # pytree flatten / unflatten of the same flat tuple
            run = getattr(getattr(package, "loader", None), "boxed_run", None)
            core = package if run is None else (lambda *xs: run(list(xs)))
            try:
                core(*self.example_inputs())
            except Exception as e:  # the package's shapes or dtypes differ from this observer's
                raise DataError(f"`package` {self._package} does not fit this observer "
                                f"({type(e).__name__}); write it with save_package() from an "
                                "observer made with the same cache and arguments.") from None
            return core
        if self._compile:
            # no fused multiply-adds and eager's roundings: the values stay the eager core's
            # (an FMA in an interpolation moved a cancelling value by 64 float32 ulps)
            return torch.compile(self.core, fullgraph=True, dynamic=False,
                                 options={"emulate_precision_casts": True})
        return self.core

    def fused(self, device: torch.device | str | None = None):
        """The tick's numeric work as one Triton launch (:mod:`robocache.kernels.online`),
        when every stream's method and dtype is one it covers: ``(run, outputs)``, ``run(arena)``
        launching it on the device arena (uint8, :attr:`inputs` laid out as the host arena)
        and ``outputs`` the core's outputs (in :attr:`ObservationCore.outputs` order) as views
        of its output arena; ``None`` otherwise (the core runs)."""
        from robocache.kernels import online as K

        device = torch.device(device or self.device)
        core, layout, u = self.core, self._arena.layout, len(self._offset_list)
        out, plans, norms = _Arena(), [], []
        for s in self.streams.values():
            # the kernel's arithmetic is float32's: float64 streams run the core, in float64
            if s.method not in K.METHODS or s.cap > K.MAX_CAP or (
                    s.method == "linear" and (_TORCH[s.dtype] not in K.LINEAR_DTYPES
                                              or s.dtype.kind == "b" or _wide(s))) or \
                    s.dim * s.dtype.itemsize > K.MAX_ROW_BYTES or (
                    s.name in core.norm_keys and s.dtype == np.float64):
                return None
            g, ring = f"g{s.group}", 2 * s.cap
            camera = s.kind == "camera"
            out.add(s.name, np.int64 if camera else s.dtype, (u,) if camera else (u, s.dim))
            out.add(f"{s.name}_is_pad", np.bool_, (u,))
            if s.method == "previous":
                out.add(f"{s.name}_age", np.float32, (u,))
            normed = s.name in core.norm_keys
            if normed:
                i = core.norm_keys.index(s.name)
                norms.append((getattr(core, f"offset{i}"), getattr(core, f"scale{i}")))
            if s.method == "linear":
                at, _, shape = layout[f"{g}.data"]
                values, stride = at // 4 + s.row * ring * shape[-1], shape[-1]
            elif not camera:
                at = layout[f"{s.name}.values"][0]
                values, stride = (at // 4, s.dim) if normed else (at, s.dim)
            else:
                values, stride = 0, 0
            plans.append((s, values, stride, normed))
        flat = [x for pair in norms for x in pair]
        norm = torch.cat(flat).to(device, torch.float32) if flat else \
            torch.zeros(1, dtype=torch.float32, device=device)
        starts = iter(np.cumsum([0] + [2 * o.numel() for o, _ in norms]).tolist())
        buf = torch.zeros(out.size, dtype=torch.uint8, device=device)
        at = {k: v[0] for k, v in out.layout.items()}
        streams = []
        for s, values, stride, normed in plans:
            g = f"g{s.group}"
            item = np.dtype(np.int64 if s.kind == "camera" else s.dtype).itemsize
            streams.append(K.StreamPlan(
                s.method, s.exact, s.cap, layout[f"{g}.times"][0] // 8 + s.row * 2 * s.cap,
                layout[f"{g}.head"][0] // 8 + s.row, values, stride, s.dim,
                s.dim * s.dtype.itemsize, at[s.name] // item, _TORCH[s.dtype]
                if s.kind == "numeric" else torch.int64, at[f"{s.name}_is_pad"],
                at.get(f"{s.name}_age", -4) // 4, next(starts) if normed else -1,
                bool(core.clip.get(s.name, False)), s.dtype.kind in "biu",
                s.tolerance_s if s.method == "frame_index" else None,
                core.zero_pad and s.kind == "numeric"))
        kw = dict(target=layout["target"][0] // 8, pre=layout["pre"][0],
                  horizon=layout["horizon"][0] // 8, instants=u, streams=streams)
        views = out.views(buf)
        return (lambda arena: K.launch(arena, buf, norm, **kw)), \
            tuple(views[n] for n in core.outputs)

    def _capture(self) -> None:
        """Capture the arena's host-to-device copy and the tick's numeric work (the fused
        kernel, or the core) as one CUDA graph (once)."""
        self._dev_buf = self._host_buf.to(self.device)
        self._host_np = self._host_buf.numpy()
        stage = torch.zeros_like(self._host_buf).pin_memory()
        self._stage_np = stage.numpy()
        self._replayed = torch.cuda.Event()
        fused = self.fused()
        if fused is None:
            if self._core is None:
                self._core = self._make_core()
            v = self._arena.views(self._dev_buf)
            args = tuple(v[n] for n in self._args)

            def run():
                return self._core(*args)
        else:
            launch, outputs = fused

            def run():
                launch(self._dev_buf)
                return outputs
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(2):  # warm up allocations (and compilations) outside the capture
                run()
        torch.cuda.current_stream(self.device).wait_stream(side)
        self._graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self._graph):
            self._dev_buf.copy_(stage, non_blocking=True)
            self._static_out = run()
        # the step's time and index: host scalars the GPU tick refills, as it does the graph's
        # outputs, instead of two tensors made per tick
        self._step = (torch.zeros((), dtype=torch.float64), torch.zeros((), dtype=torch.int64))
        self._step_np = tuple(x.numpy() for x in self._step)  # (their stores, no view per tick)

    def _assemble(self, outs, k: int, timestamp: float) -> dict[str, Any]:
        static = self._graph is not None or self._host_tick is not None
        if not static:
            out: dict[str, Any] = {"timestamp": torch.tensor(timestamp, dtype=torch.float64),
                                   "index": torch.tensor(k, dtype=torch.int64)}
        else:
            ts, index = self._step_np
            ts[()] = timestamp
            index[()] = k
            out = {"timestamp": self._step[0], "index": self._step[1]}
        if self._served is not None:  # the graph's outputs, viewed once
            out.update(self._served)
        else:
            served = self._serve(outs)
            if static and self._views_only:
                self._served = served
            out.update(served)
        if self.task is not None:
            out["task"] = self.task
        return out

    def _serve(self, outs) -> dict[str, torch.Tensor]:
        """The served keys of the core's outputs: views of them (and, with cameras, stale
        streams or rows out of order, a few ops)."""
        n = len(self.streams)
        ages = dict(zip([s.name for s in self.streams.values() if s.method == "previous"],
                        outs[2 * n:], strict=True))
        pads = [outs[2 * i + 1] for i in range(n)]
        if self.stale_s is not None:
            pads = [p | (ages[name] > self.stale_s) if name in ages else p
                    for name, p in zip(self.streams, pads, strict=True)]
        cams = [(s, outs[2 * i], pads[i]) for i, s in enumerate(self.streams.values())
                if s.kind == "camera"]
        frames = dict(zip([c[0].name for c in cams], self._cameras(cams) if cams else [],
                          strict=True))
        out = {}
        for i, (name, s) in enumerate(self.streams.items()):
            value, pad = outs[2 * i], pads[i]
            value = frames[name] if name in frames else value.reshape(-1, *s.shape)
            rows = self._rows[name]
            if rows is not None:
                value, pad = value[rows], pad[rows]
                if name in ages:
                    ages[name] = ages[name][rows]
            if name in self.squeezed:
                value, pad = value[0], pad[0]
                if name in ages:
                    ages[name] = ages[name][0]
            out[name], out[f"{name}_is_pad"] = value, pad
            if name in ages:
                out[f"{name}_age"] = ages[name]
        return out

    def _cameras(self, cams: list[tuple[_StreamSpec, torch.Tensor, torch.Tensor]]
                 ) -> list[torch.Tensor]:
        """The cameras' frames at ring ``slots`` ``[U]`` (``cams``: stream, slots, pad):
        ``[U, C, h, w]`` each, as :class:`~robocache.RobotDataset` serves them; padded rows
        are zero. Decoded as the dataset decodes an item, so the values are bit-exact on
        nvJPEG too (whose output can depend on the batch): every tick, one
        :func:`~robocache.data.cameras.decode_all` of every camera's distinct frames in the
        window, then resized and cast per camera by the same ``serve`` (reused while the
        window holds the same frames)."""
        u = cams[0][1].shape[0]
        host = torch.cat([torch.cat([sl, p.to(sl.dtype)]) for _, sl, p in cams]).cpu()
        host = host.view(len(cams), 2, u).tolist()
        rows, batch = [], []
        for (s, _, _), (slots, pads) in zip(cams, host, strict=True):
            frames = self._frames[s.name]
            have = sorted({i for i in slots if frames[i] is not None})
            rows.append([have.index(i) if frames[i] is not None and not p else -1
                         for i, p in zip(slots, pads, strict=True)])
            batch.append([frames[i] for i in have])
        last, served = self._served_frames
        if len(last) != len(batch) or any(len(x) != len(y) or any(
                f is not g or type(f) is not bytes for f, g in zip(x, y, strict=True))
                for x, y in zip(last, batch, strict=True)):  # (arrays may be refilled)
            served = self._decode_serve(cams, batch)  # the same frames: the same batch
            self._served_frames = (batch, served)
        out = []
        for (s, _, _), frames, r in zip(cams, served, rows, strict=True):
            if frames is None or all(i < 0 for i in r):
                (c, h, w), dtype = self._served_shape(s)
                out.append(torch.zeros(u, c, h, w, dtype=dtype, device=self.device))
            else:
                blank = torch.zeros_like(frames[0])
                out.append(torch.stack([blank if i < 0 else frames[i] for i in r]))
        return out

    def _decode_serve(self, cams, batch: list[list[Any]]) -> list[torch.Tensor | None]:
        """Each camera's frames (``batch``: the pushed frames, in time order) decoded in one
        :func:`~robocache.data.cameras.decode_all` call, then served (``None``: no frame)."""
        from robocache.data.cameras import decode_all, serve
        from robocache.data.frames import EncodedFrames

        jobs, raws = [], []
        for (s, _, _), frames in zip(cams, batch, strict=True):
            if frames and all(isinstance(f, (bytes, bytearray)) for f in frames):
                spec = self.manifest["streams"][s.name]
                parts = [np.frombuffer(f, np.uint8) for f in frames]
                sizes = np.cumsum([0] + [len(p) for p in parts])
                enc = EncodedFrames(torch.from_numpy(np.concatenate(parts)),
                                    torch.from_numpy(sizes.astype(np.int64)),
                                    tuple(spec["shape"]), spec["dtype"],
                                    spec.get("codec", "jpeg"))
                raws.append(len(jobs))
                jobs.append((enc, torch.arange(len(frames))))
            else:  # arrays (or arrays and bytes mixed): each frame as pushed, bytes decoded
                raws.append([self._frame(s, f) for f in frames])
        decoded = decode_all(jobs, self.device) if jobs else []
        out: list[torch.Tensor | None] = []
        for raw in raws:
            raw = decoded[raw] if isinstance(raw, int) else torch.stack(raw) if raw else None
            out.append(None if raw is None else
                       serve(raw[None], self.image_size, None, self.image_dtype)[0])
        return out

    def _frame(self, s: _StreamSpec, frame) -> torch.Tensor:
        """One pushed frame (an array, a tensor or encoded bytes): uint8 ``[C, H, W]`` on the
        device."""
        from robocache.data.cameras import decode_all
        from robocache.data.frames import EncodedFrames

        if isinstance(frame, (bytes, bytearray)):
            spec = self.manifest["streams"][s.name]
            enc = EncodedFrames(torch.frombuffer(bytearray(frame), dtype=torch.uint8),
                                torch.tensor([0, len(frame)]), tuple(spec["shape"]),
                                spec["dtype"], spec.get("codec", "jpeg"))
            return decode_all([(enc, torch.zeros(1, dtype=torch.int64))], self.device)[0][0]
        f = frame if isinstance(frame, torch.Tensor) else \
            torch.from_numpy(np.ascontiguousarray(frame))
        return (f[..., None] if f.dim() == 2 else f).permute(2, 0, 1).to(self.device)

    def _served_shape(self, s: _StreamSpec) -> tuple[tuple[int, int, int], torch.dtype]:
        """A camera's served frame ``(C, h, w)`` and dtype (as ``RobotDataset.camera_shape``)."""
        spec = self.manifest["streams"][s.name]
        h, w = spec["shape"][:2]
        if len(spec["shape"]) == 3 and spec["shape"][2] == 3 and spec["dtype"] == "uint8":
            return (3, *(self.image_size or (h, w))), self.image_dtype
        return (spec["shape"][2] if len(spec["shape"]) == 3 else 1, h, w), \
            getattr(torch, spec["dtype"])

    # ------------------------------------------------------------------ deployment
    def example_inputs(self) -> tuple[torch.Tensor, ...]:
        """The core's inputs now (``target``, ``pre``, the ring arrays), as fresh tensors on
        the observer's device: what :meth:`export` traces with."""
        if self._host_tick is not None and self._inputs is not None:
            self._write_inputs(*self._inputs)
        v = self._views
        return tuple(v[n].clone().to(self.device) for n in self._args)

    def save_package(self, path: str | Path) -> str:
        """Compile :meth:`export` into an AOTInductor package at ``path`` (``.pt2``; CPU: gcc;
        a minute or more) and return its path. The package runs with torch alone:
        ``torch._inductor.aoti_load_package(path)(*inputs)``, inputs in
        :meth:`example_inputs` order."""
        return torch._inductor.aoti_compile_and_package(self.export(), package_path=str(path))

    def export(self):
        """``torch.export.export`` of :attr:`core` at the current ring sizes (static shapes):
        the program an AOTInductor package is compiled from
        (``torch._inductor.aoti_compile_and_package``); it calls only PyTorch operators."""
        return torch.export.export(self.core, self.example_inputs())


_TORCH = {np.dtype(n): getattr(torch, n) for n in
          ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")}

__all__ = ["Observer", "ObservationCore"]
