"""Relative actions in the loader: each action chunk expressed against the sample's current
state, per key, on the batch's device.

    >>> ds = RobotDataset(cache, horizon=50, relative_actions={
    ...     "action": {"mode": "joint", "state": "observation.state", "absolute_dims": [7]}})

Per action key, one entry (:func:`parse`):

- ``mode``: ``"joint"``: every relative dimension minus the current state's
  (:func:`robocache.geometry.joint_to_relative`); ``"ee"`` / ``"base"``: the relative
  dimensions are a pose (``[x, y, z, rotation...]``, metres and the ``rotation``
  parametrization) expressed against the current end-effector pose with
  :func:`robocache.geometry.pose_to_relative` (``frame="ee"``: ``state^-1 @ pose``;
  ``frame="base"``: rotation ``R R0^T`` and translation ``p - p0`` in the base frame), served
  in the same parametrization; ``"absolute"``: served as stored (for configuration files that
  name every key).
- ``state``: the served key holding the current state (read at the sample's current step,
  whatever that key's own window).
- ``absolute_dims`` (default none): action dimensions served as stored (a gripper).
- ``state_dims`` (default: the relative dimensions' own indices, when the state is as wide as
  the action; the state's dimensions in order, when it is as wide as the relative dimensions,
  e.g. a gripper listed in ``absolute_dims``): the state dimension paired with each relative
  action dimension, in order.
- ``rotation`` (``ee`` / ``base``; default ``"auto"``): ``"rotvec"`` (axis * angle, 3),
  ``"quat"`` (wxyz, 4), ``"quat_xyzw"`` (4), ``"rot6d"`` (6), ``"matrix"`` (row-major, 9) or
  ``"euler_<order>"`` (SciPy's order, e.g. ``"euler_xyz"``, 3). ``"auto"`` reads it off the
  pose width: 6 rotvec, 7 quat, 9 rot6d, 12 matrix (Euler angles must be named).
- ``state_rotation`` (default: ``rotation`` where the state pose has its width, else
  ``"auto"``): the state pose's parametrization.

The current state is gathered in the same :func:`robocache.key_windows` launch as the windows
(one more column at offset 0); the transform is then a few elementwise ops on the batch's
device, in float32 at least, cast back to the action's dtype. The action's ``_is_pad`` also
marks the chunk of a sample whose current state had no sample (an alignment pad); with
``pad="zero"`` the padded steps stay zero after the transform (and after normalization).

Every bad entry is refused with one :class:`~robocache.errors.DataError` line naming
``relative_actions[key]`` and the fix, before any data is read.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from robocache.errors import DataError

MODES = ("joint", "ee", "base", "absolute")
FIELDS = ("mode", "state", "absolute_dims", "state_dims", "rotation", "state_rotation")
#: Rotation parametrizations and their widths (``euler_<order>``: 3).
ROTATIONS = {"rotvec": 3, "quat": 4, "quat_xyzw": 4, "rot6d": 6, "matrix": 9}
#: ``rotation="auto"``: the parametrization of a pose of this many values.
AUTO = {6: "rotvec", 7: "quat", 9: "rot6d", 12: "matrix"}


@dataclass(frozen=True)
class KeySpec:
    """One action key's validated entry (see the module docstring); dims are 0-based."""

    key: str
    mode: str
    state: str
    width: int  # the action's values per step
    state_width: int
    dims: tuple[int, ...]  # the relative action dimensions, in order
    state_dims: tuple[int, ...]  # the state dimension of each (joint), or the state pose's
    rotation: str | None = None
    state_rotation: str | None = None

    @property
    def absolute_dims(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.width) if i not in self.dims)

    def entry(self) -> dict[str, Any]:
        """This key's ``relative_actions`` entry, every field resolved."""
        out: dict[str, Any] = {"mode": self.mode, "state": self.state,
                               "absolute_dims": list(self.absolute_dims),
                               "state_dims": list(self.state_dims)}
        if self.mode != "joint":
            out.update(rotation=self.rotation, state_rotation=self.state_rotation)
        return out

    def canonical(self) -> dict[str, Any]:
        """What defines the transform (the key's name aside): the statistics' identity."""
        return {**self.entry(), "width": self.width}

    def tag(self, offsets: Sequence[int]) -> str:
        """The identity of statistics of this transform over chunks at row ``offsets``
        (:attr:`robocache.Stats.relative`)."""
        return json.dumps({**self.canonical(), "offsets": [int(o) for o in offsets]},
                          sort_keys=True, separators=(",", ":"))


