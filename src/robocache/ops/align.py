"""`robocache.align`: many sensor streams, each at its own rate, onto one clock in one launch."""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import torch

from robocache._plancache import PlanCache
from robocache.observability import nvtx
from robocache.ops import _checks as C
from robocache.ops._dispatch import Op, launches_directly
from robocache.ops.resample import OUT_OF_RANGE
from robocache.reference.interp import compute_dtype, interp_ref

_OP = "align"
METHODS = ("linear", "nearest", "previous", "pchip", "cubic", "slerp", "frame_index")
_QUAT_NORM_TOL = 1e-3


@dataclass
class Stream:
    """One sensor stream.

    Attributes:
        data: ``[B, S, D]`` (or unbatched ``[S, D]``) float samples; None for ``frame_index``
            streams (cameras: only their timestamps are needed).
        times: ``[B, S]`` or ``[S]`` float32/float64 seconds, non-decreasing.
        lengths: int ``[B]``: row b has ``lengths[b]`` valid samples (padding never read).
        method: ``linear``, ``nearest``, ``previous``, ``pchip``, ``cubic``, ``slerp``
            (unit wxyz quaternions, D = 4) or ``frame_index``.
        tolerance_s: ``frame_index`` only: a target whose nearest frame is farther than this
            is padded (never silently snapped to a far frame).
    """

    data: torch.Tensor | None
    times: torch.Tensor
    lengths: torch.Tensor | None = None
    method: str = "linear"
    tolerance_s: float | None = None


class StackedRows(Mapping):
    """Read-only name -> tensor view of one stacked ``[K, ...]`` tensor (row per stream).

    Masks and ages of all streams live in one allocation each (the eager path is
    launch-bound); a view is made when a name is looked up.
    """

    __slots__ = ("_index", "_stacked", "_squeeze")

    def __init__(self, index: dict[str, int], stacked: torch.Tensor | None, squeeze: bool):
        self._index, self._stacked, self._squeeze = index, stacked, squeeze

    def __getitem__(self, name: str) -> torch.Tensor:
        row = self._stacked[self._index[name]]
        return row[0] if self._squeeze else row

    def __iter__(self) -> Iterator[str]:
        return iter(self._index)

    def __len__(self) -> int:
        return len(self._index)

    def __repr__(self) -> str:
        return f"StackedRows({list(self._index)})"


@dataclass
class Aligned:
    """Result of `align`, keyed by stream name.

    Attributes:
        values: ``[B, T, D]`` in the stream's dtype; ``frame_index`` streams: int64 ``[B, T]``
            frame indices.
        is_pad: bool ``[B, T]``: True where the target is outside the stream's valid range
            (or, for ``frame_index`` with a tolerance, farther than it from every frame).
        age: ``previous`` streams: float32 ``[B, T]`` seconds since the sample used.
        offset: ``frame_index`` streams: float32 ``[B, T]`` seconds, ``t_frame - t_target``.
        concat: with ``concat=True``, ``[B, T, sum(D)]`` of the data streams in order (their
            ``values`` are views into it), in the promoted dtype.
    """

    values: dict[str, torch.Tensor]
    is_pad: Mapping[str, torch.Tensor]
    age: Mapping[str, torch.Tensor] = field(default_factory=dict)
    offset: Mapping[str, torch.Tensor] = field(default_factory=dict)
    concat: torch.Tensor | None = None

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.values[name]


