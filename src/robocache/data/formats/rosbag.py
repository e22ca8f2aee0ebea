"""ROS bags (rosbag2 with the MCAP or sqlite3 storage, ROS 1 ``.bag``), read without a ROS
install.

A source is a folder of episodes, one bag per episode: each a rosbag2 directory
(``metadata.yaml`` and one or more ``.mcap`` or ``.db3`` files, read in start-time order as one
recording), a bare ``.mcap`` file (``.mcap.zstd``: a file compressed whole, read as it
decompresses) or a ROS 1 ``.bag`` file; a single bag directory or file is a one-episode source.
Storages may sit side by side in one folder. Episodes are numbered in the order of their first
message's log time; ``Episode.meta`` holds the bag's ``path`` and ``files``. MCAP messages are
decoded from the schemas stored in the file by the MCAP project's own packages (``mcap`` and
``mcap-ros2-support``, the ``rosbag`` extra), one sequential pass per file with every chunk's
CRC checked. sqlite3 and ROS 1 bags are read by ``rosbags``' readers (the same extra), their
messages decoded by its type store from the definitions the bag holds (a sqlite3 bag of ROS 2
before Iron holds none: standard types come from its distribution's definitions); the
common layouts of a ROS 1 message are decoded in bulk by the same code as CDR's (the wire
format varies: :mod:`.cdr`), any other converted to the CDR of its ROS 2 form (the header's
``seq`` dropped) and decoded as a ROS 2 message, so every storage goes through one decode
path.

Streams are named by the topic without its leading slash, slashes as dots, then the field
path: ``/joint_states`` ``position`` → ``joint_states.position``, ``/ee_pose``
(``PoseStamped``) → ``ee_pose.pose.position`` and ``ee_pose.pose.orientation``. Quaternions
are stored **wxyz** (``[w, x, y, z]``), as everywhere in RoboCache (ROS's own field order is
``x, y, z, w``). The message types read, and their streams (:data:`VECTORS`):

- ``sensor_msgs/JointState``: ``position``, ``velocity``, ``effort`` (float64 ``[J]``, the
  ones the first message fills), in the joint order of the source's first bag
  (``Episode.meta["joint_names"]``); a message naming the joints in another order is
  reordered, one lacking a joint (or naming a new one) quarantines the episode.
- ``geometry_msgs`` ``Pose``/``PoseStamped``/``PoseWithCovarianceStamped``, ``Transform``/
  ``TransformStamped``, ``Twist``/``TwistStamped``, ``Accel``/``AccelStamped``, ``Wrench``/
  ``WrenchStamped``, ``Point``/``PointStamped``, ``Vector3``/``Vector3Stamped``,
  ``Quaternion``/``QuaternionStamped``; ``sensor_msgs/Imu``; ``nav_msgs/Odometry``: float64
  ``[3]`` vectors ``xyz`` and ``[4]`` quaternions ``wxyz`` (covariances are not read).
- ``std_msgs`` ``Float32/64``, ``Int8..64``, ``UInt8..64``, ``Bool``: a scalar ``data`` in its
  own dtype; ``Float32/64MultiArray``, ``Int32/64MultiArray``: ``data`` ``[N]`` (N fixed by the
  first message).
- ``sensor_msgs/CompressedImage``: a camera whose JPEG/PNG bytes are kept as they came (no
  decode, no re-encode); ``sensor_msgs/Image`` in ``rgb8``, ``bgr8`` (stored as RGB), ``mono8``
  (grey, stored as RGB) or ``16UC1``/``mono16`` (depth, uint16): a camera encoded at ingest
  like any other. Camera streams are named by the topic alone (``/wrist/image`` → ``wrist.image``).
- ``std_msgs/String``: an event stream ``<topic>.data``; the topic named by ``task_topic``
  (``--task-topic``) gives the episode's task(s) instead (distinct strings in order).

- ``sensor_msgs/MagneticField``: ``magnetic_field`` ``[3]``; ``sensor_msgs/LaserScan``:
  ``ranges`` (and ``intensities``) ``[N]``, the scan's geometry in
  ``Episode.meta["sensors"][<topic>]``; ``sensor_msgs/CameraInfo``: no stream, its calibration
  there; ``tf2_msgs/TFMessage``: pose streams per frame pair (:mod:`.tf`).
- ``sensor_msgs/PointCloud2``: ``points`` ``[N, 3]`` (``x, y, z``), ``N`` fixed by the first
  message (a topic whose count varies is not read).
- Any other message with numeric fields (``NavSatFix``, ``Joy``, control and custom
  messages): mapped from its definition (:mod:`.generic`).

Middleware types (``/rosout``'s ``rcl_interfaces/Log``, ``/parameter_events``...), point
clouds and messages without numeric fields are skipped without being decoded and listed once
in ``timing`` (the ingest summary shows it).

Times: ``header.stamp`` where the message has a header (a topic whose stamps are all zero,
never set by its publisher, uses log times), else the log time; ``time_source="log"``
(``--log-time``) uses log times for every topic. Stream times are float64 epoch seconds, the
nearest double to the nanosecond stamp (about 0.24 µs apart near 2026); the exact int64
nanoseconds are kept beside in ``Episode.meta["stamps_ns"]`` (stream -> ``[S]``).

Bad input quarantines the episode with the file, topic, message index and reason: a chunk
whose CRC fails or that does not parse, a schema that does not parse, a message that does not
decode or does not fit its stream, time going backwards within a topic. A truncated file (a
recorder killed mid-write: no summary, the last chunk cut off) quarantines it too, or with
``allow_truncated=True`` (``--allow-truncated``) the episode keeps every message up to the last
complete chunk, and ``Episode.meta["truncated"]`` says what was cut. A ``.db3`` without its
``metadata.yaml`` (or with one that is not rosbag2's, names another storage or lacks a file),
locked by another process, with a write-ahead log of messages not yet in the database, or
damaged; a ROS 1 bag without its index (a recording that did not close, ``.bag.active``): each
quarantines its episode with the file and reason.
"""

from __future__ import annotations

import contextlib
import functools
import io
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from robocache._optional import require
from robocache.data.episode import Episode, Stream, StreamSpec
from robocache.data.formats import cdr, generic, tf
from robocache.errors import DataError

XYZ = ("x", "y", "z")
WXYZ = ("w", "x", "y", "z")
# type -> (field path, leaf attributes) of each float64 vector stream, in stream order
_STAMPED = {
    "Pose": (("position", XYZ), ("orientation", WXYZ)),
    "Transform": (("translation", XYZ), ("rotation", WXYZ)),
    "Twist": (("linear", XYZ), ("angular", XYZ)),
    "Accel": (("linear", XYZ), ("angular", XYZ)),
    "Wrench": (("force", XYZ), ("torque", XYZ)),
    "Point": (("", XYZ),),
    "Vector3": (("", XYZ),),
    "Quaternion": (("", WXYZ),),
}
_FIELD = {"Pose": "pose", "Transform": "transform", "Twist": "twist", "Accel": "accel",
          "Wrench": "wrench", "Point": "point", "Vector3": "vector", "Quaternion": "quaternion"}


def _join(*parts: str) -> str:
    return ".".join(p for p in parts if p)


VECTORS: dict[str, tuple[tuple[str, tuple[str, ...]], ...]] = {
    **{f"geometry_msgs/msg/{t}": f for t, f in _STAMPED.items()},
    **{f"geometry_msgs/msg/{t}Stamped": tuple((_join(_FIELD[t], p), a) for p, a in f)
       for t, f in _STAMPED.items()},
    "geometry_msgs/msg/PoseWithCovarianceStamped": (("pose.pose.position", XYZ),
                                                    ("pose.pose.orientation", WXYZ)),
    "sensor_msgs/msg/Imu": (("orientation", WXYZ), ("angular_velocity", XYZ),
                            ("linear_acceleration", XYZ)),
    "nav_msgs/msg/Odometry": (("pose.pose.position", XYZ), ("pose.pose.orientation", WXYZ),
                              ("twist.twist.linear", XYZ), ("twist.twist.angular", XYZ)),
    "sensor_msgs/msg/MagneticField": (("magnetic_field", XYZ),),
}
SCALARS = {f"std_msgs/msg/{t}": t.lower() for t in
           ("Float32", "Float64", "Int8", "Int16", "Int32", "Int64", "UInt8", "UInt16", "UInt32",
            "UInt64", "Bool")}
