"""`robocache.windows`: history and action chunks of packed episodes, with pad masks."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

import torch

from robocache._plancache import PlanCache
from robocache.observability import nvtx
from robocache.ops import _checks as C
from robocache.ops._dispatch import Op, launches_directly
from robocache.reference.windows import episode_bounds, key_windows_ref, windows_ref

_OP = "windows"
PADS = ("edge", "zero")
_DTYPES = (*C.FLOAT_DTYPES, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)


class Windows(NamedTuple):
    """Windows gathered by `windows`.

    With ``history``/``horizon``: ``history [M, h, D]`` (rows ``-(h-1) .. 0``, the current
    row last), ``history_is_pad [M, h]``, ``horizon [M, H, D]`` (rows ``0 .. H-1``: action
    chunks start at the current step) and ``horizon_is_pad [M, H]``. With ``offsets``: the
    windows in ``history`` / ``history_is_pad`` and an empty horizon.
    """

    history: torch.Tensor
    history_is_pad: torch.Tensor
    horizon: torch.Tensor
    horizon_is_pad: torch.Tensor


@nvtx.annotate("robocache.windows")
def windows(
    data: torch.Tensor,
    episode_offsets: torch.Tensor,
    indices: torch.Tensor,
    *,
    history: int = 1,
    horizon: int = 0,
    offsets: Sequence[int] | None = None,
    pad: str = "edge",
    episodes: torch.Tensor | None = None,
    validate: bool | None = None,
) -> Windows:
    """Gather training windows around sample positions of packed episodes.

    Args:
        data: ``[total, D]`` rows of all episodes back to back (aligned streams, actions);
            any float or integer dtype.
        episode_offsets: int ``[N + 1]``, non-decreasing, ``[0, ..., total]``: episode e
            holds rows ``episode_offsets[e] : episode_offsets[e+1]`` (as FlashAttention's
            ``cu_seqlens``).
        indices: int ``[M]`` global row of each window's current step.
        history: rows ``-(history-1) .. 0`` (LeRobot's observation delta_timestamps, Octo's
            window_size); >= 0.
        horizon: rows ``0 .. horizon-1`` (action chunks, diffusion policy's horizon); >= 0.
        offsets: instead of history/horizon, any list of integer row offsets.
        pad: rows outside the window's episode repeat the episode's edge row (``"edge"``)
            or are zeros (``"zero"``); either way ``*_is_pad`` is True there.
        episodes: optional int ``[M]`` episode of each index (skips the search; validated
            to contain the index when validating).
        validate: data-dependent checks (offsets non-decreasing and spanning data, indices in
            range / in their episode): default on for CPU, off for CUDA unless
            ``ROBOCACHE_VALIDATE=1``.

    Returns:
        `Windows` (contiguous tensors in data's dtype; masks bool). CUDA: one gather kernel.

    Raises:
        ShapeError, DTypeError, DeviceError: bad ranks, dtypes, devices.
        ValueError: negative history/horizon, nothing to gather, unknown pad.
        DataError: (when validating) offsets decreasing or not ending at ``total``, an
            index outside ``[0, total)`` or outside its given episode.

    Example:
        >>> data = torch.randn(1000, 32)
        >>> offs = torch.tensor([0, 400, 1000])
        >>> w = robocache.windows(data, offs, torch.tensor([0, 399, 400]), history=2,
        ...                       horizon=16)
        >>> w.history.shape, w.horizon.shape, w.horizon_is_pad[1].sum().item()
        (torch.Size([3, 2, 32]), torch.Size([3, 16, 32]), 15)
    """
    try:
        key = (_meta(data, episode_offsets, indices, episodes), history, horizon,
               None if offsets is None else tuple(offsets), pad)
        plan = _WINDOW_PLANS.get(key)
    except (AttributeError, TypeError):  # not tensors, or odd offsets: _check names them
        key = plan = None
    if plan is None:
        # metadata checks are a pure function of the key: run once per geometry
        rel, split = _relative(history, horizon, offsets)
        _check(data, episode_offsets, indices, episodes, pad)
        M, L = indices.shape[0], len(rel)
        C.check_fits(_OP, f"{M} windows of {L} rows x {data.shape[1]} columns",
                     M * L * (C.nbytes(data.shape[1:], data.dtype) + 1 + 8), data.device,
                     "pass fewer `indices` (M) per call, or a shorter history/horizon.")
        plan = _WindowPlan(rel, split)
        if key is not None:
            _WINDOW_PLANS.put(key, plan)
    if _checked_eager(validate, data, episode_offsets, indices, episodes):
        return plan.launch(data, episode_offsets, indices, episodes, pad == "zero")
    return Windows(*_WINDOWS(data, episode_offsets, indices, episodes, list(plan.rel),
                             plan.split, pad == "zero"))


def _meta(data, episode_offsets, indices, episodes) -> tuple:
    """The tensor metadata a windows plan depends on."""
    return (data.shape, data.stride(), data.dtype, data.device, episode_offsets.shape,
            episode_offsets.dtype, episode_offsets.device, indices.shape, indices.dtype,
            indices.device,
            None if episodes is None else (episodes.shape, episodes.dtype, episodes.device))


_WINDOW_PLANS = PlanCache()


class _WindowPlan:
    """A validated `windows` geometry: relative rows, the history split and, once launched
    on CUDA, the gather's cached launch, device offsets and output shapes."""

    __slots__ = ("rel", "split", "gather", "rel_t", "shapes")

    def __init__(self, rel: tuple[int, ...], split: int):
        self.rel, self.split, self.gather, self.rel_t = rel, split, None, None

    def launch(self, data, episode_offsets, indices, episodes, zero_pad: bool) -> Windows:
        """The `Windows` of one eager CUDA call (the plan's geometry fixes every size)."""
        if self.gather is None:
            from robocache.kernels.windows import windows_plan

            M, D, K1 = indices.shape[0], data.shape[1], len(self.rel) - self.split
            self.shapes = ((M, self.split, D), (M, K1, D), (M, self.split), (M, K1))
            self.rel_t = _rel_tensor(self.rel, data.device)
            self.gather = windows_plan(data, episode_offsets.shape[0] - 1, M, len(self.rel),
                                       self.split, episodes is not None, zero_pad)
        return _windows_into(data, episode_offsets, indices, episodes, self.rel_t, self.shapes,
                             self.gather)


def _relative(history, horizon, offsets) -> tuple[tuple[int, ...], int]:
    """Relative rows and how many of them go to `history`."""
    if offsets is not None:
        rel = tuple(int(o) for o in offsets)
        if not rel:
            C.fail(_OP, "`offsets` is empty; pass at least one row offset.", ValueError)
        return rel, len(rel)
    for name, v in (("history", history), ("horizon", horizon)):
        if not isinstance(v, int) or v < 0:
            C.fail(_OP, f"`{name}` must be an int >= 0; got {v!r}.", ValueError)
    if history + horizon == 0:
        C.fail(_OP, "`history` and `horizon` are both 0: nothing to gather; ask for at least "
               "one row.", ValueError)
    return tuple(range(1 - history, 1)) + tuple(range(horizon)), history


_REL_CACHE = PlanCache(256)


def _rel_tensor(rel: tuple[int, ...], device: torch.device) -> torch.Tensor:
    """Device copy of the relative offsets, made once per (offsets, device)."""
    key = (rel, device)
    t = _REL_CACHE.get(key)
    if t is None:
        t = _REL_CACHE.put(key, torch.tensor(rel, dtype=torch.int64, device=device))
    return t


def _check(data, offsets, indices, episodes, pad) -> None:
    for name, t in (("data", data), ("episode_offsets", offsets), ("indices", indices)):
        if not isinstance(t, torch.Tensor):
            C.fail(_OP, f"`{name}` must be a torch.Tensor; got {type(t).__name__}.", TypeError)
    C.check_choice(_OP, "pad", pad, PADS)
    if data.dim() != 2:
        C.fail(_OP, f"`data` must be [total, D] (packed episodes); got shape {list(data.shape)}."
               " Flatten extra feature dims with data.flatten(1).")
    if data.dtype not in _DTYPES:
        C.check_dtype(_OP, "data", data, _DTYPES, "Convert bool/complex data first.")
    dev = data.device
    for name, t, want in (("episode_offsets", offsets, "[N + 1]"), ("indices", indices, "[M]"),
                          ("episodes", episodes, "[M]")):
        if t is None:
            continue
        C.check_dtype(_OP, name, t, C.INDEX_DTYPES, f"Pass integer {name}, e.g. .long().")
        C.check_device(_OP, name, t, dev, "data")
        if t.dim() != 1:
            C.fail(_OP, f"`{name}` must be {want}; got shape {list(t.shape)}.")
    if offsets.shape[0] < 2:
        C.fail(_OP, f"`episode_offsets` needs N + 1 >= 2 entries; got {offsets.shape[0]}.")
    if episodes is not None and episodes.shape != indices.shape:
        C.fail(_OP, f"`episodes` must match `indices` [M] = [{indices.shape[0]}]; got "
               f"{list(episodes.shape)}.")


def _checked_eager(validate, data, offsets, indices, episodes) -> bool:
    """Run the data-dependent checks ``validate`` asks for; True for an eager CUDA call, which
    then launches its plan's cached launch itself (one `is_compiling` check per call)."""
    eager = launches_directly(data)
    if C.validates_eager_cuda(validate) if eager else C.wants_validation(validate, data):
        _validate(data, offsets, indices, episodes)
    return eager


def _validate(data, offsets, indices, episodes) -> None:
    total = data.shape[0]
    if bool((offsets[1:] < offsets[:-1]).any()):
        C.fail(_OP, "`episode_offsets` decreases; offsets must be non-decreasing.", C.DataError)
    if int(offsets[0]) != 0 or int(offsets[-1]) != total:
        C.fail(_OP, f"`episode_offsets` must start at 0 and end at total = {total}; got "
               f"{int(offsets[0])} .. {int(offsets[-1])}.", C.DataError)
    if indices.numel() and (bool((indices < 0).any()) or bool((indices >= total).any())):
        C.fail(_OP, f"`indices` must lie in [0, total) = [0, {total}); got values in "
               f"[{int(indices.min())}, {int(indices.max())}].", C.DataError)
    if episodes is not None and indices.numel():
        n = offsets.shape[0] - 1
        if bool((episodes < 0).any()) or bool((episodes >= n).any()):
            C.fail(_OP, f"`episodes` must lie in [0, N) = [0, {n}).", C.DataError)
        lo, hi = episode_bounds(offsets, indices, episodes)
        bad = (indices < lo) | (indices >= hi)
        if bool(bad.any()):
            m = int(bad.nonzero()[0])
            C.fail(_OP, f"`indices[{m}]` = {int(indices[m])} lies outside its episode "
                   f"{int(episodes[m])} (rows {int(lo[m])} .. {int(hi[m]) - 1}).", C.DataError)


def _windows_cpu(data: torch.Tensor, episode_offsets: torch.Tensor, indices: torch.Tensor,
                 episodes: torch.Tensor | None, rel: list[int], split: int, zero_pad: bool,
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    values, is_pad = windows_ref(data, episode_offsets, indices,
                                 torch.tensor(rel, dtype=torch.int64), zero_pad, episodes)
    return (values[:, :split].contiguous(), is_pad[:, :split].contiguous(),
            values[:, split:].contiguous(), is_pad[:, split:].contiguous())


def _windows_cuda(data: torch.Tensor, episode_offsets: torch.Tensor, indices: torch.Tensor,
                  episodes: torch.Tensor | None, rel: list[int], split: int, zero_pad: bool,
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    from robocache.kernels.windows import windows_plan

    M, D, K1 = indices.shape[0], data.shape[1], len(rel) - split
    gather = windows_plan(data, episode_offsets.shape[0] - 1, M, len(rel), split,
                          episodes is not None, zero_pad)
    return _windows_into(data, episode_offsets, indices, episodes,
                         _rel_tensor(tuple(rel), data.device),
                         ((M, split, D), (M, K1, D), (M, split), (M, K1)), gather)


def _windows_into(data, episode_offsets, indices, episodes, rel_t, shapes, gather) -> Windows:
    """Allocate the four outputs (`shapes`: history and horizon values, then their masks) and
    run `gather` (the launcher's tensor arguments) into them."""
    out0, out1 = data.new_empty(shapes[0]), data.new_empty(shapes[1])
    pad0 = data.new_empty(shapes[2], dtype=torch.bool)
    pad1 = data.new_empty(shapes[3], dtype=torch.bool)
    gather(data, episode_offsets, indices, episodes, rel_t, out0, out1, pad0, pad1, fresh=True)
    return Windows(out0, pad0, out1, pad1)


def _windows_fake(data, episode_offsets, indices, episodes, rel, split, zero_pad):
    M, D, K1 = indices.shape[0], data.shape[1], len(rel) - split
    return (data.new_empty((M, split, D)), data.new_empty((M, split), dtype=torch.bool),
            data.new_empty((M, K1, D)), data.new_empty((M, K1), dtype=torch.bool))


_WINDOWS = Op("windows", cpu=_windows_cpu, cuda=_windows_cuda, fake=_windows_fake)


class KeyPlan(NamedTuple):
    """A key layout's launch plan: the kernel's int32 table (``[5, P]`` value positions then
    ``[4, Q]`` pad entries, see the kernel), P and Q (a window's values and pad flags), a
    divisor of every key's first column and width, and per key ``(name, base, L, W, pad
    base)``."""

    table: list[int]
    n_values: int
    n_pads: int
    align: int
    layout: list


def _key_plan(columns: dict[str, tuple[int, int]], rels: dict[str, tuple[int, ...]]
              ) -> KeyPlan:
    pos: list[list[int]] = [[] for _ in range(5)]
    pads: list[list[int]] = [[] for _ in range(4)]
    layout, obase, pbase, align = [], 0, 0, 0
    for name, (col, width) in columns.items():
        rel = rels[name]
        L = len(rel)
        for i, o in enumerate(rel):
            for d in range(width):
                for t, v in zip(pos, (o, col + d, obase, L * width, i * width + d), strict=True):
                    t.append(v)
            for t, v in zip(pads, (o, pbase, L, i), strict=True):
                t.append(v)
        layout.append((name, obase, L, width, pbase))
        obase += L * width
        pbase += L
        align = math.gcd(align, col, width)
    return KeyPlan([v for t in pos + pads for v in t], obase, pbase, align, layout)


_KEY_PLANS = PlanCache()


def _key_plan_on(columns: dict[str, tuple[int, int]], rels: dict[str, tuple[int, ...]],
                 device: torch.device) -> tuple[KeyPlan, torch.Tensor]:
    """The plan and its device table, made once per (layout, device)."""
    key = (tuple(columns.items()), tuple(rels.items()), device)
    hit = _KEY_PLANS.get(key)
    if hit is None:
        plan = _key_plan(columns, rels)
        hit = _KEY_PLANS.put(key, (plan, torch.tensor(plan.table, dtype=torch.int32,
                                                      device=device)))
    return hit


@nvtx.annotate("robocache.key_windows")
def key_windows(
    data: torch.Tensor,
    episode_offsets: torch.Tensor,
    indices: torch.Tensor,
    columns: dict[str, tuple[int, int]],
    offsets: dict[str, Sequence[int]],
    *,
    pad: str = "edge",
    episodes: torch.Tensor | None = None,
    validate: bool | None = None,
) -> dict[str, torch.Tensor]:
    """Windows of several keys packed side by side in one matrix, each key with its own row
    offsets (LeRobot's per-key ``delta_timestamps`` in steps); one kernel launch on CUDA.

    Args:
        data: ``[total, C]`` rows of all episodes back to back, keys side by side in columns
            (any float or integer dtype; keys of different dtypes can share one matrix as
            raw words, e.g. int32 views, and be viewed back after the gather).
        episode_offsets: int ``[N + 1]`` episode boundaries, as in `windows`.
        indices: int ``[M]`` global row of each window's current step.
        columns: key -> ``(first column, width)`` in ``data``.
        offsets: key -> integer row offsets (e.g. ``[-1, 0]`` for two states, ``range(50)``
            for an action chunk); every key of ``columns`` needs one, non-empty.
        pad: ``"edge"`` (rows outside the episode repeat its edge row, as LeRobot) or
            ``"zero"``; either way ``<key>_is_pad`` is True there.
        episodes: optional int ``[M]`` episode of each index (skips the search).
        validate: data-dependent checks, as in `windows`.

    Returns:
        dict: per key ``key -> [M, len(offsets[key]), width]`` in data's dtype and
        ``key + "_is_pad" -> bool [M, len(offsets[key])]``. The values of all keys are views
        of one buffer (each contiguous), as are the masks.

    Raises:
        ShapeError, DTypeError, DeviceError: bad ranks, dtypes, devices.
        ValueError: a key without offsets or with empty offsets, columns outside ``data``,
            unknown pad.
        DataError: (when validating) as `windows`.

    Example:
        >>> data = torch.randn(100, 10)          # state [0:7], gripper [7:8], action [8:10]
        >>> w = robocache.key_windows(data, torch.tensor([0, 60, 100]), torch.tensor([0, 59]),
        ...     {"state": (0, 7), "action": (8, 2)}, {"state": [-1, 0], "action": range(16)})
        >>> w["state"].shape, w["action"].shape, w["action_is_pad"][1].sum().item()
        (torch.Size([2, 2, 7]), torch.Size([2, 16, 2]), 15)
    """
    try:
        key = (_meta(data, episode_offsets, indices, episodes), tuple(columns),
               tuple(map(tuple, columns.values())), tuple(offsets),
               tuple(map(tuple, offsets.values())), pad)
        call = _KEY_CALLS.get(key)
    except (AttributeError, TypeError, KeyError):  # malformed arguments: validation names them
        key = call = None
    if call is None:
        # metadata and layout checks are a pure function of the key: run once per geometry
        _check(data, episode_offsets, indices, episodes, pad)
        call = _KeyCall(*_key_layout(data, columns, offsets))
        M = indices.shape[0]
        C.check_fits(_OP, f"{M} windows of {len(call.cols)} keys",
                     M * (call.plan.n_values * data.element_size() + call.plan.n_pads * 9),
                     data.device, "pass fewer `indices` (M) per call, or fewer `offsets`.")
        if key is not None:
            _KEY_CALLS.put(key, call)
    if _checked_eager(validate, data, episode_offsets, indices, episodes):
        return call.launch(data, episode_offsets, indices, episodes, pad == "zero")
    M = indices.shape[0]
    cols, rels = call.cols, call.rels
    names = list(cols)
    flat = [v for n in names for v in (*cols[n], len(rels[n]))]
    out, pads = _KEY_WINDOWS(data, episode_offsets, indices, episodes, flat,
                             [o for n in names for o in rels[n]], pad == "zero")
    return _split(out, pads, _views(M, call.plan.layout))


_KEY_CALLS = PlanCache()


class _KeyCall:
    """A validated `key_windows` geometry: columns and offsets per key, their `KeyPlan` and,
    once launched on CUDA, the device table, the gather's cached launch, the flat buffers'
    sizes and each key's views of them (`_views`)."""

    __slots__ = ("cols", "rels", "plan", "table", "gather", "sizes", "views")

    def __init__(self, cols: dict[str, tuple[int, int]], rels: dict[str, tuple[int, ...]]):
        self.cols, self.rels, self.plan = cols, rels, _key_plan(cols, rels)
        self.table = self.gather = None

    def launch(self, data, episode_offsets, indices, episodes, zero_pad: bool
               ) -> dict[str, torch.Tensor]:
        """The per-key windows and masks of one eager CUDA call."""
        if self.gather is None:
            from robocache.kernels.windows import key_windows_plan

            plan, M = self.plan, indices.shape[0]
            self.table = _key_plan_on(self.cols, self.rels, data.device)[1]
            self.gather = key_windows_plan(data, episode_offsets.shape[0] - 1, M,
                                           plan.n_values, plan.n_pads, plan.align,
                                           episodes is not None, zero_pad)
            self.sizes, self.views = (M * plan.n_values, M * plan.n_pads), \
                _views(M, plan.layout)
        out, pads = _buffers(data, *self.sizes)
        self.gather(data, episode_offsets, indices, episodes, self.table, out, pads, fresh=True)
        return _split(out, pads, self.views)


def _key_layout(data, columns, offsets) -> tuple[dict[str, tuple[int, int]],
                                                 dict[str, tuple[int, ...]]]:
    if not columns:
        C.fail(_OP, "`columns` is empty; name at least one key -> (first column, width).",
               ValueError)
    cols, rels = {}, {}
    for name, cw in columns.items():
        c, w = (int(x) for x in cw)
        if c < 0 or w < 1 or c + w > data.shape[1]:
            C.fail(_OP, f"`columns[{name!r}]` = ({c}, {w}) must be (first >= 0, width >= 1) "
                   f"inside data's {data.shape[1]} columns.", ValueError)
        rel = offsets.get(name)
        if rel is None or len(rel) == 0:
            C.fail(_OP, f"`offsets[{name!r}]` is missing or empty; give the key at least one "
                   "row offset, e.g. [0].", ValueError)
        rel = tuple(int(o) for o in rel)
        if max(map(abs, rel)) >= 2**31:
            C.fail(_OP, f"`offsets[{name!r}]` has an offset beyond +-2**31 rows; give row "
                   "offsets inside the episodes' length.", ValueError)
        cols[name], rels[name] = (c, w), rel
    return cols, rels


def _buffers(data: torch.Tensor, n_values: int, n_pads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The flat value (data's dtype) and pad (bool) buffers of a gather, on data's device."""
    return data.new_empty(n_values), data.new_empty(n_pads, dtype=torch.bool)


def _views(M: int, layout: list) -> list[tuple]:
    """Per key of a `KeyPlan` layout, its values' and its flags' names, and their
    ``as_strided`` arguments in the flat buffers: ``[M, L, W]`` and ``[M, L]``, contiguous."""
    return [(name, f"{name}_is_pad", ((M, L, W), (L * W, W, 1), M * base),
             ((M, L), (L, 1), M * pbase)) for name, base, L, W, pbase in layout]


def _split(out: torch.Tensor, pads: torch.Tensor, views: list[tuple]) -> dict[str, torch.Tensor]:
    """Each key's values and flags (`_views`) in the flat buffers the op made (fresh tensors:
    storage offset 0)."""
    result = {}
    for name, pad_name, value, flag in views:
        result[name] = out.as_strided(*value)
        result[pad_name] = pads.as_strided(*flag)
    return result


def _unflatten(layout: list[int], rel: list[int]) -> tuple[dict, dict]:
    """Columns and offsets per key from the op's flat ``layout`` (first, width, count per key)
    and ``rel`` (their offsets back to back)."""
    columns, offsets, at = {}, {}, 0
    for k in range(len(layout) // 3):
        c, w, n = layout[3 * k:3 * k + 3]
        columns[str(k)], offsets[str(k)] = (c, w), tuple(rel[at:at + n])
        at += n
    return columns, offsets


def _key_windows_cpu(data: torch.Tensor, episode_offsets: torch.Tensor, indices: torch.Tensor,
                     episodes: torch.Tensor | None, layout: list[int], rel: list[int],
                     zero_pad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference into the flat value and pad buffers (keys back to back)."""
    columns, offsets = _unflatten(layout, rel)
    parts = key_windows_ref(data, episode_offsets, indices, list(columns.values()),
                            list(offsets.values()), zero_pad, episodes)
    return (torch.cat([v.reshape(-1) for v, _ in parts]),
            torch.cat([p.reshape(-1) for _, p in parts]))


def _key_windows_cuda(data: torch.Tensor, episode_offsets: torch.Tensor, indices: torch.Tensor,
                      episodes: torch.Tensor | None, layout: list[int], rel: list[int],
                      zero_pad: bool) -> tuple[torch.Tensor, torch.Tensor]:
    from robocache.kernels.windows import key_windows_plan

    plan, table = _key_plan_on(*_unflatten(layout, rel), data.device)
    gather = key_windows_plan(data, episode_offsets.shape[0] - 1, indices.shape[0],
                              plan.n_values, plan.n_pads, plan.align, episodes is not None,
                              zero_pad)
    out, pads = _buffers(data, indices.shape[0] * plan.n_values, indices.shape[0] * plan.n_pads)
    gather(data, episode_offsets, indices, episodes, table, out, pads, fresh=True)
    return out, pads


def _key_windows_fake(data, episode_offsets, indices, episodes, layout, rel, zero_pad):
    M = indices.shape[0]
    per_m = sum(layout[3 * k + 1] * layout[3 * k + 2] for k in range(len(layout) // 3))
    return data.new_empty(M * per_m), data.new_empty(M * len(rel), dtype=torch.bool)


_KEY_WINDOWS = Op("key_windows", cpu=_key_windows_cpu, cuda=_key_windows_cuda,
                  fake=_key_windows_fake)