@nvtx.annotate("robocache.align")
def align(
    streams: Mapping[str, Stream | tuple],
    target_times: torch.Tensor,
    *,
    methods: Mapping[str, str] | None = None,
    lengths: Mapping[str, torch.Tensor] | None = None,
    out_of_range: str = "clamp",
    tolerance_s: float | None = None,
    concat: bool = False,
    validate: bool | None = None,
) -> Aligned:
    """Align every stream onto ``target_times``; on CUDA all streams in ONE kernel launch.

    Args:
        streams: name -> `Stream` (or a ``(data, times)`` / ``(data, times, lengths)``
            tuple, aligned linearly). Each stream has its own rate, length, width and dtype.
        target_times: ``[B, T]`` or ``[T]`` float32/float64 seconds (the common clock).
        methods: name -> method, overriding the streams' own.
        lengths: name -> int ``[B]`` lengths, overriding the streams' own.
        out_of_range: targets outside a stream's samples get ``"clamp"`` (edge values),
            ``"nan"`` or ``"extrapolate"`` (the end segment/polynomial/arc extended;
            nearest/previous hold the edge). Always flagged in ``is_pad``.
        tolerance_s: default tolerance of ``frame_index`` streams (seconds, >= 0).
        concat: also return all data streams concatenated along D (``Aligned.concat``).
        validate: data-dependent checks (finite non-decreasing timestamps, lengths in range,
            unit quaternions for slerp): default on for CPU, off for CUDA unless
            ``ROBOCACHE_VALIDATE=1``; never while compiling.

    Returns:
        `Aligned`. Semantics per method as in `robocache.resample`, plus ``pchip`` (equals
        ``scipy.interpolate.PchipInterpolator``), ``cubic`` (``CubicSpline(bc_type=
        "natural")``), ``slerp`` (``scipy.spatial.transform.Slerp``: shortest arc, sign-aware)
        and ``frame_index`` (nearest frame, ties to the earlier one).

    Raises:
        ShapeError, DTypeError, DeviceError: as `robocache.resample`, naming the stream;
            also streams whose batch sizes differ and slerp streams whose last dim is not 4.
        DataError: (when validating) bad timestamps or lengths, non-unit quaternions.
        ValueError: unknown method or out_of_range, negative tolerance, no streams.

    Example:
        >>> t50 = torch.arange(50, dtype=torch.float64) / 50
        >>> out = robocache.align({
        ...     "joints": Stream(torch.randn(8, 125, 7), torch.arange(125) / 125, method="pchip"),
        ...     "camera": Stream(None, torch.arange(30) / 30, method="frame_index",
        ...                      tolerance_s=0.02),
        ... }, t50)
        >>> out.values["joints"].shape, out.values["camera"].shape
        (torch.Size([8, 50, 7]), torch.Size([8, 50]))
    """
    specs, key = _normalize(streams, methods, lengths, tolerance_s, target_times, out_of_range,
                            concat)
    plan = _PLANS.get(key) if key is not None else None
    if plan is None:
        plan = _Plan(specs, target_times, out_of_range, concat)
    if C.wants_validation(validate, target_times):
        _validate_values(specs, target_times, plan.B)
    if launches_directly(target_times):
        # eager CUDA: the cached plan's one launch for all streams
        return _align_cuda(specs, target_times, plan, key)
    result = _align_traced(specs, target_times, plan)
    if key is not None and not torch.compiler.is_compiling():
        _PLANS.put(key, plan)
    return result


def _normalize(streams, methods, lengths, tolerance_s, target, out_of_range, concat):
    """Specs ``(name, data, times, lengths, method, tolerance)`` per stream, overrides applied,
    and the call's metadata key (None when an input is not a tensor: the checks name it)."""
    if not isinstance(streams, Mapping) or not streams:
        C.fail(_OP, "`streams` must be a non-empty mapping of name -> Stream.", ValueError)
    if tolerance_s is not None and not tolerance_s >= 0:
        C.fail(_OP, f"`tolerance_s` must be >= 0 seconds; got {tolerance_s}.", ValueError)
    specs, parts = [], []
    for name, s in streams.items():
        if isinstance(s, tuple):
            s = Stream(*s)
        if not isinstance(s, Stream):
            C.fail(_OP, f"`streams[{name!r}]` must be a Stream or a (data, times[, lengths]) "
                   f"tuple; got {type(s).__name__}.", TypeError)
        method = methods.get(name, s.method) if methods else s.method
        lens = lengths.get(name, s.lengths) if lengths else s.lengths
        tol = s.tolerance_s if s.tolerance_s is not None else tolerance_s
        d, t = s.data, s.times
        specs.append((name, d, t, lens, method, tol))
        try:
            parts.append((name, method, tol,
                          None if d is None else (d.shape, d.stride(), d.dtype, d.device),
                          t.shape, t.stride(), t.dtype, t.device,
                          None if lens is None else (lens.shape, lens.dtype, lens.device)))
        except AttributeError:
            parts = None
            break
    try:
        key = None if parts is None else (target.shape, target.stride(), target.dtype,
                                          target.device, out_of_range, concat, tuple(parts))
    except AttributeError:
        key = None
    return specs, key


