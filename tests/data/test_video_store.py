"""Video cameras kept as video (``camera_codec="video"``): the source's packets stored unchanged,
frames decoded per batch exactly as LeRobot's own PyAV decode gives them (the committed
fixtures' ``lerobot_<codec>`` frames, made by LeRobot 0.6.1: tests/fixtures/cameras)."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("av", reason="video cameras need PyAV (pip install 'robocache[video]')")

from robocache.data import RobotDataset  # noqa: E402
from robocache.data.cache import build  # noqa: E402
from robocache.errors import DataError  # noqa: E402

FIXTURES = Path(__file__).parent.parent / "fixtures" / "cameras"
CAM = "observation.images.front"


@pytest.fixture(scope="module")
def frames():
    return dict(np.load(FIXTURES / "frames.npz"))


@pytest.fixture(scope="module", params=["av1", "h264"])
def video_cache(request, tmp_path_factory):
    dest = tmp_path_factory.mktemp(request.param) / "c"
    build(FIXTURES / f"lerobot_{request.param}", dest, rate_hz=10.0, progress=False,
          device="cpu", camera_codec="video")
    return request.param, dest


def served_key(ds: RobotDataset, key: str, idx: torch.Tensor) -> np.ndarray:
    return ds[idx][key][:, -1].permute(0, 2, 3, 1).numpy()


def served(ds: RobotDataset, idx: torch.Tensor) -> np.ndarray:
    return ds[idx][CAM][:, -1].permute(0, 2, 3, 1).numpy()


def source_packets(path: Path) -> list[bytes]:
    import av

    with av.open(str(path)) as c:
        return [bytes(p) for p in c.demux(c.streams.video[0]) if p.size]


def test_frames_are_lerobots_decode_bit_for_bit(video_cache, frames):
    codec, cache = video_cache
    ds = RobotDataset(cache, keys=[CAM], image_dtype=torch.uint8)
    assert ds.manifest["streams"][CAM]["codec"] == "video"
    want = frames[f"lerobot_{codec}"]  # LeRobot 0.6.1's decode_video_frames(backend="pyav")
    np.testing.assert_array_equal(served(ds, torch.arange(len(ds))), want)
    # in any order, alone or together, each GOP decoded from its keyframe
    order = torch.randperm(len(ds), generator=torch.Generator().manual_seed(0))
    np.testing.assert_array_equal(served(ds, order), want[order.numpy()])
    for i in (0, 5, len(ds) - 1):
        np.testing.assert_array_equal(served(ds, torch.tensor([i])), want[i:i + 1])


def test_the_packets_are_the_sources_unchanged(video_cache):
    import lance

    codec, cache = video_cache
    table = lance.dataset(str(cache / "frames" / f"{CAM}.lance")).to_table().sort_by(
        [("episode_index", "ascending"), ("dts", "ascending")])
    video = next((FIXTURES / f"lerobot_{codec}" / "videos").rglob("*.mp4"))
    assert table.column("encoded").to_pylist() == source_packets(video)
    assert table.column("codec").to_pylist()[0] == {"av1": "libdav1d", "h264": "h264"}[codec]
    # every GOP starts at a frame of its episode, no later than the frame
    gop, frame = table.column("gop").to_numpy(), table.column("frame").to_numpy()
    assert (gop <= frame).all() and (gop >= 0).all()


def test_windows_and_workers_serve_the_same(video_cache, frames):
    _, cache = video_cache
    ds = RobotDataset(cache, keys=[CAM], history=3, image_dtype=torch.uint8)
    want = ds[torch.arange(len(ds))][CAM]
    assert want.shape == (len(ds), 3, 3, 48, 64)
    # a window's earlier frames are the steps before (the first steps padded with their own)
    torch.testing.assert_close(want[5, 1], want[4, 2], rtol=0, atol=0)
    back = pickle.loads(pickle.dumps(ds))
    assert torch.equal(back[torch.arange(len(ds))][CAM], want)
    for method in ("fork", "spawn"):
        loader = torch.utils.data.DataLoader(ds, batch_size=4, num_workers=2,
                                             multiprocessing_context=method)
        assert torch.equal(torch.cat([b[CAM] for b in loader]), want), method
    ram = RobotDataset(cache, keys=[CAM], history=3, image_dtype=torch.uint8, in_memory=True)
    assert torch.equal(ram[torch.arange(len(ds))][CAM], want)


def test_an_episode_starting_inside_a_gop_is_quarantined_with_the_reason(tmp_path):
    from robocache.data.cameras import add_video_feature, write_video
    from robocache.data.episode import Episode, Stream, StreamSpec
    from robocache.data.formats.lerobot import write_lerobot

    spec = StreamSpec("observation.state", "numeric", "float32", (2,), 10.0)
    eps = [Episode(i, {spec.name: Stream(spec, np.arange(n) / 10.0,
                                         np.zeros((n, 2), np.float32))}, {"tasks": ["t"]})
           for i, n in enumerate((6, 5))]
    root = write_lerobot(tmp_path / "src", eps, {spec.name: spec}, fps=10.0, version="v3.0")
    y, x = np.mgrid[0:48, 0:64]
    clip = [np.stack([np.stack([x * 3 + 9 * i + 40 * e, y * 4, 100 + 0 * x], -1)
                      for i in range(n)]).clip(0, 255).astype(np.uint8)
            for e, n in enumerate((6, 5))]
    # one keyframe every 4 frames of the file: episode 1 starts at its frame 6 (the episodes
    # encoded in one piece: add_video_feature starts each on a keyframe of its own)
    add_video_feature(root, CAM, clip, codec="libsvtav1", options={"g": "4"})
    video = next((root / "videos").rglob("*.mp4"))
    write_video(video, np.concatenate(clip), 10.0, "libsvtav1", {"g": "4"})
    m = build(root, tmp_path / "c", rate_hz=10.0, progress=False, device="cpu",
              camera_codec="video")
    assert m["counts"]["cached"] == 1 and m["counts"]["quarantined"] == 1
    (q,) = m["quarantined"]
    assert q["index"] == 1 and f"stream {CAM!r}" in q["reason"] and \
        "starts inside a group of pictures" in q["reason"], q


def test_a_damaged_packet_names_its_frame_never_a_wrong_one(tmp_path):
    import lance

    build(FIXTURES / "lerobot_h264", tmp_path / "c", rate_hz=10.0, progress=False,
          device="cpu", camera_codec="video")
    lance.dataset(str(tmp_path / "c" / "frames" / f"{CAM}.lance")).update(
        {"encoded": "X'00000001ff'"}, where="episode_index = 1 AND frame = 2")
    ds = RobotDataset(tmp_path / "c", keys=[CAM], image_dtype=torch.uint8)
    start = int(ds.offsets[1])
    with pytest.raises(DataError, match=f"camera '{CAM}', episode 1, frame 2"):
        ds[torch.tensor([0, start + 2])]
    ds[torch.tensor([start + 4])]  # the other GOPs serve


def test_refusals_are_one_line(tmp_path):
    with pytest.raises(DataError, match="camera_size.*'video' keeps the source's video"):
        build(FIXTURES / "lerobot_h264", tmp_path / "c", progress=False, device="cpu",
              camera_codec="video", camera_size="24x32")
    assert not (tmp_path / "c").exists()


@pytest.mark.gpu
def test_the_gpu_loader_serves_the_same_frames(video_cache):
    """Resident on the GPU (RobotLoader, device cuda): the frames the CPU path serves."""
    from robocache.data import RobotLoader

    _, cache = video_cache
    ds = RobotDataset(cache, keys=[CAM], history=2, image_dtype=torch.uint8)
    want = ds[torch.arange(len(ds))][CAM]
    loader = RobotLoader(ds, 4, device="cuda", normalize=None, shuffle=False, drop_last=False)
    got = torch.cat([b[CAM].cpu() for b in loader])
    assert torch.equal(got, want)


@pytest.mark.parametrize("case", ["vfr", "missing", "jump"])
@pytest.mark.parametrize("camera_codec", ["video", "jpeg"])
def test_frame_timing_is_lerobots(tmp_path, case, camera_codec):
    """A variable frame rate, a missing frame and a timestamp jump (LeRobot's H.264 fixture
    remuxed with its timestamps edited, tests/fixtures/cameras/make_timing_fixtures.py): an
    episode LeRobot 0.6.1 serves every item of is served with LeRobot's frames; one where it
    refuses an item is quarantined naming the camera and where (never a neighbour's frame
    served in its place)."""
    import json

    want = np.load(FIXTURES / "timing.npz")
    ok, frames = want[f"{case}_ok"], want[f"{case}_frames"]
    dest = tmp_path / "c"
    build(FIXTURES / f"timing_{case}", dest, progress=False, device="cpu",
          camera_codec=camera_codec)
    manifest = json.loads((dest / "manifest.json").read_text())
    lengths = [8, 6]
    starts = np.cumsum([0] + lengths)
    good = [e for e in range(2) if ok[starts[e]:starts[e + 1]].all()]
    assert sorted(q["index"] for q in manifest["quarantined"]) == \
        [e for e in range(2) if e not in good]
    for q in manifest["quarantined"]:
        assert CAM in q["reason"] or "timestamps jump" in q["reason"], q["reason"]
    if not good:
        return
    ds = RobotDataset(dest, keys=[CAM], image_dtype=torch.uint8)
    rows = np.concatenate([np.arange(starts[e], starts[e + 1]) for e in good])
    got = served(ds, torch.arange(len(ds)))
    if camera_codec == "video":
        np.testing.assert_array_equal(got, frames[rows])
        return
    # JPEG q95: each frame LeRobot's own frame within the codec's loss, not a neighbour's
    err = ((got.astype(float) - frames[rows]) ** 2).mean(axis=(1, 2, 3))
    assert (10 * np.log10(255 ** 2 / np.maximum(err, 1e-12)) > 35).all()


def test_raw_frames_are_encoded_once_as_h264(tmp_path):
    """A zarr camera of raw frames with ``camera_codec="video"``: encoded once (H.264, a
    keyframe every 2 frames), served as each stored packet decodes (exactly), close to the
    source pixels, in a few of JPEG's bytes; an odd-sized camera is stored as JPEG."""
    import av
    import lance
    import pyarrow as pa
    import pyarrow.compute  # noqa: F401
    import zarr

    y, x = np.mgrid[0:48, 0:64]
    rgb = np.stack([np.stack([(x * 4 + 3 * i) % 256, (y * 5 + i) % 256,
                              np.full_like(x, 60 + i)], -1) for i in range(10)]).astype(np.uint8)
    odd = rgb[:, :47, :63]
    root = zarr.open_group(str(tmp_path / "rb.zarr"), mode="w", zarr_format=2)
    root.create_array("data/camera", data=rgb)
    root.create_array("data/odd", data=np.ascontiguousarray(odd))
    root.create_array("data/state", data=np.arange(20, dtype=np.float32).reshape(10, 2))
    root.create_array("meta/episode_ends", data=np.array([4, 10]))
    m = build(tmp_path / "rb.zarr", tmp_path / "c", progress=False, device="cpu",
              source_options={"fps": 10.0}, camera_codec="video")
    assert m["streams"]["camera"]["codec"] == "video" and "h264" in m["streams"]["camera"][
        "encoder"]
    assert m["streams"]["odd"]["codec"] == "jpeg"
    ds = RobotDataset(tmp_path / "c", keys=["camera"], image_dtype=torch.uint8)
    got = served_key(ds, "camera", torch.arange(len(ds)))
    table = lance.dataset(str(tmp_path / "c" / "frames" / "camera.lance")).to_table()
    table = table.sort_by([("episode_index", "ascending"), ("frame", "ascending")])
    assert table.column("codec")[0].as_py() == "h264"
    np.testing.assert_array_equal(table.column("timestamp").to_numpy(),
                                  np.r_[np.arange(4), np.arange(6)] / 10.0)
    want = []
    for e in (0, 1):  # each episode's packets, decoded by FFmpeg as they are stored
        rows = table.filter(pa.compute.equal(table.column("episode_index"), e))
        ctx = av.CodecContext.create("h264", "r")
        ctx.extradata = rows.column("extradata")[0].as_py()
        frames = []
        for data, pts, dts in zip(rows.column("encoded").to_pylist(),
                                  rows.column("pts").to_pylist(),
                                  rows.column("dts").to_pylist(), strict=True):
            packet = av.Packet(data)
            packet.pts, packet.dts = pts, dts
            frames += ctx.decode(packet)
        frames += ctx.decode(None)
        want += [f.to_ndarray(format="rgb24") for f in sorted(frames, key=lambda f: f.pts)]
    np.testing.assert_array_equal(got, np.stack(want))
    err = ((got.astype(float) - rgb) ** 2).mean()
    assert 10 * np.log10(255 ** 2 / err) > 30
    assert sum(len(b) for b in table.column("encoded").to_pylist()) < rgb.nbytes / 10