ARRAYS = {f"std_msgs/msg/{t}MultiArray": t.lower() for t in ("Float32", "Float64", "Int32",
                                                              "Int64")}
JOINT_STATE = "sensor_msgs/msg/JointState"
JOINT_FIELDS = ("position", "velocity", "effort")
COMPRESSED = "sensor_msgs/msg/CompressedImage"
IMAGE = "sensor_msgs/msg/Image"
STRING = "std_msgs/msg/String"
# raw Image encodings read: encoding -> (dtype, channels in the message)
RAW_ENCODINGS = {"rgb8": ("uint8", 3), "bgr8": ("uint8", 3), "mono8": ("uint8", 1),
                 "16UC1": ("uint16", 1), "mono16": ("uint16", 1)}
TIME_SOURCES = ("header", "log")


def _mcap():
    require("mcap_ros2.decoder", "rosbag", "Reading ROS 2 bags", "mcap-ros2-support")
    return require("mcap.stream_reader", "rosbag", "Reading ROS 2 bags", "mcap")


def _type_name(name: str) -> str:
    """``pkg/Type`` or ``pkg/msg/Type`` → ``pkg/msg/Type``."""
    parts = name.split("/")
    return f"{parts[0]}/msg/{parts[1]}" if len(parts) == 2 else name


def stream_base(topic: str) -> str:
    """The stream-name prefix of a topic: no leading slash, slashes as dots."""
    return topic.strip("/").replace("/", ".")


MCAP_SUFFIXES = (".mcap", ".mcap.zstd")  # .zstd: rosbag2's --compression-mode file
SQLITE_SUFFIXES = (".db3", ".db3.zstd")
# .bag.active: a ROS 1 recording that never closed (listed, so that it is refused by name)
ROS1_SUFFIXES = (".bag", ".bag.active")
STORAGES = {"mcap": MCAP_SUFFIXES, "sqlite3": SQLITE_SUFFIXES, "ros1": ROS1_SUFFIXES}


def storage(file: Path) -> str | None:
    """The storage of a bag file by its name: ``"mcap"``, ``"sqlite3"``, ``"ros1"`` or
    ``None``."""
    return next((k for k, suffixes in STORAGES.items() if file.name.endswith(suffixes)), None)


def _is_bag_file(path: Path) -> bool:
    return path.is_file() and storage(path) is not None


def _bag_files(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if _is_bag_file(p))


@contextlib.contextmanager
def _open(file: Path):
    """``(stream, raw file)``: the MCAP bytes of ``file`` (a ``.mcap.zstd`` decompressed as
    it is read) and the file itself (whose position tells how far reading got)."""
    with open(file, "rb") as raw:
        if file.name.endswith(".zstd"):
            zstd = require("zstandard", "rosbag", "Reading zstd-compressed bags")
            with zstd.ZstdDecompressor().stream_reader(raw) as stream:
                yield stream, raw
        else:
            yield raw, raw


def bags(path: Path) -> list[tuple[Path, list[Path]]]:
    """The bags of a source: ``(bag path, its files)``, in directory order. A bag is a
    rosbag2 directory (``metadata.yaml`` beside its ``.mcap`` / ``.db3`` files) or one file
    (``.mcap``, ``.db3``, ROS 1 ``.bag``); a ``.db3`` or ``.bag`` that cannot be read is still
    a bag, whose episode says why."""
    if path.is_file():
        return [(path, [path])] if _is_bag_file(path) else []
    if not path.is_dir():
        return []
    own = _bag_files(path)
    if own and (path / "metadata.yaml").exists():
        found = [(path, [f for f in own if storage(f) != "ros1"])] + \
            [(f, [f]) for f in own if storage(f) == "ros1"]
        return [b for b in found if b[1]]
    out = [(p, [p]) for p in own]
    for sub in sorted(p for p in path.iterdir() if p.is_dir()):
        files = _bag_files(sub)
        if not files:
            continue
        if (sub / "metadata.yaml").exists() or all(storage(f) != "ros1" for f in files):
            out.append((sub, [f for f in files if storage(f) != "ros1"]))
            files = [f for f in files if storage(f) == "ros1"]
        out += [(f, [f]) for f in files]
    return sorted((b for b in out if b[1]), key=lambda b: str(b[0]))


# beside a bag's files: what rosbag2 and sqlite3 leave there
_COMPANIONS = ("metadata.yaml", "-wal", "-shm", "-journal")


def not_bags(path: Path) -> list[Path]:
    """The files of a source folder (and of its bag folders) that are not part of a bag."""
    if not path.is_dir():
        return []
    out = []
    for folder in [path, *sorted(p for p in path.iterdir() if p.is_dir())]:
        if folder is not path and not _bag_files(folder):
            continue
        out += [f for f in sorted(folder.iterdir()) if f.is_file() and not f.name.startswith(
            ".") and storage(f) is None and not f.name.endswith(_COMPANIONS)]
    return out


def detect(path: Path) -> bool:
    return bool(bags(path))


def _seconds(ns: np.ndarray) -> np.ndarray:
    """int64 epoch nanoseconds → float64 seconds, rounded once (the whole seconds are exact)."""
    sec, rem = np.divmod(ns, 1_000_000_000)
    return sec.astype(np.float64) + rem.astype(np.float64) / 1e9


@dataclass
class _Topic:
    """What one topic collects during a pass over a bag."""

    topic: str
    type: str
    decode: Any = None
    log_ns: list[int] = None
    stamp_ns: list[int] = None
    values: list[Any] = None
    skipped: str | None = None  # why the topic is not read (no mapping, not selected)
    raw: list[bytes] | None = None  # messages kept as CDR bytes, decoded in bulk at the end
    wire: cdr.Wire = cdr.CDR  # how the kept bytes are serialized (ROS 1 bags: cdr.ROS1)
    generic: list | None = None  # the leaves of a message mapped from its definition
    sensor: dict | None = None  # what a topic puts in Episode.meta["sensors"]
    count: int = 0  # messages on the topic, read or not
    first_ns: int | None = None  # log times of its first and last message
    last_ns: int | None = None

    def __post_init__(self):
        self.log_ns, self.stamp_ns, self.values = [], [], []
        if self.type in cdr.LAYOUTS or self.type in SCALARS or self.type in (JOINT_STATE,
                                                                             COMPRESSED):
            self.raw = []

    def seen(self, log_ns: int) -> None:
        self.count += 1
        self.last_ns = log_ns
        if self.first_ns is None:
            self.first_ns = log_ns

    def facts(self) -> dict[str, Any]:
        """Type, message count and mean log-time rate (Hz) of the topic."""
        span = (self.last_ns - self.first_ns) / 1e9 if self.count > 1 else 0.0
        return {"type": self.type, "messages": self.count,
                "rate_hz": round((self.count - 1) / span, 3) if span > 0 else None}


