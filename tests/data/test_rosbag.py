"""ROS bags: every message read equals what mcap-ros2-support's writer wrote
(tests/fixtures/rosbag/make_fixtures.py), and the same messages rewritten as sqlite3 and ROS 1
bags by rosbags' writers; the options; the bad bags quarantined with the file, topic, message
index and reason."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import shutil
import subprocess
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mcap_ros2", reason="needs mcap-ros2-support (pip install "
                                        "'robocache[rosbag]')")

from robocache.data.formats import open_source  # noqa: E402
from robocache.data.formats.rosbag import RosbagSource  # noqa: E402
from robocache.errors import DataError  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "rosbag"
BAGS = FIXTURES / "bags"
BAD = FIXTURES / "bad"
EXPECTED = dict(np.load(FIXTURES / "expected.npz", allow_pickle=True))
ROOT = Path(__file__).resolve().parents[2]


def _script(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


SCRIPT = _script(FIXTURES / "make_fixtures.py", "rosbag_fixtures")  # message definitions

# topic -> (stream name, field in expected.npz) of every stream the fixtures carry
STREAMS = {
    "/joint_states": [("joint_states.position", "position"),
                      ("joint_states.velocity", "velocity")],
    "/ee_pose": [("ee_pose.pose.position", "pose.position"),
                 ("ee_pose.pose.orientation", "pose.orientation")],
    "/cmd_vel": [("cmd_vel.linear", "linear"), ("cmd_vel.angular", "angular")],
    "/gripper": [("gripper.data", "data")],
    "/camera/color": [("camera.color", "")],
    "/wrist/image_raw": [("wrist.image_raw", "")],
    "/depth": [("depth", "")],
    "/note": [("note.data", "data")],
}


def nearest_seconds(ns: np.ndarray) -> np.ndarray:
    """The double nearest to each ``ns / 1e9`` (exact rational rounding, independent of the
    reader's arithmetic)."""
    return np.array([float(Fraction(int(n), 10**9)) for n in ns])


def assert_stream(episode, prefix: str, topic: str, name: str, field: str,
                  time_source: str = "header", count: int | None = None) -> None:
    stream = episode.streams[name]
    stamps, logs = EXPECTED[f"{prefix}{topic}/stamp_ns"], EXPECTED[f"{prefix}{topic}/log_ns"]
    want_ns = logs if time_source == "log" or stamps[0] < 0 else stamps
    want = EXPECTED[f"{prefix}{topic}/{field}"]
    if count is not None:
        want_ns, want = want_ns[:count], want[:count]
    assert np.array_equal(episode.meta["stamps_ns"][name], want_ns), name
    assert stream.times.dtype == np.float64
    assert np.array_equal(stream.times, nearest_seconds(want_ns)), name
    if want.dtype.kind in "OU":  # JPEG bytes passed through, strings as events
        assert list(stream.data) == list(want), name
    else:
        assert stream.data.dtype == want.dtype and np.array_equal(stream.data, want), name


@pytest.fixture(scope="module")
def source():
    return open_source(BAGS, task_topic="/task")


def test_every_message_equals_what_was_written(source):
    assert source.format == "rosbag" and source.fps is None
    for index, prefix in ((0, "0"), (1, "1")):
        ep = source.read(index)
        for topic, streams in STREAMS.items():
            for name, field in streams:
                assert_stream(ep, prefix, topic, name, field)
        assert ep.meta["joint_names"] == {"joint_states": ["shoulder", "elbow", "wrist"]}
    # no stream of the unmapped or task topics
    assert not any(n.startswith(("rosout", "parameter_events", "task")) for n in source.specs)


def test_episodes_by_start_time_with_their_bag(source):
    """ep1.mcap sorts before ep0/ by name but starts 10 s later; ep0/ is a rosbag2 directory
    of two files (metadata.yaml beside)."""
    ep0, ep1 = source.read(0), source.read(1)
    assert ep0.meta["path"] == str(BAGS / "ep0") and len(ep0.meta["files"]) == 2
    assert ep1.meta["path"] == str(BAGS / "ep1.mcap")
    assert ep0.start < ep1.start
    assert ep0.meta["tasks"] == ["pick up the red cube"]
    assert ep1.meta["tasks"] == ["stack the blocks"]


def test_specs_and_quaternion_order(source):
    s = source.specs
    assert s["ee_pose.pose.orientation"].shape == (4,)  # wxyz: w first, unit norm
    q = source.read(0).streams["ee_pose.pose.orientation"].data
    assert np.allclose(np.linalg.norm(q, axis=1), 1.0)
    assert (s["camera.color"].kind, s["camera.color"].encoding, s["camera.color"].shape) == \
        ("image", "jpeg", (24, 32, 3))
    assert (s["wrist.image_raw"].dtype, s["wrist.image_raw"].shape) == ("uint8", (16, 20, 3))
    assert (s["depth"].dtype, s["depth"].shape) == ("uint16", (4, 5))
    assert s["note.data"].kind == "event" and s["gripper.data"].shape == ()
    assert s["joint_states.position"].rate_hz == pytest.approx(200, rel=0.01)
    assert "joint_states.effort" not in s  # empty in every message


def test_unmapped_types_listed_once_in_timing(source):
    assert source.timing.count("/rosout (rcl_interfaces/msg/Log: no mapping)") == 1
    assert "/parameter_events (rcl_interfaces/msg/ParameterEvent: no mapping)" in source.timing


def test_log_time_for_every_topic():
    ep = open_source(BAGS, time_source="log").read(0)
    for topic in ("/joint_states", "/camera/color"):
        name, field = STREAMS[topic][0]
        assert_stream(ep, "0", topic, name, field, time_source="log")


def test_task_topic_as_events_without_the_option():
    src = open_source(BAGS)
    assert src.read(0).streams["task.data"].data.tolist() == ["pick up the red cube"]


def test_topic_selection():
    src = open_source(BAGS, topics=["/joint_states", "ee_pose"], exclude_topics=["/ee_pose"])
    assert sorted(src.specs) == ["joint_states.position", "joint_states.velocity"]
    with pytest.raises(DataError, match=r"\['/nope'\].*not in the bag"):
        open_source(BAGS, topics=["/nope"])
    with pytest.raises(DataError, match="time_source"):
        open_source(BAGS, time_source="publish")


def bag_folder(tmp_path: Path, *bad: str) -> Path:
    """A source folder: the good bags, then the named bad ones (which start later)."""
    root = tmp_path / "src"
    shutil.copytree(BAGS, root)
    for name in bad:
        shutil.copy(BAD / name, root / name)
    return root


@pytest.mark.parametrize("name,reason", [
    ("truncated.mcap", r"truncated\.mcap is truncated after \d+ complete messages .*"
                       r"--allow-truncated"),
    ("bad_crc.mcap", r"bad_crc\.mcap: unreadable after \d+ messages .*CRCValidationError"),
    ("bad_schema.mcap", r"topic /ee_pose message 0: its schema geometry_msgs/msg/PoseStamped "
                        r"does not parse"),
    ("backwards.mcap", r"topic /joint_states message 40: time goes backwards \(header.stamp"),
    ("missing_joint.mcap", r"topic /joint_states message 25: joints \['shoulder', 'elbow'\] "
                           r"do not match .*lacking \['wrist'\]"),
])
def test_bad_bag_fails_its_episode_only(tmp_path, name, reason):
    src = open_source(bag_folder(tmp_path, name))
    assert src.episode_indices() == [0, 1, 2]
    with pytest.raises(DataError, match=reason):
        src.read(2)
    assert len(src.read(1).streams) == len(src.specs)


def test_allow_truncated_keeps_every_message_before_the_cut():
    ep = RosbagSource(BAD / "truncated.mcap", allow_truncated=True).read(0)
    assert "is truncated after" in ep.meta["truncated"]
    total = 0
    for topic, streams in STREAMS.items():
        name, field = streams[0]
        n = len(ep.streams[name])
        assert 0 < n <= len(EXPECTED[f"bad{topic}/log_ns"])
        assert_stream(ep, "bad", topic, name, field, count=n)
        total += n
    assert total < sum(len(EXPECTED[f"bad{t}/log_ns"]) for t in STREAMS)


def test_no_bag(tmp_path):
    (tmp_path / "x.txt").write_text("x")
    with pytest.raises(DataError, match="unknown dataset format"):
        open_source(tmp_path)
    with pytest.raises(DataError, match="no ROS bag"):
        RosbagSource(tmp_path)


def cli(*args: str) -> subprocess.CompletedProcess:
    """``robocache ARGS`` in this process (a subprocess each cost 4-5 s of start-up and
    imports): its exit code, stdout and stderr."""
    from typer.testing import CliRunner

    from robocache.cli import app

    r = CliRunner().invoke(app, list(args))
    if r.exception is not None and not isinstance(r.exception, SystemExit):
        raise r.exception
    return subprocess.CompletedProcess(args, r.exit_code, r.stdout, r.stderr)


def test_ingest_quarantines_the_bad_bags(tmp_path):
    root = bag_folder(tmp_path, "truncated.mcap", "bad_crc.mcap")
    run = cli("ingest", str(root), str(tmp_path / "cache"), "--rate", "20", "--task-topic",
              "/task", "--device", "cpu", "--no-progress", "--json")
    assert run.returncode == 3, run.stderr
    manifest = json.loads(run.stdout)
    assert manifest["counts"]["cached"] == 2 and manifest["counts"]["quarantined"] == 2
    reasons = [q["reason"] for q in manifest["quarantined"]]
    assert "CRCValidationError" in reasons[0] and "--allow-truncated" in reasons[1]
    assert "/rosout (rcl_interfaces/msg/Log: no mapping)" in manifest["timing"]
    assert "Traceback" not in run.stderr
    run = cli("ingest", str(root), str(tmp_path / "kept"), "--rate", "20", "--device", "cpu",
              "--no-progress", "--json", "--allow-truncated", "--exclude-topic", "/rosout")
    manifest = json.loads(run.stdout)
    assert manifest["counts"]["cached"] == 3, run.stderr  # truncated kept, bad CRC not
    assert "/rosout" not in manifest["timing"]


def test_ingest_bad_options_one_line(tmp_path):
    run = cli("ingest", str(BAGS), str(tmp_path / "c"), "--no-progress")
    assert run.returncode == 2 and "--rate" in run.stderr
    run = cli("ingest", str(ROOT / "data" / "sample" / "panda_multirate"), str(tmp_path / "d"),
              "--topic", "/x", "--no-progress")
    assert run.returncode == 2 and run.stderr.count("\n") == 1
    assert "`topics` (--topic) is an option of rosbag sources" in run.stderr
    assert not (tmp_path / "d").exists()


def test_missing_packages_name_the_pip_command():
    code = ("import sys; sys.modules['mcap_ros2'] = None\nfrom robocache.data.formats import "
            f"open_source; open_source({str(BAGS)!r})")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, env={"PYTHONPATH": str(ROOT / "src")})
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("robocache.errors.MissingDependencyError"), last
    assert "mcap-ros2-support" in last and "pip install 'robocache[rosbag]'" in last