# mixtures: caches keeping the camera as video (H.264, AV1) beside one keeping it as JPEG, and
# a source without the camera (its rows serve the blank frame)

@pytest.fixture(scope="module")
def mix_caches(tmp_path_factory):
    root = tmp_path_factory.mktemp("video-mixture")
    out = {}
    for name, fixture, camera_codec in (("h264", "lerobot_h264", "video"),
                                        ("av1", "lerobot_av1", "video"),
                                        ("jpeg", "lerobot_h264", "jpeg")):
        build(FIXTURES / fixture, root / name, rate_hz=10.0, progress=False, device="cpu",
              camera_codec=camera_codec)
        out[name] = root / name
    return out


def mix_sources(caches, **kw) -> list[RobotDataset]:
    """H.264 video, AV1 video, JPEG, and the H.264 cache without its camera."""
    kw = {"history": 2, "horizon": 2, "image_dtype": torch.uint8, **kw}
    return [RobotDataset(caches["h264"], **kw), RobotDataset(caches["av1"], **kw),
            RobotDataset(caches["jpeg"], **kw),
            RobotDataset(caches["h264"], keys=["observation.state", "action"], **kw)]


def test_stacked_video_and_jpeg_frames_decode_as_each_caches_own(mix_caches, frames,
                                                                  monkeypatch):
    """A mixture's camera stacked over two videos of different codecs, a JPEG cache and the
    blank frame: each row decodes to its cache's own frame, the blank to zeros exactly, and
    each GOP a batch needs is decoded once."""
    from robocache.data.cameras import decode_all
    from robocache.data.frames import EncodedFrames, StackedFrames, stack
    from robocache.data.video_store import VideoPackets

    parts = [d.frames[CAM] for d in mix_sources(mix_caches)[:3]]
    stacked = stack(parts)
    assert isinstance(stacked, StackedFrames) and stacked.codec == "mixed"
    jpeg = decode_all([(parts[2], torch.arange(len(parts[2])))])[0]
    want = torch.cat([torch.from_numpy(frames["lerobot_h264"]).permute(0, 3, 1, 2),
                      torch.from_numpy(frames["lerobot_av1"]).permute(0, 3, 1, 2), jpeg,
                      torch.zeros(1, *jpeg.shape[1:], dtype=torch.uint8)])
    assert len(stacked) == len(want)
    decoded = []
    real = VideoPackets._decode_gop

    def once(self, g, wanted, decoders):
        decoded.append((id(self), g))
        return real(self, g, wanted, decoders)

    monkeypatch.setattr(VideoPackets, "_decode_gop", once)
    gen = torch.Generator().manual_seed(1)
    for rows in (torch.randint(0, len(want), (6, 3), generator=gen),
                 torch.arange(len(want)).flip(0), torch.tensor([len(want) - 1] * 2),
                 torch.tensor([3, 3, 20, 20, 20]), torch.zeros(0, dtype=torch.int64)):
        decoded.clear()
        got = decode_all([(stacked, rows)])[0]
        assert got.shape == (*rows.shape, 3, 48, 64)
        assert torch.equal(got, want[rows]), rows
        assert len(decoded) == len(set(decoded))  # each GOP once
    # read ahead (the read on a thread, the decode later) decodes the same
    rows = torch.arange(len(want))
    assert torch.equal(decode_all([stacked.read(rows)])[0], want)
    # in memory the JPEG cache's frames join the videos' the same way
    ram = stack([*parts[:2], parts[2].load()])
    assert torch.equal(decode_all([(ram, rows)])[0], want)
    # frames of another size do not stack (one line naming the shapes)
    small = EncodedFrames(torch.zeros(0, dtype=torch.uint8), torch.zeros(1, dtype=torch.int64),
                          (24, 32, 3), "uint8", "png")
    with pytest.raises(DataError, match=r"differ in shape or dtype .*\(24, 32, 3\)"):
        stack([parts[0], small])


