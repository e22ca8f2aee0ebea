"""``robocache export --format lerobot``: LeRobot 0.6.1's own ``LeRobotDataset`` loads the
export and its items equal the cache's (numbers bit for bit; frames within the codec budget).

The items LeRobot gave for the committed export (tests/fixtures/export/make_fixtures.py) are
checked here without LeRobot; with LeRobot's virtual environment present, a fresh export is
loaded by LeRobot itself as well.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("mcap_ros2", reason="the cache is built from ROS 2 bags: needs "
                                        "mcap-ros2-support (pip install 'robocache[rosbag]')")
pytest.importorskip("pandas", reason="writing LeRobot datasets needs pandas")

import robocache  # noqa: E402
from robocache.data.export import export_lerobot  # noqa: E402
from robocache.errors import DataError  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures" / "export"
ITEMS = dict(np.load(FIXTURES / "items.npz"))
META = json.loads((FIXTURES / "meta.json").read_text())
# the Python of LeRobot's own virtual environment (LeRobot needs Python >= 3.12), when present
LEROBOT_PYTHON = Path(os.environ["LEROBOT_PYTHON"]) if os.environ.get("LEROBOT_PYTHON") else None
CAMERAS = ("camera.color", "wrist.image_raw")
# The codec budget: AV1 at CRF 30, yuv420p (LeRobot's recording setting) of the cache's frames
# (JPEG 4:4:4: full chroma) on the fixtures' tiny frames gave 30.0-32.4 dB PSNR for the 24x32
# camera and 22.0-29.3 dB for the 16x20 one (its chroma, kept whole in the cache, is halved on
# 8x10 planes); each frame must also be closest to its own step's frame
MIN_PSNR = {"camera.color": 28.0, "wrist.image_raw": 20.0}

_spec = importlib.util.spec_from_file_location("export_fixtures", FIXTURES / "make_fixtures.py")
_script = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_script)
build_cache = _script.build_cache


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2)
    return float("inf") if mse == 0 else 10 * np.log10(255.0 ** 2 / mse)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    dest = tmp_path_factory.mktemp("export") / "cache"
    build_cache(dest)
    return dest


def cached(cache: Path) -> dict[str, np.ndarray]:
    """The cache's rows in (episode, step) order: numeric streams as stored, every camera's
    frame at each step decoded with Pillow (a step before the first frame: the first)."""
    import lance
    from PIL import Image

    manifest = json.loads((cache / "manifest.json").read_text())
    table = lance.dataset(str(cache / "data.lance")).to_table()
    order = np.lexsort((table.column("step").to_numpy(), table.column("episode_index").to_numpy()))
    out = {"episode_index": table.column("episode_index").to_numpy()[order],
           "task": np.array(table.column("task").to_pylist())[order]}
    for name, s in manifest["streams"].items():
        col = s["column"]
        if s["kind"] == "numeric":
            flat = table.column(col).combine_chunks().flatten().to_numpy(zero_copy_only=False)
            out[name] = flat.reshape(len(order), -1)[order]
        elif name in CAMERAS:
            frames = lance.dataset(str(cache / "frames" / f"{name}.lance")).to_table()
            at = {(e, f): i for i, (e, f) in enumerate(zip(
                frames.column("episode_index").to_pylist(), frames.column("frame").to_pylist(),
                strict=True))}
            rows = [at[(e, max(f, 0))] for e, f in zip(
                out["episode_index"], table.column(f"{col}/frame").to_numpy()[order],
                strict=True)]
            out[name] = np.stack([np.asarray(Image.open(io.BytesIO(
                frames.column("encoded")[r].as_py())).convert("RGB")) for r in rows])
    return out


def assert_items_equal_cache(items: dict[str, np.ndarray], want: dict[str, np.ndarray],
                             fps: float) -> None:
    n = len(want["episode_index"])
    assert len(items["index"]) == n
    for name, values in want.items():
        if name in CAMERAS:
            got = np.rint(items[name].transpose(0, 2, 3, 1) * 255).astype(np.uint8)
            assert got.shape == values.shape, name
            for i in range(n):
                assert psnr(got[i], values[i]) > MIN_PSNR[name], (name, i)
                # the frame of its own step, not a neighbour's
                other = [psnr(got[i], values[j]) for j in range(n) if
                         not np.array_equal(values[j], values[i])]
                assert not other or psnr(got[i], values[i]) > max(other), (name, i)
        elif name == "task":
            assert items["task"].tolist() == values.tolist()
        elif name != "episode_index":
            got = items[name].reshape(n, -1)
            # LeRobot serves floats as float32: the cached value rounded once, bit for bit
            ref = values.astype(np.float32) if values.dtype == np.float64 else values
            assert got.dtype == ref.dtype and np.array_equal(got, ref), name
    ends = np.flatnonzero(np.diff(want["episode_index"])) + 1
    frame = np.arange(n) - np.repeat(np.r_[0, ends], np.diff(np.r_[0, ends, n]))
    assert np.array_equal(items["frame_index"], frame)
    assert np.array_equal(items["timestamp"], (frame / fps).astype(np.float32))
    assert np.array_equal(items["episode_index"], np.searchsorted(
        np.unique(want["episode_index"]), want["episode_index"]))


def test_lerobot_items_of_the_committed_export_equal_the_cache(cache):
    """The items LeRobot 0.6.1 gave for the committed export equal a cache built now."""
    assert META["lerobot_version"] == "0.6.1"
    assert_items_equal_cache(ITEMS, cached(cache), META["rate_hz"])


def test_export_equals_the_committed_one(cache, tmp_path):
    import pyarrow.parquet as pq

    summary = export_lerobot(cache, tmp_path / "out")
    assert summary["not_exported"] == {
        "depth": "depth cameras are not exported",
        "note.data": "event streams have no LeRobot feature"}
    for rel in ("data/chunk-000/file-000.parquet", "meta/episodes/chunk-000/file-000.parquet",
                "meta/tasks.parquet"):
        assert pq.read_table(tmp_path / "out" / rel).equals(
            pq.read_table(FIXTURES / "lerobot" / rel)), rel
    info = json.loads((tmp_path / "out" / "meta" / "info.json").read_text())
    assert info == json.loads((FIXTURES / "lerobot" / "meta" / "info.json").read_text())
    assert info["fps"] == 20 and info["codebase_version"] == "v3.0"
    stats = json.loads((tmp_path / "out" / "meta" / "stats.json").read_text())
    assert np.shape(stats["camera.color"]["mean"]) == (3, 1, 1)


def test_our_lerobot_reader_agrees_with_lerobot(cache, tmp_path):
    """robocache.LeRobotDataset over a fresh export serves what LeRobot served."""
    export_lerobot(cache, tmp_path / "out")
    ours = robocache.LeRobotDataset("robocache/export", root=tmp_path / "out",
                                    cache=tmp_path / "c")
    got = {k: [] for k in ITEMS}
    for i in range(len(ours)):
        for k, v in ours[i].items():
            got[k].append(v)
    for k, want in ITEMS.items():
        if k == "task":
            assert got[k] == want.tolist()
        elif k in CAMERAS:
            # the same video decoded by PyAV (into our cache's JPEG frames) and by torchcodec:
            # their chroma upsampling differs, which on these tiny frames is as large as the
            # codec's own error (28.5 / 31.1 dB at worst for the 16x20 / 24x32 camera)
            frames = np.stack([v.numpy() for v in got[k]])
            worst = min(psnr(np.rint(a * 255), np.rint(b * 255)) for a, b in
                        zip(frames, want, strict=True))
            assert worst > MIN_PSNR[k], (k, worst)
        else:
            assert np.array_equal(np.stack([v.numpy() for v in got[k]]), want), k


def test_images_are_lossless_from_the_cache(cache, tmp_path):
    export_lerobot(cache, tmp_path / "out", cameras="image",
                   rename={"joint_states.position": "observation.state"})
    ds = robocache.LeRobotDataset("robocache/export", root=tmp_path / "out",
                                  cache=tmp_path / "c")
    want = cached(cache)
    assert "observation.state" in ds.features and "joint_states.position" not in ds.features
    for i in (0, 7, len(ds) - 1):
        item = ds[i]
        for name in CAMERAS:
            frame = np.rint(item[name].numpy().transpose(1, 2, 0) * 255).astype(np.uint8)
            assert np.array_equal(frame, want[name][i]), (name, i)


@pytest.mark.skipif(LEROBOT_PYTHON is None or not LEROBOT_PYTHON.exists(),
                    reason="LeRobot's own virtual environment is absent (set LEROBOT_PYTHON to "
                           "its python); the committed items are checked instead")
def test_lerobot_loads_a_fresh_export(cache, tmp_path):
    export_lerobot(cache, tmp_path / "out")
    run = subprocess.run([str(LEROBOT_PYTHON), str(FIXTURES / "make_fixtures.py"), "items",
                          str(tmp_path / "out"), str(tmp_path / "items.npz")],
                         capture_output=True, text=True, timeout=600,
                         env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""})
    assert run.returncode == 0, run.stderr[-2000:]
    assert_items_equal_cache(dict(np.load(tmp_path / "items.npz")), cached(cache), 20.0)


def test_bad_input_writes_nothing(cache, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("mine")
    with pytest.raises(DataError, match="not an empty directory"):
        export_lerobot(cache, tmp_path / "full")
    assert [p.name for p in (tmp_path / "full").iterdir()] == ["x"]
    with pytest.raises(DataError, match="`cameras`"):
        export_lerobot(cache, tmp_path / "a", cameras="gif")
    with pytest.raises(DataError, match="`rename`"):
        export_lerobot(cache, tmp_path / "a", rename={"nope": "x"})
    with pytest.raises(DataError, match="`rename`"):
        export_lerobot(cache, tmp_path / "a", rename={"gripper.data": "index"})
    with pytest.raises(DataError, match="`vcodec`"):
        export_lerobot(cache, tmp_path / "a", vcodec="libnope")
    with pytest.raises(FileNotFoundError, match="not a RoboCache cache"):
        export_lerobot(tmp_path / "full", tmp_path / "a")
    with pytest.raises(DataError, match="`rename`"):  # refused before anything is made
        export_lerobot(cache, tmp_path / "new" / "deep" / "a", rename={"x": "y"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["full"]


def test_cli_one_line_errors(cache, tmp_path):
    def cli(*args):
        return subprocess.run([sys.executable, "-m", "robocache.cli", "export", *args],
                              capture_output=True, text=True, timeout=300,
                              env={**os.environ, "PYTHONPATH": str(ROOT / "src")})

    run = cli(str(cache), str(tmp_path / "o"), "--format", "rlds")
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "--format" in run.stderr
    run = cli(str(cache), str(tmp_path / "o"), "--rename", "x")
    assert run.returncode == 2 and "STREAM=KEY" in run.stderr
    run = cli(str(tmp_path), str(tmp_path / "o"))
    assert run.returncode == 2 and "not a RoboCache cache" in run.stderr
    assert not (tmp_path / "o").exists()
    run = cli(str(cache), str(tmp_path / "o"), "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["frames"] == len(ITEMS["index"])


def test_a_failed_export_leaves_nothing(cache, tmp_path, monkeypatch):
    import robocache.data.export as export

    def fail(*args):
        (args[1] / "data").mkdir(parents=True)  # half-written, then a failure
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(export, "_write", fail)
    with pytest.raises(OSError, match="No space"):
        export_lerobot(cache, tmp_path / "new" / "deep" / "out")
    assert list(tmp_path.iterdir()) == []


def _episode_frames(cache: Path, key: str) -> list[np.ndarray]:
    """Camera ``key``'s frame at every step of the cache, one array per episode."""
    import lance
    from PIL import Image

    col = json.loads((cache / "manifest.json").read_text())["streams"][key]["column"]
    rows = lance.dataset(str(cache / "data.lance")).to_table(
        columns=["episode_index", "step", f"{col}/frame"])
    ep, step, frame = (rows.column(c).to_numpy() for c in ("episode_index", "step", f"{col}/frame"))
    table = lance.dataset(str(cache / "frames" / f"{key}.lance")).to_table()
    decoded = {(e, f): np.asarray(Image.open(io.BytesIO(b)).convert("RGB")) for e, f, b in zip(
        table.column("episode_index").to_pylist(), table.column("frame").to_pylist(),
        table.column("encoded").to_pylist(), strict=True)}
    order = np.lexsort((step, ep))
    return [np.stack([decoded[(e, max(int(f), 0))] for f in frame[order][ep[order] == e]])
            for e in np.unique(ep)]