def _fail(key: str, text: str) -> None:
    raise DataError(f"`relative_actions[{key!r}]` {text}")


def _dims(key: str, name: str, value: Any, width: int, what: str) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence) or not all(
            isinstance(i, int) and not isinstance(i, bool) for i in value):
        _fail(key, f"`{name}` must be a list of integer indices; got {value!r}.")
    out = tuple(int(i) for i in value)
    bad = [i for i in out if not 0 <= i < width]
    if bad or len(set(out)) != len(out):
        _fail(key, f"`{name}` must name distinct dimensions of {what} (0..{width - 1}); "
              f"got {list(out)}.")
    return out


def _rotation(key: str, name: str, value: Any, width: int) -> str:
    """The parametrization ``value`` (or ``"auto"``) of a pose of ``width`` values."""
    if value in (None, "auto"):
        if width not in AUTO:
            _fail(key, f"has a pose of {width} values, which `{name}='auto'` cannot read "
                  f"(6: rotvec, 7: quat, 9: rot6d, 12: matrix); name it, e.g. "
                  f"'{name}': 'euler_xyz', or list the extra dims in `absolute_dims`.")
        return AUTO[width]
    size = 3 if isinstance(value, str) and value.startswith("euler_") else ROTATIONS.get(value)
    if size is None or (value.startswith("euler_") and not _euler_ok(value[6:])):
        _fail(key, f"`{name}` must be 'auto', one of {sorted(ROTATIONS)} or 'euler_<order>' "
              f"(e.g. 'euler_xyz'); got {value!r}.")
    if width != 3 + size:
        _fail(key, f"has a pose of {width} values but `{name}`={value!r} needs {3 + size} "
              "(x, y, z and the rotation); fix `absolute_dims` / `state_dims` or the "
              "rotation.")
    return value


def _euler_ok(order: str) -> bool:
    from robocache.ops.geometry import _check_order

    try:
        _check_order("relative_actions", order)
    except ValueError:
        return False
    return True