class RosbagSource:
    """A folder of ROS 2 bags, one per episode (see the module docstring).

    Args:
        path: the folder of bags, one bag directory, or one ``.mcap`` file.
        topics: read only these topics (``--topic``; default: every mapped topic).
        exclude_topics: never read these topics (``--exclude-topic``).
        task_topic: a ``std_msgs/String`` topic whose strings are the episode's task
            (``--task-topic``).
        time_source: ``"header"`` (``header.stamp`` where present, else the log time) or
            ``"log"`` (``--log-time``: the log time of every message).
        allow_truncated: keep a truncated bag's messages up to its last complete chunk instead
            of quarantining it (``--allow-truncated``).

    Raises:
        DataError: no bag at ``path``, a bad option (named), a topic that ``topics`` or
            ``task_topic`` names but the first readable bag lacks, or no readable bag.
        MissingDependencyError: ``mcap`` / ``mcap-ros2-support`` are not installed.
    """

    format = "rosbag"

    def __init__(self, path: str | Path, *, topics: list[str] | None = None,
                 exclude_topics: list[str] | None = None, task_topic: str | None = None,
                 time_source: str = "header", allow_truncated: bool = False,
                 tf_chains: list[str | tuple[str, str]] | None = None):
        self.path = Path(path)
        _mcap()
        self.tf_chains = [_tf_chain(c) for c in tf_chains or ()]
        if time_source not in TIME_SOURCES:
            raise DataError(f"`time_source` must be one of {TIME_SOURCES}; got "
                            f"{time_source!r} (--log-time sets 'log').")
        self.topics = [_topic(t) for t in topics] if topics else None
        self.exclude = {_topic(t) for t in exclude_topics or ()}
        self.task_topic = _topic(task_topic) if task_topic else None
        self.time_source, self.allow_truncated = time_source, allow_truncated
        found = bags(self.path)
        if not found:
            raise DataError(f"{self.path}: no ROS bag (a rosbag2 directory with .mcap or .db3 "
                            "files, .mcap files, or ROS 1 .bag files).")
        # episodes in the order of their first message (a bag that cannot tell goes last)
        self._starts = {}
        for bag, files in found:
            if all(storage(f) == "mcap" for f in files):
                self._starts.update((f, _start_ns(f)) for f in files)
            else:
                self._starts.update(dict.fromkeys(files, _rosbags_start_ns(bag, files)))
        starts = [min((self._starts[f] for f in files if self._starts[f] is not None),
                      default=None) for _, files in found]
        order = sorted(range(len(found)), key=lambda i: (starts[i] is None, starts[i] or 0, i))
        self.bags = [found[i] for i in order]
        self._first: Episode | None = None
        self.topic_table: dict[str, dict] = {}
        reasons = []
        for index in range(len(self.bags)):
            # what a bag that fails half-way declared is dropped with it
            self.joint_names: dict[str, list[str]] = {}
            self.skipped: dict[str, str] = {}
            self.specs: dict[str, StreamSpec] = {}
            try:
                self._first = self._read(index, discover=True)
                break
            except DataError as e:
                reasons.append(f"episode {index} ({self.bags[index][0]}): {e}")
        if self._first is None:
            raise DataError(f"{self.path}: no bag could be read; {reasons[0]}")
        missing = [t for t in (self.topics or []) + [self.task_topic] if t and
                   t not in self._seen]
        if missing:
            raise DataError(f"{self.bags[self._first.index][0]}: topics {missing} (from --topic "
                            f"/ --task-topic) are not in the bag; its topics: "
                            f"{sorted(self._seen)}.")
        self.fps = None  # bags have no frame rate: ingest at an explicit --rate
        how = ("log times" if time_source == "log" else
               "header.stamp where a message has one, else log times")
        self.timing = f"ROS bags: {how}"
        if self.skipped:
            self.timing += "; not read: " + ", ".join(f"{t} ({why})" for t, why in
                                                      sorted(self.skipped.items()))

    def episode_indices(self) -> list[int]:
        return list(range(len(self.bags)))

    def locate(self, index: int) -> str:
        """The bag of episode ``index``."""
        return str(self.bags[index][0])

    def read(self, index: int) -> Episode:
        if not 0 <= index < len(self.bags):
            raise DataError(f"{self.path}: no episode {index} (it has {len(self.bags)}).")
        if self._first is not None and self._first.index == index:
            episode, self._first = self._first, None  # read once, while finding the streams
            return episode
        return self._read(index)

    def _wanted(self, topic: str, type_: str) -> str | None:
        """Why ``topic`` is not read (``None``: it is)."""
        if topic in self.exclude or (self.topics is not None and topic not in self.topics
                                     and topic != self.task_topic):
            return "not selected"
        if type_ in VECTORS or type_ in SCALARS or type_ in ARRAYS or type_ in (
                JOINT_STATE, COMPRESSED, IMAGE, STRING, tf.TF, POINT_CLOUD):
            return None
        return f"{type_}: no mapping"

    def _read(self, index: int, discover: bool = False) -> Episode:
        """One pass over the bag's files; ``discover``: declare the specs from it."""
        bag, files = self.bags[index]
        topics: dict[str, _Topic] = {}
        truncated = None
        if _storage_of(files) == "mcap":
            for file in sorted(files, key=lambda f: (self._starts[f] or 0, f.name)):
                cut = self._pass(file, topics)
                if cut:
                    truncated = cut
                    break  # later files of the bag would leave a gap
        else:
            self._pass_rosbags(bag, files, topics)
        for t in topics.values():
            if not t.skipped:
                self._bulk(t, bag.name)
        if discover:
            self._seen = set(topics)
        streams: dict[str, Stream] = {}
        meta: dict[str, Any] = {"path": str(bag), "files": [str(f) for f in files],
                                "tasks": [], "stamps_ns": {}, "joint_names": {}}
        if truncated:
            meta["truncated"] = truncated

        def add(name: str, spec: StreamSpec, ns: np.ndarray, data) -> None:
            if discover:
                self.specs[name] = spec
                self._check_new(name)
            elif name not in self.specs:
                return  # a topic the first bag lacked: not a stream of this source
            streams[name] = Stream(self.specs[name], _seconds(ns), data)
            meta["stamps_ns"][name] = ns

        tf_topics = []
        table = meta["topics"] = {t.topic: {**t.facts(), "streams": [], "not_read": None}
                                  for t in topics.values()}
        for t in topics.values():
            if t.skipped:
                if discover and t.skipped != "not selected":
                    self.skipped[t.topic] = t.skipped
                table[t.topic]["not_read"] = t.skipped
                continue
            if t.type == tf.TF:
                tf_topics.append((t.topic, t.log_ns, t.values))
                continue
            ns = self._times(t)
            if t.topic == self.task_topic:
                if t.type != STRING:
                    raise DataError(f"--task-topic {t.topic} carries {t.type}, not "
                                    f"{STRING}.")
                meta["tasks"] = list(dict.fromkeys(t.values))
                table[t.topic]["not_read"] = "the episode's task (--task-topic)"
                continue
            try:
                produced = list(self._streams(t, discover))
            except _Unmapped as e:  # a topic whose samples fit no fixed-shape stream
                if any(n.startswith(stream_base(t.topic) + ".") for n in self.specs) and \
                        not discover:
                    raise DataError(str(e)) from None
                produced, t.skipped = [], f"{t.type}: {e}"
            if t.skipped:  # a frame format found unread while making its streams
                if discover:
                    self.skipped[t.topic] = t.skipped
                table[t.topic]["not_read"] = t.skipped
                continue
            for name, spec, data in produced:
                add(name, spec, ns, data)
                table[t.topic]["streams"].append(name)
            if t.sensor is not None:
                meta.setdefault("sensors", {})[stream_base(t.topic)] = t.sensor
                if not produced:
                    table[t.topic]["not_read"] = (f"into Episode.meta['sensors']"
                                                  f"['{stream_base(t.topic)}']")
        if tf_topics or self.tf_chains:
            for name, spec, ns, data in self._tf_streams(tf_topics, meta["stamps_ns"], meta):
                add(name, spec, ns, data)
            static = {tf.stream_base(p, c) for p, c, kind in meta["tf_frames"]
                      if kind == "static"}
            for topic, *_ in tf_topics:
                table[topic]["streams"] = [
                    n for n in streams if n.startswith("tf.") and
                    (n.rsplit(".", 1)[0] in static) == (topic == tf.TF_STATIC_TOPIC)]
        self._tabulate(table)
        meta["joint_names"] = {k: v for k, v in self.joint_names.items()
                               if any(n.startswith(k + ".") for n in streams)}
        meta["length"] = sum(len(s) for s in streams.values())
        return Episode(index, streams, meta)

    def _tf_streams(self, tf_topics, stamps: dict[str, np.ndarray], meta: dict):
        """``(name, spec, ns, data)`` of every TF pair and requested chain
        (:mod:`~robocache.data.formats.tf`); static pairs held over the span of the other
        streams (``stamps``) and the moving pairs."""
        links = tf.links(tf_topics, self.time_source == "log")
        moving = [link.ns for link in links if not link.static]
        ends = [(int(ns[0]), int(ns[-1])) for ns in [*stamps.values(), *moving] if len(ns)]
        if not ends:
            ends = [(int(link.log_ns[0]), int(link.log_ns[-1])) for link in links]
        start, end = min(a for a, _ in ends), max(b for _, b in ends)
        links = [tf.hold_static(link, start, end) if link.static else link for link in links]
        meta["tf_frames"] = [(link.parent, link.child, "static" if link.static else "moving")
                             for link in links]
        out = {(link.parent, link.child): (link.ns, link.values, _rate(link.log_ns)
                                           if not link.static else None) for link in links}
        for source, target in self.tf_chains:
            if (source, target) not in out:
                path = tf.chain(links, source, target)
                ns, values = tf.compose(path)
                rates = [_rate(link.log_ns) for link, _ in path if not link.static]
                out[(source, target)] = (ns, values, max((r for r in rates if r), default=None))
        for (parent, child), (ns, values, rate) in out.items():
            base = tf.stream_base(parent, child)
            yield (f"{base}.position", StreamSpec(f"{base}.position", "numeric", "float64",
                                                  (3,), rate), ns, values[:, :3])
            yield (f"{base}.orientation", StreamSpec(f"{base}.orientation", "numeric",
                                                     "float64", (4,), rate, quaternion=True),
                   ns, values[:, 3:])

    def _check_new(self, name: str) -> None:
        clash = [n for n in self.specs if n != name and n.startswith(name + ".")]
        if clash:
            raise DataError(f"stream {name!r} (a camera or bare-vector topic) is the prefix of "
                            f"{clash}; exclude one of the topics (--exclude-topic).")

    def _pass(self, file: Path, topics: dict[str, _Topic]) -> str | None:
        """Read one file's messages into ``topics``; returns what truncation cut (when
        allowed), raises on bad input."""
        from mcap_ros2.decoder import DecoderFactory

        factory = DecoderFactory()
        size = file.stat().st_size
        count = 0
        with _open(file) as (stream, f):
            try:
                for channel, schema, record in iter_messages(stream):
                    count += 1
                    self._message(channel, schema, record, factory, topics, file)
            except DataError:
                raise
            except Exception as e:  # the mcap reader fails in its own ways on damaged files
                # the stream reads ahead of what it parsed: at the end, the file was cut
                at_end = f.tell() >= size
                what = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                if at_end:
                    cut = f"{file.name} is truncated after {count} complete messages ({what})"
                    if self.allow_truncated:
                        return cut
                    raise DataError(f"{cut}; pass --allow-truncated (allow_truncated=True) "
                                    "to keep the messages before the cut.") from e
                raise DataError(f"{file.name}: unreadable after {count} messages (a chunk "
                                f"with a bad CRC or damaged records: {what}).") from e
        return None

    def _message(self, channel, schema, record, factory, topics, file: Path) -> None:
        if channel is None:
            raise DataError(f"{file.name}: a message on channel {record.channel_id}, which no "
                            "channel record declares.")
        t = topics.get(channel.topic)
        if t is None:
            type_ = _type_name(schema.name) if schema else "(no schema)"
            t = self._new_topic(topics, channel.topic, type_,
                                lambda: _mcap_decoder(factory, channel, schema, file),
                                (lambda: _schema_nodes(schema, type_)) if schema else None)
        t.seen(record.log_time)
        if not t.skipped:
            self._collect(t, record.log_time, record.data, file.name)

    def _new_topic(self, topics: dict[str, _Topic], topic: str, type_: str, decoder,
                   nodes=None) -> _Topic:
        """Declare a topic at its first message; ``decoder()`` makes its decode function
        (raising :class:`_Unmapped` where the topic cannot be decoded but the bag is sound),
        ``nodes()`` the parsed definitions that map a type without its own mapping."""
        t = topics[topic] = _Topic(topic, type_)
        t.skipped = self._wanted(topic, type_)
        if type_ in NOT_MAPPED:
            t.skipped = f"{type_}: {NOT_MAPPED[type_]}"
        elif t.skipped == f"{type_}: no mapping" and nodes is not None and \
                not type_.startswith(generic.NOT_DATA):
            try:
                plan, _ = generic.leaves(nodes(), type_)
            except Exception:  # no usable definition: stays unmapped
                plan = []
            if type_ in ONLY:
                plan = [leaf for leaf in plan if leaf.path in ONLY[type_]]
            if plan or type_ in SENSOR_META:
                t.generic, t.skipped = plan, None
            else:
                t.skipped = f"{type_}: no numeric field"
        if t.skipped is None:
            try:
                t.decode = decoder()
            except _Unmapped as e:
                t.skipped = f"{type_}: {e}"
        return t

    def _collect(self, t: _Topic, log_ns: int, data: bytes, file: str) -> None:
        """One message of a read topic: kept as CDR bytes or decoded now."""
        t.log_ns.append(log_ns)
        if t.raw is not None:
            t.raw.append(data)
            return
        if t.type == IMAGE and not t.values:  # an encoding not read skips the topic
            try:
                encoding = t.decode(data).encoding
            except Exception:  # undecodable: _decode below names the message
                encoding = None
            if encoding is not None and encoding not in RAW_ENCODINGS:
                t.skipped = f"{t.type} {encoding}: no mapping"
                return
        stamp, value = _decode(t, data, len(t.values), file)
        t.stamp_ns.append(stamp)
        t.values.append(value)

    def _pass_rosbags(self, bag: Path, files: list[Path], topics: dict[str, _Topic]) -> None:
        """Read a sqlite3 rosbag2 directory or a ROS 1 bag into ``topics`` through
        ``rosbags``' readers; ROS 1 messages are kept in their own serialization (the topic's
        ``wire``), which the bulk decode and the topic's decode function read."""
        kind = _storage_of(files)
        opener = _rosbags_reader(bag, files, kind)
        name = bag.name
        count = 0
        try:
            with opener as reader:
                store, unread = _typestore(reader, kind)
                messages = _ros1_messages(bag, {c.id: c for c in reader.connections}) \
                    if kind == "ros1" else reader.messages()
                for conn, log_ns, data in messages:
                    t = topics.get(conn.topic)
                    if t is None:
                        t = self._new_topic(topics, conn.topic, conn.msgtype, functools.partial(
                            _rosbags_decoder, store, conn, unread, kind),
                            lambda: store.fielddefs)
                        t.wire = cdr.ROS1 if kind == "ros1" else cdr.CDR
                    count += 1
                    t.seen(log_ns)
                    if t.skipped:
                        continue
                    self._collect(t, log_ns, data, name)
            if kind == "ros1":
                for t in topics.values():
                    _in_log_order(t)
        except DataError:
            raise
        except Exception as e:  # the storage fails in its own ways on damaged files
            what = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            raise DataError(f"{name}: unreadable after {count} messages ({what}).") from e

    def _bulk(self, t: _Topic, file: str) -> None:
        """Decode the messages a topic kept as CDR bytes: together where the layout allows
        (:mod:`~robocache.data.formats.cdr`, checked against mcap-ros2-support on the first
        message), else one by one with mcap-ros2-support (which names a bad message)."""
        raw, t.raw = t.raw, None
        if not raw:
            return
        fast = None
        try:
            if t.type in cdr.LAYOUTS:
                got = cdr.vectors(raw, t.type, t.wire)
                if got is not None:
                    values, stamps = got
                    fast = (stamps if stamps is not None else np.full(len(raw), -1), values)
            elif t.type in SCALARS:
                values = cdr.scalars(raw, SCALARS[t.type], t.wire)
                if values is not None:
                    fast = (np.full(len(raw), -1), values)
            elif t.type == JOINT_STATE:
                fast = cdr.joint_states(raw, t.wire)
            else:
                pairs = [cdr.compressed_image(data, t.wire) for data in raw]
                fast = (np.array([st for st, _ in pairs], np.int64),
                        [_image_bytes(v) for _, v in pairs])
        except Exception:  # a message the fixed layout does not fit: decoded one by one
            fast = None
        if fast is not None and _same(_decode(t, raw[0], 0, file), (fast[0][0], _first(
                t, fast[1]))):
            t.stamp_ns, t.values = fast
            return
        decoded = [_decode(t, data, i, file) for i, data in enumerate(raw)]
        t.stamp_ns = [st for st, _ in decoded]
        t.values = [v for _, v in decoded]
        if t.type == JOINT_STATE:
            t.values = _joint_groups(t.values)

    def _times(self, t: _Topic) -> np.ndarray:
        """int64 ns of the topic's messages, checked non-decreasing."""
        stamps = np.asarray(t.stamp_ns, np.int64)
        use_log = self.time_source == "log" or not len(stamps) or stamps[0] < 0 or \
            not stamps.any()
        ns = np.asarray(t.log_ns, np.int64) if use_log else stamps
        back = np.flatnonzero(np.diff(ns) < 0)
        if back.size:
            i = int(back[0]) + 1
            which = "log time" if use_log else "header.stamp"
            raise DataError(f"topic {t.topic} message {i}: time goes backwards ({which} "
                            f"{int(ns[i - 1])} ns, then {int(ns[i])} ns).")
        return ns

    def _streams(self, t: _Topic, discover: bool):
        """``(name, spec, data)`` of each stream of a topic."""
        base = stream_base(t.topic)
        rate = _rate(t.log_ns)
        n = len(t.values)
        if t.generic is not None:
            yield from self._generic(t, base, rate)
        elif t.type == POINT_CLOUD:
            yield from _points(t, base, rate)
        elif t.type == STRING:
            data = np.empty(n, dtype=object)
            data[:] = t.values
            yield _join(base, "data"), StreamSpec(_join(base, "data"), "event", "str", ()), data
        elif t.type == JOINT_STATE:
            yield from self._joints(t, base, rate, discover)
        elif t.type in VECTORS:
            fields = VECTORS[t.type]
            values = np.asarray(t.values, np.float64).reshape(n, -1)
            at = 0
            for path, attrs in fields:
                name = _join(base, path)
                yield name, StreamSpec(name, "numeric", "float64", (len(attrs),), rate,
                                       quaternion=attrs == WXYZ), values[:, at:at + len(attrs)]
                at += len(attrs)
        elif t.type in SCALARS or t.type in ARRAYS:
            name = _join(base, "data")
            dtype = SCALARS.get(t.type) or ARRAYS[t.type]
            dtype = "bool" if dtype == "bool" else dtype
            if t.type in ARRAYS:
                sizes = [len(v) for v in t.values]
                bad = next((i for i, s in enumerate(sizes) if s != sizes[0]), None)
                if bad is not None:
                    raise DataError(f"topic {t.topic} message {bad}: {sizes[bad]} values, the "
                                    f"first message has {sizes[0]}.")
                values = np.asarray(t.values, dtype).reshape(n, sizes[0] if n else 0)
                shape = (values.shape[1],)
            else:
                values, shape = np.asarray(t.values, dtype), ()
            yield name, StreamSpec(name, "numeric", np.dtype(dtype).name, shape, rate), values
        else:
            yield from _camera(t, base, rate)

    def _generic(self, t: _Topic, base: str, rate: float | None):
        """The streams of a message mapped from its definition (:mod:`generic`)."""
        for leaf, data in generic.columns(t.topic, t.values, t.generic):
            name = _join(base, leaf.path)
            yield name, StreamSpec(name, "numeric", np.dtype(leaf.dtype).name, data.shape[1:],
                                   rate, quaternion=leaf.kind == "quaternion"), data

    def _joints(self, t: _Topic, base: str, rate: float | None, discover: bool):
        """The JointState streams from the topic's groups (:func:`_joint_groups`), columns in
        the source's joint order."""
        first = _first(t, t.values) if t.values else None
        names0 = self.joint_names.get(base)
        if names0 is None:
            if not discover:
                return
            names0 = self.joint_names[base] = list(first[0]) if first else []
        where = {n: j for j, n in enumerate(names0)}
        fields = [k for k in range(len(JOINT_FIELDS)) if first and len(first[k + 1])]
        n, width = len(t.log_ns), len(names0)
        out = {k: np.empty((n, width), np.float64) for k in fields}
        for names, rows, arrays in sorted(t.values, key=lambda g: g[1][0]):
            i = int(rows[0])
            lacking = [j for j in names0 if j not in names]
            extra = [j for j in names if j not in where]
            if lacking or extra or len(names) != width:
                raise DataError(f"topic {t.topic} message {i}: joints {list(names)} do not "
                                f"match {names0} (lacking {lacking}, new {extra}).")
            order = np.array([where[j] for j in names])
            for k in fields:
                if arrays[k].shape[1] != width:
                    raise DataError(f"topic {t.topic} message {i}: {arrays[k].shape[1]} "
                                    f"{JOINT_FIELDS[k]} values for {width} joints.")
                out[k][np.ix_(rows, order)] = arrays[k]
        for k in fields:
            name = _join(base, JOINT_FIELDS[k])
            yield name, StreamSpec(name, "numeric", "float64", (width,), rate), out[k]

    def _tabulate(self, table: dict[str, dict]) -> None:
        """Add an episode's topics to the table ``describe`` gives (messages summed over the
        episodes read; type, rate and mapping from the first that has the topic)."""
        for topic, facts in table.items():
            row = self.topic_table.setdefault(topic, {**facts, "messages": 0, "episodes": 0})
            row["messages"] += facts["messages"]
            row["episodes"] += 1

    def describe(self) -> dict[str, Any]:
        """The facts ``inspect`` shows: bags, the options, topics not read, every topic of
        the episodes read (type, messages, rate, the streams it maps to or why not), and the
        files of the folder that are not bags."""
        return {"bags": [str(b) for b, _ in self.bags], "time_source": self.time_source,
                "task_topic": self.task_topic, "not_read": dict(self.skipped),
                "joint_names": dict(self.joint_names), "topics": dict(self.topic_table),
                "not_bags": [str(f) for f in not_bags(self.path)]}