def test_bulk_decode_equals_mcap_ros2(monkeypatch):
    """The CDR layouts decoded together (robocache.data.formats.cdr) give what
    mcap-ros2-support's decoder gives message by message, for every stream."""
    from robocache.data.formats import cdr

    fast = open_source(BAGS).read(0)
    for name in ("vectors", "scalars", "joint_state", "compressed_image"):
        monkeypatch.setattr(cdr, name, lambda *a: None)  # every topic one by one
    slow = open_source(BAGS).read(0)
    assert fast.streams.keys() == slow.streams.keys()
    for name, s in fast.streams.items():
        assert np.array_equal(s.times, slow.streams[name].times), name
        if s.data.dtype == object:
            assert list(s.data) == list(slow.streams[name].data), name
        else:
            assert s.data.dtype == slow.streams[name].data.dtype, name
            assert np.array_equal(s.data, slow.streams[name].data), name


def test_bulk_decode_of_every_layout():
    """Each fixed layout against mcap-ros2-support, on messages written by its writer."""
    import io as _io

    from mcap.stream_reader import StreamReader
    from mcap_ros2.decoder import DecoderFactory
    from mcap_ros2.writer import Writer

    from robocache.data.formats import cdr
    from robocache.data.formats.rosbag import VECTORS, _extract

    DEFS, H, POINT, QUAT, msgdef = (getattr(SCRIPT, k) for k in
                                    ("DEFS", "H", "POINT", "QUAT", "msgdef"))

    rng = np.random.default_rng(5)
    pose = ("geometry_msgs/Pose", "geometry_msgs/Point position\n"
                                  "geometry_msgs/Quaternion orientation\n")
    deps = {"geometry_msgs/Point": POINT, "geometry_msgs/Quaternion": QUAT,
            "geometry_msgs/Vector3": POINT}
    defs = {
        "geometry_msgs/msg/Pose": msgdef(pose[1], *deps.items()),
        "sensor_msgs/msg/Imu": msgdef(
            "std_msgs/Header header\ngeometry_msgs/Quaternion orientation\n"
            "float64[9] orientation_covariance\ngeometry_msgs/Vector3 angular_velocity\n"
            "float64[9] angular_velocity_covariance\ngeometry_msgs/Vector3 linear_acceleration\n"
            "float64[9] linear_acceleration_covariance\n", *H, *deps.items()),
        "nav_msgs/msg/Odometry": msgdef(
            "std_msgs/Header header\nstring child_frame_id\n"
            "geometry_msgs/PoseWithCovariance pose\ngeometry_msgs/TwistWithCovariance twist\n",
            *H, ("geometry_msgs/PoseWithCovariance", "geometry_msgs/Pose pose\n"
                 "float64[36] covariance\n"),
            ("geometry_msgs/TwistWithCovariance", "geometry_msgs/Twist twist\n"
             "float64[36] covariance\n"), pose,
            ("geometry_msgs/Twist", "geometry_msgs/Vector3 linear\n"
                                    "geometry_msgs/Vector3 angular\n"), *deps.items()),
        "geometry_msgs/msg/TransformStamped": msgdef(
            "std_msgs/Header header\nstring child_frame_id\n"
            "geometry_msgs/Transform transform\n", *H,
            ("geometry_msgs/Transform", "geometry_msgs/Vector3 translation\n"
                                        "geometry_msgs/Quaternion rotation\n"), *deps.items()),
        "std_msgs/msg/Int16": "int16 data\n",
        "std_msgs/msg/Bool": "bool data\n",
    }

    def v3():
        return dict(zip("xyz", rng.normal(size=3).tolist(), strict=True))

    def q():
        return dict(zip("xyzw", rng.normal(size=4).tolist(), strict=True))

    def head(i):
        return {"stamp": {"sec": 1_700_000_000 + i, "nanosec": 7 * i}, "frame_id": "f" * i}

    def make(type_, i):
        cov = rng.normal(size=36).tolist()
        return {
            "geometry_msgs/msg/Pose": lambda: {"position": v3(), "orientation": q()},
            "sensor_msgs/msg/Imu": lambda: {
                "header": head(i), "orientation": q(), "orientation_covariance": cov[:9],
                "angular_velocity": v3(), "angular_velocity_covariance": cov[9:18],
                "linear_acceleration": v3(), "linear_acceleration_covariance": cov[18:27]},
            "nav_msgs/msg/Odometry": lambda: {
                "header": head(i), "child_frame_id": "c" * (i % 5),
                "pose": {"pose": {"position": v3(), "orientation": q()}, "covariance": cov},
                "twist": {"twist": {"linear": v3(), "angular": v3()}, "covariance": cov}},
            "geometry_msgs/msg/TransformStamped": lambda: {
                "header": head(i), "child_frame_id": "x" * (i % 3),
                "transform": {"translation": v3(), "rotation": q()}},
            "std_msgs/msg/Int16": lambda: {"data": int(rng.integers(-30000, 30000))},
            "std_msgs/msg/Bool": lambda: {"data": bool(i % 2)},
        }[type_]()

    for type_, text in {**defs, "sensor_msgs/msg/JointState": DEFS[
            "sensor_msgs/msg/JointState"]}.items():
        buf = _io.BytesIO()
        w = Writer(buf)
        schema = w.register_msgdef(type_, text)
        for i in range(9):
            msg = make(type_, i) if type_ != "sensor_msgs/msg/JointState" else {
                "header": head(i), "name": ["a" * (i + 1), "b"], "position": [1.0, float(i)],
                "velocity": [], "effort": [2.0, 3.0][: i % 3]}
            w.write_message("/t", schema, msg, log_time=i)
        w.finish()
        buf.seek(0)
        raw, decode = [], None
        for r in StreamReader(buf).records:
            if type(r).__name__ == "Schema":
                decode = DecoderFactory().decoder_for("cdr", r)
            elif type(r).__name__ == "Message":
                raw.append(r.data)
        want = [_extract(type_, decode(d)) for d in raw]
        if type_ in VECTORS:
            values, stamps = cdr.vectors(raw, type_)
            assert np.array_equal(values, np.asarray(want, np.float64)), type_
            if stamps is not None:
                assert stamps.tolist() == [decode(d).header.stamp.sec * 10**9 +
                                           decode(d).header.stamp.nanosec for d in raw]
        elif type_.startswith("std_msgs"):
            dtype = "int16" if "Int16" in type_ else "bool"
            got = cdr.scalars(raw, dtype)
            assert got.dtype == dtype and got.tolist() == want, type_
        else:  # names of varying lengths, effort of 0-2 values: one group per layout
            stamps, groups = cdr.joint_states(raw)
            assert sorted(i for _, rows, _ in groups for i in rows) == list(range(len(raw)))
            for names, rows, arrays in groups:
                for r, i in enumerate(rows):
                    assert names == want[i][0]
                    assert all(np.array_equal(a[r], b) for a, b in
                               zip(arrays, want[i][1:], strict=True))