def parse(spec: Mapping[str, Any] | None, fields: Mapping[str, tuple[int, bool, bool]],
          action_keys: Sequence[str]) -> dict[str, KeySpec]:
    """Validate ``relative_actions`` against the served keys.

    Args:
        spec: action key -> entry (see the module docstring); None: none.
        fields: every served key -> (values per step, floating point?, camera?).
        action_keys: the keys windowed as action chunks.

    Returns:
        The relative keys' :class:`KeySpec` (``"absolute"`` entries dropped).

    Raises:
        DataError: one line naming the entry and the fix (see the module docstring).
    """
    if spec is None:
        return {}
    if not isinstance(spec, Mapping):
        raise DataError("`relative_actions` must map action keys to entries such as "
                        "{'mode': 'joint', 'state': 'observation.state'}; got "
                        f"{type(spec).__name__}.")
    out = {}
    numeric = sorted(k for k, (_, _, cam) in fields.items() if not cam)
    for key, entry in spec.items():
        if key not in fields or key not in action_keys:
            raise DataError(f"`relative_actions` names {key!r}, which is not a served action "
                            f"key; served action keys: {list(action_keys)} (pass a "
                            "`horizon` >= 1, or list it in `action_keys`).")
        if not isinstance(entry, Mapping):
            _fail(key, f"must be a mapping such as {{'mode': 'joint', 'state': "
                  f"'observation.state'}}; got {entry!r}.")
        unknown = sorted(set(entry) - set(FIELDS))
        if unknown:
            _fail(key, f"has unknown fields {unknown}; the fields are {list(FIELDS)}.")
        mode = entry.get("mode")
        if mode not in MODES:
            _fail(key, f"`mode` must be one of {list(MODES)}; got {mode!r}.")
        if mode == "absolute":
            continue
        width, floating, _ = fields[key]
        if not floating:
            _fail(key, "is not a floating-point stream; relative actions need float values.")
        state = entry.get("state")
        if state not in fields or fields[state][2]:
            _fail(key, f"`state` must be a served numeric key (the current state); got "
                  f"{state!r}; served numeric keys: {numeric} (add it to `keys`).")
        if state == key:
            _fail(key, "`state` must be another key than the action itself.")
        state_width, state_float, _ = fields[state]
        if not state_float:
            _fail(key, f"`state` {state!r} is not a floating-point stream.")
        absolute = _dims(key, "absolute_dims", entry.get("absolute_dims", []), width,
                         f"the action ({width} values)")
        dims = tuple(i for i in range(width) if i not in absolute)
        if not dims:
            _fail(key, "leaves no dimension relative; drop the entry or use "
                  "{'mode': 'absolute'}.")
        if "state_dims" in entry:
            state_dims = _dims(key, "state_dims", entry["state_dims"], state_width,
                               f"{state!r} ({state_width} values)")
        elif state_width == width:
            state_dims = dims
        elif len(dims) == state_width:  # the action's extra dims listed absolute: in order
            state_dims = tuple(range(state_width))
        else:
            _fail(key, f"is {width} values wide but its state {state!r} is {state_width}; "
                  "pass `state_dims` (the state dimension of each relative action dimension, "
                  "in order) or list the action's extra dims in `absolute_dims`.")
        rotation = state_rotation = None
        if mode == "joint":
            if len(state_dims) != len(dims):
                _fail(key, f"has {len(dims)} relative dimensions but `state_dims` names "
                      f"{len(state_dims)}; give one state dimension per relative dimension.")
        else:
            rotation = _rotation(key, "rotation", entry.get("rotation", "auto"), len(dims))
            wanted = entry.get("state_rotation")
            if wanted is None:
                wanted = rotation if 3 + (3 if rotation.startswith("euler_") else
                                          ROTATIONS[rotation]) == len(state_dims) else "auto"
            state_rotation = _rotation(key, "state_rotation", wanted, len(state_dims))
        out[key] = KeySpec(key, mode, state, width, state_width, dims, state_dims, rotation,
                           state_rotation)
    return out


# --------------------------------------------------------------------------- the transform

def _to_matrix(x: torch.Tensor, rotation: str) -> torch.Tensor:
    from robocache.ops import geometry as G

    if rotation == "rotvec":
        return G.rotvec_to_matrix(x)
    if rotation == "quat":
        return G.quat_to_matrix(x)
    if rotation == "quat_xyzw":
        return G.quat_to_matrix(G.quat_xyzw_to_wxyz(x))
    if rotation == "rot6d":
        return G.rot6d_to_matrix(x)
    if rotation == "matrix":
        return x.reshape(*x.shape[:-1], 3, 3)
    return G.euler_to_matrix(x, rotation[6:])


def _from_matrix(m: torch.Tensor, rotation: str) -> torch.Tensor:
    from robocache.ops import geometry as G

    if rotation == "rotvec":
        return G.matrix_to_rotvec(m)
    if rotation == "quat":
        return G.matrix_to_quat(m)
    if rotation == "quat_xyzw":
        return G.quat_wxyz_to_xyzw(G.matrix_to_quat(m))
    if rotation == "rot6d":
        return G.matrix_to_rot6d(m)
    if rotation == "matrix":
        return m.reshape(*m.shape[:-2], 9)
    return G.matrix_to_euler(m, rotation[6:])


def _pose(x: torch.Tensor, rotation: str) -> torch.Tensor:
    """Poses ``[..., 4, 4]`` from ``[..., 3 + r]`` (translation, then the rotation)."""
    from robocache.ops.geometry import make_pose

    return make_pose(_to_matrix(x[..., 3:], rotation), x[..., :3])


