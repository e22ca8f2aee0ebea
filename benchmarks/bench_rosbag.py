"""Benchmark reading ROS bags (MCAP, sqlite3, ROS 1) and ingesting them: where does the time go?

    $ robocache bench rosbag --json benchmarks/results/rosbag.json
    $ taskset -c 0 python benchmarks/bench_rosbag.py --json rosbag.json     # per core

Two sources, written here with mcap-ros2-support's writer (zstd chunks, as rosbag2's MCAP
storage with compression on):

- ``numeric``: bags of ``sensor_msgs/JointState`` at 1 kHz (7 joints: position, velocity,
  effort), ``geometry_msgs/PoseStamped`` at 100 Hz and ``std_msgs/Float64`` at 50 Hz.
- ``camera``: bags of ``sensor_msgs/CompressedImage`` at 30 Hz (JPEG, 480x640 with
  sensor-like noise in the full run, about 0.1 MB a frame) and JointState at 100 Hz.

Cases (one process; the read path is single-threaded, so pin it to one core to compare per
core):

- ``records``: the MCAP records only (read, decompress, CRC check), no CDR decode: the
  container's floor.
- ``decode``: the same plus mcap-ros2-support's CDR decode of every message, one message
  object each (what the reader does only where its bulk decode does not apply).
- ``episodes``: :class:`~robocache.data.formats.rosbag.RosbagSource` opened and reading every
  bag into episodes (decode, field extraction, joint reordering, stream assembly): what
  ingest consumes.
- ``episodes-sqlite3``, ``episodes-ros1``: the same messages rewritten by ``rosbags``' writers
  as rosbag2 sqlite3 bags (``.db3``, message definitions stored) and ROS 1 bags (lz4 chunks),
  read into the same episodes: each storage's speed on the same content, beside ``episodes``
  (MCAP).
- ``ingest``: ``robocache.cache.build`` of the bags at 50 Hz (alignment on the GPU when there
  is one; camera frames kept as their JPEG bytes), beside ``episodes`` to show whether reading
  bounds it. Its ``stages`` split one pass over the episodes (after a warm-up episode) into
  ``read`` (the reader), ``encode`` (camera frames into their Lance table), ``align`` and
  ``write`` (the Lance files), in seconds.

Records give ``messages_per_s`` and ``MB_per_s`` (bag bytes over wall time).
"""

from __future__ import annotations

import io
import tempfile
import time
from pathlib import Path

import numpy as np

from robocache.bench import harness as H
from robocache.bench.standalone import main

FAMILY = "rosbag"
FULL = {"bags": 4, "seconds": 10.0, "camera": (480, 640), "repeats": 3}
QUICK = {"bags": 2, "seconds": 1.0, "camera": (48, 64), "repeats": 1}
RATE = 50.0


