"""ROS 2 bags: every message read equals what mcap-ros2-support's writer wrote
(tests/fixtures/rosbag/make_fixtures.py), the options, and the bad bags quarantined with the
topic, message index and reason."""

from __future__ import annotations

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
    with pytest.raises(DataError, match="no ROS 2 bag"):
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