def transform(values: torch.Tensor, state: torch.Tensor, spec: KeySpec,
              index: dict[str, torch.Tensor]) -> torch.Tensor:
    """``values [B, T, W]`` (an action chunk, ``W >= spec.width``: columns past the action's
    are left as they are) against ``state [B, Ws]`` (the current state), per ``spec``; in
    float32 at least, returned in ``values``' dtype. ``index``: :func:`index_tensors` on the
    values' device."""
    from robocache.ops.geometry import joint_to_relative, pose_to_relative

    acc = torch.promote_types(values.dtype, torch.float32)
    v, s = values.to(acc), state.to(acc)
    if spec.mode == "joint":
        # the state under each relative dim, zero under the others (x - 0 is x, bit for bit)
        paired = torch.where(index["mask"], s.index_select(-1, index["state"]), 0)
        out = joint_to_relative(v, paired)
    else:
        poses = _pose(v.index_select(-1, index["dims"]), spec.rotation)
        now = _pose(s.index_select(-1, index["state"]), spec.state_rotation)
        rel = pose_to_relative(poses, now, frame=spec.mode)
        flat = torch.cat((rel[..., :3, 3], _from_matrix(rel[..., :3, :3], spec.rotation)), -1)
        out = v.index_copy(-1, index["dims"], flat)
    return out.to(values.dtype)


def index_tensors(spec: KeySpec, width: int, device: torch.device) -> dict[str, torch.Tensor]:
    """The index tensors :func:`transform` takes for values ``width`` wide, on ``device``."""
    if spec.mode == "joint":
        state = [0] * width
        for d, s in zip(spec.dims, spec.state_dims, strict=True):
            state[d] = s
        mask = torch.zeros(width, dtype=torch.bool)
        mask[list(spec.dims)] = True
        return {"state": torch.tensor(state, device=device), "mask": mask.to(device)}
    return {"dims": torch.tensor(spec.dims, device=device),
            "state": torch.tensor(spec.state_dims, device=device)}


def now_column(state: str) -> str:
    """The gathered column of ``state`` at the current step (offset 0)."""
    return f"{state}\0now"


def state_columns(states: Sequence[str], layout: Mapping[str, Any]) -> tuple[dict, dict]:
    """The extra :func:`robocache.key_windows` columns and offsets of a dataset's relative
    keys: each state key at the current step (and its alignment-pad flag, where it has one)."""
    cols, offs = {}, {}
    for state in states:
        key = layout[state]
        cols[now_column(state)], offs[now_column(state)] = (key.col, key.words), [0]
        if key.pad_col is not None:
            cols[f"{now_column(state)}\0pad"] = (key.pad_col, 1)
            offs[f"{now_column(state)}\0pad"] = [0]
    return cols, offs