def _defs() -> dict[str, str]:
    """The message definitions of the bag fixtures' script."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "rosbag" / \
        "make_fixtures.py"
    spec = importlib.util.spec_from_file_location("rosbag_fixtures", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.DEFS


def _frame(h: int, w: int, i: int, rng: np.random.Generator) -> bytes:
    """A JPEG frame of a camera-like size (a pattern plus sensor-like noise)."""
    from PIL import Image

    y, x = np.mgrid[0:h, 0:w]
    pixels = np.stack([(x // 2 + 7 * i) % 256, (y // 2 + 3 * i) % 256, (x + y) // 4 % 256], -1)
    pixels = pixels + rng.normal(0, 8, pixels.shape)
    out = io.BytesIO()
    Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(out, "JPEG", quality=90)
    return out.getvalue()


def write_bags(root: Path, kind: str, bags: int, seconds: float,
               camera: tuple[int, int]) -> tuple[int, int]:
    """Write ``bags`` bags of ``kind`` under ``root``; returns (messages, bytes)."""
    from mcap_ros2.writer import Writer

    defs = _defs()
    rates = ({"/joint_states": 1000, "/ee_pose": 100, "/gripper": 50} if kind == "numeric"
             else {"/camera/color": 30, "/joint_states": 100})
    types = {"/joint_states": "sensor_msgs/msg/JointState",
             "/ee_pose": "geometry_msgs/msg/PoseStamped", "/gripper": "std_msgs/msg/Float64",
             "/camera/color": "sensor_msgs/msg/CompressedImage"}
    rng = np.random.default_rng(0)
    frames = [_frame(*camera, i, rng) for i in range(30)] if kind == "camera" else []
    joints = [f"joint_{j}" for j in range(7)]
    root.mkdir(parents=True)
    count = 0
    for b in range(bags):
        t0 = (1_764_000_000 + 100 * b) * 10**9
        msgs = []
        for topic, hz in rates.items():
            for i in range(int(seconds * hz)):
                msgs.append((t0 + i * 10**9 // hz, topic, i))
        msgs.sort()
        with open(root / f"bag_{b}.mcap", "wb") as f:
            w = Writer(f)
            schemas = {t: w.register_msgdef(types[t], defs[types[t]]) for t in rates}
            for ns, topic, i in msgs:
                head = {"stamp": {"sec": ns // 10**9, "nanosec": ns % 10**9}, "frame_id": "b"}
                if topic == "/joint_states":
                    v = rng.normal(size=21).tolist()
                    msg = {"header": head, "name": joints, "position": v[:7],
                           "velocity": v[7:14], "effort": v[14:]}
                elif topic == "/ee_pose":
                    msg = {"header": head, "pose": {
                        "position": {"x": 0.1, "y": 0.2, "z": float(i)},
                        "orientation": {"w": 1.0, "x": 0.0, "y": 0.0, "z": 0.0}}}
                elif topic == "/gripper":
                    msg = {"data": float(i % 2)}
                else:
                    msg = {"header": head, "format": "jpeg", "data": frames[i % len(frames)]}
                w.write_message(topic, schemas[topic], msg, log_time=ns, publish_time=ns)
            w.finish()
        count += len(msgs)
    return count, sum(p.stat().st_size for p in root.glob("*.mcap"))


def rewrite(root: Path, storage: str) -> Path:
    """The MCAP bags under ``root`` rewritten with ``rosbags``' writers beside them: a folder
    of rosbag2 sqlite3 bags (``storage="sqlite3"``, the CDR bytes as they are) or of ROS 1
    bags (``"ros1"``, lz4 chunks, the messages in ROS 1's serialization)."""
    from rosbags.rosbag1 import Writer as Ros1Writer
    from rosbags.rosbag2 import Writer as Ros2Writer
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    from robocache.data.formats.rosbag import iter_messages

    out = root.parent / f"{root.name}-{storage}"
    out.mkdir()
    for path in sorted(root.glob("*.mcap")):
        store = get_typestore(Stores.EMPTY)
        with open(path, "rb") as f:
            messages = list(iter_messages(f))
        for schema in {s.name: s for _, s, _ in messages}.values():
            store.register(get_types_from_msg(schema.data.decode(), schema.name))
        if storage == "sqlite3":
            writer = Ros2Writer(out / path.stem, version=8)
        else:
            writer = Ros1Writer(out / f"{path.stem}.bag")
            writer.set_compression(Ros1Writer.CompressionFormat.LZ4)
        with writer as w:
            conns = {}
            for channel, schema, r in messages:
                conn = conns.get(channel.topic)
                if conn is None:
                    conn = conns[channel.topic] = w.add_connection(channel.topic, schema.name,
                                                                   typestore=store)
                data = r.data if storage == "sqlite3" else store.cdr_to_ros1(r.data,
                                                                              schema.name)
                w.write(conn, r.log_time, data)
    return out


def _records(files: list[Path], decode: bool) -> int:
    from mcap_ros2.decoder import DecoderFactory

    from robocache.data.formats.rosbag import iter_messages

    n = 0
    for path in files:
        factory = DecoderFactory()
        with open(path, "rb") as f:
            for channel, schema, r in iter_messages(f):
                n += 1
                if decode:
                    factory.decoder_for(channel.message_encoding, schema)(r.data)
    return n


def stages(root: Path, dest: Path, device: str) -> dict[str, float]:
    """Seconds per ingest stage over the episodes after the first (a warm-up)."""
    from robocache.data.cache import CacheConfig, align_episode, prepare_episode, write_episode
    from robocache.data.formats.rosbag import RosbagSource

    src = RosbagSource(root)
    config = CacheConfig(rate_hz=RATE, device=device)
    out = {"read": 0.0, "encode": 0.0, "align": 0.0, "write": 0.0}
    for i in src.episode_indices():
        p = prepare_episode(src, i, src.specs, config)
        t0 = time.perf_counter()
        cols = align_episode(p.episode, src.specs, config, device)
        t1 = time.perf_counter()
        write_episode(dest, p.episode, cols, src.specs, config, p.frames)
        if i:  # the first episode warms imports and pools up
            for k, v in {**p.seconds, "align": t1 - t0,
                         "write": time.perf_counter() - t1}.items():
                out[k] += v
    return out


def run(quick: bool = False, copy_gbps: float | None = None) -> list[dict]:
    import torch

    from robocache.data.cache import build
    from robocache.data.formats.rosbag import RosbagSource

    cfg = QUICK if quick else FULL
    device = "cuda" if torch.cuda.is_available() else "cpu"
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("numeric", "camera"):
            root = Path(tmp) / kind
            messages, nbytes = write_bags(root, kind, cfg["bags"], cfg["seconds"],
                                          cfg["camera"])
            files = sorted(root.glob("*.mcap"))
            _records(files, decode=False)  # a warm-up pass: the bags in the page cache

            def episodes(root=root):
                src = RosbagSource(root)  # which reads the first bag, finding its streams
                for i in src.episode_indices():
                    src.read(i)

            others = {storage: rewrite(root, storage) for storage in ("sqlite3", "ros1")}
            for other in others.values():
                episodes(other)  # a warm-up pass: the bags in the page cache

            name = f"{kind}-{len(files)}bags-{nbytes / 1e6:.0f}MB"
            passes = (("records", lambda files=files: _records(files, False)),
                      ("decode", lambda files=files: _records(files, True)),
                      ("episodes", episodes),
                      *((f"episodes-{storage}", lambda other=other: episodes(other))
                        for storage, other in others.items()))
            kept = []
            for impl, fn in passes:
                samples = []
                for _ in range(cfg["repeats"]):
                    t0 = time.perf_counter()
                    fn()
                    samples.append((time.perf_counter() - t0) * 1e3)
                kept.append(H.case(FAMILY, name, impl, H.summarize(samples), nbytes=nbytes,
                                   source=kind, bags=len(files)))
            t0 = time.perf_counter()
            manifest = build(RosbagSource(root), Path(tmp) / f"{kind}.cache", rate_hz=RATE,
                             device=device, progress=False)
            kept.append(H.case(FAMILY, name, "ingest",
                               H.summarize([(time.perf_counter() - t0) * 1e3]), nbytes=nbytes,
                               source=kind, bags=manifest["counts"]["cached"], device=device,
                               stages=stages(root, Path(tmp) / f"{kind}.stages", device)))
            H.add_rates(kept, messages, "messages", nbytes)
            records += kept
    return records


if __name__ == "__main__":
    main(run, __doc__)