def iter_messages(f):
    """``(channel, schema, message)`` records of every message of an open MCAP file, in file
    order, each chunk's CRC checked before its messages (``channel`` ``None`` for a message
    on an undeclared channel, ``schema`` ``None`` for a channel without one)."""
    stream_reader = _mcap()
    schemas, channels = {}, {}
    for record in stream_reader.StreamReader(f, validate_crcs=True).records:
        kind = type(record).__name__
        if kind == "Schema":
            schemas[record.id] = record
        elif kind == "Channel":
            channels[record.id] = record
        elif kind == "Message":
            channel = channels.get(record.channel_id)
            yield channel, schemas.get(channel.schema_id) if channel else None, record


def _tf_chain(chain: str | tuple[str, str]) -> tuple[str, str]:
    """``"source:target"`` or ``(source, target)`` → the two frame names."""
    parts = chain.split(":") if isinstance(chain, str) else list(chain)
    if len(parts) != 2 or not all(isinstance(p, str) and p.strip("/") for p in parts):
        raise DataError(f"`tf_chains` (--tf-chain) takes SOURCE:TARGET frame pairs, e.g. "
                        f"base_link:tool0; got {chain!r}.")
    return tf.frame(parts[0]), tf.frame(parts[1])


def _topic(name: str) -> str:
    return name if name.startswith("/") else "/" + name


