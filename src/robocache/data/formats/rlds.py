"""RLDS / TFDS builder directories (Open X-Embodiment, DROID...), read without TensorFlow.

A TFDS dataset version folder holds ``features.json`` (the feature tree), ``dataset_info.json``
(splits, shard lengths) and shards ``<name>-<split>.tfrecord-XXXXX-of-YYYYY``; each record is a
``tf.train.Example`` holding one episode. RLDS episodes nest their ``steps`` (a TFDS
``Dataset``/``Sequence``) beside episode-level features (``episode_metadata``). Pass the
version folder, or its parent (the newest version is picked).

Streams: every step feature becomes a stream named by its path inside ``steps`` with ``.``
(``observation.image``, ``observation.state``, ``action``, ``reward``, ``is_first``...):

- ``Tensor`` / ``Scalar`` / ``ClassLabel`` → numeric, the declared dtype and shape.
- ``Image`` → image stream whose samples stay **encoded** (``StreamSpec.encoding``: ``"jpeg"``
  or ``"png"``; an object array of ``bytes`` per step, no decode, no re-encode).
- ``Text`` → ``language_instruction`` becomes the episode's task(s) (distinct values in step
  order); other text features become event streams (one string per step).

RLDS has no timestamps: step ``k`` is at ``k / fps`` seconds, ``fps`` from the reader option
(``--fps``) or else from :data:`CONTROL_HZ` (control rates of Open X-Embodiment datasets by
dataset name); ``timing`` says which (the manifest and ``inspect`` show it). Episode-level
features go to ``Episode.meta``.

Splits: ``split="train"`` (default: the first split), ``"val"``, slices ``"train[:95%]"``,
``"train[10:20]"``, unions ``"train[:10]+val"``; episode ``i`` is the ``i``-th record of the
selection in shard order. A record whose CRC fails, or that a truncated shard cuts off (or that
a broken length makes unreachable), fails ``read`` with the reason, so ingest quarantines that
episode and goes on.
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from robocache.data.episode import Episode, Stream, StreamSpec
from robocache.data.formats import check_fps, tfrecord
from robocache.errors import DataError

# Control rates (Hz) of Open X-Embodiment datasets, from its dataset overview; RLDS stores none.
CONTROL_HZ = {
    "fractal20220817_data": 3.0, "kuka": 10.0, "bridge": 5.0, "bridge_orig": 5.0,
    "taco_play": 15.0, "jaco_play": 10.0, "berkeley_cable_routing": 10.0, "roboturk": 10.0,
    "viola": 20.0, "berkeley_autolab_ur5": 5.0, "toto": 30.0, "language_table": 10.0,
    "stanford_hydra_dataset_converted_externally_to_rlds": 10.0,
    "austin_buds_dataset_converted_externally_to_rlds": 20.0,
    "austin_sailor_dataset_converted_externally_to_rlds": 20.0,
    "austin_sirius_dataset_converted_externally_to_rlds": 20.0,
    "furniture_bench_dataset_converted_externally_to_rlds": 10.0,
    "ucsd_kitchen_dataset_converted_externally_to_rlds": 2.0,
    "iamlab_cmu_pickup_insert_converted_externally_to_rlds": 20.0,
    "utaustin_mutex": 20.0, "berkeley_fanuc_manipulation": 10.0, "cmu_stretch": 10.0,
    "cmu_play_fusion": 5.0, "stanford_robocook_converted_externally_to_rlds": 5.0,
    "droid": 15.0,
}
TASK_KEY = "language_instruction"
_VERSION = re.compile(r"\d+\.\d+\.\d+")
_SHARD = re.compile(r"(?P<name>.+)-(?P<split>[^-.]+)\.tfrecord-(?P<i>\d{5})-of-(?P<n>\d{5})$")
_SLICE = re.compile(r"^(?P<split>[\w-]+)(\[(?P<lo>-?\d+%?)?:(?P<hi>-?\d+%?)?\])?$")
_DTYPES = {"float32", "float64", "float16", "int8", "int16", "int32", "int64", "uint8",
           "uint16", "uint32", "uint64", "bool"}


@dataclass
class Feature:
    """A node of the feature tree (see :func:`parse_features`).

    Attributes:
        path: ``/``-joined path from the root (``steps/observation/image``).
        kind: ``"dict"``, ``"steps"`` (a Dataset/Sequence), ``"tensor"``, ``"image"``, ``"text"``.
        dtype: NumPy dtype name of tensors and images.
        shape: per-element shape (``-1`` for unknown sizes).
        encoding: ``"jpeg"``/``"png"`` for images; ``"none"``/``"bytes"``/``"zlib"`` for tensors.
        children: sub-features of ``dict`` and ``steps`` nodes.
    """

    path: str
    kind: str
    dtype: str | None = None
    shape: tuple[int, ...] = ()
    encoding: str | None = None
    children: dict[str, Feature] = field(default_factory=dict)

    def leaves(self):
        if self.kind in ("dict", "steps"):
            for c in self.children.values():
                yield from c.leaves()
        else:
            yield self

    def describe(self) -> dict[str, Any]:
        if self.kind in ("dict", "steps"):  # a sequence shows as "<name>[]"
            return {f"{k}[]" if c.kind == "steps" else k: c.describe()
                    for k, c in self.children.items()}
        text = self.kind if self.kind == "text" else \
            f"{self.kind} {self.dtype}{list(self.shape)}"
        return text + (f" {self.encoding}" if self.encoding not in (None, "none") else "")


def _shape(proto: dict) -> tuple[int, ...]:
    return tuple(int(d) for d in proto.get("shape", {}).get("dimensions", []))


def parse_features(tree: dict, path: str = "") -> Feature:
    """The feature tree of a TFDS ``features.json`` (its JSON form of the feature protos).

    Raises:
        DataError: a feature type the reader does not support, named with its path.
    """
    cls = tree.get("pythonClassName", "").rsplit(".", 1)[-1]
    where = path or "<root>"
    if "featuresDict" in tree:
        return Feature(path, "dict", children={
            k: parse_features(v, f"{path}/{k}" if path else k)
            for k, v in tree["featuresDict"]["features"].items()})
    if "sequence" in tree:
        inner = parse_features(tree["sequence"]["feature"], path)
        if inner.kind == "steps" or any(f.kind == "steps" for f in inner.leaves()):
            raise DataError(f"feature {where!r}: nested sequences are not supported.")
        children = inner.children if inner.kind == "dict" else {"": inner}
        return Feature(path, "steps", children=children)
    if "image" in tree:
        img = tree["image"]
        if img.get("encodingFormat", "png") not in ("png", "jpeg"):
            raise DataError(f"feature {where!r}: image encoding {img.get('encodingFormat')!r} "
                            "is not supported (png, jpeg are).")
        return Feature(path, "image", img.get("dtype", "uint8"), _shape(img),
                       img.get("encodingFormat", "png"))
    if "tensor" in tree:
        t = tree["tensor"]
        if t.get("dtype") not in _DTYPES:
            raise DataError(f"feature {where!r}: tensor dtype {t.get('dtype')!r} is not "
                            f"supported (supported: {sorted(_DTYPES)}).")
        if t.get("encoding", "none") not in ("none", "bytes", "zlib"):
            raise DataError(f"feature {where!r}: tensor encoding {t.get('encoding')!r} is not "
                            "supported (none, bytes, zlib are).")
        return Feature(path, "tensor", t["dtype"], _shape(t), t.get("encoding", "none"))
    if "text" in tree:
        return Feature(path, "text", "str")
    if "classLabel" in tree:
        return Feature(path, "tensor", "int64", (), "none")
    raise DataError(f"feature {where!r}: type {cls or sorted(tree)} is not supported (supported: "
                    "FeaturesDict, Dataset/Sequence, Tensor, Scalar, Image, Text, ClassLabel).")


def _version_dir(path: Path) -> Path | None:
    """``path`` if it is a version folder, else its newest version subfolder."""
    if not path.is_dir():
        return None
    if (path / "features.json").exists() or (path / "dataset_info.json").exists() or \
            any(_SHARD.match(p.name) for p in path.glob("*.tfrecord-*")):
        return path
    versions = [p for p in path.iterdir() if p.is_dir() and _VERSION.fullmatch(p.name)]
    if not versions:
        return None
    return max(versions, key=lambda p: tuple(int(x) for x in p.name.split(".")))


def detect(path: Path) -> bool:
    return path.is_dir() and _version_dir(path) is not None


@dataclass
class _Shard:
    path: Path
    declared: int | None
    scan: tfrecord.Scan | None = None


class RldsSource:
    """An RLDS / TFDS dataset version folder (see the module docstring).

    Args:
        path: the version folder, or its parent (the newest version is read).
        split: split expression (``"train"``, ``"train[:95%]"``, ``"train[:10]+val"``);
            default: the first split of ``dataset_info.json``.
        fps: control rate in Hz (steps are ``1 / fps`` apart); default from
            :data:`CONTROL_HZ` by dataset name.

    Raises:
        DataError: no ``features.json``, an unsupported feature (named with its path), no
            ``steps`` sequence, an unknown split or bad slice; ``read`` without a rate for the
            dataset (``rate_error`` says so; the features and splits still describe).
    """

    format = "rlds"

    def __init__(self, path: str | Path, split: str | None = None, fps: float | None = None):
        self.path = Path(path)
        version = _version_dir(self.path)
        if version is None:
            raise DataError(f"{self.path}: not a TFDS dataset folder (no features.json, "
                            "dataset_info.json or *.tfrecord-* shards, nor a version subfolder).")
        self.root = version
        if not (version / "features.json").exists():
            raise DataError(f"{version} looks like a TFDS dataset but has no features.json; "
                            "copy the whole version folder (TFDS writes features.json beside "
                            "dataset_info.json).")
        self.features = parse_features(json.loads((version / "features.json").read_text()))
        steps = [c for c in self.features.children.values() if c.kind == "steps"] \
            if self.features.kind == "dict" else []
        if len(steps) != 1:
            raise DataError(f"{version}: an RLDS episode has one steps sequence "
                            f"(tfds.features.Dataset); found {len(steps)}.")
        self.steps = steps[0]
        info_path = version / "dataset_info.json"
        self.info = json.loads(info_path.read_text()) if info_path.exists() else {}
        self.name = self.info.get("name") or version.parent.name
        self.shards = self._shards()
        self.split = split or next(iter(self.shards), "train")
        self.selection = self._select(self.split)
        # without a rate the features still list (inspect); reading an episode is refused
        self.rate_error: str | None = None
        if fps is not None:
            self.fps, self.timing = check_fps(fps, 0.0, self.path)
        else:
            key = next((k for k in (self.name, version.parent.name, version.parent.parent.name)
                        if k in CONTROL_HZ), None)
            if key is None:
                self.fps = None
                self.rate_error = (f"{version}: RLDS stores no timestamps and {self.name!r} is "
                                   "not in the table of control rates; pass fps=<Hz> (--fps).")
                self.timing = "no timestamps and no known control rate: pass --fps to read"
            else:
                self.fps = CONTROL_HZ[key]
                self.timing = (f"no timestamps: {self.fps:g} Hz, the control rate of {key} (set "
                               "it with --fps)")
        # the cache manifest records the format: a resume with another split is refused
        self.format = f"rlds split={self.split}"
        self.specs: dict[str, StreamSpec] = {}
        for leaf in self.steps.leaves():
            name = self._stream(leaf)
            if leaf.path.rsplit("/", 1)[-1] == TASK_KEY and leaf.kind == "text":
                continue
            if leaf.kind == "image":
                self.specs[name] = StreamSpec(name, "image", leaf.dtype, leaf.shape, self.fps,
                                              encoding=leaf.encoding)
            elif leaf.kind == "text":
                self.specs[name] = StreamSpec(name, "event", "str", (), None)
            else:
                if -1 in leaf.shape:
                    raise DataError(f"feature {leaf.path!r}: a step tensor of unknown shape "
                                    f"{list(leaf.shape)} is not supported.")
                self.specs[name] = StreamSpec(name, "numeric", leaf.dtype, leaf.shape, self.fps)
        self._files: dict[Path, Any] = {}

    def _stream(self, leaf: Feature) -> str:
        return leaf.path[len(self.steps.path) + 1:].replace("/", ".")

    def _shards(self) -> dict[str, list[_Shard]]:
        """Split -> its shards in order; record counts from dataset_info.json when declared."""
        declared = {s["name"]: [int(x) for x in s.get("shardLengths", [])]
                    for s in self.info.get("splits", [])}
        out: dict[str, list[_Shard]] = {}
        for p in sorted(self.root.glob("*.tfrecord-*")):
            m = _SHARD.match(p.name)
            if m:
                lengths = declared.get(m["split"], [])
                i = int(m["i"])
                out.setdefault(m["split"], []).append(
                    _Shard(p, lengths[i] if i < len(lengths) else None))
        for name, lengths in declared.items():  # declared shards that are missing on disk
            have = {int(_SHARD.match(s.path.name)["i"]) for s in out.get(name, [])}
            for i, n in enumerate(lengths):
                if i not in have:
                    p = self.root / f"{self.name}-{name}.tfrecord-{i:05d}-of-{len(lengths):05d}"
                    out.setdefault(name, []).append(_Shard(p, n))
            out.get(name, []).sort(key=lambda s: s.path.name)
        if not out:
            raise DataError(f"{self.root}: no *.tfrecord-XXXXX-of-YYYYY shards.")
        return out

    def _count(self, shard: _Shard) -> int:
        if shard.declared is not None:
            return shard.declared
        return len(self._scan(shard).offsets)

    def _scan(self, shard: _Shard) -> tfrecord.Scan:
        if shard.scan is None:
            shard.scan = tfrecord.scan(shard.path) if shard.path.exists() else \
                tfrecord.Scan([], [], f"{shard.path.name} is missing")
        return shard.scan

    def _select(self, expr: str) -> list[tuple[_Shard, int]]:
        """(shard, record) of each episode of a split expression, in order."""
        out = []
        for part in expr.replace(" ", "").split("+"):
            m = _SLICE.match(part)
            if m is None or m["split"] not in self.shards:
                raise DataError(f"`split` {part!r} is not a split of {self.root} (splits: "
                                f"{sorted(self.shards)}; slices as 'train[:95%]', "
                                "'train[10:20]', joined with '+').")
            records = [(s, r) for s in self.shards[m["split"]] for r in range(self._count(s))]
            n = len(records)
            out += records[slice(_bound(m["lo"], n, 0), _bound(m["hi"], n, n))]
        return out

    def episode_indices(self) -> list[int]:
        return list(range(len(self.selection)))

    def record(self, index: int) -> bytes:
        """The raw record (serialized Example) of episode ``index``, its CRCs checked.

        Raises:
            DataError: the record is corrupt, cut off by a truncated shard, or unreachable
                after a broken length.
        """
        if not 0 <= index < len(self.selection):
            raise DataError(f"episode {index} is out of range (0..{len(self.selection) - 1}).")
        shard, r = self.selection[index]
        scan = self._scan(shard)
        if r >= len(scan.offsets):
            why = scan.error or (f"{shard.path.name} holds {len(scan.offsets)} records, "
                                 f"dataset_info.json declares {shard.declared}")
            raise DataError(f"record {r} of {shard.path.name} is unreadable: {why}.")
        f = self._files.get(shard.path)
        if f is None:
            f = self._files[shard.path] = open(shard.path, "rb")  # noqa: SIM115
        return tfrecord.read_record(f, scan.offsets[r], scan.lengths[r], shard.path.name)

    def read(self, index: int) -> Episode:
        if self.rate_error is not None:
            raise DataError(self.rate_error)
        values = tfrecord.parse_example(self.record(index))
        return self.episode(index, values)

    def episode(self, index: int, values: dict) -> Episode:
        """Build the :class:`Episode` from a parsed record's ``{key: values}``."""
        n = self._num_steps(index, values)
        times = np.arange(n, dtype=np.float64) / self.fps
        streams, tasks = {}, []
        for leaf in self.steps.leaves():
            v = values.get(leaf.path)
            if v is None:
                raise DataError(f"episode {index}: the record lacks feature {leaf.path!r}.")
            name = self._stream(leaf)
            if leaf.kind in ("image", "text"):
                if len(v) != n:
                    raise DataError(f"episode {index}: feature {leaf.path!r} has {len(v)} "
                                    f"values for {n} steps.")
                if leaf.kind == "text" and name.rsplit(".", 1)[-1] == TASK_KEY:
                    tasks = list(dict.fromkeys(b.decode() for b in v))
                    continue
                data = np.empty(n, dtype=object)
                data[:] = v if leaf.kind == "image" else [b.decode() for b in v]
            else:
                data = _tensor(leaf, v, index, leading=n)
            streams[name] = Stream(self.specs[name], times, data)
        meta: dict[str, Any] = {"tasks": tasks, "length": n}
        for leaf in self.features.leaves():
            if leaf.path.startswith(self.steps.path + "/") or leaf.path not in values:
                continue
            v = values[leaf.path]
            if leaf.kind == "text":
                meta[leaf.path] = [b.decode() for b in v] if len(v) != 1 else v[0].decode()
            elif leaf.kind == "tensor":
                t = _tensor(leaf, v, index)
                meta[leaf.path] = t.item() if t.size == 1 else t.tolist()
        return Episode(index, streams, meta)

    def _num_steps(self, index: int, values: dict) -> int:
        for leaf in self.steps.leaves():
            v = values.get(leaf.path)
            if v is None:
                continue
            if leaf.kind in ("image", "text") or leaf.encoding in ("bytes", "zlib"):
                return len(v)
            size = int(np.prod(leaf.shape)) if leaf.shape else 1
            return len(v) // size if size else 0
        raise DataError(f"episode {index}: the record holds no step feature.")

    def describe(self) -> dict[str, Any]:
        """The facts ``inspect`` shows: features, splits (episodes, shards), the rate."""
        splits = {}
        for name, shards in self.shards.items():
            splits[name] = {"episodes": sum(self._count(s) for s in shards),
                            "shards": [s.path.name for s in shards],
                            "bytes": sum(s.path.stat().st_size for s in shards
                                         if s.path.exists())}
        return {"name": self.name, "version": self.root.name, "split": self.split,
                "selected_episodes": len(self.selection), "rate_hz": self.fps,
                "features": self.features.describe(),
                "splits": splits}

    def close(self) -> None:
        for f in self._files.values():
            f.close()
        self._files.clear()


def _bound(text: str | None, n: int, default: int) -> int:
    """A slice bound of ``n`` records: an index, or a percentage rounded to the nearest."""
    if text is None:
        return default
    if text.endswith("%"):
        pct = int(text[:-1])
        return int(round(n * pct / 100)) if pct >= 0 else n - int(round(n * -pct / 100))
    return int(text)


def _tensor(leaf: Feature, v, index: int, leading: int | None = None) -> np.ndarray:
    """A tensor feature's values reshaped to ``[leading, *shape]`` (or ``shape``) as its dtype."""
    dtype = np.dtype(leaf.dtype)
    if leaf.encoding in ("bytes", "zlib"):
        rows = [np.frombuffer(zlib.decompress(b) if leaf.encoding == "zlib" else b, dtype)
                for b in v]
        arr = np.stack(rows) if rows else np.zeros((0,), dtype)
    else:
        arr = np.asarray(v).astype(dtype, copy=False)
    shape = leaf.shape if leading is None else (leading, *leaf.shape)
    try:
        return arr.reshape(shape)
    except ValueError as e:
        raise DataError(f"episode {index}: feature {leaf.path!r} has {arr.size} values, "
                        f"which do not fit shape {list(shape)}.") from e