class _Plan:
    """Per-geometry facts of an align call, checked once; on CUDA also the launch plan."""

    __slots__ = ("B", "T", "batched", "oor", "out_shapes", "out_dtypes", "concat_dtype",
                 "widths", "aux_index", "cubic", "launch", "order", "names", "pad_rows",
                 "age_rows", "offset_rows")

    def __init__(self, specs, target, out_of_range, concat):
        if not isinstance(target, torch.Tensor):
            C.fail(_OP, f"`target_times` must be a torch.Tensor; got {type(target).__name__}.",
                   TypeError)
        C.check_choice(_OP, "out_of_range", out_of_range, OUT_OF_RANGE)
        first = next((d for _, d, *_ in specs if isinstance(d, torch.Tensor)), None)
        ref_times = specs[0][2]
        if first is not None:
            batched = first.dim() == 3
            B = first.shape[0] if batched else None
        elif isinstance(ref_times, torch.Tensor) and ref_times.dim() == 2:
            batched, B = True, ref_times.shape[0]
        else:
            batched = target.dim() == 2
            B = target.shape[0] if batched else None
        self.batched, self.B, self.T = batched, (B if batched else 1), target.shape[-1]
        self.oor = out_of_range
        self.out_shapes, self.out_dtypes, self.widths, self.aux_index = [], [], [], {}
        self.cubic = []
        for k, (name, data, times, lens, method, tol) in enumerate(specs):
            where = f"streams[{name!r}]."
            C.check_choice(_OP, f"{where}method", method, METHODS)
            if data is None and method != "frame_index":
                C.fail(_OP, f"`{where}data` is None but method {method!r} interpolates data; "
                       "pass the samples, or use method='frame_index'.", ValueError)
            C.check_series(_OP, where, data, times, target, lens, batch=B)
            if method == "slerp" and data.shape[-1] != 4:
                C.fail(_OP, f"`{where}data` must be wxyz quaternions [..., 4] for slerp; got last "
                       f"dim {data.shape[-1]}. Convert xyzw with robocache.geometry.")
            if tol is not None and not tol >= 0:
                C.fail(_OP, f"`{where}tolerance_s` must be >= 0 seconds; got {tol}.", ValueError)
            if method == "frame_index":
                self.out_shapes.append((self.B, self.T))
                self.out_dtypes.append(torch.int64)
                self.widths.append(0)
            else:
                self.out_shapes.append((self.B, self.T, data.shape[-1]))
                self.out_dtypes.append(data.dtype)
                self.widths.append(data.shape[-1])
            if method in ("previous", "frame_index"):
                self.aux_index[k] = len(self.aux_index)
            if method == "cubic":
                self.cubic.append(k)
        data_dtypes = [d for d, w in zip(self.out_dtypes, self.widths, strict=True) if w]
        self.concat_dtype = None
        if concat:
            if not data_dtypes:
                C.fail(_OP, "`concat=True` needs at least one stream with data.", ValueError)
            self.concat_dtype = data_dtypes[0]
            for d in data_dtypes[1:]:
                self.concat_dtype = torch.promote_types(self.concat_dtype, d)
        # every output, the masks and ages/offsets, and the reference's bracket indices/weights
        C.check_fits(_OP, f"{len(specs)} streams aligned onto [B, T] = [{self.B}, {self.T}]",
                     sum(C.nbytes(s, d) for s, d in zip(self.out_shapes, self.out_dtypes,
                                                        strict=True))
                     * (2 if concat else 1) + self.B * self.T * len(specs) * 29, target.device,
                     "pass fewer `target_times` (T), fewer streams or a smaller batch (B).")
        self.names = [sp[0] for sp in specs]
        self.pad_rows = {name: k for k, name in enumerate(self.names)}
        self.age_rows = {specs[k][0]: i for k, i in self.aux_index.items()
                         if specs[k][4] == "previous"}
        self.offset_rows = {specs[k][0]: i for k, i in self.aux_index.items()
                            if specs[k][4] == "frame_index"}
        # cubic rows are long serial programs: launch them first
        self.order = sorted(range(len(specs)), key=lambda k: specs[k][4] != "cubic")
        self.launch = None


_PLANS = PlanCache()