@pytest.mark.parametrize("workers,in_memory", [(0, False), (0, True), (2, False)])
def test_a_mixture_of_video_and_jpeg_caches_serves_each_caches_items(mix_caches, workers,
                                                                      in_memory):
    """RobotLoader over H.264 video, AV1 video, JPEG and a source without the camera (resident
    and with 2 forked workers, frames read per batch or ``in_memory``): each sample's frames
    are its cache's own item's, the camera-less source's zeros padded everywhere."""
    from robocache.data import MixedDataset, RobotLoader

    sources = mix_sources(mix_caches, in_memory=in_memory)
    mixed = MixedDataset(sources, weights=[1.0] * len(sources))
    loader = RobotLoader(mixed, 12, device="cpu", seed=2, normalize=None,
                         num_workers=workers)
    seen = set()
    for batch in loader:
        assert batch[CAM].shape == (12, 2, 3, 48, 64) and batch[CAM].dtype == torch.uint8
        for i, d in enumerate(sources):
            rows = batch["source"] == i
            if not rows.any():
                continue
            seen.add(i)
            if CAM not in d.keys:
                assert not batch[CAM][rows].any() and batch[f"{CAM}_is_pad"][rows].all()
                continue
            want = d.fetch(batch["index"][rows])
            assert torch.equal(batch[CAM][rows], want[CAM])
            assert torch.equal(batch[f"{CAM}_is_pad"][rows], want[f"{CAM}_is_pad"])
    assert seen == set(range(len(sources)))