def _rate(log_ns: list[int]) -> float | None:
    """The nominal rate of a topic: 1 / its median log-time step (``None`` below 2 messages)."""
    if len(log_ns) < 2:
        return None
    step = float(np.median(np.diff(np.asarray(log_ns, np.int64))))
    return round(1e9 / step, 3) if step > 0 else None


def _start_ns(file: Path) -> int | None:
    """The log time of the file's first message: from its summary, else the first chunk."""
    from mcap.reader import make_reader

    try:
        if file.name.endswith(".zstd"):
            raise ValueError("no random access into a compressed file")
        with open(file, "rb") as f:
            summary = make_reader(f).get_summary()
            if summary is not None and summary.statistics is not None and \
                    summary.statistics.message_count:
                return int(summary.statistics.message_start_time)
    except Exception:  # no summary (a truncated file): read up to the first message
        pass
    stream_reader = _mcap()
    try:
        with _open(file) as (f, _):
            for record in stream_reader.StreamReader(f).records:
                if type(record).__name__ == "Message":
                    return int(record.log_time)
    except Exception:  # unreadable from the start: read() says why
        return None
    return None


def _storage_of(files: list[Path]) -> str:
    """The one storage of a bag's files.

    Raises:
        DataError: the files mix storages.
    """
    kinds = sorted({storage(f) for f in files})
    if len(kinds) != 1:
        raise DataError(f"{files[0].parent}: one bag mixes {' and '.join(kinds)} files "
                        f"({', '.join(f.name for f in files)}); move each recording to a "
                        "folder of its own.")
    return kinds[0]