class RelativeActions:
    """A dataset's relative keys (:func:`parse`), applied to each batch in
    :meth:`~robocache.data.dataset.RobotDataset.finish`; ``post``: a
    :class:`robocache.Normalizer` of the keys whose normalization waits for the transform
    (the relative keys, and their state keys, whose raw rows the transform reads), set by
    :meth:`~robocache.data.dataset.RobotDataset.normalized`."""

    def __init__(self, specs: Mapping[str, KeySpec], post=None):
        self.specs, self.post = dict(specs), post
        self._index: dict[tuple, dict[str, torch.Tensor]] = {}

    def __getstate__(self) -> dict[str, Any]:  # pickled without the per-device tensors
        return {"specs": self.specs, "post": self.post}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["specs"], state["post"])

    def with_post(self, post) -> RelativeActions:
        return RelativeActions(self.specs, post)

    @property
    def states(self) -> list[str]:
        return list(dict.fromkeys(s.state for s in self.specs.values()))

    def deferred(self) -> set[str]:
        """Keys normalized after the transform, not in the packed rows."""
        return set(self.specs) | set(self.states)

    def columns(self, layout: Mapping[str, Any]) -> tuple[dict, dict]:
        return state_columns(self.states, layout)

    def _indices(self, spec: KeySpec, width: int, device: torch.device):
        hit = self._index.get((spec.key, width, device))
        if hit is None:
            hit = self._index[(spec.key, width, device)] = index_tensors(spec, width, device)
        return hit

    def run(self, out: dict[str, torch.Tensor], raw: Mapping[str, torch.Tensor], dataset
            ) -> dict[str, torch.Tensor]:
        """:meth:`apply` for ``dataset``'s batch (its layout and padding)."""
        return self.apply(out, raw, dataset.layout, dataset.pad == "zero")

    def apply(self, out: dict[str, torch.Tensor], raw: Mapping[str, torch.Tensor],
              layout: Mapping[str, Any], zero_pad: bool) -> dict[str, torch.Tensor]:
        """The relative keys of a finished batch ``out`` transformed (and normalized, with
        :attr:`post`), from the gathered ``raw`` words; returns the changed entries."""
        changed = {}
        for key, spec in self.specs.items():
            state = layout[spec.state]
            now = state.values(raw[now_column(spec.state)])[:, 0]
            values = out[key]
            squeezed = values.dim() == 2  # a key served without a window dimension
            chunk = values[:, None] if squeezed else values
            rel = transform(chunk, now, spec, self._indices(spec, chunk.shape[-1],
                                                             chunk.device))
            pad = out[f"{key}_is_pad"]
            if state.pad_col is not None:  # no current state: the chunk is not served
                missing = raw[f"{now_column(spec.state)}\0pad"][:, 0, 0] != 0
                pad = pad | (missing[:, None] if not squeezed else missing)
            changed[key] = rel[:, 0] if squeezed else rel
            changed[f"{key}_is_pad"] = pad
        if self.post is not None:
            changed.update(self.post({k: changed.get(k, out[k]) for k in self.deferred()
                                      if k in out}))
        if zero_pad:  # padding stays zero in the served (normalized) units
            for key in self.deferred():
                if key in changed and f"{key}_is_pad" in out:
                    pad = changed.get(f"{key}_is_pad", out[f"{key}_is_pad"])
                    window = raw[f"{key}_is_pad"]
                    window = window[:, 0] if pad.dim() == 1 else window
                    changed[key] = torch.where(window[..., None], 0, changed[key])
        return changed


class PerSource:
    """A mixture's stacked sources (``robocache.data.loader._Packed``): each source's
    :class:`RelativeActions` (or None) applied to its rows of the batch, the others' kept.
    Values are at the mixture's widths; each source's transform reads and writes its own
    dimensions only, and its normalization runs on them."""

    def __init__(self, sources: Sequence[RelativeActions | None], widths: Sequence[Mapping]):
        self.sources, self.widths = list(sources), [dict(w) for w in widths]

    @property
    def states(self) -> list[str]:
        return list(dict.fromkeys(s for r in self.sources if r is not None for s in r.states))

    def deferred(self) -> set[str]:
        return set().union(*(r.deferred() for r in self.sources if r is not None))

    def columns(self, layout: Mapping[str, Any]) -> tuple[dict, dict]:
        return state_columns(self.states, layout)

    def run(self, out: dict[str, torch.Tensor], raw: Mapping[str, torch.Tensor], dataset
            ) -> dict[str, torch.Tensor]:
        """Each source's transform on its rows of the stacked ``dataset``'s batch."""
        return self.apply(out, raw, dataset.layout, dataset.pad == "zero",
                          dataset.rows[raw["index"], 0])

    def apply(self, out: dict[str, torch.Tensor], raw: Mapping[str, torch.Tensor],
              layout: Mapping[str, Any], zero_pad: bool, source: torch.Tensor
              ) -> dict[str, torch.Tensor]:
        changed: dict[str, torch.Tensor] = {}
        for i, rel in enumerate(self.sources):
            if rel is None:
                continue
            mine = rel.apply(_narrowed(out, self.widths[i]), raw, layout, zero_pad)
            rows = source == i
            for k, v in mine.items():
                base = changed.get(k, out[k])
                if v.shape != base.shape:  # back to the mixture's width (zeros past it)
                    v = torch.nn.functional.pad(v, (0, base.shape[-1] - v.shape[-1]))
                changed[k] = torch.where(rows.view(-1, *[1] * (base.dim() - 1)), v, base)
        return changed


def _narrowed(out: Mapping[str, torch.Tensor], widths: Mapping[str, int]) -> dict:
    """``out`` with each key of ``widths`` cut to that many values per step."""
    return {k: v[..., :widths[k]] if k in widths and not k.endswith("_is_pad") else v
            for k, v in out.items()}