def _validate_values(specs, target, B):
    for name, data, times, lens, method, _ in specs:
        where = f"streams[{name!r}]."
        if lens is not None:
            C.check_lengths(_OP, lens, B, times.shape[-1], target.device, values=True,
                            name=f"{where}lengths")
        C.check_timestamps(_OP, f"{where}times", times, lens)
        if method == "slerp":
            norm = data.double().norm(dim=-1)
            if lens is not None:
                valid = torch.arange(norm.shape[-1], device=norm.device) < lens.reshape(-1, 1)
                norm = torch.where(valid, norm, 1.0)
            worst = float((norm - 1).abs().max())
            if not worst <= _QUAT_NORM_TOL:
                C.fail(_OP, f"`{where}data` holds quaternions whose norm is off 1 by up to "
                       f"{worst:.3g} (> {_QUAT_NORM_TOL}); normalize them (q / q.norm(dim=-1, "
                       "keepdim=True)) or check the column order (wxyz).", C.DataError)
    if bool(torch.isnan(target).any()):
        C.fail(_OP, "`target_times` contains NaN; pass finite target times.", C.DataError)


def _allocate(plan, device):
    """Outputs of one call: values (or one concatenated buffer), and ONE stacked tensor each
    for the masks ``[K, B, T]`` and the ages/offsets ``[n_aux, B, T]`` of all streams: the
    eager path is launch-bound, and every allocation or view costs microseconds."""
    pads = torch.empty((len(plan.out_shapes), plan.B, plan.T), dtype=torch.bool, device=device)
    auxs = torch.empty((len(plan.aux_index), plan.B, plan.T), dtype=torch.float32,
                       device=device) if plan.aux_index else None
    concat = None
    if plan.concat_dtype is not None:
        concat = torch.empty((plan.B, plan.T, sum(plan.widths)), dtype=plan.concat_dtype,
                             device=device)
        pieces = iter(concat.split([w for w in plan.widths if w], dim=-1))
        outs = [next(pieces) if w else torch.empty(s, dtype=d, device=device)
                for s, d, w in zip(plan.out_shapes, plan.out_dtypes, plan.widths, strict=True)]
    else:
        outs = [torch.empty(s, dtype=d, device=device)
                for s, d in zip(plan.out_shapes, plan.out_dtypes, strict=True)]
    return outs, pads, auxs, concat


def _result(plan, outs, pads, auxs, concat) -> Aligned:
    """`Aligned` over per-stream values and the stacked masks / ages / offsets."""
    squeeze = not plan.batched
    return Aligned(
        values={name: (v[0] if squeeze else v) for name, v in zip(plan.names, outs,
                                                                   strict=True)},
        is_pad=StackedRows(plan.pad_rows, pads, squeeze),
        age=StackedRows(plan.age_rows, auxs, squeeze),
        offset=StackedRows(plan.offset_rows, auxs, squeeze),
        concat=None if concat is None else (concat[0] if squeeze else concat),
    )


def _align_cuda(specs, target, plan, key) -> Aligned:
    from robocache.kernels import interp as K

    outs, pads, auxs, concat = _allocate(plan, target.device)
    scratch = {k: torch.empty((plan.B, specs[k][2].shape[-1], 2 * plan.widths[k] + 1),
                              dtype=compute_dtype(specs[k][1].dtype), device=target.device)
               for k in plan.cubic}
    BT = plan.B * plan.T
    if plan.launch is None:
        plan.launch = K.InterpPlan([K.StreamLaunch(
            specs[k][1], specs[k][2], specs[k][3], outs[k], pads,
            auxs if k in plan.aux_index else None,
            K.METHOD_CODES[specs[k][4]], K.OOR_CODES[plan.oor], specs[k][5],
            scratch.get(k), pad_offset=k * BT,
            aux_offset=plan.aux_index.get(k, 0) * BT) for k in plan.order], target, plan.B)
        if key is not None:
            _PLANS.put(key, plan)
    # one pass over the streams in launch order (this path is timed against a bare launch)
    datas, times, lens, os_, ss = [], [], [], [], []
    for k in plan.order:
        _, d, t, ln, _, _ = specs[k]
        datas.append(target if d is None else d)
        times.append(t)
        lens.append(target if ln is None else ln)
        os_.append(outs[k])
        ss.append(scratch.get(k, target))
    n = len(plan.order)
    plan.launch.launch(target, tuple(datas), tuple(times), tuple(lens), tuple(os_),
                       (pads,) * n, (target if auxs is None else auxs,) * n, tuple(ss))
    return _result(plan, outs, pads, auxs, concat)