def test_frames_not_read_skip_their_topic(tmp_path):
    """An Image encoding or a CompressedImage format without a mapping (rgba8, grey JPEG) is
    skipped and listed, as an unmapped type is; the other topics are read."""
    from mcap_ros2.writer import Writer
    from PIL import Image

    DEFS = SCRIPT.DEFS
    grey = _io_bytes(Image.fromarray(np.zeros((4, 6), np.uint8)))
    with open(tmp_path / "b.mcap", "wb") as f:
        w = Writer(f)
        image = w.register_msgdef("sensor_msgs/msg/Image", DEFS["sensor_msgs/msg/Image"])
        jpeg = w.register_msgdef("sensor_msgs/msg/CompressedImage",
                                 DEFS["sensor_msgs/msg/CompressedImage"])
        f64 = w.register_msgdef("std_msgs/msg/Float64", DEFS["std_msgs/msg/Float64"])
        for i in range(3):
            head = {"stamp": {"sec": 1, "nanosec": i}, "frame_id": ""}
            w.write_message("/rgba", image, {"header": head, "height": 1, "width": 1,
                                             "encoding": "rgba8", "is_bigendian": 0, "step": 4,
                                             "data": b"\0\0\0\0"}, log_time=10 + i)
            w.write_message("/grey", jpeg, {"header": head, "format": "jpeg", "data": grey},
                            log_time=10 + i)
            w.write_message("/x", f64, {"data": float(i)}, log_time=10 + i)
        w.finish()
    src = open_source(tmp_path / "b.mcap")
    assert list(src.specs) == ["x.data"]
    assert "/rgba (sensor_msgs/msg/Image rgba8: no mapping)" in src.timing
    assert "/grey (sensor_msgs/msg/CompressedImage: L frames, not RGB" in src.timing
    assert src.read(0).streams["x.data"].data.tolist() == [0.0, 1.0, 2.0]


def test_resampled_orientations_stay_unit_quaternions(tmp_path):
    """A PoseStamped's orientation is a quaternion stream: aligned by slerp at --rate by
    default, each row a unit quaternion (linear interpolation shrank them to norm 0.19)."""
    import lance

    from robocache.data.cache import build

    m = build(BAGS, tmp_path / "c", rate_hz=50.0, progress=False, device="cpu")
    assert m["streams"]["ee_pose.pose.orientation"]["method"] == "slerp"
    assert m["streams"]["ee_pose.pose.position"]["method"] == "linear"
    table = lance.dataset(str(tmp_path / "c" / "data.lance")).to_table()
    q = np.stack(table.column("ee_pose/pose/orientation").to_numpy(zero_copy_only=False))
    np.testing.assert_allclose(np.linalg.norm(q, axis=1), 1.0, rtol=0, atol=1e-12)


def test_compressed_bytes_that_are_not_an_image_are_named(tmp_path):
    """A CompressedImage whose bytes begin as a JPEG but are not one: its bag is quarantined
    with a reason naming the file, topic and message (not Pillow's stream object)."""
    from mcap_ros2.writer import Writer
    from PIL import Image

    from robocache.data.cache import build

    DEFS = SCRIPT.DEFS
    good = _io_bytes(Image.fromarray(np.zeros((4, 6, 3), np.uint8)))
    (tmp_path / "src").mkdir()
    for ep in range(2):
        with open(tmp_path / "src" / f"ep{ep}.mcap", "wb") as f:
            w = Writer(f)
            jpeg = w.register_msgdef("sensor_msgs/msg/CompressedImage",
                                     DEFS["sensor_msgs/msg/CompressedImage"])
            f64 = w.register_msgdef("std_msgs/msg/Float64", DEFS["std_msgs/msg/Float64"])
            for i in range(3):
                head = {"stamp": {"sec": 1, "nanosec": i}, "frame_id": ""}
                data = b"\xff\xd8" + b"junk" * 10 if ep == 1 else good
                w.write_message("/cam", jpeg, {"header": head, "format": "jpeg", "data": data},
                                log_time=10 + i)
                w.write_message("/x", f64, {"data": float(i)}, log_time=10 + i)
            w.finish()
    m = build(tmp_path / "src", tmp_path / "c", rate_hz=10.0, progress=False, device="cpu")
    assert m["counts"]["cached"] == 1 and [q["index"] for q in m["quarantined"]] == [1]
    reason = m["quarantined"][0]["reason"]
    assert "ep1.mcap" in reason and "topic /cam message 0" in reason
    assert "not a readable image" in reason and "BytesIO" not in reason


def _io_bytes(image) -> bytes:
    import io as _io

    out = _io.BytesIO()
    image.save(out, format="JPEG")
    return out.getvalue()