def _mcap_decoder(factory, channel, schema, file: Path):
    """mcap-ros2-support's decode function for a channel's messages."""
    try:  # the schema parser prints its complaints: the reason says them once
        with contextlib.redirect_stderr(io.StringIO()), \
                contextlib.redirect_stdout(io.StringIO()):
            decode = factory.decoder_for(channel.message_encoding, schema)
    except Exception as e:  # the schema text does not parse
        raise DataError(f"{file.name}: topic {channel.topic} message 0: its schema "
                        f"{schema.name} does not parse ({type(e).__name__}: {e}).") from e
    if decode is None:
        raise DataError(f"{file.name}: topic {channel.topic}: messages encoded as "
                        f"{channel.message_encoding!r} with a "
                        f"{schema.encoding if schema else 'missing'} schema; only "
                        "ROS 2 CDR with ros2msg schemas is read.")
    return decode


def _schema_nodes(schema, type_: str) -> dict:
    """The type definitions of an MCAP schema (``ros2msg`` or ``ros2idl`` text), parsed by
    ``rosbags``' type system."""
    from rosbags.typesys import get_types_from_idl, get_types_from_msg

    text = bytes(schema.data).decode()
    return get_types_from_idl(text) if schema.encoding == "ros2idl" else \
        get_types_from_msg(text, type_)


def _camera_info(msg) -> dict[str, Any]:
    """A ``sensor_msgs/CameraInfo``'s calibration (its first message; ROS 1 names the
    matrices ``D``, ``K``, ``R``, ``P``)."""
    return {"frame_id": msg.header.frame_id, "width": int(msg.width),
            "height": int(msg.height), "distortion_model": msg.distortion_model,
            **{k: [float(v) for v in (getattr(msg, k) if hasattr(msg, k) else
                                      getattr(msg, k.upper()))] for k in ("d", "k", "r", "p")}}


def _scan_geometry(msg) -> dict[str, Any]:
    """A ``sensor_msgs/LaserScan``'s geometry (its first message): angles in radians,
    times in seconds, ranges in metres."""
    return {"frame_id": msg.header.frame_id, **{k: float(getattr(msg, k)) for k in (
        "angle_min", "angle_max", "angle_increment", "time_increment", "scan_time",
        "range_min", "range_max")}}


CAMERA_INFO = "sensor_msgs/msg/CameraInfo"
LASER_SCAN = "sensor_msgs/msg/LaserScan"
# types whose calibration or geometry goes into Episode.meta["sensors"] (from the first message)
SENSOR_META = {CAMERA_INFO: _camera_info, LASER_SCAN: _scan_geometry}
# types with numeric fields that are not mapped from their definition, and why
NOT_MAPPED = {"sensor_msgs/msg/PointCloud": "no mapping (the point count varies per message)"}
# types mapped from their definition whose streams are only these fields
ONLY = {CAMERA_INFO: (), LASER_SCAN: ("ranges", "intensities")}


def _rosbags():
    return require("rosbags.typesys", "rosbag", "Reading sqlite3 (.db3) and ROS 1 bags",
                   "rosbags")


def _sqlite_check(file: Path) -> None:
    """Refuse a ``.db3`` that another process holds locked or whose write-ahead log holds
    messages the database does not (a recording still running, or killed before it closed:
    reading the database alone would drop them without a word)."""
    import sqlite3

    wal = file.with_name(file.name + "-wal")
    if wal.exists() and wal.stat().st_size > 0:
        raise DataError(f"{file.name}: its write-ahead log {wal.name} holds messages not yet "
                        "in the database (a recording still running, or killed before it "
                        "closed); once no recorder writes it, fold them in with `sqlite3 "
                        f"{file.name} 'PRAGMA wal_checkpoint'`.")
    if file.name.endswith(".zstd"):
        return
    try:
        with contextlib.closing(sqlite3.connect(f"file:{file}?mode=ro", uri=True,
                                                timeout=0)) as db:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.OperationalError as e:
        if "locked" in str(e):
            raise DataError(f"{file.name} is locked by another process (a recorder still "
                            "writing it?); read it once the recording has ended.") from e
        raise DataError(f"{file.name}: not a readable sqlite3 database ({e}).") from e
    except sqlite3.DatabaseError as e:
        raise DataError(f"{file.name}: not a readable sqlite3 database ({e}).") from e


def _rosbags_reader(bag: Path, files: list[Path], kind: str):
    """An unopened ``rosbags`` reader of a sqlite3 rosbag2 directory or a ROS 1 bag, after the
    checks whose failure its own errors would not name.

    Raises:
        DataError: no or a foreign ``metadata.yaml``, a ``.db3`` it does not list, a locked or
            unfinished database, an unindexed ROS 1 bag.
    """
    _rosbags()
    if kind == "ros1":
        from rosbags.rosbag1 import Reader

        if bag.name.endswith(".active"):
            raise DataError(f"{bag.name}: a ROS 1 recording that never closed (.active: its "
                            "index was never written); `rosbag reindex` it, then rename it "
                            "to .bag.")
        return _Ros1Reader(Reader(bag), bag)
    from rosbags.rosbag2 import Reader

    meta = bag / "metadata.yaml" if bag.is_dir() else bag.parent / "metadata.yaml"
    if not bag.is_dir() or not meta.exists():
        raise DataError(f"{files[0].name}: a sqlite3 bag file without its rosbag2 "
                        "metadata.yaml (it says how the file is split and compressed); put "
                        "the .db3 in its bag directory, or rebuild the file with `ros2 bag "
                        "reindex DIR`.")
    try:
        info = _yaml(meta)["rosbag2_bagfile_information"]
        listed = [Path(str(p)).name for p in info["relative_file_paths"]]
        ident = info["storage_identifier"]
    except Exception as e:  # not YAML, or not rosbag2's keys
        raise DataError(f"{meta}: not a rosbag2 metadata.yaml ({type(e).__name__}: {e}); "
                        "rebuild it with `ros2 bag reindex DIR`.") from None
    if ident != "sqlite3":
        raise DataError(f"{meta}: says storage {ident!r}, but the bag holds "
                        f"{', '.join(f.name for f in files)}; rebuild it with `ros2 bag "
                        "reindex DIR`.")
    unlisted = [f.name for f in files if f.name not in listed]
    if unlisted:
        raise DataError(f"{meta}: does not list {unlisted} (it lists {listed}); rebuild it "
                        "with `ros2 bag reindex DIR`, or move the other files out.")
    for f in files:
        _sqlite_check(f)
    return _Ros2Reader(Reader(bag), meta)


def _yaml(path: Path) -> dict:
    """A YAML file, by PyYAML's C parser where it is installed (rosbags' own parser, pure
    Python, takes tens of milliseconds for a metadata.yaml)."""
    try:
        import yaml
    except ImportError:
        from ruamel.yaml import YAML

        return YAML(typ="safe").load(path.read_text())
    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


class _Ros1Reader:
    """``rosbags``' ROS 1 reader whose opening errors name the bag and the fix."""

    def __init__(self, reader, path: Path):
        self.reader, self.path = reader, path

    def __enter__(self):
        try:
            self.reader.open()
        except Exception as e:
            what = str(e) or type(e).__name__
            fix = ("; `rosbag reindex` rebuilds its index" if "index" in what else "")
            if "not indexed" in what:
                what = ("not indexed: a recording that did not close (its index, written "
                        "last, is missing)")
            raise DataError(f"{self.path.name}: {what}{fix}.") from None
        return self.reader

    def __exit__(self, *exc):
        with contextlib.suppress(Exception):
            self.reader.close()


class _Ros2Reader(_Ros1Reader):
    def __enter__(self):
        try:
            self.reader.open()
        except Exception as e:
            raise DataError(f"{self.path}: {str(e) or type(e).__name__}") from None
        return self.reader


def _rosbags_start_ns(bag: Path, files: list[Path]) -> int | None:
    """The log time of a sqlite3 or ROS 1 bag's first message, from its ``metadata.yaml`` or
    its index (``None``: unreadable or empty; reading says why)."""
    try:
        if _storage_of(files) == "sqlite3":
            info = _yaml(bag / "metadata.yaml")["rosbag2_bagfile_information"]
            return int(info["starting_time"]["nanoseconds_since_epoch"]) if \
                info["message_count"] else None
        return _ros1_start_ns(bag)
    except Exception:
        return None


_U32 = struct.Struct("<I")


def _ros1_fields(raw) -> dict[str, bytes]:
    """The ``name=value`` fields of a ROS 1 record header."""
    out, at = {}, 0
    while at < len(raw):
        n = _U32.unpack_from(raw, at)[0]
        name, _, value = bytes(raw[at + 4:at + 4 + n]).partition(b"=")
        out[name.decode()] = value
        at += 4 + n
    return out


