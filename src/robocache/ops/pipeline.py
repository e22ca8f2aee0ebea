"""`robocache.Pipeline`: resample -> normalize -> augment declared once, run as one kernel.

    >>> pipe = Pipeline([Resample(rate=50.0, num=500),
    ...                  Normalize(stats, "mean_std"),
    ...                  Augment(k=10, position=0, orientation=3, max_translation=0.05,
    ...                          max_rotation=0.2, noise_std=0.01, time_warp=0.3)])
    >>> out = pipe(data, times, seed=step)     # out.data [B, 10, 500, D], out.dropped [B, 10, NS]
    >>> pipe.capture(data, times)              # CUDA graph for this shape bucket; replayed after

Per output element the chain is, in this order (the declared order only configures it):

1. time warp + resample: target j of variant (b, k) is ``times[b, 0] + span * phi_bk(j / (T-1))``
   with ``span = (T - 1) / rate`` and phi the variant's monotone time map (identity without
   warp); linear interpolation, edges held (`robocache.resample`, out_of_range='clamp');
2. SE(3) on the pose columns, in data units: ``p -> R p + t`` (3 columns from `position`),
   ``q -> r * q`` (4 wxyz columns from `orientation`, norm preserved);
3. normalization with the statistics (`robocache.normalize`);
4. Gaussian noise with `noise_std` (normalized units when normalizing);
5. stream dropout: zero every column of a dropped stream; `dropped` flags it.

All parameters of variant i = b K + k are Philox draws of ``(seed, i)``; the noise of output
element e (flat index of ``[B, K, T, D]``) is Philox ``(seed, e)``. So the same seed gives
bitwise the same output on one device, and CPU, the unfused composition and the fused
kernel agree to float rounding. Arithmetic is float32; the output has data's dtype.

On CUDA the chain is ONE Triton kernel (`kernels.pipeline`); ``fused=False`` runs the
composition of the individual ops instead (resample, geometry, normalize, noise kernels) —
the CPU path and the test oracle.

CUDA graphs: `capture` records the fused call for a shape *bucket*: B rounds up to the
next of `batch_buckets`, S up to a multiple of `length_multiple`; inputs are copied into
static buffers (rows beyond B get length 1, samples beyond S are masked by lengths and never
read) and the output is the first B rows of a static buffer, overwritten by the next replay of
that bucket (clone it to keep it). Once something is captured, calls with a new bucket capture
it too, up to `max_graphs`; a batch larger than the largest bucket, or a full cache, runs
eagerly and warns once.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import astuple, dataclass, field
from typing import NamedTuple

import torch

from robocache._plancache import PlanCache
from robocache.errors import DeviceError, ShapeError
from robocache.observability import nvtx
from robocache.ops import _shared
from robocache.ops._checks import (
    FLOAT_DTYPES,
    TIME_DTYPES,
    check_device,
    check_dtype,
    check_fits,
    check_lengths,
    check_nonneg,
    check_streams,
    check_timestamps,
    fail,
    wants_validation,
)
from robocache.ops._dispatch import Op
from robocache.ops.normalize import EPS, Stats, affine_params
from robocache.reference import augment as ref

__all__ = ["Pipeline", "PipelineOutput", "Resample", "Normalize", "Augment"]
_OP = "Pipeline"


@dataclass(frozen=True)
class FusedPlan:
    """Compile-time shape of the chain (hashable: one Triton specialization per plan)."""

    pos: int = -1
    quat: int = -1
    terms: int = 0
    crop: bool = False
    norm: bool = False
    clip: bool = False
    noise: bool = False
    streams: int = 0


@dataclass(frozen=True)
class Resample:
    """Resample every row onto `num` targets at `rate` Hz starting at its first timestamp."""

    rate: float
    num: int


@dataclass(frozen=True)
class Normalize:
    """Normalize with `stats` in `mode` (see `robocache.normalize`)."""

    stats: Stats
    mode: str = "mean_std"
    eps: float = EPS


@dataclass(frozen=True)
class Augment:
    """K augmented variants per trajectory.

    Attributes:
        k: variants per trajectory (>= 1).
        position: first of 3 xyz position columns (metres), or None.
        orientation: first of 4 wxyz quaternion columns, or None.
        max_translation: metres, translation uniform in the cube.
        max_rotation: radians, angle uniform in [0, max_rotation] about a uniform axis.
        noise_std: scalar or per-dimension std (>= 0), after normalization.
        time_warp: strength in [0, 1) of the monotone time map (0: none).
        warp_terms: sine terms of the time map (1..8).
        keep_endpoints: the time map fixes both ends; if False they move by up to max_crop.
        max_crop: fraction in [0, 0.5) cut at each end when not keeping endpoints.
        dropout: probability of dropping each stream per variant.
        streams: column ranges ``(start, stop)`` of the streams dropout acts on.
    """

    k: int = 1
    position: int | None = None
    orientation: int | None = None
    max_translation: float = 0.0
    max_rotation: float = 0.0
    noise_std: float | Sequence[float] = 0.0
    time_warp: float = 0.0
    warp_terms: int = 3
    keep_endpoints: bool = True
    max_crop: float = 0.0
    dropout: float = 0.0
    streams: tuple[tuple[int, int], ...] = field(default_factory=tuple)


class PipelineOutput(NamedTuple):
    data: torch.Tensor     # [B, K, T, D]
    dropped: torch.Tensor  # bool [B, K, NS]


@dataclass
class _Graph:
    """A captured fused call and its static buffers (inputs padded to the bucket)."""

    graph: torch.cuda.CUDAGraph
    data: torch.Tensor
    times: torch.Tensor
    lengths: torch.Tensor
    seed: torch.Tensor
    out: torch.Tensor
    dropped: torch.Tensor

    def replay(self, data, times, lengths, seed: int) -> PipelineOutput:
        B, S, _ = data.shape
        self.data[:B, :S].copy_(data)
        self.times[:B, :S].copy_(times)
        if lengths is None:
            self.lengths[:B].fill_(S)
        else:
            self.lengths[:B].copy_(lengths)
        self.seed.fill_(seed)
        self.graph.replay()
        return PipelineOutput(self.out[:B], self.dropped[:B])


class Pipeline:
    """Declared preprocessing steps, run fused on CUDA and replayable as CUDA graphs.

    Args:
        steps: `Resample` (required), then optionally `Normalize`, then optionally `Augment`.
        batch_buckets: batch sizes graphs are captured for (a batch pads up to the next one).
        length_multiple: source lengths S pad up to a multiple of this for graphs.
        max_graphs: graphs kept; beyond it calls run eagerly (with one warning).

    Raises:
        TypeError: an unknown step. ValueError: steps out of order or out of range (K < 1,
        negative noise scales, ...).

    Example:
        >>> pipe = Pipeline([Resample(50.0, 100), Augment(k=4, noise_std=0.1)])
        >>> pipe(torch.randn(2, 30, 5), torch.linspace(0, 2, 30), seed=0).data.shape
        torch.Size([2, 4, 100, 5])
    """

    def __init__(self, steps: Sequence[Resample | Normalize | Augment], *,
                 batch_buckets: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
                 length_multiple: int = 64, max_graphs: int = 8):
        order = [type(s) for s in steps]
        for s in steps:
            if not isinstance(s, (Resample, Normalize, Augment)):
                fail(_OP, f"steps must be Resample, Normalize or Augment; got "
                     f"{type(s).__name__}.", TypeError)
        if order not in ([Resample], [Resample, Normalize], [Resample, Augment],
                         [Resample, Normalize, Augment]):
            fail(_OP, "steps must be Resample, then optionally Normalize, then optionally "
                 f"Augment; got {[t.__name__ for t in order]}.", ValueError)
        self.resample: Resample = steps[0]
        self.normalize: Normalize | None = next((s for s in steps if isinstance(s, Normalize)),
                                                None)
        self.augment: Augment = next((s for s in steps if isinstance(s, Augment)), Augment())
        self._check_config()
        self.batch_buckets = tuple(sorted(batch_buckets))
        self.length_multiple = length_multiple
        self.max_graphs = max_graphs
        self._graphs: dict[tuple, _Graph] = {}
        self._warned = False
        self._checked = PlanCache()  # geometries whose metadata passed `_check_meta`
        self._device_params: dict[torch.device, tuple] = {}

    # ------------------------------------------------------------------ configuration
    def _check_config(self) -> None:
        r, a, n = self.resample, self.augment, self.normalize
        if not r.rate > 0 or not isinstance(r.num, int) or r.num < 1:
            fail(_OP, f"Resample needs rate > 0 Hz and num >= 1 targets; got rate={r.rate!r}, "
                 f"num={r.num!r}.", ValueError)
        if not isinstance(a.k, int) or a.k < 1:
            fail(_OP, f"Augment.k (variants per trajectory) must be an int >= 1; got {a.k!r}.",
                 ValueError)
        check_nonneg(_OP, "Augment.max_translation", a.max_translation)
        check_nonneg(_OP, "Augment.max_rotation", a.max_rotation)
        check_nonneg(_OP, "Augment.time_warp", a.time_warp, 1.0)
        check_nonneg(_OP, "Augment.max_crop", a.max_crop, 0.5)
        if not 0 <= a.dropout <= 1:
            fail(_OP, f"Augment.dropout must be in [0, 1]; got {a.dropout!r}.", ValueError)
        if not 1 <= a.warp_terms <= ref.MAX_WARP_TERMS:
            fail(_OP, f"Augment.warp_terms must be in [1, {ref.MAX_WARP_TERMS}]; got "
                 f"{a.warp_terms}.", ValueError)
        if len(a.streams) > ref.MAX_STREAMS:
            fail(_OP, f"at most {ref.MAX_STREAMS} streams; got {len(a.streams)}.", ValueError)
        std = torch.as_tensor(a.noise_std, dtype=torch.float32).flatten()
        self._std = _shared.noise_std_vector(_OP, std, std.numel())
        if n is not None:
            self._affine = affine_params(n.stats, n.mode, eps=n.eps)
        if a.dropout > 0 and not a.streams:
            fail(_OP, "Augment.dropout > 0 needs `streams` (column ranges) to drop.", ValueError)
        # kernel scalars: max translation, max rotation, warp amplitude per term, crop, dropout
        self._scalars = (float(a.max_translation), float(a.max_rotation),
                         a.time_warp / a.warp_terms,
                         float(a.max_crop) if not a.keep_endpoints else 0.0, float(a.dropout))
        self.plan = FusedPlan(
            pos=-1 if a.position is None else a.position,
            quat=-1 if a.orientation is None else a.orientation,
            terms=a.warp_terms if a.time_warp > 0 else 0,
            crop=not a.keep_endpoints and a.max_crop > 0,
            norm=n is not None, clip=n is not None and self._affine[2],
            noise=bool((self._std > 0).any()), streams=len(a.streams))
        self._plan_ints = [int(v) for v in astuple(self.plan)]

    def _check(self, data: torch.Tensor, times: torch.Tensor,
               lengths: torch.Tensor | None) -> torch.Tensor:
        """Validate inputs; returns times as ``[B, S]`` (an expanded view when shared).

        Metadata checks are a pure function of shapes/dtypes/devices: each geometry is
        checked once, later calls only look it up (the eager path is launch-bound at small B).
        """
        key = (data.shape, data.dtype, data.device, times.shape, times.dtype, times.device,
               None if lengths is None else (lengths.shape, lengths.dtype, lengths.device))
        if torch.compiler.is_compiling():
            self._check_meta(data, times, lengths)
        elif key not in self._checked:
            self._check_meta(data, times, lengths)
            self._checked.put(key, True)
        return times if times.dim() == 2 else times.expand(data.shape[0], -1)

    def _check_meta(self, data, times, lengths) -> None:
        check_dtype(_OP, "data", data, FLOAT_DTYPES, "Convert with data.float().")
        check_dtype(_OP, "times", times, TIME_DTYPES, "Pass float seconds, e.g. times.double().")
        if data.dim() != 3 or data.shape[1] == 0:
            fail(_OP, f"`data` must be [B, S, D] with S >= 1; got {list(data.shape)}.")
        B, S, D = data.shape
        if times.shape not in ((B, S), (S,)):
            fail(_OP, f"`times` must be [B, S] = [{B}, {S}] or [S]; got {list(times.shape)}.")
        check_device(_OP, "times", times, data.device, "data")
        if lengths is not None:
            check_lengths(_OP, lengths, B, S, data.device, values=False)
        n, a = self.normalize, self.augment
        check_fits(_OP, f"the output [B, K, T, D] = [{B}, {a.k}, {self.resample.num}, {D}]",
                   B * a.k * self.resample.num * D * data.element_size(), data.device,
                   "lower Resample.num, Augment.k or the batch size.")
        if n is not None and n.stats.dim != D:
            fail(_OP, f"`data` has D = {D} columns but the Normalize statistics have "
                 f"{n.stats.dim}; pass the statistics computed for this key.", ShapeError)
        for name, col, width in (("position", a.position, 3), ("orientation", a.orientation, 4)):
            if col is not None and not 0 <= col <= D - width:
                fail(_OP, f"Augment.{name} = {col} needs columns {col}..{col + width - 1} but "
                     f"data has D = {D}.", ShapeError)
        if self._std.numel() not in (1, D):
            fail(_OP, f"Augment.noise_std has {self._std.numel()} entries but data has D = {D}.",
                 ShapeError)
        check_streams(_OP, a.streams, D)

    def _params(self, device: torch.device, d: int) -> tuple:
        """Per-column float32 offset, scale, std and int32 stream id on `device` (cached)."""
        hit = self._device_params.get((device, d))
        if hit is None:
            if self.normalize is not None:
                offset, scale = (v.float() for v in self._affine[:2])
            else:
                offset, scale = torch.zeros(d), torch.ones(d)
            std = self._std.expand(d) if self._std.numel() == 1 else self._std
            col = _shared.stream_of_column(self.augment.streams, d)
            hit = tuple(t.contiguous().to(device) for t in (offset, scale, std, col))
            self._device_params[(device, d)] = hit
        return hit

    @property
    def span(self) -> float:
        return (self.resample.num - 1) / self.resample.rate

    # ------------------------------------------------------------------ running
    @nvtx.annotate("robocache.pipeline")
    def __call__(self, data: torch.Tensor, times: torch.Tensor, *,
                 lengths: torch.Tensor | None = None, seed: _shared.Seed,
                 fused: bool | None = None, validate: bool | None = None) -> PipelineOutput:
        """Run the pipeline on a batch.

        Args:
            data: ``[B, S, D]`` float samples (unit stride along D is not required).
            times: ``[B, S]`` or ``[S]`` float32/float64 seconds, non-decreasing per row.
            lengths: int ``[B]`` valid samples per row (in [1, S]).
            seed: int or torch.Generator: all randomness of this call.
            fused: CUDA only: the fused kernel (default) or the composition of single ops.
            validate: data-dependent checks, as :func:`robocache.resample` (finite,
                non-decreasing timestamps; lengths in [1, S]): default on CPU tensors, on CUDA
                when ``True`` or ``ROBOCACHE_VALIDATE=1``.

        Returns:
            `PipelineOutput(data [B, K, T, D] in data's dtype, dropped bool [B, K, NS])`;
            ``B == 0`` gives empty tensors of those shapes.

        Raises:
            ShapeError / DTypeError / DeviceError: inputs that do not fit the steps.
            DataError: (when validating) NaN/infinite or decreasing timestamps, lengths outside
                ``[1, S]``.
        """
        tb = self._check(data, times, lengths)
        s = _shared.as_seed(_OP, seed)
        if wants_validation(validate, data):
            if lengths is not None:
                check_lengths(_OP, lengths, data.shape[0], data.shape[1], data.device,
                              values=True)
            check_timestamps(_OP, "times", tb, lengths)
        if data.shape[0] == 0:
            k, d = self.augment.k, data.shape[2]
            return PipelineOutput(data.new_empty(0, k, self.resample.num, d),
                                  torch.empty(0, k, len(self.augment.streams), dtype=torch.bool,
                                              device=data.device))
        if data.device.type != "cuda" or fused is False:
            return self._compose(data, tb, lengths, s)
        g = self._graph_for(data, tb) if self._graphs else None
        if g is not None:
            return g.replay(data, tb, lengths, s)
        return self._fused(data, tb, lengths, s)

    def _fused(self, data, times, lengths, seed, out=None, dropped=None,
               seed_t: torch.Tensor | None = None) -> PipelineOutput:
        """The fused kernel: through its registered op; or, while recording a CUDA graph
        (`out`, `dropped` and the device seed `seed_t` given), into those static buffers."""
        D = data.shape[2]
        a = self.augment
        data = data if data.stride(-1) == 1 else data.contiguous()
        offset, scale, std, col = self._params(data.device, D)
        if seed_t is None:
            return PipelineOutput(*_PIPELINE_FUSED(
                data, times, lengths, seed, offset, scale, std, col, a.k, self.resample.num,
                self.span, list(self._scalars), self._plan_ints))
        from robocache.kernels.pipeline import pipeline_cuda

        pipeline_cuda(self.plan, data, times, lengths, out, dropped, offset, scale, std, col,
                      a.k, self.span, seed_t, *self._scalars)
        return PipelineOutput(out, dropped)

    def sample(self, batch: int, seed: _shared.Seed, device=None) -> dict[str, torch.Tensor]:
        """The parameters a call with `seed` uses, materialized (``[B, K, ...]``): rotation,
        translation, warp coeffs/crop and dropped. Same Philox draws as the kernel."""
        a, k, ns = self.augment, self.augment.k, len(self.augment.streams)
        # One Philox pass over every slot (the same draws as sample_rigid/_time_warp/_dropout).
        u = ref.param_uniforms(_shared.as_seed(_OP, seed), batch * k, 0, ref.SLOT_DROP + ns, device)
        u = u.view(batch, k, -1)
        rot, trans = ref.rigid_from_uniforms(u, a.max_translation, a.max_rotation)
        coeffs, crop = ref.warp_from_uniforms(u, a.time_warp, a.warp_terms,
                                              a.max_crop if self.plan.crop else 0.0)
        return {"rotation": rot, "translation": trans, "warp_coeffs": coeffs, "warp_crop": crop,
                "dropped": u[..., ref.SLOT_DROP:] < a.dropout}

    def _compose(self, data, times, lengths, seed) -> PipelineOutput:
        """The chain as separate ops (CPU path, ``fused=False``, and the oracle)."""
        from robocache.ops.geometry import quat_apply, quat_multiply
        from robocache.ops.resample import resample

        B, S, D = data.shape
        a, k, T, dev = self.augment, self.augment.k, self.resample.num, data.device
        p = self.sample(B, seed, dev)
        u = torch.arange(T, device=dev, dtype=torch.float32) / max(T - 1, 1)
        if self.plan.terms or self.plan.crop:
            u = ref.warp_phase(u.expand(B, k, T), p["warp_coeffs"], p["warp_crop"])
        target = times[:, :1, None] + (u * self.span).to(times.dtype)  # [B, K?, T]
        target = target.expand(B, k, T).reshape(B * k, T)
        rep = data.repeat_interleave(k, 0)
        y = resample(rep, times.repeat_interleave(k, 0), target, validate=False,
                     lengths=None if lengths is None else lengths.repeat_interleave(k, 0))
        y = y.float().view(B, k, T, D)
        r, t = p["rotation"][:, :, None], p["translation"][:, :, None]
        if a.position is not None:
            c = a.position
            y = torch.cat([y[..., :c], quat_apply(r, y[..., c:c + 3]) + t, y[..., c + 3:]], -1)
        if a.orientation is not None:
            c = a.orientation
            y = torch.cat([y[..., :c], quat_multiply(r, y[..., c:c + 4]), y[..., c + 4:]], -1)
        offset, scale, std, col = self._params(dev, D)
        if self.plan.norm:
            y = _shared.affine(y, offset, scale, self.plan.clip, False)
        if self.plan.noise:
            y = _shared.add_noise(y, std, seed)
        if self.plan.streams:
            y = _shared.zero_streams(y, col, p["dropped"])
        return PipelineOutput(y.to(data.dtype), p["dropped"])

    # ------------------------------------------------------------------ CUDA graphs
    def _bucket(self, data: torch.Tensor, times: torch.Tensor) -> tuple | None:
        B, S, D = data.shape
        bb = next((b for b in self.batch_buckets if b >= B), None)
        if bb is None:
            return None
        m = self.length_multiple
        return (bb, -(-S // m) * m, D, data.dtype, times.dtype, data.device)

    def _graph_for(self, data, times) -> _Graph | None:
        key = self._bucket(data, times)
        g = self._graphs.get(key) if key is not None else None
        if g is None and key is not None and len(self._graphs) < self.max_graphs:
            g = self._record(key)
        if g is None:
            if not self._warned:
                self._warned = True
                why = (f"batch {data.shape[0]} exceeds the largest bucket "
                       f"{self.batch_buckets[-1]}" if key is None
                       else f"the graph cache is full ({self.max_graphs} shapes)")
                warnings.warn(f"Pipeline: running eagerly (no CUDA graph): {why}. Raise "
                              "`batch_buckets` / `max_graphs` to capture it.", stacklevel=3)
            return None
        return g

    def capture(self, data: torch.Tensor, times: torch.Tensor, *,
                lengths: torch.Tensor | None = None) -> None:
        """Record a CUDA graph of the fused call for the bucket of this example's shape.

        Raises:
            DeviceError: `data` is not a CUDA tensor.
            ValueError: the batch exceeds the largest bucket.
        """
        if data.device.type != "cuda":
            fail(_OP, f"capture needs CUDA tensors (CUDA graphs); `data` is on {data.device}. "
                 "Move the example to the GPU, e.g. data.cuda(), or run eagerly on CPU.",
                 DeviceError)
        tb = self._check(data, times, lengths)
        key = self._bucket(data, tb)
        if key is None:
            fail(_OP, f"batch {data.shape[0]} exceeds the largest bucket "
                 f"{self.batch_buckets[-1]}; pass larger `batch_buckets`.", ValueError)
        if key not in self._graphs:
            self._record(key)

    def _record(self, key: tuple) -> _Graph:
        bb, sb, d, dtype, tdtype, dev = key
        a = self.augment
        sd = torch.zeros(bb, sb, d, dtype=dtype, device=dev)
        st = torch.zeros(bb, sb, dtype=tdtype, device=dev)
        sl = torch.ones(bb, dtype=torch.int64, device=dev)
        seed_t = torch.zeros((), dtype=torch.int64, device=dev)
        out = torch.empty(bb, a.k, self.resample.num, d, dtype=dtype, device=dev)
        dropped = torch.empty(bb, a.k, len(a.streams), dtype=torch.bool, device=dev)
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):  # warm-up compiles the kernel outside the capture
            self._fused(sd, st, sl, 0, out, dropped, seed_t)
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self._fused(sd, st, sl, 0, out, dropped, seed_t)
        g = _Graph(graph, sd, st, sl, seed_t, out, dropped)
        self._graphs[key] = g
        return g


def _pipeline_fused_cuda(data: torch.Tensor, times: torch.Tensor,
                         lengths: torch.Tensor | None, seed: int, offset: torch.Tensor,
                         scale: torch.Tensor, std: torch.Tensor, col: torch.Tensor, k: int,
                         num: int, span: float, scalars: list[float],
                         plan: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    from robocache.kernels.pipeline import pipeline_cuda

    B, _, D = data.shape
    out = torch.empty(B, k, num, D, dtype=data.dtype, device=data.device)
    dropped = torch.empty(B, k, plan[-1], dtype=torch.bool, device=data.device)
    pipeline_cuda(FusedPlan(*plan), data, times, lengths, out, dropped, offset, scale, std, col,
                  k, span, seed, *scalars)
    return out, dropped


def _pipeline_fused_fake(data, times, lengths, seed, offset, scale, std, col, k, num, span,
                         scalars, plan):
    B, _, D = data.shape
    return (data.new_empty(B, k, num, D),
            data.new_empty(B, k, plan[-1], dtype=torch.bool))


# The fused kernel has no CPU twin of its own (the CPU path is the composition `_compose`): its
# launcher serves every device, CPU tensors only under TRITON_INTERPRET=1.
_PIPELINE_FUSED = Op(
    "pipeline_fused", cpu=None, cuda=_pipeline_fused_cuda, fake=_pipeline_fused_fake,
    schema=torch.library.infer_schema(_pipeline_fused_cuda, mutates_args=()))