def test_file_compressed_bags(tmp_path):
    """rosbag2's --compression-mode file writes each file as .mcap.zstd: read as it is
    decompressed, equal to the plain file; cut short, it is a truncated bag."""
    import zstandard

    bag = tmp_path / "src" / "ep1"
    bag.mkdir(parents=True)
    plain = (BAGS / "ep1.mcap").read_bytes()
    z = zstandard.ZstdCompressor().compressobj()
    # blocks of 8 kB (a real bag's file holds many of zstd's blocks; a cut keeps the whole ones)
    data = b"".join(z.compress(plain[i:i + 8192]) + z.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)
                    for i in range(0, len(plain), 8192)) + z.flush()
    (bag / "ep1_0.mcap.zstd").write_bytes(data)
    (bag / "metadata.yaml").write_text("rosbag2_bagfile_information:\n  version: 8\n")
    got = open_source(tmp_path / "src").read(0)
    want = open_source(BAGS / "ep1.mcap").read(0)
    assert got.streams.keys() == want.streams.keys()
    for name, s in want.streams.items():
        assert np.array_equal(got.streams[name].times, s.times), name
        assert list(got.streams[name].data) == list(s.data) if s.data.dtype == object else \
            np.array_equal(got.streams[name].data, s.data), name
    cut = tmp_path / "cut.mcap.zstd"
    cut.write_bytes(data[:len(data) * 2 // 3])
    with pytest.raises(DataError, match="is truncated after"):
        RosbagSource(cut)
    kept = RosbagSource(cut, allow_truncated=True).read(0)
    assert 0 < len(kept.streams["joint_states.position"]) < \
        len(want.streams["joint_states.position"])


# --- sqlite3 (.db3) and ROS 1 (.bag) storage: the fixtures' messages rewritten by rosbags'
# own writers, read back equal to what was written and to rosbags' own decode

def _mcap_messages(files: list[Path]) -> list[tuple[str, str, str, int, bytes]]:
    """``(topic, type, ros2msg text, log ns, CDR bytes)`` of every message of MCAP files."""
    from mcap.stream_reader import StreamReader

    out = []
    for file in files:
        schemas, channels = {}, {}
        with open(file, "rb") as f:
            for r in StreamReader(f).records:
                kind = type(r).__name__
                if kind == "Schema":
                    schemas[r.id] = r
                elif kind == "Channel":
                    channels[r.id] = r
                elif kind == "Message":
                    c = channels[r.channel_id]
                    s = schemas[c.schema_id]
                    out.append((c.topic, s.name, s.data.decode(), r.log_time, r.data))
    return out


FIXTURE_EPISODES = {"0": sorted((BAGS / "ep0").glob("*.mcap")), "1": [BAGS / "ep1.mcap"]}


def write_db3(bag: Path, messages, *, compress: str | None = None) -> None:
    """A rosbag2 sqlite3 bag of ``messages`` (their CDR bytes as they are) with its
    ``metadata.yaml`` and message definitions (rosbag2 Iron's storage); ``compress``:
    ``"message"`` or ``"file"`` (zstd)."""
    from rosbags.rosbag2 import Writer
    from rosbags.rosbag2.enums import CompressionFormat, CompressionMode
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    store = get_typestore(Stores.EMPTY)
    for type_, text in {m[1]: m[2] for m in messages}.items():
        store.register(get_types_from_msg(text, type_))
    writer = Writer(bag, version=8)
    if compress:
        writer.set_compression(getattr(CompressionMode, compress.upper()),
                               CompressionFormat.ZSTD)
    with writer as w:
        conns = {}
        for topic, type_, _, log, data in messages:
            if topic not in conns:
                conns[topic] = w.add_connection(topic, type_, typestore=store)
            w.write(conns[topic], log, data)


def write_ros1(path: Path, messages, *, compression: str = "lz4") -> None:
    """A ROS 1 bag of the ``messages`` (definitions and md5 as ROS 1 Noetic's, types it
    lacks added; the header's ``seq`` counting), in ``compression`` chunks."""
    import struct

    from rosbags.rosbag1 import Writer
    from rosbags.typesys import Stores, get_types_from_msg, get_typestore

    noetic = get_typestore(Stores.ROS1_NOETIC)
    ros2 = get_typestore(Stores.EMPTY)
    for type_, text in {m[1]: m[2] for m in messages}.items():
        types = get_types_from_msg(text, type_)
        ros2.register(types)
        # types Noetic's store lacks (tf2_msgs, custom ones): their ROS 1 form
        noetic.register({k: v for k, v in types.items() if k not in noetic.fielddefs})
    writer = Writer(path)
    writer.set_compression(getattr(Writer.CompressionFormat, compression.upper()))
    with writer as w:
        conns, seq = {}, {}
        for topic, type_, _, log, data in messages:
            if type_.startswith("rcl_interfaces/"):  # ROS 2's own: not in ROS 1 bags
                continue
            if topic not in conns:
                conns[topic] = w.add_connection(topic, type_, typestore=noetic)
            raw = bytearray(ros2.cdr_to_ros1(data, type_))
            if noetic.fielddefs[type_][1][:1] and noetic.fielddefs[type_][1][0][0] == "header":
                seq[topic] = seq.get(topic, 0) + 1
                struct.pack_into("<I", raw, 0, seq[topic])
            w.write(conns[topic], log, bytes(raw))


@pytest.fixture(scope="module")
def storages(tmp_path_factory):
    """The two fixture episodes as a folder of sqlite3 bags (zstd-compressed: ep0 per file,
    ep1 per message) and as a folder of ROS 1 bags (lz4 and bz2 chunks)."""
    pytest.importorskip("rosbags")
    root = tmp_path_factory.mktemp("storages")
    for ep, files in FIXTURE_EPISODES.items():
        messages = _mcap_messages(files)
        write_db3(root / "db3" / f"ep{ep}", messages, compress="file" if ep == "0" else
                  "message")
        (root / "ros1").mkdir(exist_ok=True)
        write_ros1(root / "ros1" / f"ep{ep}.bag", messages,
                   compression="lz4" if ep == "0" else "bz2")
    return root


ROS1_TOPICS = [t for t in STREAMS]  # every fixture topic has a ROS 1 Noetic type


@pytest.mark.parametrize("kind", ["db3", "ros1"])
def test_storage_reads_every_message_as_written(storages, kind):
    src = open_source(storages / kind, task_topic="/task")
    assert src.format == "rosbag" and src.episode_indices() == [0, 1]
    for index, prefix in ((0, "0"), (1, "1")):
        ep = src.read(index)
        for topic, streams in STREAMS.items():
            for name, field in streams:
                assert_stream(ep, prefix, topic, name, field)
        assert ep.meta["tasks"] == [["pick up the red cube"], ["stack the blocks"]][index]
        assert ep.meta["joint_names"] == {"joint_states": ["shoulder", "elbow", "wrist"]}
    if kind == "db3":
        assert "/rosout (rcl_interfaces/msg/Log: no mapping)" in src.timing
    ep = open_source(storages / kind, time_source="log").read(0)
    assert_stream(ep, "0", "/joint_states", "joint_states.position", "position",
                  time_source="log")


@pytest.mark.parametrize("kind", ["db3", "ros1"])
def test_storage_equals_rosbags_own_decode(storages, kind):
    """Each mapped stream against rosbags' AnyReader (ROS 1 decoded from its own
    serialization, not through the CDR the reader converts it to)."""
    from rosbags.highlevel import AnyReader

    bag = storages / kind / ("ep1" if kind == "db3" else "ep1.bag")
    ep = open_source(bag).read(0)
    with AnyReader([bag]) as r:
        got: dict[str, list] = {}
        for conn, log, raw in r.messages():
            if conn.topic in ("/ee_pose", "/joint_states", "/cmd_vel", "/gripper"):
                got.setdefault(conn.topic, []).append((log, r.deserialize(raw, conn.msgtype)))
    pose = ep.streams["ee_pose.pose.orientation"].data
    want = np.array([[m.pose.orientation.w, m.pose.orientation.x, m.pose.orientation.y,
                      m.pose.orientation.z] for _, m in got["/ee_pose"]])
    assert np.array_equal(pose, want)
    assert ep.meta["stamps_ns"]["ee_pose.pose.position"].tolist() == [
        m.header.stamp.sec * 10**9 + m.header.stamp.nanosec for _, m in got["/ee_pose"]]
    assert np.array_equal(ep.streams["joint_states.velocity"].data[0],
                          _by_name(got["/joint_states"][0][1], "velocity"))
    assert ep.meta["stamps_ns"]["gripper.data"].tolist() == [log for log, _ in got["/gripper"]]
    assert ep.streams["gripper.data"].data.tolist() == [m.data for _, m in got["/gripper"]]
    assert np.array_equal(ep.streams["cmd_vel.angular"].data, np.array(
        [[m.angular.x, m.angular.y, m.angular.z] for _, m in got["/cmd_vel"]]))


def _by_name(msg, field: str) -> np.ndarray:
    """A JointState field in the fixtures' joint order."""
    return np.asarray(getattr(msg, field))[[list(msg.name).index(n) for n in
                                            ("shoulder", "elbow", "wrist")]]


def test_folder_mixing_storages_reads_every_bag(storages, tmp_path):
    """MCAP, sqlite3 and ROS 1 bags side by side: each one episode, ordered by start time."""
    root = tmp_path / "mixed"
    shutil.copytree(BAGS / "ep0", root / "a_ep0")
    shutil.copytree(storages / "db3" / "ep1", root / "b_ep1")
    shutil.copy(storages / "ros1" / "ep0.bag", root / "c_ep0.bag")
    src = open_source(root)
    assert [Path(src.locate(i)).name for i in src.episode_indices()] == \
        ["a_ep0", "c_ep0.bag", "b_ep1"]
    for i, prefix in ((0, "0"), (1, "0"), (2, "1")):
        assert_stream(src.read(i), prefix, "/ee_pose", "ee_pose.pose.position", "pose.position")


def _db3(storages: Path, tmp_path: Path, name: str = "ep1") -> Path:
    bag = tmp_path / "src" / name
    shutil.copytree(storages / "db3" / "ep1", bag)
    return bag


def _damage_db3(bag: Path, how: str) -> None:
    db = next(bag.glob("*.db3"))
    if how == "no_metadata":
        (bag / "metadata.yaml").unlink()
    elif how == "foreign_metadata":
        (bag / "metadata.yaml").write_text("name: my robot\nfiles: [a, b]\n")
    elif how == "mcap_metadata":
        (bag / "metadata.yaml").write_text((BAGS / "ep0" / "metadata.yaml").read_text())
    elif how == "unlisted":
        shutil.copy(db, bag / "extra.db3")
    elif how == "truncated":
        data = db.read_bytes()
        db.write_bytes(data[:len(data) // 2])
    elif how == "mixed":
        shutil.copy(BAGS / "ep1.mcap", bag / "ep1.mcap")
    elif how == "wal":
        (bag / (db.name + "-wal")).write_bytes(b"\0" * 4096)


@pytest.mark.parametrize("how,reason", [
    ("no_metadata", r"ep1\.db3: a sqlite3 bag file without its rosbag2 metadata\.yaml"),
    ("foreign_metadata", r"metadata\.yaml: not a rosbag2 metadata\.yaml \(KeyError"),
    ("mcap_metadata", r"metadata\.yaml: says storage 'mcap', but the bag holds ep1\.db3"),
    ("unlisted", r"metadata\.yaml: does not list \['extra\.db3'\]"),
    ("truncated", r"ep1(\.db3)?: (unreadable after \d+ messages|not a readable sqlite3)"),
    ("mixed", r"z_ep1: one bag mixes mcap and sqlite3 files \(ep1\.db3, ep1\.mcap\)"),
    ("wal", r"ep1\.db3: its write-ahead log ep1\.db3-wal holds messages not yet"),
])
def test_damaged_db3_fails_its_episode_only(storages, tmp_path, how, reason):
    bag = _db3(storages, tmp_path, "z_ep1")
    _damage_db3(bag, how)
    shutil.copytree(BAGS / "ep0", tmp_path / "src" / "a_ep0")
    src = open_source(tmp_path / "src")
    assert len(src.episode_indices()) == 2
    bad = next(i for i in src.episode_indices() if "z_ep1" in src.locate(i))
    with pytest.raises(DataError, match=reason) as e:
        src.read(bad)
    assert "\n" not in str(e.value)
    assert len(src.read(1 - bad).streams) == len(src.specs)


def test_locked_db3_is_refused_by_name(storages, tmp_path):
    import sqlite3

    bag = _db3(storages, tmp_path)
    db = sqlite3.connect(next(bag.glob("*.db3")))
    db.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(DataError, match=r"ep1\.db3 is locked by another process"):
            RosbagSource(bag)
    finally:
        db.rollback()
        db.close()
    assert len(RosbagSource(bag).read(0).streams) > 0


def _unindex(bag: Path) -> None:
    """What a killed ``rosbag record`` leaves: chunks, but ``index_pos`` 0 and no index."""
    data = bytearray(bag.read_bytes())
    at = data.index(b"index_pos=") + len(b"index_pos=")
    data[at:at + 8] = bytes(8)
    bag.write_bytes(bytes(data))


@pytest.mark.parametrize("name", ["z.bag", "z.bag.active"])
def test_unindexed_ros1_bag_fails_its_episode_only(storages, tmp_path, name):
    root = tmp_path / "src"
    root.mkdir()
    shutil.copy(storages / "ros1" / "ep0.bag", root / "a.bag")
    shutil.copy(storages / "ros1" / "ep1.bag", root / name)
    _unindex(root / name)
    src = open_source(root)
    assert src.episode_indices() == [0, 1]
    want = (r"z\.bag: not indexed: a recording that did not close .*`rosbag reindex`"
            if name == "z.bag" else r"z\.bag\.active: a ROS 1 recording that never closed")
    with pytest.raises(DataError, match=want):
        src.read(1)
    assert len(src.read(0).streams) == len(src.specs)


def test_db3_without_message_definitions(storages, tmp_path):
    """rosbag2 before Iron stores no message definitions: standard types are read with the
    definitions of the bag's ROS 2 distribution, and equal what was written."""
    import sqlite3

    bag = _db3(storages, tmp_path)
    with contextlib.closing(sqlite3.connect(next(bag.glob("*.db3")))) as db:
        db.execute("DELETE FROM message_definitions")
        db.commit()
    ep = RosbagSource(bag).read(0)
    for topic in ("/joint_states", "/ee_pose", "/camera/color", "/depth"):
        name, field = STREAMS[topic][0]
        assert_stream(ep, "1", topic, name, field)


@pytest.mark.slow
def test_ingest_of_mixed_storages_quarantines_the_damaged(storages, tmp_path):
    root = tmp_path / "src"
    shutil.copytree(storages / "db3" / "ep0", root / "ep0")
    shutil.copy(storages / "ros1" / "ep1.bag", root / "ep1.bag")
    shutil.copytree(storages / "db3" / "ep1", root / "ep2")
    (root / "ep2" / "metadata.yaml").unlink()
    run = cli("ingest", str(root), str(tmp_path / "cache"), "--rate", "20", "--device", "cpu",
              "--no-progress", "--json")
    assert run.returncode == 3, run.stderr
    manifest = json.loads(run.stdout)
    assert manifest["counts"]["cached"] == 2 and manifest["counts"]["quarantined"] == 1
    assert "ep1.db3: a sqlite3 bag file without its rosbag2 metadata.yaml" in \
        manifest["quarantined"][0]["reason"]


# --- TF: pose streams per frame pair, chains composed over time

def _tf_msgdef() -> str:
    H, POINT, QUAT, msgdef = (getattr(SCRIPT, k) for k in ("H", "POINT", "QUAT", "msgdef"))
    return msgdef("geometry_msgs/TransformStamped[] transforms\n",
                  ("geometry_msgs/TransformStamped", "std_msgs/Header header\n"
                   "string child_frame_id\ngeometry_msgs/Transform transform\n"), *H,
                  ("geometry_msgs/Transform", "geometry_msgs/Vector3 translation\n"
                   "geometry_msgs/Quaternion rotation\n"),
                  ("geometry_msgs/Vector3", POINT), ("geometry_msgs/Quaternion", QUAT))


def _unit(rng, n: int = 1) -> np.ndarray:
    q = rng.normal(size=(n, 4))
    return q / np.linalg.norm(q, axis=1, keepdims=True)


def write_tf_bag(path: Path, transforms: dict | None = None, seed: int = 3) -> dict:
    """An MCAP bag of /tf (world → base_link at 50 Hz, base_link → /link1 at 100 Hz, header
    stamps behind the log times), /tf_static (link1 → tool0, base_link → camera) and a Float64
    topic; ``transforms``: extra (parent, child) pairs of /tf at 100 Hz. Returns what was
    written: pair -> (stamp ns [S], float64 [S, 7] xyz wxyz)."""
    from mcap_ros2.writer import Writer

    rng = np.random.default_rng(seed)
    t0 = 1_764_000_000 * 10**9
    moving = {("world", "base_link"): 20_000_000, ("base_link", "/link1"): 10_000_000,
              **dict.fromkeys(transforms or (), 10_000_000)}
    written: dict = {}
    events = []  # (log ns, topic, transforms)
    for (parent, child), step in moving.items():
        for i in range(int(0.5e9 // step)):
            log = t0 + 3_000_000 + i * step + int(rng.integers(0, 500_000))
            stamp = log - int(rng.integers(0, 1_000_000))
            value = np.concatenate([rng.normal(size=3), _unit(rng)[0]])
            events.append((log, "/tf", [(parent, child, stamp, value)]))
            written.setdefault((parent, child.lstrip("/")), []).append((stamp, value))
    static = [("link1", "tool0", t0, np.concatenate([rng.normal(size=3), _unit(rng)[0]])),
              ("base_link", "camera", 0, np.concatenate([rng.normal(size=3), _unit(rng)[0]]))]
    events.append((t0 + 1_000_000, "/tf_static", static))
    for parent, child, stamp, value in static:
        written[(parent, child)] = [(stamp, value)]
    events.sort(key=lambda e: e[0])
    with open(path, "wb") as f:
        w = Writer(f)
        schema = w.register_msgdef("tf2_msgs/msg/TFMessage", _tf_msgdef())
        f64 = w.register_msgdef("std_msgs/msg/Float64", SCRIPT.DEFS["std_msgs/msg/Float64"])
        for i in range(11):
            w.write_message("/x", f64, {"data": float(i)}, log_time=t0 + i * 50_000_000)
        for log, topic, trs in events:
            msg = {"transforms": [{
                "header": {"stamp": {"sec": st // 10**9, "nanosec": st % 10**9},
                           "frame_id": p},
                "child_frame_id": c,
                "transform": {"translation": dict(zip("xyz", v[:3].tolist(), strict=True)),
                              "rotation": dict(zip("wxyz", v[3:].tolist(), strict=True))}}
                for p, c, st, v in trs]}
            w.write_message(topic, schema, msg, log_time=log)
        w.finish()
    return {k: (np.array([s for s, _ in v], np.int64), np.array([x for _, x in v]))
            for k, v in written.items()}


def _pose(values: np.ndarray):
    from scipy.spatial.transform import Rotation

    return values[:, :3], Rotation.from_quat(values[:, [4, 5, 6, 3]])  # scipy: xyzw


def _at(ns: np.ndarray, values: np.ndarray, want_ns: np.ndarray) -> np.ndarray:
    """A pair's poses at ``want_ns``: positions linear, rotations slerp (scipy's)."""
    from scipy.spatial.transform import Rotation, Slerp

    t = (ns - ns[0]) / 1e9
    x = (want_ns - ns[0]) / 1e9
    pos = np.stack([np.interp(x, t, values[:, k]) for k in range(3)], 1)
    rot = Slerp(t, Rotation.from_quat(values[:, [4, 5, 6, 3]]))(x)
    q = rot.as_quat()
    return np.concatenate([pos, q[:, [3, 0, 1, 2]]], 1)


def _compose(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    pa, ra = _pose(a)
    pb, rb = _pose(b)
    q = (ra * rb).as_quat()
    return np.concatenate([pa + ra.apply(pb), q[:, [3, 0, 1, 2]]], 1)


def _inverse(a: np.ndarray) -> np.ndarray:
    p, r = _pose(a)
    q = r.inv().as_quat()
    return np.concatenate([-r.inv().apply(p), q[:, [3, 0, 1, 2]]], 1)


def _same_pose(got: np.ndarray, want: np.ndarray) -> None:
    np.testing.assert_allclose(got[:, :3], want[:, :3], rtol=0, atol=1e-12)
    sign = np.sign(np.sum(got[:, 3:] * want[:, 3:], axis=1, keepdims=True))  # q and -q
    np.testing.assert_allclose(got[:, 3:], sign * want[:, 3:], rtol=0, atol=1e-12)


@pytest.fixture(scope="module")
def tf_bag(tmp_path_factory):
    path = tmp_path_factory.mktemp("tf") / "tf.mcap"
    return path, write_tf_bag(path)


def test_tf_pairs_are_pose_streams(tf_bag):
    path, written = tf_bag
    src = RosbagSource(path)
    ep = src.read(0)
    for pair in (("world", "base_link"), ("base_link", "link1")):
        name = "tf." + ".".join(pair)
        ns, values = written[pair]
        assert ep.meta["stamps_ns"][name + ".position"].tolist() == ns.tolist()
        assert np.array_equal(ep.streams[name + ".position"].times, nearest_seconds(ns))
        assert np.array_equal(ep.streams[name + ".position"].data, values[:, :3])
        assert np.array_equal(ep.streams[name + ".orientation"].data, values[:, 3:])
        assert src.specs[name + ".orientation"].quaternion
        assert src.specs[name + ".position"].rate_hz == pytest.approx(1e9 / (
            20_000_000 if pair[0] == "world" else 10_000_000), rel=0.1)
    # static pairs: constant over the span of every other stream
    span = [min(int(v[0]) for v in ep.meta["stamps_ns"].values()),
            max(int(v[-1]) for v in ep.meta["stamps_ns"].values())]
    for pair in (("link1", "tool0"), ("base_link", "camera")):
        name = "tf." + ".".join(pair)
        assert ep.meta["stamps_ns"][name + ".position"].tolist() == span
        assert np.array_equal(ep.streams[name + ".orientation"].data,
                              np.repeat(written[pair][1][:, 3:], 2, axis=0))
    assert ("base_link", "camera", "static") in ep.meta["tf_frames"]


def test_tf_chain_composed_over_time(tf_bag):
    path, written = tf_bag
    ep = RosbagSource(path, tf_chains=["base_link:tool0", ("tool0", "camera"),
                                       "/world:tool0"]).read(0)
    bl_l1 = written[("base_link", "link1")]
    l1_t0 = np.repeat(written[("link1", "tool0")][1], len(bl_l1[0]), axis=0)
    cam = np.repeat(written[("base_link", "camera")][1], len(bl_l1[0]), axis=0)
    # one moving link: its own times, composed with the static one
    got = np.concatenate([ep.streams["tf.base_link.tool0.position"].data,
                          ep.streams["tf.base_link.tool0.orientation"].data], 1)
    assert ep.meta["stamps_ns"]["tf.base_link.tool0.position"].tolist() == bl_l1[0].tolist()
    want = _compose(bl_l1[1], l1_t0)
    _same_pose(got, want)
    # up to the common frame (inverted), then down
    got = np.concatenate([ep.streams["tf.tool0.camera.position"].data,
                          ep.streams["tf.tool0.camera.orientation"].data], 1)
    _same_pose(got, _compose(_inverse(want), cam))
    # two moving links at their own rates: every sample time inside their common span, each
    # link aligned there (linear / slerp)
    w_bl = written[("world", "base_link")]
    ns = np.unique(np.concatenate([w_bl[0], bl_l1[0]]))
    ns = ns[(ns >= max(w_bl[0][0], bl_l1[0][0])) & (ns <= min(w_bl[0][-1], bl_l1[0][-1]))]
    assert ep.meta["stamps_ns"]["tf.world.tool0.position"].tolist() == ns.tolist()
    got = np.concatenate([ep.streams["tf.world.tool0.position"].data,
                          ep.streams["tf.world.tool0.orientation"].data], 1)
    want = _compose(_compose(_at(*w_bl, ns), _at(*bl_l1, ns)),
                    np.repeat(written[("link1", "tool0")][1], len(ns), axis=0))
    np.testing.assert_allclose(got[:, :3], want[:, :3], rtol=0, atol=1e-9)
    np.testing.assert_allclose(np.abs(np.sum(got[:, 3:] * want[:, 3:], axis=1)), 1, atol=1e-9)


@pytest.mark.parametrize("chain,extra,reason", [
    ("base_link:nowhere", None, r"TF chain base_link → nowhere: frame nowhere is in no "
                                r"transform of the bag \(frames: \["),
    ("base_link:odom", [("map", "odom")], r"TF chain base_link → odom: no transforms link "
                                          r"them \(base_link's tree has root world, odom's "
                                          r"has root map\)"),
    ("world:tool0", [("tool0", "world")], r"TF frames .* form a loop"),
    ("world:tool0", [("camera", "link1")], r"TF frame link1 has two parents, base_link and "
                                           r"camera"),
])
def test_tf_chain_gap_or_loop_one_line(tmp_path, chain, extra, reason):
    write_tf_bag(tmp_path / "b.mcap", extra)
    with pytest.raises(DataError, match=reason) as e:
        RosbagSource(tmp_path / "b.mcap", tf_chains=[chain])
    assert "\n" not in str(e.value)
    with pytest.raises(DataError, match="SOURCE:TARGET"):
        RosbagSource(tmp_path / "b.mcap", tf_chains=["base_link"])


def test_tf_from_ros1_and_db3_equals_mcap(tf_bag, tmp_path):
    path, _ = tf_bag
    messages = _mcap_messages([path])
    write_ros1(tmp_path / "tf.bag", messages)
    write_db3(tmp_path / "tf_db3", messages)
    want = RosbagSource(path, tf_chains=["world:tool0"]).read(0)
    for other in (tmp_path / "tf.bag", tmp_path / "tf_db3"):
        got = RosbagSource(other, tf_chains=["world:tool0"]).read(0)
        assert got.streams.keys() == want.streams.keys()
        for name, s in want.streams.items():
            assert np.array_equal(got.streams[name].data, s.data), (other, name)
            assert np.array_equal(got.meta["stamps_ns"][name], want.meta["stamps_ns"][name])


@pytest.mark.slow
def test_ingest_tf_chain(tf_bag, tmp_path):
    path, _ = tf_bag
    run = cli("ingest", str(path), str(tmp_path / "c"), "--rate", "50", "--device", "cpu",
              "--no-progress", "--json", "--tf-chain", "base_link:tool0")
    assert run.returncode == 0, run.stderr
    streams = json.loads(run.stdout)["streams"]
    assert streams["tf.base_link.tool0.orientation"]["method"] == "slerp"
    assert streams["tf.base_link.camera.position"]["method"] == "previous"  # held
    run = cli("ingest", str(path), str(tmp_path / "d"), "--rate", "50", "--no-progress",
              "--tf-chain", "tool0")
    assert run.returncode == 2 and run.stderr.count("\n") == 1, run.stderr
    assert "--tf-chain" in run.stderr and "SOURCE:TARGET" in run.stderr
    assert not (tmp_path / "d").exists()


def test_inspect_lists_topics_and_every_unreadable_file(storages, tmp_path):
    root = tmp_path / "src"
    shutil.copytree(storages / "db3" / "ep0", root / "ep0")
    shutil.copy(storages / "ros1" / "ep1.bag", root / "ep1.bag")
    shutil.copytree(storages / "db3" / "ep1", root / "ep2")
    (root / "ep2" / "metadata.yaml").unlink()
    (root / "notes.txt").write_text("operator notes")
    run = cli("inspect", str(root), "--json")
    assert run.returncode == 0, run.stderr
    facts = json.loads(run.stdout)
    topics = facts["topics"]
    assert topics["/joint_states"] == {
        "type": "sensor_msgs/msg/JointState", "messages": 400, "episodes": 2,
        "rate_hz": topics["/joint_states"]["rate_hz"], "not_read": None,
        "streams": ["joint_states.position", "joint_states.velocity"]}
    assert topics["/joint_states"]["rate_hz"] == pytest.approx(200, rel=0.01)
    assert topics["/rosout"]["not_read"] == "rcl_interfaces/msg/Log: no mapping"
    assert topics["/ee_pose"]["messages"] == 200
    [bad] = facts["unreadable"]
    assert "ep1.db3: a sqlite3 bag file without its rosbag2 metadata.yaml" in bad["reason"]
    assert facts["not_bags"] == [str(root / "notes.txt")]
    run = cli("inspect", str(root))
    assert "/rosout" in run.stdout and "not read: rcl_interfaces/msg/Log" in run.stdout
    assert "not a bag (not read):" in run.stdout and "notes.txt" in run.stdout


# --- any message with numeric fields, mapped from its definition; the listed sensor types

CUSTOM = ("my_robot/msg/Gripper", "std_msgs/Header header\nfloat32 width\nint32 mode\n"
          "bool grasped\nfloat64[3] force\ngeometry_msgs/Quaternion tip\nuint8[] flags\n"
          "string note\nbuiltin_interfaces/Time started\nmy_robot/Finger[2] fingers\n"
          "my_robot/Finger palm\n")
FINGER = ("my_robot/Finger", "float32 angle\nuint16 contact\n")


def _humble_def(type_: str) -> str:
    from rosbags.typesys import Stores, get_typestore

    return get_typestore(Stores.ROS2_HUMBLE).generate_msgdef(type_, ros_version=2)[0]


def write_types_bag(path: Path, n: int = 12) -> dict:
    """An MCAP bag of a custom message and of Joy, NavSatFix, MagneticField, LaserScan,
    CameraInfo and PointCloud2 (mcap-ros2-support's writer); returns the messages written
    per topic."""
    from mcap_ros2.writer import Writer

    H, QUAT, msgdef = (getattr(SCRIPT, k) for k in ("H", "QUAT", "msgdef"))
    rng = np.random.default_rng(11)
    t0 = 1_764_000_000 * 10**9
    defs = {"my_robot/msg/Gripper": msgdef(CUSTOM[1], *H, ("geometry_msgs/Quaternion", QUAT),
                                           FINGER),
            **{t: _humble_def(t) for t in (
                "sensor_msgs/msg/Joy", "sensor_msgs/msg/NavSatFix",
                "sensor_msgs/msg/MagneticField", "sensor_msgs/msg/LaserScan",
                "sensor_msgs/msg/CameraInfo", "sensor_msgs/msg/PointCloud2")}}
    topics = {"/gripper_state": "my_robot/msg/Gripper", "/joy": "sensor_msgs/msg/Joy",
              "/fix": "sensor_msgs/msg/NavSatFix", "/mag": "sensor_msgs/msg/MagneticField",
              "/scan": "sensor_msgs/msg/LaserScan", "/camera/info": "sensor_msgs/msg/CameraInfo",
              "/points": "sensor_msgs/msg/PointCloud2", "/cloud": "sensor_msgs/msg/PointCloud2"}
    written: dict = {t: [] for t in topics}

    def head(i):
        st = t0 + i * 20_000_000 + 7
        return {"stamp": {"sec": st // 10**9, "nanosec": st % 10**9}, "frame_id": "f"}

    def v3():
        return dict(zip("xyz", rng.normal(size=3).tolist(), strict=True))

    def make(topic, i):
        if topic == "/gripper_state":
            return {"header": head(i), "width": float(np.float32(rng.normal())),
                    "mode": int(rng.integers(-5, 5)), "grasped": bool(i % 2),
                    "force": rng.normal(size=3).tolist(),
                    "tip": dict(zip("xyzw", rng.normal(size=4).tolist(), strict=True)),
                    "flags": bytes(rng.integers(0, 255, 4, dtype=np.uint8)), "note": "n" * i,
                    "started": {"sec": 5, "nanosec": i},
                    "fingers": [{"angle": 1.0, "contact": 2}] * 2,
                    "palm": {"angle": float(np.float32(i / 3)), "contact": i}}
        if topic == "/joy":
            return {"header": head(i), "axes": rng.normal(size=4).astype(np.float32).tolist(),
                    "buttons": rng.integers(0, 2, 6).tolist()}
        if topic == "/fix":
            return {"header": head(i), "status": {"status": 0, "service": 1},
                    "latitude": 48.1 + i * 1e-6, "longitude": 11.5, "altitude": 520.0 + i,
                    "position_covariance": rng.normal(size=9).tolist(),
                    "position_covariance_type": 2}
        if topic == "/mag":
            return {"header": head(i), "magnetic_field": v3(),
                    "magnetic_field_covariance": [0.0] * 9}
        if topic == "/scan":
            return {"header": head(i), "angle_min": -1.5, "angle_max": 1.5,
                    "angle_increment": 0.5, "time_increment": 0.001, "scan_time": 0.1,
                    "range_min": 0.1, "range_max": 30.0,
                    "ranges": rng.uniform(0, 30, 7).astype(np.float32).tolist(),
                    "intensities": []}
        if topic == "/camera/info":
            return {"header": head(i), "height": 480, "width": 640,
                    "distortion_model": "plumb_bob", "d": [0.1, 0.0, 0.0, 0.0, 0.0],
                    "k": [500.0, 0, 320, 0, 500, 240, 0, 0, 1], "r": [1.0, 0, 0, 0, 1, 0, 0, 0, 1],
                    "p": [500.0, 0, 320, 0, 0, 500, 240, 0, 0, 0, 1, 0], "binning_x": 0,
                    "binning_y": 0, "roi": {"x_offset": 0, "y_offset": 0, "height": 0,
                                            "width": 0, "do_rectify": False}}
        # x, y, z float32 and an rgb word, 16 bytes a point; /cloud organized 2 x 3 with
        # 4 bytes of padding at the end of each row, /points a lidar scan of i + 1 points
        h, w = (2, 3) if topic == "/cloud" else (1, i + 1)
        xyz = rng.normal(size=(h, w, 3)).astype(np.float32)
        xyz[0, 0] = np.nan  # an invalid point
        rows = np.zeros((h, w * 16 + 4), np.uint8)
        pts = rows[:, :w * 16].reshape(h, w, 16)
        pts[..., :12] = xyz.view(np.uint8).reshape(h, w, 12)
        field = [{"name": n, "offset": o, "datatype": d, "count": 1} for n, o, d in
                 (("x", 0, 7), ("y", 4, 7), ("z", 8, 7), ("rgb", 12, 6))]
        return {"header": head(i), "height": h, "width": w, "fields": field,
                "is_bigendian": False, "point_step": 16, "row_step": w * 16 + 4,
                "data": rows.tobytes(), "is_dense": False, "_xyz": xyz}

    with open(path, "wb") as f:
        w = Writer(f)
        schemas = {t: w.register_msgdef(type_, defs[type_]) for t, type_ in topics.items()}
        for i in range(n):
            for topic in topics:
                msg = make(topic, i)
                written[topic].append(msg)
                msg = {k: v for k, v in msg.items() if k != "_xyz"}
                w.write_message(topic, schemas[topic], msg, log_time=t0 + i * 20_000_000 + 9)
        w.finish()
    return written


@pytest.fixture(scope="module")
def types_bag(tmp_path_factory):
    path = tmp_path_factory.mktemp("types") / "types.mcap"
    return path, write_types_bag(path)


def _stamps(msgs) -> list[int]:
    return [m["header"]["stamp"]["sec"] * 10**9 + m["header"]["stamp"]["nanosec"] for m in msgs]


def _check_types(ep, specs, written) -> None:
    g = written["/gripper_state"]
    s = ep.streams
    assert ep.meta["stamps_ns"]["gripper_state.width"].tolist() == _stamps(g)
    assert s["gripper_state.width"].data.dtype == np.float32
    assert s["gripper_state.width"].data.tolist() == [m["width"] for m in g]
    assert s["gripper_state.mode"].data.dtype == np.int32
    assert s["gripper_state.mode"].data.tolist() == [m["mode"] for m in g]
    assert s["gripper_state.grasped"].data.tolist() == [m["grasped"] for m in g]
    assert np.array_equal(s["gripper_state.force"].data, [m["force"] for m in g])
    assert specs["gripper_state.tip"].quaternion
    assert np.array_equal(s["gripper_state.tip"].data, [[m["tip"][k] for k in "wxyz"]
                                                        for m in g])
    assert s["gripper_state.flags"].data.dtype == np.uint8
    assert s["gripper_state.flags"].data.tolist() == [list(m["flags"]) for m in g]
    assert s["gripper_state.started"].data.tolist() == [5 * 10**9 + i for i in range(len(g))]
    assert s["gripper_state.palm.angle"].data.tolist() == [m["palm"]["angle"] for m in g]
    assert s["gripper_state.palm.contact"].data.dtype == np.uint16
    assert not any(n.startswith(("gripper_state.fingers", "gripper_state.note")) for n in s)
    j = written["/joy"]
    assert s["joy.axes"].data.dtype == np.float32 and s["joy.axes"].data.shape == (len(j), 4)
    assert s["joy.axes"].data.tolist() == [m["axes"] for m in j]
    assert s["joy.buttons"].data.tolist() == [m["buttons"] for m in j]
    fix = written["/fix"]
    assert s["fix.latitude"].data.tolist() == [m["latitude"] for m in fix]
    assert s["fix.altitude"].data.tolist() == [m["altitude"] for m in fix]
    assert s["fix.status.status"].data.dtype == np.int8
    assert np.array_equal(s["fix.position_covariance"].data,
                          [m["position_covariance"] for m in fix])
    assert np.array_equal(s["mag.magnetic_field"].data, [[m["magnetic_field"][k] for k in "xyz"]
                                                         for m in written["/mag"]])
    scan = written["/scan"]
    assert s["scan.ranges"].data.dtype == np.float32
    assert s["scan.ranges"].data.tolist() == [m["ranges"] for m in scan]
    assert "scan.intensities" not in s and "scan.angle_min" not in s  # empty; in meta
    assert ep.meta["sensors"]["scan"] == {
        "frame_id": "f", "angle_min": -1.5, "angle_max": 1.5, "angle_increment": 0.5,
        "time_increment": float(np.float32(0.001)), "scan_time": float(np.float32(0.1)),
        "range_min": float(np.float32(0.1)), "range_max": 30.0}
    info = ep.meta["sensors"]["camera.info"]
    assert (info["width"], info["height"], info["distortion_model"]) == (640, 480, "plumb_bob")
    assert info["k"] == [500.0, 0, 320, 0, 500, 240, 0, 0, 1]
    assert not any(n.startswith(("camera.info", "points")) for n in s)
    cloud = s["cloud.points"].data  # organized 2 x 3: its NaN point kept, row padding skipped
    assert cloud.dtype == np.float32 and cloud.shape == (len(written["/cloud"]), 6, 3)
    want = np.stack([m["_xyz"].reshape(6, 3) for m in written["/cloud"]])
    assert np.array_equal(cloud, want, equal_nan=True) and np.isnan(cloud[:, 0]).all()
    assert specs["cloud.points"].shape == (6, 3)


def test_numeric_messages_mapped_from_their_definition(types_bag):
    path, written = types_bag
    src = RosbagSource(path)
    _check_types(src.read(0), src.specs, written)
    assert "/points (sensor_msgs/msg/PointCloud2: topic /points message 1: 2 points, the " \
        "first message 1: the point count varies" in src.timing
    facts = src.describe()["topics"]
    assert facts["/camera/info"]["not_read"] == "into Episode.meta['sensors']['camera.info']"


def test_numeric_messages_from_db3_and_ros1(types_bag, tmp_path):
    path, written = types_bag
    messages = [m for m in _mcap_messages([path]) if m[0] != "/points"]
    write_db3(tmp_path / "db3", messages)
    write_ros1(tmp_path / "t.bag", messages)
    for bag in (tmp_path / "db3", tmp_path / "t.bag"):
        src = RosbagSource(bag)
        _check_types(src.read(0), src.specs, written)


def test_sequence_changing_length_fails_its_episode(tmp_path):
    from mcap_ros2.writer import Writer

    with open(tmp_path / "j.mcap", "wb") as f:
        w = Writer(f)
        joy = w.register_msgdef("sensor_msgs/msg/Joy", _humble_def("sensor_msgs/msg/Joy"))
        for i in range(4):
            w.write_message("/joy", joy, {"header": {"stamp": {"sec": 1, "nanosec": i},
                                                     "frame_id": ""},
                                          "axes": [0.5] * (3 if i < 2 else 2), "buttons": []},
                            log_time=10 + i)
        w.finish()
    with pytest.raises(DataError, match=r"topic /joy message 2: field axes holds 2 values, "
                                        r"the first message 3"):
        RosbagSource(tmp_path / "j.mcap")


def test_ros1_common_layouts_decoded_in_bulk(storages, monkeypatch):
    """ROS 1 messages of the fixed layouts go through the bulk decode (its ROS 1 wire
    format), not one by one, and equal what was written (test above)."""
    from robocache.data.formats import cdr

    got = {}
    for name in ("vectors", "scalars", "joint_states"):
        real = getattr(cdr, name)

        def spy(*a, real=real, name=name):
            out = real(*a)
            got.setdefault(name, []).append((a[-1], out is not None))
            return out

        monkeypatch.setattr(cdr, name, spy)
    RosbagSource(storages / "ros1" / "ep0.bag").read(0)
    assert got.keys() == {"vectors", "scalars", "joint_states"}
    assert all(wire == cdr.ROS1 and ok for calls in got.values() for wire, ok in calls)


def test_camera_info_intrinsics_feed_depth_to_points(types_bag):
    """CameraInfo's k (row-major 3x3) is the intrinsics depth_to_points takes."""
    import torch

    from robocache.ops.pointcloud import depth_to_points

    info = RosbagSource(types_bag[0]).read(0).meta["sensors"]["camera.info"]
    k = torch.tensor(info["k"], dtype=torch.float64).reshape(3, 3)
    depth = torch.full((info["height"], info["width"]), 2.0, dtype=torch.float64)
    cloud = depth_to_points(depth, k)
    u, v = 10, 7  # the pixel's column and row
    p = cloud.points[v * info["width"] + u]
    assert torch.allclose(p, torch.tensor([(u - 320) * 2 / 500, (v - 240) * 2 / 500, 2.0],
                                          dtype=p.dtype))


def test_ros1_messages_written_out_of_time_order(tmp_path):
    """ROS 1 bags are read chunk by chunk in file order; a bag whose messages were written
    out of time order still reads in log-time order, as rosbags' reader gives them."""
    messages = _mcap_messages(FIXTURE_EPISODES["1"])
    write_ros1(tmp_path / "r.bag", messages[::-1], compression="bz2")
    ep = RosbagSource(tmp_path / "r.bag", time_source="log").read(0)
    for topic in ("/joint_states", "/gripper", "/camera/color"):
        name, field = STREAMS[topic][0]
        assert_stream(ep, "1", topic, name, field, time_source="log")


def test_point_cloud_feeds_voxelize(types_bag):
    """A PointCloud2 stream [S, N, 3] is what voxelize takes (its NaN points dropped)."""
    import torch

    from robocache.ops.pointcloud import voxelize

    points = torch.from_numpy(RosbagSource(types_bag[0]).read(0).streams["cloud.points"].data)
    grid = voxelize(points, bounds_min=-10.0, voxel_size=1.0, grid_size=20, mode="count")
    assert grid.dropped.tolist() == [1] * len(points)  # the NaN point of each cloud


def test_db3_split_files_read_as_one_recording(tmp_path):
    """A sqlite3 bag split in two files (--max-bag-duration) listed by its metadata.yaml: one
    episode, every message as written."""
    import yaml

    messages = _mcap_messages(FIXTURE_EPISODES["0"])
    half = len(messages) // 2
    for part, msgs in enumerate((messages[:half], messages[half:])):
        write_db3(tmp_path / f"part{part}", msgs)
    bag = tmp_path / "src" / "ep0"
    bag.mkdir(parents=True)
    infos = [yaml.safe_load((tmp_path / f"part{p}" / "metadata.yaml").read_text())[
        "rosbag2_bagfile_information"] for p in (0, 1)]
    for p in (0, 1):
        shutil.copy(tmp_path / f"part{p}" / f"part{p}.db3", bag / f"ep0_{p}.db3")
    counts: dict = {}
    for info in infos:
        for t in info["topics_with_message_count"]:
            name = t["topic_metadata"]["name"]
            counts.setdefault(name, {**t, "message_count": 0})["message_count"] += \
                t["message_count"]
    start = infos[0]["starting_time"]["nanoseconds_since_epoch"]
    end = infos[1]["starting_time"]["nanoseconds_since_epoch"] + \
        infos[1]["duration"]["nanoseconds"]
    merged = {**infos[0], "relative_file_paths": ["ep0_0.db3", "ep0_1.db3"],
              "files": [{**f, "path": f"ep0_{p}.db3"} for p, info in enumerate(infos)
                        for f in info["files"]],
              "message_count": len(messages), "duration": {"nanoseconds": end - start},
              "topics_with_message_count": list(counts.values())}
    (bag / "metadata.yaml").write_text(yaml.safe_dump({"rosbag2_bagfile_information": merged}))
    ep = open_source(tmp_path / "src").read(0)
    assert len(ep.meta["files"]) == 2
    for topic, streams in STREAMS.items():
        for name, field in streams:
            assert_stream(ep, "0", topic, name, field)


def test_db3_message_that_does_not_decode_is_named(tmp_path):
    import sqlite3

    write_db3(tmp_path / "bag", _mcap_messages(FIXTURE_EPISODES["1"]))
    with contextlib.closing(sqlite3.connect(tmp_path / "bag" / "bag.db3")) as db:
        (topic,) = db.execute("SELECT id FROM topics WHERE name = '/ee_pose'").fetchone()
        ids = [r[0] for r in db.execute("SELECT id FROM messages WHERE topic_id = ? ORDER BY "
                                        "timestamp", (topic,))]
        db.execute("UPDATE messages SET data = ? WHERE id = ?", (b"\0\1\0\0\7", ids[3]))
        db.commit()
    with pytest.raises(DataError, match=r"bag: topic /ee_pose message 3 does not decode as "
                                        r"geometry_msgs/msg/PoseStamped"):
        RosbagSource(tmp_path / "bag")


def test_truncated_ros1_bag_fails_its_episode_only(storages, tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    shutil.copy(storages / "ros1" / "ep0.bag", root / "a.bag")
    data = (storages / "ros1" / "ep1.bag").read_bytes()
    (root / "z.bag").write_bytes(data[:len(data) * 9 // 10])
    src = open_source(root)
    with pytest.raises(DataError, match=r"z\.bag: Bag index looks damaged.*`rosbag reindex`"):
        src.read(1)
    assert len(src.read(0).streams) == len(src.specs)
