"""A mixture of robot datasets from one YAML file: what :meth:`MixedDataset.from_config`
builds and ``robocache mixture FILE --check`` checks.

    >>> mixed = MixedDataset.from_config("mixture.yaml", tokenizer=tokenizer)
    >>> loader = RobotLoader(mixed, batch_size=256)

The file (docs/mixtures.md has a complete one)::

    history: 2                      # observation steps per sample
    horizon: 16                     # action steps per sample
    balance: frames                 # none (the weights alone), frames, episodes, embodiment
    pad: {state: 32, action: 32}    # common widths, zero-padded with <key>_dim_mask
    language: {max_length: 48}      # tokens per prompt (default: the longest prompt's)
    datasets:
      - name: droid
        path: s3://bucket/droid.cache         # a cache: a folder, or an object-store URI
        weight: 2.0                           # multiplies the balance (default 1)
        embodiment: franka                    # for balance: embodiment (default: the name)
        cameras: {primary: observation.images.exterior_1, wrist: observation.images.wrist}
        state: observation.state
        action: {key: action, relative: joint, absolute_dims: [7]}
        instructions: droid_instructions.json # several per episode, one chosen per sample
        language: {subtask: language.subtask} # string streams, served per step
      - name: aloha
        path: /data/aloha.cache
        kinematics: {urdf: arm.urdf, end_link: gripper, joint_dims: [0, 1, 2, 3, 4, 5]}
        state: {key: observation.state, to_ee: true}
        action: {key: action, to_ee: true}

Every source is served under one schema: ``observation.images.<role>`` per camera role,
``observation.state``, ``action``, the prompt as ``task`` and string streams under their
``language`` keys (see :mod:`robocache.data.language`); each source is normalized with its
own statistics (:class:`robocache.RobotLoader` keeps one normalizer per source), and a batch
carries ``source`` (the dataset's index) per sample.

``resolve`` checks the whole file against the caches' manifests (metadata only: no episode
is read) and refuses bad input with one line naming the file, the dataset and the fix: an
unknown key, a mapping to a stream the cache lacks, action (or state) widths that differ
without ``pad``, weights whose sum is not positive, a URDF whose chain's joint count does not
match the stream.
"""

from __future__ import annotations

import difflib
import inspect
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from robocache.errors import DataError, URDFError

#: Top-level keys of a mixture file.
TOP_KEYS = ("datasets", "history", "horizon", "balance", "pad", "language")
#: Keys of one dataset's entry.
DATASET_KEYS = ("name", "path", "storage_options", "weight", "embodiment", "episodes", "cameras",
                "state", "action", "language", "instructions", "episode_keys", "kinematics")
#: Batch keys a ``language`` entry may not take (the prompt's, and the batch's own).
RESERVED = ("task", "source", "index", "episode_index", "timestamp")
#: Keys of a ``state`` / ``action`` mapping.
STREAM_KEYS = {"state": ("key", "to_ee"),
               "action": ("key", "to_ee", "relative", "absolute_dims")}
KINEMATICS_KEYS = ("urdf", "end_link", "base_link", "joint_dims")
BALANCES = ("none", "frames", "episodes", "embodiment")
RELATIVE = ("absolute", "joint", "ee", "base")
#: The common schema's names.
STATE, ACTION, CAMERA = "observation.state", "action", "observation.images."
#: Keywords of :class:`RobotDataset` a caller may give every source.
DATASET_KWARGS = ("image_size", "image_transforms", "image_dtype", "seed", "in_memory")