def test_every_exported_frame_is_its_own_steps_within_the_budget(tmp_path, monkeypatch):
    """The export lowers the CRF from LeRobot's 30 until each frame of the RLDS fixture
    (random textures), decoded, is within the budget of its cached frame in yuv420p (here
    0.5 dB above what CRF 30 gives, so that it must) and nearer it than any other frame 4
    steps about."""
    import av

    import robocache.data.cameras as cameras
    from robocache.data.cache import build
    from robocache.data.formats import open_source

    src = open_source(ROOT / "tests" / "fixtures" / "rlds" / "toy_rlds" / "jpeg", fps=10.0)
    build(src, tmp_path / "cache", rate_hz="native", progress=False, device="cpu")
    first = export_lerobot(tmp_path / "cache", tmp_path / "crf30")["video_quality"]
    assert first["observation.image"]["crf"] == 30
    monkeypatch.setattr(cameras, "VIDEO_BUDGET_DB",
                        first["observation.image"]["min_psnr_db"] + 0.5)
    summary = export_lerobot(tmp_path / "cache", tmp_path / "out")
    assert summary["video_quality"]["observation.image"]["crf"] < 30
    for key in ("observation.image", "observation.wrist_image"):
        clips = _episode_frames(tmp_path / "cache", key)
        with av.open(str(tmp_path / "out" / "videos" / key / "chunk-000" / "file-000.mp4")) as c:
            got = [f.to_ndarray(format="rgb24") for f in c.decode(video=0)]
        assert len(got) == sum(map(len, clips))
        at = 0
        for clip in clips:
            # the frame as yuv420p holds it: what no codec setting changes
            own = [av.VideoFrame.from_ndarray(f, format="rgb24").reformat(format="yuv420p")
                   .to_ndarray(format="rgb24") for f in clip]
            for t in range(len(clip)):
                assert psnr(got[at + t], own[t]) >= cameras.VIDEO_BUDGET_DB, (key, at + t)
                for u in range(max(t - 4, 0), min(t + 5, len(clip))):
                    if not np.array_equal(clip[u], clip[t]):
                        assert psnr(got[at + t], own[t]) > psnr(got[at + t], own[u]), (key, t, u)
            at += len(clip)


def test_a_budget_no_crf_meets_is_refused(cache, tmp_path, monkeypatch):
    import robocache.data.cameras as cameras

    monkeypatch.setattr(cameras, "VIDEO_BUDGET_DB", 99.0)
    with pytest.raises(DataError, match=r"CRF 2 cannot keep the frame of episode \d+, step \d+"):
        export_lerobot(cache, tmp_path / "out")
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("codec", "hw"), [("libx265", (8, 8)), ("libx264", (15, 17))])
def test_a_size_the_encoder_refuses_is_named(tmp_path, codec, hw):
    """x265 opens no frame under 16 pixels a side, x264 none of an odd size in yuv420p: one
    DataError naming the encoder, the size and the ways out, not FFmpeg's ArgumentError."""
    from robocache.data.cameras import write_video

    with pytest.raises(DataError, match=rf"{codec} cannot encode {hw[0]}x{hw[1]} frames .*"
                                        "--vcodec libsvtav1"):
        write_video(tmp_path / "v.mp4", np.zeros((3, *hw, 3), np.uint8), 10.0, codec)