def _align_cpu(specs, target, plan, key=None) -> Aligned:
    B = plan.B
    x = target.expand(B, -1) if target.dim() == 1 else target
    outs, pads, auxs = [], [], []
    for _, data, times, lens, method, tol in specs:
        d3 = None if data is None else (data if plan.batched else data.unsqueeze(0))
        t2 = times.expand(B, -1) if times.dim() == 1 else times
        v, p, a = interp_ref(d3, t2, x, lens, method, plan.oor, tol)
        outs.append(v)
        pads.append(p)
        auxs.append(a)
    concat = None
    if plan.concat_dtype is not None:
        concat = torch.cat([v.to(plan.concat_dtype)
                            for v, w in zip(outs, plan.widths, strict=True) if w], dim=-1)
    return _result(plan, outs, torch.stack(pads), _stack([auxs[k] for k in plan.aux_index]),
                   concat)


def _stack(tensors):
    return torch.stack(tensors) if tensors else None


def _align_traced(specs, target, plan) -> Aligned:
    """Through the registered op, on batched views (an unbatched call is a batch of one)."""
    datas = [None if d is None else (d if plan.batched else d.unsqueeze(0))
             for _, d, *_ in specs]
    tgt = target if plan.batched or target.dim() == 2 else target.unsqueeze(0)
    values, pads, auxs = _ALIGN(
        tgt, datas, [s[2] for s in specs], [s[3] for s in specs],
        [METHODS.index(s[4]) for s in specs],
        [math.nan if s[5] is None else float(s[5]) for s in specs], plan.oor)
    concat = None
    if plan.concat_dtype is not None:
        concat = torch.cat([v.to(plan.concat_dtype)
                            for v, w in zip(values, plan.widths, strict=True) if w], dim=-1)
        pieces = iter(concat.split([w for w in plan.widths if w], dim=-1))
        values = [next(pieces) if w else v for v, w in zip(values, plan.widths, strict=True)]
    return _result(plan, values, torch.stack(pads), _stack([auxs[k] for k in plan.aux_index]),
                   concat)


def _align_lists(run, target, datas, times, lengths, methods, tolerances, out_of_range):
    """`run` (`_align_cpu` / `_align_cuda`) on the op's list arguments (batched data, methods
    as indices into METHODS, tolerances NaN where unset); aux entries are empty for streams
    without age/offset."""
    streams = {str(k): Stream(d, t, ln, METHODS[m], None if math.isnan(tol) else tol)
               for k, (d, t, ln, m, tol) in enumerate(zip(datas, times, lengths, methods,
                                                          tolerances, strict=True))}
    specs, key = _normalize(streams, None, None, None, target, out_of_range, False)
    plan = _PLANS.get(key) or _Plan(specs, target, out_of_range, False)
    res = run(specs, target, plan, key)
    empty = target.new_empty((0,), dtype=torch.float32)
    auxs = [res.age[k] if k in res.age else res.offset.get(k, empty) for k in streams]
    # pads and auxes are views of one buffer each: outputs of a custom op may not alias
    return (list(res.values.values()), [res.is_pad[k].clone() for k in streams],
            [a.clone() for a in auxs])


def _align_op_cpu(target: torch.Tensor, datas: list[torch.Tensor | None],
                  times: list[torch.Tensor], lengths: list[torch.Tensor | None],
                  methods: list[int], tolerances: list[float], out_of_range: str,
                  ) -> tuple[list[torch.Tensor], list[torch.Tensor], list[torch.Tensor]]:
    return _align_lists(_align_cpu, target, datas, times, lengths, methods, tolerances,
                        out_of_range)


def _align_fake(target, datas, times, lengths, methods, tolerances, out_of_range):
    B = next((d.shape[0] for d in datas if d is not None),
             times[0].shape[0] if times[0].dim() == 2 else
             target.shape[0] if target.dim() == 2 else 1)
    T = target.shape[-1]
    values, pads, auxs = [], [], []
    for d, m in zip(datas, methods, strict=True):
        m = METHODS[m]
        values.append(target.new_empty((B, T), dtype=torch.int64) if m == "frame_index"
                      else d.new_empty((B, T, d.shape[-1])))
        pads.append(target.new_empty((B, T), dtype=torch.bool))
        auxs.append(target.new_empty((B, T) if m in ("previous", "frame_index") else (0,),
                                     dtype=torch.float32))
    return values, pads, auxs


# the schema comes from the typed CPU implementation; the CUDA one takes the same arguments
_ALIGN = Op("align", cpu=_align_op_cpu, cuda=functools.partial(_align_lists, _align_cuda),
            fake=_align_fake)