@dataclass
class Source:
    """One dataset of a mixture file, resolved against its cache's manifest.

    Attributes:
        name, embodiment: as the file gives them (defaults: the cache folder's name).
        path: the cache (a relative path resolved against the file's folder).
        given_weight: the file's ``weight``; ``weight``: the sampling weight after balancing,
            normalized over the mixture.
        mapping: common key -> the cache's stream.
        widths: common numeric key -> its served width (after a conversion to EE poses).
        episodes, frames: what the cache serves (from its manifest); ``episode_list``: the
            file's ``episodes`` (None: all).
        relative: the ``relative_actions`` entry given to :class:`RobotDataset`, or None.
        to_ee: common keys converted from joints to the end-effector pose through
            ``kinematics`` (the file's entry, with its parsed ``chain``).
        language: batch key -> the cache's string stream served under it.
        joined: common key -> the streams joined (in order) into it, where there are several
            (``mapping`` names the first).
        instructions, episode_keys: the episode instructions file (or mapping) and the names
            of its episodes; storage_options: object-store settings of ``path``.
    """

    name: str
    path: str
    embodiment: str
    given_weight: float
    mapping: dict[str, str]
    widths: dict[str, int] = field(default_factory=dict)
    episodes: int = 0
    frames: int = 0
    episode_list: list[int] | None = None
    weight: float = 0.0
    relative: dict[str, Any] | None = None
    to_ee: list[str] = field(default_factory=list)
    kinematics: dict[str, Any] | None = None
    language: dict[str, str] = field(default_factory=dict)
    joined: dict[str, list[str]] = field(default_factory=dict)
    instructions: Any = None
    episode_keys: Any = None
    storage_options: dict[str, Any] | None = None

    def encoding(self) -> str:
        """The action encoding in words (``as stored, relative joint (absolute dims [7])``,
        ``ee, absolute``...)."""
        if ACTION not in self.mapping:
            return "-"
        space = "ee" if ACTION in self.to_ee else "as stored"
        if self.relative is None:
            return f"{space}, absolute"
        rel = self.relative
        dims = f" (absolute dims {rel['absolute_dims']})" if rel["absolute_dims"] else ""
        return f"{space}, relative {rel['mode']}{dims}"


@dataclass
class Mixture:
    """A mixture file, resolved: its settings and :class:`Source` list."""

    path: Path
    history: int
    horizon: int
    balance: str
    pad: dict[str, int]
    max_length: int | None
    sources: list[Source]

    def table(self) -> list[dict[str, Any]]:
        """One row per dataset, for ``robocache mixture --check`` (``--json`` prints it)."""
        return [{"name": s.name, "path": s.path, "embodiment": s.embodiment,
                 "episodes": s.episodes, "frames": s.frames, "weight": s.weight,
                 "widths": {k: self.pad.get(k, w) for k, w in s.widths.items()},
                 "own_widths": dict(s.widths),
                 "mapping": {**s.mapping, **{k: " + ".join(v) for k, v in s.joined.items()},
                             **s.language},
                 "action_encoding": s.encoding(),
                 "instructions": None if s.instructions is None else str(s.instructions)}
                for s in self.sources]


def _where(path: Path, name: str | None = None) -> str:
    return f"{path}: dataset {name!r}" if name is not None else str(path)