def test_robocache_mixture_accepts_video_and_jpeg_caches(mix_caches, tmp_path):
    """``robocache mixture FILE --check`` (manifests) and without it (one batch served)."""
    import json

    import yaml
    from typer.testing import CliRunner

    from robocache.cli import app

    roles = {"primary": CAM}
    config = {"history": 2, "horizon": 2, "datasets": [
        {"name": name, "path": str(mix_caches[name]), "cameras": roles,
         "state": "observation.state", "action": "action"} for name in mix_caches]}
    config["datasets"].append({"name": "blind", "path": str(mix_caches["h264"]),
                               "state": "observation.state", "action": "action"})
    path = tmp_path / "mix.yaml"
    path.write_text(yaml.safe_dump(config))
    runner = CliRunner()
    result = runner.invoke(app, ["mixture", str(path), "--check"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(app, ["mixture", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["batch"]["observation.images.primary"] == [8, 2, 3, 48, 64]


@pytest.mark.gpu
def test_the_gpu_serves_a_video_and_jpeg_mixture_as_each_cache(mix_caches):
    """Resident on the GPU (NVDEC for H.264, CPU threads for AV1, nvJPEG for JPEG, zeros for
    the blank frame, in one batch): each sample's frames are its cache's own on the GPU."""
    from robocache.data import MixedDataset, RobotLoader

    sources = mix_sources(mix_caches)
    mixed = MixedDataset(sources, weights=[1.0] * len(sources))
    seen = set()
    for batch in RobotLoader(mixed, 12, device="cuda", seed=2, normalize=None):
        for i, d in enumerate(sources):
            rows = (batch["source"] == i).cpu()
            if not rows.any():
                continue
            seen.add(i)
            got = batch[CAM].cpu()[rows]
            if CAM not in d.keys:
                assert not got.any() and batch[f"{CAM}_is_pad"].cpu()[rows].all()
                continue
            own = d.to("cuda").fetch(batch["index"][rows.to(batch["index"].device)])
            if i < 2:  # video (NVDEC or CPU threads): the CPU's frames, exactly
                assert torch.equal(got, own[CAM].cpu())
                assert torch.equal(got, d.fetch(batch["index"].cpu()[rows])[CAM])
            else:  # nvJPEG, in a batch of another size than the cache's own (a level apart
                # at most, should its backend differ with the batch)
                torch.testing.assert_close(got, own[CAM].cpu(), rtol=0, atol=1)
    assert seen == set(range(len(sources)))


def test_a_build_that_keeps_every_video_decodes_none():
    """Kept video is a copy: a build whose video cameras are all kept as video prepares
    episodes as a numeric build does (whole episodes in worker processes), not in NVDEC's
    lanes, which it would not use."""
    from robocache.data.build.config import CacheConfig
    from robocache.data.build.read import decoded_videos
    from robocache.data.episode import StreamSpec

    specs = {"cam": StreamSpec("cam", "video", "uint8", (48, 64, 3), 30.0),
             "state": StreamSpec("state", "numeric", "float32", (2,), 30.0)}
    assert not decoded_videos(specs, CacheConfig(camera_codec="video"))
    assert not decoded_videos(specs, CacheConfig(camera_codec="auto"))
    assert decoded_videos(specs, CacheConfig(camera_codec="jpeg"))
    assert decoded_videos(specs, CacheConfig(camera_codec="auto", camera_size=(24, 32)))
    assert decoded_videos(specs, CacheConfig(camera_codec="video", camera_codecs={"cam": "png"}))