def _ros1_record(f) -> tuple[dict[str, bytes], int, int] | None:
    """The next record of a ROS 1 bag file: (header fields, data position, data length),
    the file left after the data (``None`` at the end)."""
    head = f.read(4)
    if len(head) < 4:
        return None
    fields = _ros1_fields(f.read(_U32.unpack(head)[0]))
    size = _U32.unpack(f.read(4))[0]
    at = f.tell()
    f.seek(size, 1)
    return fields, at, size


def _ros1_chunks(f) -> list[tuple[int, int]]:
    """``(chunk position, start ns)`` of each chunk-info record of a ROS 1 bag's index (at the
    end of the file; ``[]`` without one)."""
    f.seek(0)
    if not f.readline().startswith(b"#ROSBAG V2.0"):
        return []
    index = struct.unpack("<Q", _ros1_record(f)[0]["index_pos"])[0]
    if not index:
        return []
    f.seek(index)
    out = []
    while (record := _ros1_record(f)) is not None:
        fields = record[0]
        if fields.get("op") == b"\x06":  # chunk info
            sec, nsec = struct.unpack("<II", fields["start_time"])
            out.append((struct.unpack("<Q", fields["chunk_pos"])[0],
                        sec * 1_000_000_000 + nsec))
    return out


def _ros1_start_ns(path: Path) -> int | None:
    """The earliest start time of a ROS 1 bag's chunks, from its index (the chunks themselves
    are not read)."""
    with open(path, "rb") as f:
        return min((start for _, start in _ros1_chunks(f)), default=None)


def _ros1_messages(path: Path, connections: dict[int, Any]):
    """``(connection, log ns, message bytes)`` of every message of a ROS 1 bag, chunk after
    chunk in file order (each chunk decompressed once, its records walked in order): what
    ``rosbags``' reader gives, without its per-message seeks and time merge."""
    import bz2

    with open(path, "rb") as f:
        for pos, _ in sorted(_ros1_chunks(f)):
            f.seek(pos)
            fields, at, size = _ros1_record(f)
            f.seek(at)
            blob = f.read(size)
            compression = fields["compression"].decode()
            if compression == "bz2":
                blob = bz2.decompress(blob)
            elif compression == "lz4":
                blob = require("lz4.frame", "rosbag", "Reading lz4 ROS 1 bags", "lz4"
                               ).decompress(blob)
            elif compression != "none":
                raise DataError(f"{path.name}: chunk compression {compression!r} is not read "
                                "(read: none, bz2, lz4).")
            data, at = memoryview(blob), 0
            while at < len(data):
                head = _ros1_fields(data[at + 4:at + 4 + _U32.unpack_from(data, at)[0]])
                at += 4 + _U32.unpack_from(data, at)[0]
                size = _U32.unpack_from(data, at)[0]
                at += 4
                if head.get("op") == b"\x02":  # message data
                    sec, nsec = struct.unpack("<II", head["time"])
                    yield (connections[_U32.unpack(head["conn"])[0]],
                           sec * 1_000_000_000 + nsec, bytes(data[at:at + size]))
                at += size


def _in_log_order(t: _Topic) -> None:
    """A topic's messages ordered by log time (stable), as ``rosbags``' reader gives them: a
    ROS 1 bag is read chunk by chunk in file order."""
    ns = np.asarray(t.log_ns, np.int64)
    if not np.any(np.diff(ns) < 0):
        return
    order = np.argsort(ns, kind="stable")
    t.log_ns = ns[order].tolist()
    for name in ("raw", "stamp_ns", "values"):
        kept = getattr(t, name)
        if kept:
            setattr(t, name, [kept[i] for i in order])


def _typestore(reader, kind: str):
    """A ``rosbags`` type store with every topic's type, from the definitions in the bag (ROS
    1: the connection's; sqlite3: the ``message_definitions`` table of ROS 2 Iron and later);
    a sqlite3 bag of an older ROS 2 holds none, so a standard type comes from the store of its
    ``ros_distro`` (Humble where it names none). Returns ``(store, {topic: why not})``."""
    from rosbags.typesys import Stores, get_types_from_idl, get_types_from_msg, get_typestore

    store, unread, base = get_typestore(Stores.EMPTY), {}, None
    for conn in reader.connections:
        try:
            text, fmt = conn.msgdef.data, getattr(conn.msgdef.format, "name", "")
            if kind == "sqlite3" and not text:
                if base is None:
                    distro = f"ROS2_{(reader.ros_distro or 'humble').upper()}"
                    base = get_typestore(getattr(Stores, distro, Stores.ROS2_HUMBLE))
                if conn.msgtype not in base.fielddefs:
                    unread[conn.topic] = ("no message definition in the bag (rosbag2 before "
                                          "Iron stores none) and not a standard ROS 2 type")
                    continue
                text, fmt = base.generate_msgdef(conn.msgtype, ros_version=2)[0], "MSG"
            types = (get_types_from_idl(text) if fmt == "IDL" else
                     get_types_from_msg(text, conn.msgtype))
            header = types.get("std_msgs/msg/Header")
            if header is not None:  # ROS 1's seq: dropped with the bytes by ros1_to_cdr
                types["std_msgs/msg/Header"] = (header[0], [f for f in header[1]
                                                            if f[0] != "seq"])
            store.register(types)
        except Exception as e:  # a definition that does not parse or clashes with another
            unread[conn.topic] = (f"its message definition does not parse "
                                  f"({type(e).__name__}: {e})")
    return store, unread


def _rosbags_decoder(store, conn, unread: dict[str, str], kind: str):
    """``rosbags``' decode function for a connection's messages (ROS 1: converted to the CDR
    of their ROS 2 form first)."""
    if conn.topic in unread:
        raise _Unmapped(unread[conn.topic])
    type_ = conn.msgtype
    if type_ not in store.fielddefs:
        raise _Unmapped("no message definition in the bag")
    if kind == "ros1":
        return lambda data: store.deserialize_cdr(store.ros1_to_cdr(data, type_), type_)
    return functools.partial(store.deserialize_cdr, typename=type_)


def _decode(t: _Topic, data: bytes, i: int, file: str) -> tuple[int, Any]:
    """One message through mcap-ros2-support: (header stamp ns or -1, its values)."""
    try:
        msg = t.decode(data)
        value = generic.extract(msg, t.generic) if t.generic is not None else \
            _extract(t.type, msg)
        if t.type in SENSOR_META and i == 0:
            t.sensor = SENSOR_META[t.type](msg)
    except DataError as e:
        raise DataError(f"{file}: topic {t.topic} message {i}: {e}") from e
    except Exception as e:  # bytes that do not decode with the schema
        raise DataError(f"{file}: topic {t.topic} message {i} does not decode as "
                        f"{t.type} ({type(e).__name__}: {e}).") from e
    header = getattr(msg, "header", None)
    return (header.stamp.sec * 1_000_000_000 + header.stamp.nanosec if header is not None
            else -1), value


def _joint_groups(values: list[tuple]) -> list[tuple]:
    """JointState values one per message → groups ``(names, rows, [position, velocity,
    effort] [len(rows), count])`` of the messages alike (names and array lengths)."""
    rows: dict[tuple, list[int]] = {}
    for i, (names, *arrays) in enumerate(values):
        rows.setdefault((names, *map(len, arrays)), []).append(i)
    return [(key[0], np.array(r), [np.array([values[i][k + 1] for i in r], np.float64)
                                   .reshape(len(r), key[k + 1]) for k in range(3)])
            for key, r in rows.items()]


def _first(t: _Topic, values) -> Any:
    """The values of a topic's first message (JointState: from its groups)."""
    if t.type != JOINT_STATE:
        return values[0]
    names, rows, arrays = next(g for g in values if g[1][0] == 0)
    return (names, *(a[0] for a in arrays))


def _same(a: tuple[int, Any], b: tuple[int, Any]) -> bool:
    """Whether two decodes of one message agree (stamp and values, bit for bit)."""
    if a[0] != b[0]:
        return False
    x, y = a[1], b[1]
    if isinstance(x, tuple):  # JointState (names, arrays...) or an image (codec, bytes)
        return len(x) == len(y) and all(
            u == v if isinstance(u, (str, bytes, tuple)) else
            np.array_equal(np.asarray(u, np.float64), np.asarray(v, np.float64))
            for u, v in zip(x, y, strict=True))
    return np.array_equal(np.asarray(x), np.asarray(y))