def _unknown(given: Mapping, known: tuple[str, ...], where: str, what: str) -> None:
    for key in given:
        if key not in known:
            close = difflib.get_close_matches(str(key), known, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise DataError(f"{where}: unknown key {key!r} in {what}; {hint}the known keys are "
                            f"{', '.join(known)}.")


def _int(value: Any, where: str, what: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise DataError(f"{where}: `{what}` must be an integer >= {low}; got {value!r}.")
    return value


def load(path: str | Path, **overrides) -> dict[str, Any]:
    """The mixture file ``path`` parsed (YAML), with top-level ``overrides`` applied.

    Raises:
        DataError: a file that cannot be read or parsed, not a mapping, or an unknown key.
    """
    import yaml

    path = Path(path)
    try:
        config = yaml.safe_load(path.read_text())
    except OSError as e:
        raise DataError(f"{path}: the mixture file cannot be read ({e.strerror or e}); check "
                        "the path.") from e
    except yaml.YAMLError as e:
        raise DataError(f"{path}: not valid YAML ({' '.join(str(e).split())}); fix the "
                        "syntax.") from e
    if not isinstance(config, dict):
        raise DataError(f"{path}: a mixture file must be a mapping with a `datasets` list; got "
                        f"{type(config).__name__}.")
    _unknown(config, TOP_KEYS, str(path), "the file")
    for key, value in overrides.items():
        if key == "max_length":
            config["language"] = {**(config.get("language") or {}), "max_length": value}
        else:
            config[key] = value
    return config


def _stream(entry: Any, slot: str, where: str) -> dict[str, Any]:
    """A ``state`` / ``action`` entry as a mapping whose ``key`` is a list of streams (a bare
    name or list is its ``key``)."""
    names = lambda k: [k] if isinstance(k, str) else k  # noqa: E731
    if isinstance(entry, (str, list)):
        entry = {"key": entry}
    key = entry.get("key") if isinstance(entry, dict) else None
    if not (isinstance(key, str) or (isinstance(key, list) and key
                                     and all(isinstance(k, str) for k in key))):
        raise DataError(f"{where}: `{slot}` must be a stream name, a list of them (joined in "
                        f"order), or a mapping with `key`; got {entry!r}.")
    _unknown(entry, STREAM_KEYS[slot], where, f"`{slot}`")
    return {**entry, "key": names(key)}


def resolve(path: str | Path, **overrides) -> Mixture:
    """Check a mixture file against its caches' manifests (no episode is read) and resolve
    what each dataset serves, its episodes, frames and weight.

    Raises:
        DataError: one line naming the file, the dataset and the fix: an unknown key, a bad
            value, a cache that is missing, a mapping to a stream the cache lacks, widths that
            differ without ``pad`` (or exceed it), weights whose sum is not positive, a URDF
            whose chain's joint count does not match the stream.
    """
    path = Path(path)
    config = load(path, **overrides)
    where = str(path)
    datasets = config.get("datasets")
    if not isinstance(datasets, list) or not datasets:
        raise DataError(f"{where}: `datasets` must be a non-empty list of datasets, each with "
                        "a `path`.")
    history = _int(config.get("history", 1), where, "history", 1)
    horizon = _int(config.get("horizon", 0), where, "horizon", 0)
    balance = config.get("balance", "none")
    if balance not in BALANCES:
        raise DataError(f"{where}: `balance` must be one of {', '.join(BALANCES)}; got "
                        f"{balance!r}.")
    pad = config.get("pad") or {}
    if not isinstance(pad, dict):
        raise DataError(f"{where}: `pad` must map state / action to a width, e.g. "
                        "{state: 32, action: 32}.")
    _unknown(pad, ("state", "action"), where, "`pad`")
    pad = {STATE if k == "state" else ACTION: _int(v, where, f"pad.{k}", 1)
           for k, v in pad.items()}
    language = config.get("language") or {}
    if not isinstance(language, dict):
        raise DataError(f"{where}: `language` must be a mapping, e.g. {{max_length: 48}}.")
    _unknown(language, ("max_length",), where, "`language`")
    max_length = language.get("max_length")
    if max_length is not None:
        _int(max_length, where, "language.max_length", 1)
    sources = [_source(path, i, entry) for i, entry in enumerate(datasets)]
    names = [s.name for s in sources]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise DataError(f"{where}: dataset {twice[0]!r} is named twice; give each dataset its "
                        "own `name`.")
    _check_widths(path, sources, pad)
    _weigh(path, sources, balance)
    return Mixture(path, history, horizon, balance, pad, max_length, sources)


def _source(path: Path, i: int, entry: Any) -> Source:
    """One dataset entry checked against its cache's manifest."""
    from robocache.data.location import Location

    if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
        raise DataError(f"{path}: dataset {i} must be a mapping with `path` (a cache folder or "
                        f"URI); got {entry!r}.")
    uri = entry["path"]
    name = entry.get("name", Path(uri.rstrip("/")).name)
    where = _where(path, name)
    _unknown(entry, DATASET_KEYS, where, "the dataset")
    if "://" not in uri and not Path(uri).is_absolute():
        uri = str(path.parent / uri)
    weight = entry.get("weight", 1.0)
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) \
            or not math.isfinite(weight) or weight < 0:
        raise DataError(f"{where}: `weight` must be a finite number >= 0; got {weight!r}.")
    options = entry.get("storage_options")
    try:
        manifest = Location(uri if "://" in uri else Path(uri), options).manifest()
    except (OSError, DataError) as e:
        raise DataError(f"{where}: no cache at {uri} ({' '.join(str(e).split())}); fix `path` "
                        "(a folder `robocache ingest` wrote, or its URI).") from e
    streams = manifest["streams"]
    src = Source(name, uri, str(entry.get("embodiment", name)), float(weight), {},
                 storage_options=options, instructions=entry.get("instructions"),
                 episode_keys=entry.get("episode_keys"))

    def stream(key: str, slot: str, kinds: tuple[str, ...]) -> str:
        if key not in streams or streams[key]["kind"] not in kinds:
            have = sorted(k for k, s in streams.items() if s["kind"] in kinds)
            close = difflib.get_close_matches(key, have, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise DataError(f"{where}: `{slot}` maps to {key!r}, which the cache at {uri} "
                            f"does not have{hint}; map it to one of its "
                            f"{'/'.join(kinds)} streams: {', '.join(have) or 'none'}.")
        return key

    cameras = entry.get("cameras") or {}
    if not isinstance(cameras, dict):
        raise DataError(f"{where}: `cameras` must map roles to camera streams, e.g. "
                        "{primary: observation.images.top}.")
    for role, key in cameras.items():
        src.mapping[f"{CAMERA}{role}"] = stream(str(key), f"cameras.{role}", ("image", "video"))
    language = entry.get("language") or {}
    if not isinstance(language, dict):
        raise DataError(f"{where}: `language` must map batch keys to string streams of the "
                        "cache, e.g. {subtask: language.subtask}.")
    for key, name in language.items():
        if not str(key).isidentifier() or key in RESERVED:
            raise DataError(f"{where}: `language` key {key!r} must be a plain name other than "
                            f"{', '.join(RESERVED)} (the prompt is `task`); rename it.")
        src.language[key] = stream(str(name), f"language.{key}", ("event",))
    slots = {}
    for slot, common in (("state", STATE), ("action", ACTION)):
        if entry.get(slot) is not None:
            slots[slot] = _stream(entry[slot], slot, where)
            parts = [stream(k, slot, ("numeric",)) for k in slots[slot]["key"]]
            if len(set(parts)) != len(parts):
                raise DataError(f"{where}: `{slot}` names a stream twice ({parts}); name each "
                                "once.")
            src.mapping[common] = parts[0]
            if len(parts) > 1:
                src.joined[common] = parts
            src.widths[common] = sum(int(math.prod(streams[k]["shape"])) for k in parts)
    chain = _kinematics(path, name, entry.get("kinematics"), slots, src, uri)
    if chain is not None:
        src.kinematics = {**entry["kinematics"], "chain": chain}
    action = slots.get("action", {})
    relative = action.get("relative", "absolute")
    # a mapping: `mode` and RobotDataset's other relative-action fields, passed as they are
    fields = dict(relative) if isinstance(relative, dict) else {"mode": relative}
    mode = fields.pop("mode", None)
    if mode not in RELATIVE:
        raise DataError(f"{where}: `action.relative` must be one of {', '.join(RELATIVE)} (or "
                        f"a mapping with `mode`); got {relative!r}.")
    dims = action.get("absolute_dims", [])
    if not isinstance(dims, list) or not all(isinstance(d, int) and not isinstance(d, bool)
                                             and 0 <= d < src.widths.get(ACTION, 0)
                                             for d in dims):
        raise DataError(f"{where}: `action.absolute_dims` must list action dims in [0, "
                        f"{src.widths.get(ACTION, 0)}) that stay absolute (grippers); got "
                        f"{dims!r}.")
    if mode != "absolute":
        if STATE not in src.mapping:
            raise DataError(f"{where}: `action.relative: {mode}` is relative to the state; map "
                            "`state` to the robot's state stream.")
        if src.joined:
            raise DataError(f"{where}: relative actions are served from one state and one "
                            f"action stream; this dataset joins {src.joined}; cache them as "
                            "one stream each, or drop `action.relative`.")
        if src.to_ee:
            raise DataError(f"{where}: `to_ee` and `action.relative` together are not served "
                            "yet; cache the end-effector pose as a stream and map it, or drop "
                            "one of them.")
        if (src.mapping[ACTION], src.mapping[STATE]) != (ACTION, STATE):
            raise DataError(f"{where}: relative actions are served under the stream names "
                            f"they are cached with, and this dataset's action and state are "
                            f"{src.mapping[ACTION]!r} and {src.mapping[STATE]!r}; rename them "
                            f"`{ACTION}` and `{STATE}` at ingest, or drop `action.relative`.")
        src.relative = {"mode": mode, "state": src.mapping[STATE], "absolute_dims": dims,
                        **fields}
    episodes = entry.get("episodes")
    cached = {int(e["index"]): int(e["rows"]) for e in manifest["episodes"]}
    if episodes is not None:
        if not isinstance(episodes, list) or not episodes or \
                not all(isinstance(e, int) and e in cached for e in episodes):
            raise DataError(f"{where}: `episodes` must list episodes the cache holds (it holds "
                            f"{len(cached)}, indices {min(cached, default=0)}.."
                            f"{max(cached, default=0)}); got {episodes!r}.")
        src.episode_list = sorted(set(episodes))
    chosen = src.episode_list if src.episode_list is not None else list(cached)
    src.episodes, src.frames = len(chosen), sum(cached[e] for e in chosen)
    if src.instructions is not None and not isinstance(src.instructions, (str, dict)):
        raise DataError(f"{where}: `instructions` must be a JSON file of episode -> "
                        "instructions (or that mapping).")
    if isinstance(src.instructions, str) and not Path(src.instructions).is_absolute():
        src.instructions = str(path.parent / src.instructions)
    if isinstance(src.episode_keys, str) and not Path(src.episode_keys).is_absolute():
        src.episode_keys = str(path.parent / src.episode_keys)
    for what in ("instructions", "episode_keys"):
        value = getattr(src, what)
        if isinstance(value, str) and not Path(value).is_file():
            raise DataError(f"{where}: `{what}` names {value}, which is not a file; fix the "
                            "path (relative paths are relative to the mixture file).")
    return src


def _kinematics(path: Path, name: str, spec: Any, slots: dict, src: Source, uri: str):
    """The chain of a dataset's ``kinematics`` entry, checked against the streams converted
    with ``to_ee`` (their joint dims); the converted widths set in ``src``."""
    where = _where(path, name)
    wanted = [slot for slot, e in slots.items() if e.get("to_ee")]
    if spec is None:
        if wanted:
            raise DataError(f"{where}: `{wanted[0]}.to_ee` converts joints to the end-effector "
                            "pose through the robot's URDF; add `kinematics: {urdf: ..., "
                            "end_link: ...}`.")
        return None
    if not isinstance(spec, dict) or not {"urdf", "end_link"} <= set(spec):
        raise DataError(f"{where}: `kinematics` must be a mapping with `urdf` and `end_link` "
                        "(and optionally `base_link`, `joint_dims`).")
    _unknown(spec, KINEMATICS_KEYS, where, "`kinematics`")
    from robocache.kinematics import Chain

    urdf = spec["urdf"]
    urdf_path = Path(urdf) if Path(urdf).is_absolute() else path.parent / urdf
    try:
        chain = Chain.from_urdf(urdf_path, spec["end_link"], spec.get("base_link"))
    except (URDFError, OSError) as e:
        raise DataError(f"{where}: kinematics: {' '.join(str(e).split())}") from e
    for slot in wanted:
        common = STATE if slot == "state" else ACTION
        width = src.widths[common]
        dims = spec.get("joint_dims", list(range(width)))
        if not isinstance(dims, list) or not all(isinstance(d, int) and 0 <= d < width
                                                 for d in dims) or len(set(dims)) != len(dims):
            raise DataError(f"{where}: `kinematics.joint_dims` must list distinct dims of "
                            f"{slot} ({width}-D) holding the joints; got {dims!r}.")
        if len(dims) != chain.dof:
            fix = (f"name its {chain.dof} joint dims with `kinematics.joint_dims` (the others "
                   "are kept, after the pose)") if len(dims) > chain.dof else \
                "use the URDF of this robot, or an `end_link` with as many joints before it"
            raise DataError(f"{where}: the URDF {urdf}'s chain {chain.base_link} -> "
                            f"{chain.end_link} has {chain.dof} joints, but {slot} "
                            f"{src.mapping[common]!r} has {len(dims)} joint dims; {fix}.")
        src.to_ee.append(common)
        src.widths[common] = 9 + width - len(dims)  # position + rot6d, then the kept dims
    return chain


def _check_widths(path: Path, sources: list[Source], pad: dict[str, int]) -> None:
    for key, slot in ((ACTION, "action"), (STATE, "state")):
        have = [(s.name, s.widths[key]) for s in sources if key in s.widths]
        if key in pad:
            wide = [(n, w) for n, w in have if w > pad[key]]
            if wide:
                raise DataError(f"{_where(path, wide[0][0])}: {slot} is {wide[0][1]}-D, wider "
                                f"than `pad.{slot}: {pad[key]}`; raise `pad.{slot}` to at "
                                f"least {max(w for _, w in have)}.")
        elif len({w for _, w in have}) > 1:
            (n0, w0), (n1, w1) = have[0], next(x for x in have if x[1] != have[0][1])
            raise DataError(f"{_where(path, n1)}: {slot} is {w1}-D where dataset {n0!r} is "
                            f"{w0}-D; add `pad: {{{slot}: {max(w for _, w in have)}}}` (or "
                            f"wider) to serve every {slot} zero-padded with {key}_dim_mask.")


def _weigh(path: Path, sources: list[Source], balance: str) -> None:
    """Each source's normalized weight: its ``weight`` times its balance share."""
    per_embodiment: dict[str, int] = {}
    for s in sources:
        per_embodiment[s.embodiment] = per_embodiment.get(s.embodiment, 0) + s.frames
    raw = []
    for s in sources:
        share = {"none": 1.0, "frames": float(s.frames), "episodes": float(s.episodes),
                 "embodiment": s.frames / per_embodiment[s.embodiment]
                 if per_embodiment[s.embodiment] else 0.0}[balance]
        raw.append(s.given_weight * share)
    total = sum(raw)
    if not total > 0:
        listed = ", ".join(f"{s.name}={s.given_weight:g}" for s in sources)
        raise DataError(f"{path}: the weights sum to {total:g} (datasets {listed}, balance "
                        f"{balance}); give at least one dataset with data a positive `weight`.")
    for s, w in zip(sources, raw, strict=True):
        s.weight = w / total


def open_mixture(path: str | Path, *, tokenizer: Any = None, **overrides):
    """The :class:`MixedDataset` a mixture file describes (see :func:`resolve`); every check
    runs before any episode is read.

    Args:
        path: the mixture file.
        tokenizer: a Hugging Face tokenizer; batches then carry ``task.input_ids`` and
            ``task.attention_mask`` (each distinct prompt tokenized once, here).
        **overrides: the file's top-level settings (``history``, ``horizon``, ``balance``,
            ``pad``, ``max_length``) or :class:`RobotDataset` keywords for every source
            (:data:`DATASET_KWARGS`).
    """
    from robocache.data.dataset import RobotDataset
    from robocache.data.language import Language, event_strings, read_instructions
    from robocache.data.loader import MixedDataset

    kwargs = {k: overrides.pop(k) for k in list(overrides) if k in DATASET_KWARGS}
    bad = sorted(set(overrides) - set(TOP_KEYS) - {"max_length"})
    if bad:
        raise DataError(f"{path}: unknown override {bad[0]!r}; pass one of the file's settings "
                        f"({', '.join(TOP_KEYS[1:])}, max_length), `tokenizer`, or a "
                        f"RobotDataset keyword ({', '.join(DATASET_KWARGS)}).")
    mixture = resolve(path, **overrides)
    relative_ok = "relative_actions" in inspect.signature(RobotDataset).parameters
    instructions = []
    for s in mixture.sources:  # every file read before the caches' data
        where = _where(mixture.path, s.name)
        if s.relative is not None and not relative_ok:
            raise DataError(f"{where}: `action.relative` needs relative actions in "
                            "RobotDataset, which this RoboCache does not have; drop it.")
        instructions.append({} if s.instructions is None else
                            read_instructions(s.instructions, where, s.episode_keys))
    datasets = []
    for s in mixture.sources:
        keys = list(dict.fromkeys([*s.mapping.values(), *(k for v in s.joined.values()
                                                          for k in v)]))
        actions = s.joined.get(ACTION, [s.mapping[ACTION]] if ACTION in s.mapping else [])
        extra = {"relative_actions": {s.mapping[ACTION]: s.relative}} if s.relative else {}
        try:
            ds = RobotDataset(s.path if "://" in s.path else Path(s.path),
                              history=mixture.history, horizon=mixture.horizon, keys=keys,
                              action_keys=actions,
                              episodes=s.episode_list, storage_options=s.storage_options,
                              **kwargs, **extra)
        except DataError as e:
            raise DataError(f"{_where(mixture.path, s.name)}: {e}") from e
        for parts in s.joined.values():
            ds = join(ds, parts)
        for common in s.to_ee:
            ds = to_ee(ds, s.mapping[common], s.kinematics["chain"],
                       s.kinematics.get("joint_dims"))
        datasets.append(ds.renamed({v: k for k, v in s.mapping.items()}))
    mixed = MixedDataset(datasets, [s.weight for s in mixture.sources],
                         names=[s.name for s in mixture.sources], widths=mixture.pad)
    mixed.language = [Language.build(
        [(d.task_names, d.task_id.numpy(), d.episode_index.numpy(), inst)
         for d, inst in zip(datasets, instructions, strict=True)],
        tokenizer, mixture.max_length)]
    keys = dict.fromkeys(k for s in mixture.sources for k in s.language)
    for key in keys:  # string streams (LeRobot's string features: subtasks...), per step
        rows = []
        for d, s in zip(datasets, mixture.sources, strict=True):
            names, ids = event_strings(d, s.language[key]) if key in s.language else \
                ([""], np.zeros(len(d), np.int64))
            rows.append((names, ids, d.episode_index.numpy(), {}))
        mixed.language.append(Language.build(rows, tokenizer, mixture.max_length, key))
    mixed.config = mixture
    return mixed


def relative_stats(path: str | Path, *, device: str | None = None,
                   **overrides) -> dict[str, dict[str, Any]]:
    """The statistics of the relative action chunks of every dataset of a mixture file whose
    action is relative, computed over its whole cache with the file's horizon and stored there
    (:func:`robocache.data.stats.relative_action_stats`), where :meth:`MixedDataset.from_config`
    then finds them: the file drives the statistics as it drives training.

    Returns:
        dataset name -> ``{action key: robocache.Stats}``.
    """
    from robocache.data.stats import relative_action_stats

    mixture = resolve(path, **overrides)
    if mixture.horizon < 1:
        raise DataError(f"{mixture.path}: relative action statistics are of chunks; set "
                        "`horizon` >= 1.")
    out = {}
    for s in mixture.sources:
        if s.relative is None:
            continue
        try:
            out[s.name] = relative_action_stats(
                s.path if "://" in s.path else Path(s.path), {s.mapping[ACTION]: s.relative},
                mixture.horizon, device=device, storage_options=s.storage_options)
        except DataError as e:
            raise DataError(f"{_where(mixture.path, s.name)}: {e}") from e
    return out


def join(ds, keys: list[str]):
    """``ds`` serving streams ``keys`` joined in order as ``keys[0]`` (float32, float64 when
    one of them is; the others no longer served): padded where any of them is, with the
    statistics of the joined values computed here over the served steps."""
    import torch

    from robocache.ops.normalize import compute_stats

    parts = [ds.layout[k] for k in keys]
    dtype = torch.float64 if any(p.dtype == torch.float64 for p in parts) else torch.float32
    values = torch.cat([p.values(ds.data[:, p.col:p.col + p.words]).to(dtype) for p in parts],
                       1)
    pad = torch.zeros(len(ds), dtype=torch.bool, device=ds.device)
    for p in parts:
        if p.pad_col is not None:
            pad |= ds.data[:, p.pad_col] != 0
    return ds.replaced(keys[0], values, compute_stats(values[~pad]), pad=pad, drop=keys[1:])


def to_ee(ds, key: str, chain, joint_dims: list[int] | None = None):
    """``ds`` serving joint stream ``key`` as the end-effector pose through ``chain``
    (:func:`robocache.kinematics.fk` of its ``joint_dims``, default all): position (m) and
    rot6d, then the stream's other dims as they are; statistics of the pose computed here
    over every served step."""
    import torch

    from robocache.kinematics import fk
    from robocache.ops.geometry import matrix_to_rot6d
    from robocache.ops.normalize import compute_stats

    key_ = ds.layout[key]
    q = key_.values(ds.data[:, key_.col:key_.col + key_.words])
    dims = list(range(q.shape[1])) if joint_dims is None else list(joint_dims)
    rest = [d for d in range(q.shape[1]) if d not in dims]
    pose = fk(chain, q[:, dims].to(torch.float64))
    values = torch.cat([pose[:, :3, 3], matrix_to_rot6d(pose[:, :3, :3]),
                        q[:, rest].to(torch.float64)], 1).to(key_.dtype)
    keep = values
    if key_.pad_col is not None:  # statistics of the steps the stream had a sample at
        keep = values[ds.data[:, key_.pad_col] == 0]
    return ds.replaced(key, values, compute_stats(keep.float() if keep.dtype != torch.float64
                                                  else keep))