def _xyz(msg, path: str, attrs: tuple[str, ...]) -> list[float]:
    obj = msg
    for part in path.split(".") if path else ():
        obj = getattr(obj, part)
    return [getattr(obj, a) for a in attrs]


def _extract(type_: str, msg) -> Any:
    """The values a message contributes to its streams (see :meth:`RosbagSource._streams`)."""
    if type_ in VECTORS:
        return [v for path, attrs in VECTORS[type_] for v in _xyz(msg, path, attrs)]
    if type_ == JOINT_STATE:
        return (tuple(msg.name), msg.position, msg.velocity, msg.effort)
    if type_ == STRING or type_ in SCALARS or type_ in ARRAYS:
        return msg.data
    if type_ == tf.TF:
        return tf.extract(msg)
    if type_ == POINT_CLOUD:
        return _cloud_points(msg)
    if type_ == COMPRESSED:
        return _image_bytes(bytes(msg.data), msg.format)
    return _raw_image(msg)


def _image_bytes(data: bytes, format: str = "") -> tuple[str, bytes]:
    """A CompressedImage's bytes with their codec, from the bytes themselves."""
    if data[:2] == b"\xff\xd8":
        return ("jpeg", data)
    if data[:8] == b"\x89PNG\r\n\x1a\n":
        return ("png", data)
    raise DataError(f"format {format!r}: the bytes are neither JPEG nor PNG.")


def _raw_image(msg) -> np.ndarray:
    """A ``sensor_msgs/Image`` as RGB uint8 ``[H, W, 3]`` or depth uint16 ``[H, W]``."""
    enc = msg.encoding
    if enc not in RAW_ENCODINGS:
        raise DataError(f"image encoding {enc!r} is not read (read: {sorted(RAW_ENCODINGS)}).")
    dtype, channels = RAW_ENCODINGS[enc]
    h, w, step = int(msg.height), int(msg.width), int(msg.step)
    item = np.dtype(dtype).itemsize
    if step < w * channels * item or len(msg.data) < h * step:
        raise DataError(f"{len(msg.data)} bytes with step {step} do not hold a {h}x{w} "
                        f"{enc} image.")
    rows = np.frombuffer(bytes(msg.data), np.uint8, h * step).reshape(h, step)
    pixels = rows[:, :w * channels * item].copy().view(
        np.dtype(dtype).newbyteorder(">" if msg.is_bigendian else "<"))
    pixels = pixels.astype(dtype).reshape(h, w, channels)
    if enc == "bgr8":
        return pixels[..., ::-1].copy()
    if enc == "mono8":
        return np.repeat(pixels, 3, axis=2)
    return pixels[..., 0]


def _camera(t: _Topic, base: str, rate: float | None):
    name = base
    if t.type == COMPRESSED:
        codecs = {c for c, _ in t.values}
        if len(codecs) > 1:
            i = next(i for i, (c, _) in enumerate(t.values) if c != t.values[0][0])
            raise DataError(f"topic {t.topic} message {i}: a {t.values[i][0]} frame in a "
                            f"{t.values[0][0]} stream.")
        codec = t.values[0][0] if t.values else "jpeg"
        try:
            shape = _encoded_shape(t.values[0][1]) if t.values else (0, 0, 3)
        except _Unmapped as e:
            t.skipped = f"{t.type}: {e}"
            return
        except DataError as e:
            raise DataError(f"topic {t.topic} message 0: {e}") from None
        data = np.empty(len(t.values), dtype=object)
        data[:] = [b for _, b in t.values]
        yield name, StreamSpec(name, "image", "uint8" if len(shape) == 3 else "uint16", shape,
                               rate, encoding=codec), data
        return
    shapes = [v.shape for v in t.values]
    bad = next((i for i, s in enumerate(shapes) if s != shapes[0]), None)
    if bad is not None:
        raise DataError(f"topic {t.topic} message {bad}: a {shapes[bad]} frame in a "
                        f"{shapes[0]} stream.")
    data = np.stack(t.values) if t.values else np.zeros((0, 0, 0, 3), np.uint8)
    yield name, StreamSpec(name, "image", data.dtype.name, tuple(data.shape[1:]), rate), data


POINT_CLOUD = "sensor_msgs/msg/PointCloud2"
# PointField datatypes (1..8) as NumPy types
_POINT_FIELD = {1: "i1", 2: "u1", 3: "i2", 4: "u2", 5: "i4", 6: "u4", 7: "f4", 8: "f8"}


def _cloud_points(msg) -> np.ndarray | list[str]:
    """A ``sensor_msgs/PointCloud2``'s ``x, y, z`` fields as ``[height * width, 3]`` (float64
    when the fields are, else float32; an organized cloud's invalid points stay NaN); a cloud
    without them: its field names."""
    fields = {f.name: f for f in msg.fields}
    if not all(k in fields for k in "xyz"):
        return sorted(fields)
    order = ">" if msg.is_bigendian else "<"
    try:
        types = [order + _POINT_FIELD[int(fields[k].datatype)] for k in "xyz"]
    except KeyError as e:
        raise DataError(f"PointField datatype {e.args[0]} is not one of 1..8.") from None
    h, w, step, row = int(msg.height), int(msg.width), int(msg.point_step), int(msg.row_step)
    data = np.frombuffer(bytes(msg.data), np.uint8)
    if row < w * step or len(data) < h * row or max(
            int(fields[k].offset) for k in "xyz") + 4 > step:
        raise DataError(f"{len(data)} bytes with row_step {row} and point_step {step} do not "
                        f"hold a {h}x{w} cloud.")
    packed = np.ascontiguousarray(data[:h * row].reshape(h, row)[:, :w * step])
    points = packed.reshape(h * w, step).view(np.dtype({
        "names": list("xyz"), "formats": types, "offsets": [int(fields[k].offset) for k in "xyz"],
        "itemsize": step})).reshape(h * w)
    dtype = np.float64 if all(t.endswith("f8") for t in types) else np.float32
    return np.stack([points[k].astype(dtype) for k in "xyz"], -1)


def _points(t: _Topic, base: str, rate: float | None):
    """A PointCloud2 topic's ``points`` stream ``[N, 3]``, N fixed by its first message (a cloud
    of another size: in the first bag, the topic is not read; later, its episode fails)."""
    if t.values and isinstance(t.values[0], list):
        raise _Unmapped(f"fields {t.values[0]}, no x, y, z: no mapping")
    sizes = [v.shape[0] if isinstance(v, np.ndarray) else -1 for v in t.values]
    bad = next((i for i, n in enumerate(sizes) if n != sizes[0]), None)
    if bad is not None:
        raise _Unmapped(f"topic {t.topic} message {bad}: {sizes[bad]} points, the first message "
                        f"{sizes[0]}: the point count varies, no fixed-shape stream")
    data = np.stack(t.values) if t.values else np.zeros((0, 0, 3), np.float32)
    name = _join(base, "points")
    yield name, StreamSpec(name, "numeric", data.dtype.name, tuple(data.shape[1:]), rate), data


class _Unmapped(DataError):
    """A readable image of a kind no stream maps (the topic is skipped, saying why)."""


def _encoded_shape(data: bytes) -> tuple[int, ...]:
    """The frame shape of JPEG/PNG bytes, from their header: RGB ``(H, W, 3)``, 16-bit grey
    ``(H, W)``.

    Raises:
        DataError: the bytes are not an image Pillow reads.
        _Unmapped: an image of another mode.
    """
    pil = require("PIL.Image", "data", "Reading camera frames", "pillow")
    try:
        with pil.open(io.BytesIO(data)) as im:
            w, h, mode = *im.size, im.mode
    except (OSError, ValueError, SyntaxError) as e:  # Pillow's errors for unreadable bytes
        kind = "JPEG" if data[:2] == b"\xff\xd8" else "PNG"
        raise DataError(f"{len(data)} bytes that begin as a {kind} but are not a readable "
                        f"image ({type(e).__name__})") from None
    if mode in ("I;16", "I;16B", "I"):
        return (h, w)
    if mode != "RGB":
        raise _Unmapped(f"{mode} frames, not RGB (or 16-bit depth PNG): no mapping")
    return (h, w, 3)

