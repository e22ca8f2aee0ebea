"""Camera streams: LeRobot-written videos (AV1, H.264) kept as video (the default) or decoded
at ingest and stored as JPEG/PNG, served per batch; checked against LeRobot's own decode
(tests/fixtures/cameras)."""

from __future__ import annotations

import json
import logging
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from robocache.data import RobotDataset
from robocache.data.cache import build
from robocache.errors import DataError

FIXTURES = Path(__file__).parent.parent / "fixtures" / "cameras"
CAM = "observation.images.front"


def psnr(a: np.ndarray, b: np.ndarray) -> float:
    return float(10 * np.log10(255.0**2 / np.mean((a.astype(float) - b.astype(float)) ** 2)))


def to_uint8(x: torch.Tensor) -> np.ndarray:
    """``[..., C, H, W]`` floats in [0, 1] as uint8 ``[..., H, W, C]``."""
    return (x.movedim(-3, -1) * 255).round().to(torch.uint8).cpu().numpy()


# nvJPEG (GPU) and libjpeg-turbo (CPU) are both valid JPEG decoders, but they upsample 4:2:0
# chroma differently (libjpeg-turbo's "fancy" triangular filter): pixels at colour edges differ
# by tens of grey levels (up to 72 on 5% of these small textured frames, H100), so the GPU path
# is held to the JPEG tolerance against the source, as the CPU path is, not to the CPU decode.
GPU_CPU_MIN_PSNR = 30.0


@pytest.fixture(scope="module")
def frames():
    return dict(np.load(FIXTURES / "frames.npz"))


def served(cache: Path, **kw) -> np.ndarray:
    ds = RobotDataset(cache, keys=[CAM], image_dtype=torch.uint8, **kw)
    return ds[torch.arange(len(ds))][CAM][:, 0].permute(0, 2, 3, 1).numpy()


@pytest.mark.parametrize("codec", ["av1", "h264"])
def test_lerobot_video_frames_match_lerobot_decode(tmp_path, frames, codec):
    m = build(FIXTURES / f"lerobot_{codec}", tmp_path / "c", rate_hz=10.0, progress=False,
              device="cpu", camera_codec="jpeg")
    assert m["counts"]["cached"] == 2 and m["streams"][CAM]["codec"] == "jpeg"
    got = served(tmp_path / "c")
    want, original = frames[f"lerobot_{codec}"], frames[f"original_{codec}"]
    assert got.shape == want.shape
    for step in range(len(got)):  # the right frame at every step, within the JPEG tolerance
        errors = [np.mean((got[step].astype(float) - w) ** 2) for w in want]
        assert int(np.argmin(errors)) == step
        assert psnr(got[step], want[step]) > 33.0
    # default quality: within 1 dB of the source decode's PSNR against the original frames
    assert psnr(want, original) - psnr(got, original) < 1.0
    import lance

    table = lance.dataset(str(tmp_path / "c" / "frames" / f"{CAM}.lance")).to_table()
    np.testing.assert_array_equal(table.column("source_frame").to_numpy(), np.r_[0:8, 8:14])
    np.testing.assert_allclose(table.column("timestamp").to_numpy(),
                               np.r_[0:8, 0:6] / 10.0, atol=1e-6)


@pytest.mark.parametrize("codec", ["av1", "h264"])
def test_lerobot_dataset_serves_lerobot_videos(tmp_path, frames, codec):
    import robocache

    ds = robocache.LeRobotDataset("robocache/cameras", root=FIXTURES / f"lerobot_{codec}",
                                  cache=tmp_path / "c", delta_timestamps={CAM: [-0.1, 0.0]},
                                  image_transforms=lambda x: x.flip(-1), video_backend="pyav")
    want = frames[f"lerobot_{codec}"]  # LeRobot's own decode, [F, H, W, 3]
    items = [ds[i] for i in range(len(ds))]
    got = torch.stack([it[CAM] for it in items])  # LeRobot's [K, C, H, W] float32 in [0, 1]
    assert got.dtype == torch.float32 and got.shape == (len(want), 2, 3, 48, 64)
    assert got.min() >= 0 and got.max() <= 1
    now = (got[:, 1].flip(-1).permute(0, 2, 3, 1) * 255).round().to(torch.uint8).numpy()
    # the default (camera_codec="auto") keeps the videos' packets: LeRobot's frames exactly
    assert json.loads((tmp_path / "c" / "manifest.json").read_text())[
        "streams"][CAM]["codec"] == "video"
    np.testing.assert_array_equal(now, want)
    pad = torch.stack([it[f"{CAM}_is_pad"] for it in items])
    first = torch.stack([it["frame_index"] for it in items]) == 0
    assert torch.equal(pad[:, 0], first) and not pad[:, 1].any()
    prev = torch.where(first[:, None, None, None], got[:, 1], torch.roll(got[:, 1], 1, 0))
    torch.testing.assert_close(got[:, 0], prev, rtol=0, atol=0)  # edge-padded as LeRobot
    batch = ds.get_batch(torch.arange(len(ds)))
    torch.testing.assert_close(batch[CAM], got, rtol=0, atol=0)
    if torch.cuda.is_available():  # the GPU batch path (NVDEC for H.264): the same frames
        gpu = robocache.LeRobotDataset("robocache/cameras", root=FIXTURES / f"lerobot_{codec}",
                                       cache=tmp_path / "c", device="cuda",
                                       delta_timestamps={CAM: [-0.1, 0.0]})
        on_gpu = gpu.get_batch(torch.arange(len(ds)))
        assert on_gpu[CAM].is_cuda
        np.testing.assert_array_equal(to_uint8(on_gpu[CAM][:, 1]), want)
        assert torch.equal(on_gpu[f"{CAM}_is_pad"].cpu(), pad)


def test_default_keeps_video_cameras_as_video_and_raw_frames_as_jpeg(tmp_path, frames):
    """``camera_codec`` "auto" (the default): a LeRobot video camera's packets are kept
    (frames exactly LeRobot's decode); ``camera_codecs`` stores one camera otherwise. Raw
    frames: :func:`test_zarr_rgb_and_depth_cameras`; resized: the camera_size tests."""
    m = build(FIXTURES / "lerobot_h264", tmp_path / "c", rate_hz=10.0, progress=False,
              device="cpu")
    assert m["streams"][CAM]["codec"] == "video" and m["counts"]["quarantined"] == 0
    np.testing.assert_array_equal(served(tmp_path / "c"), frames["lerobot_h264"])
    m = build(FIXTURES / "lerobot_h264", tmp_path / "j", rate_hz=10.0, progress=False,
              device="cpu", camera_codecs={CAM: "jpeg"})
    assert (m["streams"][CAM]["codec"], m["streams"][CAM]["quality"]) == ("jpeg", 95)


def test_default_keeps_written_videos_and_stores_one_cut_inside_gops_as_png(tmp_path, caplog):
    """Videos written by add_video_feature (each episode starting on a keyframe, as LeRobot
    writes them) are kept as video. Episodes cut from one video encoded in one piece (a
    keyframe every 2 frames, 7-frame episodes: the second starts inside a GOP) cannot be kept
    as video: "auto" stores those
    cameras as PNG (their decode's frames exactly), says so once per camera, and quarantines
    nothing; explicit "video"
    quarantines the episodes that start inside a GOP, naming the fix."""
    from robocache.data.cameras import write_video

    src = _two_cameras(tmp_path / "src", episodes=3)
    m = build(src, tmp_path / "kept", rate_hz=10.0, progress=False, device="cpu")
    assert m["streams"][CAM]["codec"] == m["streams"][CAM2]["codec"] == "video"
    assert m["counts"]["quarantined"] == 0
    for c, key in enumerate((CAM, CAM2)):  # each camera's file encoded again, in one piece
        clips = [_clip(7, 13 * i + 50 * c) for i in range(3)]
        write_video(next((src / "videos" / key).rglob("*.mp4")), np.concatenate(clips), 10.0,
                    "libx264")
    with caplog.at_level(logging.WARNING):
        m = build(src, tmp_path / "c", rate_hz=10.0, progress=False, device="cpu")
    assert m["counts"] == {**m["counts"], "cached": 3, "quarantined": 0}
    assert m["streams"][CAM]["codec"] == m["streams"][CAM2]["codec"] == "png"
    said = [r.getMessage() for r in caplog.records if "not a keyframe" in r.getMessage()]
    assert len(said) == 2 and "episode 1 starts at 0.7 s" in said[0], said
    assert "--camera-codec jpeg" in said[0]
    m = build(src, tmp_path / "v", rate_hz=10.0, progress=False, device="cpu",
              camera_codec="video")
    assert m["counts"]["quarantined"] == 2 and m["streams"][CAM]["codec"] == "video"
    assert all("--camera-codec jpeg" in q["reason"] for q in m["quarantined"])


def test_default_extends_a_cache_built_with_another_codec_alike(tmp_path, caplog):
    """A cache whose camera is JPEG (built before "auto" was the default) is extended with
    JPEG frames by a build at the defaults, which says so, instead of being refused as
    another cache; an explicit codec other than the cache's is still refused."""
    src = FIXTURES / "lerobot_h264"
    build(src, tmp_path / "c", rate_hz=10.0, progress=False, device="cpu", camera_codec="jpeg",
          episodes=[0])
    with caplog.at_level(logging.WARNING):
        m = build(src, tmp_path / "c", rate_hz=10.0, progress=False, device="cpu")
    assert (m["counts"]["new"], m["counts"]["skipped"]) == (1, 1)
    assert m["streams"][CAM]["codec"] == "jpeg"
    assert any(f"stores camera {CAM!r} as jpeg" in r.getMessage() for r in caplog.records)
    with pytest.raises(DataError, match="holds a cache with a different streams"):
        build(src, tmp_path / "c", rate_hz=10.0, progress=False, device="cpu",
              camera_codec="png")


@pytest.mark.parametrize("options,match", [
    ({"camera_codec": "h264"}, r"`camera_codec` \(--camera-codec\) must be one of 'auto', "
                               r"'jpeg', 'png', 'video'; got 'h264'"),
    ({"camera_codecs": {CAM: "webp"}}, r"`camera_codecs\['observation.images.front'\]` must "
                                       r"be one of 'auto'"),
    ({"camera_codecs": "jpeg"}, r"`camera_codecs` must be a dict"),
    ({"camera_codecs": {CAM: "video"}, "camera_size": (8, 8)}, r"`camera_size`"),
])
def test_camera_codec_options_are_checked(tmp_path, options, match):
    with pytest.raises(DataError, match=match):
        build(FIXTURES / "lerobot_h264", tmp_path / "c", progress=False, device="cpu",
              **options)
    assert not (tmp_path / "c").exists()


def test_png_is_lossless_and_transforms_are_seeded(tmp_path, frames):
    build(FIXTURES / "lerobot_h264", tmp_path / "c", rate_hz=10.0, progress=False,
          device="cpu", camera_codec="png")
    np.testing.assert_array_equal(served(tmp_path / "c"), frames["lerobot_h264"])
    from robocache import ImageTransformsConfig

    cfg = ImageTransformsConfig(max_num_transforms=4, crop_scale=(0.7, 1.0))
    batches = [RobotDataset(tmp_path / "c", keys=[CAM], history=2, image_size=(24, 32),
                            image_transforms=cfg, seed=s)[torch.arange(6)] for s in (3, 3, 4)]
    assert batches[0][CAM].shape == (6, 2, 3, 24, 32)
    assert batches[0][CAM].dtype == torch.float32
    torch.testing.assert_close(batches[0][CAM], batches[1][CAM], rtol=0, atol=0)
    assert not torch.equal(batches[0][CAM], batches[2][CAM])
    assert batches[0][f"{CAM}_is_pad"][0].tolist() == [True, False]


def test_truncated_video_quarantines_its_episode_only(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(FIXTURES / "lerobot_h264", src)
    video = next((src / "videos").rglob("*.mp4"))
    data = video.read_bytes()
    video.write_bytes(data[: int(len(data) * 0.8)])
    m = build(src, tmp_path / "c", rate_hz=10.0, progress=False, device="cpu")
    assert m["counts"]["cached"] == 1 and m["counts"]["quarantined"] == 1
    assert m["quarantined"][0]["index"] == 1 and "video" in m["quarantined"][0]["reason"]


def test_unknown_camera_key_names_the_available_ones(tmp_path):
    build(FIXTURES / "lerobot_h264", tmp_path / "c", rate_hz=10.0, progress=False,
          device="cpu")
    with pytest.raises(DataError, match=r"observation\.images\.back.*observation\.images\.front"):
        RobotDataset(tmp_path / "c", keys=["observation.images.back"])


def test_camera_size_stores_frames_resized_at_ingest(tmp_path, frames):
    """--camera-size: RGB frames stored (and served) at that size, equal to the source decode
    resized by Pillow within the JPEG tolerance; the manifest keeps the source's shape."""
    from robocache.data.cameras import resize

    m = build(FIXTURES / "lerobot_h264", tmp_path / "c", rate_hz=10.0, progress=False,
              device="cpu", camera_size="24x32")
    assert m["streams"][CAM]["shape"] == [24, 32, 3] and m["streams"][CAM]["codec"] == "jpeg"
    assert m["streams"][CAM]["source_shape"] == [48, 64, 3]
    got = served(tmp_path / "c")
    want = np.stack([resize(f, (24, 32)) for f in frames["lerobot_h264"]])
    assert got.shape == want.shape == (len(want), 24, 32, 3)
    assert psnr(got, want) > 33.0


def test_camera_size_resizes_a_sources_own_image_bytes_and_keeps_depth(tmp_path):
    """Images the source stores encoded (the sample's PNG camera) are decoded, resized and
    re-encoded; uint16 depth keeps its size."""
    import zarr

    sample = Path(__file__).parents[2] / "data" / "sample" / "panda_multirate"
    m = build(sample, tmp_path / "c", progress=False, device="cpu", camera_size=(8, 8))
    top = m["streams"]["observation.images.top"]
    assert top["shape"] == [8, 8, 3] and top["codec"] == "jpeg"
    ds = RobotDataset(tmp_path / "c", keys=["observation.images.top"])
    assert ds[torch.arange(2)]["observation.images.top"].shape[-2:] == (8, 8)
    rng = np.random.default_rng(0)
    root = zarr.open_group(str(tmp_path / "rb.zarr"), mode="w", zarr_format=2)
    root.create_array("data/depth", data=rng.integers(300, 5000, (6, 12, 16)).astype(np.uint16))
    root.create_array("data/state", data=rng.normal(size=(6, 2)).astype(np.float32))
    root.create_array("meta/episode_ends", data=np.array([3, 6]))
    m = build(tmp_path / "rb.zarr", tmp_path / "d", rate_hz=10.0, progress=False,
              device="cpu", source_options={"fps": 10.0}, camera_size=(8, 8))
    depth = m["streams"]["depth"]
    assert depth["shape"] == [12, 16] and "source_shape" not in depth


@pytest.mark.parametrize("size", ["24by32", "0x32", (24,), (24.5, 32)],
                         ids=["not-HxW", "zero", "one-number", "not-integers"])
def test_camera_size_must_be_two_positive_integers(tmp_path, size):
    with pytest.raises(DataError, match=r"`camera_size` \(--camera-size\) must be"):
        build(FIXTURES / "lerobot_h264", tmp_path / "c", progress=False, device="cpu",
              camera_size=size)


def test_zarr_rgb_and_depth_cameras(tmp_path):
    import zarr

    from robocache import depth_to_points

    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:24, 0:32]
    rgb = np.stack([np.stack([x * 6 + i, y * 8 + 2 * i, np.full_like(x, 60 + i)], -1)
                    for i in range(10)]).astype(np.uint8)
    depth = rng.integers(300, 5000, (10, 24, 32)).astype(np.uint16)
    root = zarr.open_group(str(tmp_path / "rb.zarr"), mode="w", zarr_format=2)
    root.create_array("data/camera", data=rgb)
    root.create_array("data/depth", data=depth)
    root.create_array("data/state", data=rng.normal(size=(10, 2)).astype(np.float32))
    root.create_array("meta/episode_ends", data=np.array([4, 10]))
    m = build(tmp_path / "rb.zarr", tmp_path / "c", rate_hz=10.0, progress=False,
              device="cpu", source_options={"fps": 10.0})
    assert m["streams"]["depth"]["codec"] == "png"  # the default: raw RGB as JPEG q95 4:4:4
    assert tuple(m["streams"]["camera"][k] for k in ("codec", "quality", "chroma")) == \
        ("jpeg", 95, "444")
    ds = RobotDataset(tmp_path / "c", keys=["camera", "depth"])
    batch = ds[torch.arange(len(ds))]
    assert batch["depth"].dtype == torch.uint16 and batch["depth"].shape == (10, 1, 1, 24, 32)
    np.testing.assert_array_equal(batch["depth"][:, 0, 0].numpy(), depth)  # lossless
    assert psnr((batch["camera"][:, 0] * 255).permute(0, 2, 3, 1).numpy(), rgb) > 40
    k = torch.tensor([[30.0, 0, 16], [0, 30.0, 12], [0, 0, 1]])
    pc = depth_to_points(batch["depth"][:, 0, 0], k)
    assert pc.points.shape == (10, 24 * 32, 3) and bool(pc.valid.all())


@pytest.fixture(scope="module")
def h264_cache(tmp_path_factory):
    dest = tmp_path_factory.mktemp("cameras") / "c"
    build(FIXTURES / "lerobot_h264", dest, rate_hz=10.0, progress=False, device="cpu",
          camera_codec="jpeg")
    return dest


def test_loader_workers_decode_on_the_cpu(h264_cache):
    from robocache.data import RobotLoader

    ds = RobotDataset(h264_cache, keys=[CAM, "observation.state"], history=2,
                      image_size=(16, 20))
    loader = RobotLoader(ds, 4, device="cpu", num_workers=1, normalize=None, seed=0)
    batch = next(iter(loader))
    assert batch[CAM].shape == (4, 2, 3, 16, 20) and batch[CAM].dtype == torch.float32
    want = ds[batch["index"]]
    torch.testing.assert_close(batch[CAM], want[CAM], rtol=0, atol=0)


@pytest.mark.gpu
def test_resident_camera_batches_come_from_a_prefetch_thread_in_order(h264_cache):
    """The background thread serves the epoch in the sampler's order, the frames nvJPEG
    decodes for those indices; leaving the loop early stops the thread."""
    import threading

    from robocache.data import RobotLoader

    ds = RobotDataset(h264_cache, keys=[CAM, "observation.state"], history=2)
    loader = RobotLoader(ds, 3, device="cuda", normalize=None, seed=0, drop_last=False)
    ds = loader.datasets[0]  # the resident copy the loader serves from
    order = loader.sampler.order()
    batches = [{k: v.clone() for k, v in b.items()} for b in loader]
    assert torch.equal(torch.cat([b["index"] for b in batches]).cpu(), order)
    for b in batches:
        torch.testing.assert_close(b[CAM], ds[b["index"]][CAM], rtol=0, atol=0)
    for _ in iter(loader):
        break
    assert not any(t.name == "robocache-prefetch" for t in threading.enumerate())


@pytest.mark.gpu
def test_an_error_preparing_a_camera_batch_is_raised_to_the_caller(h264_cache, monkeypatch):
    """A batch that fails on the prefetch thread raises in the caller's loop after the batches
    before it, and the thread stops."""
    import threading

    from robocache.data import RobotLoader

    loader = RobotLoader(RobotDataset(h264_cache, keys=[CAM], history=2), 2, device="cuda",
                         normalize=None, seed=0)
    gather, third = type(loader.packed).gather, loader.sampler.order()[4:6]

    def failing(self, indices, frames=None):
        if torch.equal(indices.cpu(), third):
            raise OSError("disk gone")
        return gather(self, indices, frames)

    monkeypatch.setattr(type(loader.packed), "gather", failing)
    got = []
    with pytest.raises(OSError, match="disk gone"):
        for b in loader:
            got.append(b["index"].clone())
    assert len(got) == 2
    assert not any(t.name == "robocache-prefetch" for t in threading.enumerate())


def test_decode_decodes_each_distinct_frame_once(h264_cache, monkeypatch):
    from robocache.data import cameras

    frames = RobotDataset(h264_cache, keys=[CAM], in_memory=True).frames[CAM]
    rows = torch.tensor([[3, 0], [3, 3], [len(frames) - 1, 0]])
    sliced = []
    slices = cameras.EncodedFrames.slices
    monkeypatch.setattr(cameras.EncodedFrames, "slices",
                        lambda self, r: sliced.append(r.tolist()) or slices(self, r))
    out = cameras.decode(frames, rows)
    assert sliced == [[0, 3, len(frames) - 1]]  # once each, in one call
    assert out.shape == (3, 2, frames.channels, *frames.frame_shape[:2])
    for i, j in np.ndindex(*rows.shape):
        torch.testing.assert_close(out[i, j], cameras.decode(frames, rows[i, j, None])[0])


@pytest.mark.parametrize("mode,subsampling,progressive",
                         [("RGB", 0, False), ("RGB", 1, False), ("RGB", 2, False),
                          ("RGB", 2, True), ("L", 0, False), ("CMYK", 0, False)])
def test_cpu_decode_gives_pillows_pixels(mode, subsampling, progressive):
    """The CPU decode (libjpeg-turbo through simplejpeg, Pillow for what it refuses) gives
    the pixels Pillow's decode gives: chroma 4:4:4 / 4:2:2 / 4:2:0, progressive, odd sizes,
    a grey JPEG and a CMYK one in an RGB camera."""
    import io

    from PIL import Image

    from robocache.data import cameras

    assert cameras._simplejpeg() is not None  # (the data extra installs it)
    rng = np.random.default_rng(subsampling)
    y, x = np.mgrid[0:37, 0:53]
    base = np.stack([x * 4, y * 6, (x + y) * 3], -1) + rng.integers(0, 40, (37, 53, 3))
    image = Image.fromarray(base.clip(0, 255).astype(np.uint8)).convert(mode)
    blobs = []
    for q in (95, 70):
        buf = io.BytesIO()
        image.save(buf, "JPEG", quality=q, subsampling=subsampling, progressive=progressive)
        blobs.append(buf.getvalue())
    data = torch.frombuffer(bytearray(b"".join(blobs)), dtype=torch.uint8)
    offsets = torch.tensor([0, len(blobs[0]), len(blobs[0]) + len(blobs[1])])
    enc = cameras.EncodedFrames(data, offsets, (37, 53, 3), "uint8", "jpeg")
    got = cameras.decode_all([(enc, torch.tensor([1, 0]))], "cpu")[0]
    for row, blob in zip(got, blobs[::-1], strict=True):
        with Image.open(io.BytesIO(blob)) as im:
            want = np.asarray(im.convert("RGB"))
        np.testing.assert_array_equal(row.permute(1, 2, 0).numpy(), want)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_decode_all_rows_in_order_need_no_gather(h264_cache, monkeypatch, device):
    """Rows that are 0, 1, ... (an online window's) decode without the unique and the gather,
    in one call with a camera whose rows need both, to the frames the gathering path gives
    (the same frames in the same decode batch: nvJPEG's output can depend on the batch)."""
    from robocache.data import cameras

    frames = RobotDataset(h264_cache, keys=[CAM], in_memory=True).frames[CAM]
    in_order, mixed = torch.arange(3), torch.tensor([[2, 0], [2, 2]])
    unique = torch.unique
    seen = []
    monkeypatch.setattr(torch, "unique", lambda r, **kw: seen.append(r.tolist()) or
                        unique(r, **kw))
    got = cameras.decode_all([(frames, in_order), (frames, mixed)], device)
    assert seen == [[2, 0, 2, 2]]  # only the camera whose rows need it
    want = cameras.decode_all([(frames, in_order.flip(0)), (frames, mixed)], device)
    assert got[0].shape == (3, frames.channels, *frames.frame_shape[:2])
    assert got[1].shape == (2, 2, frames.channels, *frames.frame_shape[:2])
    assert torch.equal(got[0], want[0].flip(0)) and torch.equal(got[1], want[1])


@pytest.mark.gpu
def test_nvjpeg_resident_path_matches_the_cpu_path(h264_cache):
    from robocache import ImageTransformsConfig

    cfg = ImageTransformsConfig(max_num_transforms=5, crop_scale=(0.8, 1.0))
    kw = dict(keys=[CAM], history=2, image_size=(24, 32), image_transforms=cfg, seed=1)
    cpu = RobotDataset(h264_cache, **kw)
    gpu = RobotDataset(h264_cache, **kw).to("cuda")
    idx = torch.arange(len(cpu))
    a, b = cpu[idx][CAM], gpu[idx.cuda()][CAM].cpu()
    assert psnr(to_uint8(b), to_uint8(a)) > GPU_CPU_MIN_PSNR
    kw = dict(keys=[CAM], history=2, image_size=(24, 32), image_dtype=torch.bfloat16)
    a = RobotDataset(h264_cache, **kw)[idx][CAM].float()  # resize only
    b = RobotDataset(h264_cache, **kw).to("cuda")[idx.cuda()][CAM].float().cpu()
    assert psnr(to_uint8(b), to_uint8(a)) > GPU_CPU_MIN_PSNR


def _scene(n: int, shift: int) -> np.ndarray:
    # 64x64: libx265 (as bundled with PyAV) corrupts the heap on frames under 64 pixels
    y, x = np.mgrid[0:64, 0:64]
    return np.stack([np.stack([x * 3 + 3 * i + shift, y * 3 + shift, 120 + 0 * x + 9 * i], -1)
                     for i in range(n)]).clip(0, 255).astype(np.uint8)


def _lerobot_state_only(root: Path, lengths, version: str = "v3.0") -> Path:
    from robocache.data.episode import Episode, Stream, StreamSpec
    from robocache.data.formats.lerobot import write_lerobot

    spec = StreamSpec("observation.state", "numeric", "float32", (2,), 10.0)
    eps = [Episode(i, {spec.name: Stream(spec, np.arange(n) / 10.0,
                                         np.zeros((n, 2), np.float32))}, {"tasks": ["t"]})
           for i, n in enumerate(lengths)]
    return write_lerobot(root, eps, {spec.name: spec}, fps=10.0, version=version)


@pytest.mark.parametrize("codec", ["libx264", "libx265"])
def test_v21_one_video_per_episode_and_wrong_shape(tmp_path, codec):
    import json

    from robocache.data.cameras import write_video

    root = _lerobot_state_only(tmp_path / "src", (6, 5), version="v2.1")
    info = json.loads((root / "meta" / "info.json").read_text())
    info["features"][CAM] = {"dtype": "video", "shape": [64, 64, 3],
                             "info": {"video.fps": 10.0}}
    (root / "meta" / "info.json").write_text(json.dumps(info))
    frames = [_scene(6, 0), _scene(5, 40)]
    for i, f in enumerate(frames):
        path = root / info["video_path"].format(episode_chunk=0, video_key=CAM, episode_index=i)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_video(path, f, 10.0, codec)
    build(root, tmp_path / "c", rate_hz=10.0, progress=False, device="cpu")
    assert psnr(served(tmp_path / "c"), np.concatenate(frames)) > 30
    info["features"][CAM]["shape"] = [60, 64, 3]  # frames of the wrong shape: quarantined
    (root / "meta" / "info.json").write_text(json.dumps(info))
    m = build(root, tmp_path / "c2", rate_hz=10.0, progress=False, device="cpu")
    assert m["counts"]["quarantined"] == 2 and "shape" in m["quarantined"][0]["reason"]


def test_robomimic_image_observations(tmp_path):
    import h5py

    img = _scene(7, 0)
    with h5py.File(tmp_path / "image.hdf5", "w") as f:
        g = f.create_group("data").create_group("demo_0")
        g.create_dataset("obs/agentview_image", data=img)
        g.create_dataset("actions", data=np.zeros((7, 2)))
        g.attrs["num_samples"] = 7
    build(tmp_path / "image.hdf5", tmp_path / "c", rate_hz=20.0, progress=False, device="cpu")
    ds = RobotDataset(tmp_path / "c", keys=["obs.agentview_image"], image_dtype=torch.uint8)
    got = ds[torch.arange(len(ds))]["obs.agentview_image"][:, 0].permute(0, 2, 3, 1).numpy()
    assert psnr(got, img) > 40


def test_bundled_sample_serves_its_camera(tmp_path):
    from robocache.data.sample import VIDEO_KEY, sample_path

    m = build(sample_path(), tmp_path / "c", rate_hz=50.0, progress=False, device="cpu",
              keys=["observation.state", VIDEO_KEY])
    assert m["counts"]["quarantined"] == 0 and m["streams"][VIDEO_KEY]["kind"] == "video"
    ds = RobotDataset(tmp_path / "c", keys=[VIDEO_KEY], history=2)
    batch = ds[torch.arange(0, len(ds), 97)]
    assert batch[VIDEO_KEY].shape == (len(range(0, len(ds), 97)), 2, 3, 96, 128)
    assert not batch[f"{VIDEO_KEY}_is_pad"][:, 1].any()


CAM2 = "observation.images.wrist"


def _clip(n: int, shift: int, hw: tuple[int, int] = (48, 64)) -> np.ndarray:
    """``n`` frames of a moving gradient: each frame and each clip distinct."""
    h, w = hw
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([np.stack([(x * 255) // w + 5 * i + shift, (y * 255) // h + shift,
                               120 + 0 * x + 9 * i], -1)
                     for i in range(n)]).clip(0, 255).astype(np.uint8)


def _two_cameras(root: Path, episodes: int = 6, length: int = 7, hw=(48, 64),
                 codec: str = "libx264", options: dict[str, str] | None = None) -> Path:
    """A LeRobot v3.0 dataset: a state stream and two cameras, one mp4 per camera."""
    from robocache.data.cameras import add_video_feature

    root = _lerobot_state_only(root, [length] * episodes)
    for c, key in enumerate((CAM, CAM2)):
        add_video_feature(root, key, [_clip(length, 13 * i + 50 * c, hw)
                                      for i in range(episodes)], codec=codec, options=options)
    return root


def _contents(dest: Path) -> dict:
    """Everything a cache serves: every table's rows (sorted by episode, then step or frame),
    stats, counts and quarantine reasons; not its file names or timings."""
    import json

    import lance

    out = {}
    for path in [dest / "data.lance", *sorted((dest / "frames").glob("*.lance"))]:
        table = lance.dataset(str(path)).to_table()
        order = "step" if "step" in table.column_names else "frame"
        out[path.name] = table.sort_by([("episode_index", "ascending"),
                                        (order, "ascending")]).to_pydict()
    manifest = json.loads((dest / "manifest.json").read_text())
    out["manifest"] = {k: manifest[k] for k in ("counts", "episodes", "quarantined", "streams")}
    out["stats"] = json.loads((dest / "stats.json").read_text())
    return out


@pytest.mark.parametrize("truncate", [False, True])
def test_ingest_is_the_same_with_one_or_several_decode_workers(tmp_path, truncate):
    src = _two_cameras(tmp_path / "src")
    if truncate:  # episodes 2 and 4 of one camera point past its video's end: quarantined
        import pyarrow as pa
        import pyarrow.parquet as pq

        meta = src / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
        table = pq.read_table(meta)
        for col in (f"videos/{CAM2}/from_timestamp", f"videos/{CAM2}/to_timestamp"):
            values = table.column(col).to_numpy().copy()
            values[[2, 4]] += 60.0
            table = table.set_column(table.schema.get_field_index(col), col, pa.array(values))
        pq.write_table(table, meta)
    caches = {}
    for workers in (1, 3):
        m = build(src, tmp_path / f"w{workers}", rate_hz=10.0, progress=False, device="cpu",
                  decode_workers=workers, video_decoder="pyav", camera_codec="jpeg")
        assert m["decode"] == {"workers": workers, "video_decoder": "pyav",
                               "video_frames": {"pyav": 2 * 7 * m["counts"]["cached"]}}
        caches[workers] = _contents(tmp_path / f"w{workers}")
    assert caches[1] == caches[3]
    c = caches[1]["manifest"]["counts"]
    if truncate:
        quarantined = caches[1]["manifest"]["quarantined"]
        assert (c["cached"], c["quarantined"]) == (4, 2)
        assert [q["index"] for q in quarantined] == [2, 4]
        assert all("truncated" in q["reason"] for q in quarantined)
    else:
        assert c["cached"] == 6 and len(caches[1]["observation.images.front.lance"]["frame"]) == 42


def test_prepared_keeps_order_and_at_most_workers_episodes_ahead(tmp_path):
    from robocache.data.cache import CacheConfig, open_specs, prepared

    src, specs = open_specs(_two_cameras(tmp_path / "src", episodes=5),
                            CacheConfig(camera_codec="jpeg"))
    reads = []
    read = src.read
    src.read = lambda i: reads.append(i) or read(i)
    got = []
    config = CacheConfig(decode_workers=2, video_decoder="pyav", camera_codec="jpeg")
    for k, p in enumerate(prepared(src, [4, 0, 3, 1, 2], specs, config), 1):
        assert p.error is None and p.episode.streams[CAM].data is None  # pixels dropped
        assert len(p.frames[CAM]) == 7
        assert len(reads) <= k + 2  # the one yielded, and two more at most
        got.append(p.index)
    assert got == [4, 0, 3, 1, 2]


def test_decode_options_are_checked(tmp_path):
    from robocache.data.cameras import nvdec_available
    from robocache.errors import DeviceError

    with pytest.raises(DataError, match="decode_workers"):
        build(FIXTURES / "lerobot_h264", tmp_path / "a", progress=False, decode_workers=0)
    with pytest.raises(DataError, match="video_decoder"):
        build(FIXTURES / "lerobot_h264", tmp_path / "b", progress=False, video_decoder="gpu")
    if not nvdec_available():
        with pytest.raises(DeviceError, match="PyNvVideoCodec"):
            build(FIXTURES / "lerobot_h264", tmp_path / "c", progress=False,
                  video_decoder="nvdec")


def test_ingest_cli_decode_flags(tmp_path):
    import json

    from typer.testing import CliRunner

    from robocache.cli import app

    res = CliRunner().invoke(app, ["ingest", str(FIXTURES / "lerobot_h264"), str(tmp_path / "c"),
                                   "--rate", "10", "--device", "cpu", "--decode-workers", "2",
                                   "--video-decoder", "pyav", "--json"])
    assert res.exit_code == 0, res.output
    decode = json.loads(res.stdout)["decode"]
    assert decode["workers"] == 2 and decode["video_decoder"] == "pyav"


def _nvdec():
    from robocache.data.cameras import nvdec_available

    if not nvdec_available():
        pytest.skip("needs PyNvVideoCodec (NVDEC)")


# NVDEC's RGB conversion vs PyAV's (swscale rgb24): the same frames, pixel values a few grey
# levels apart at most; the bound is the target, to be replaced by the measured gap
NVDEC_MIN_PSNR = 40.0


# encoder options without B-frames, per codec
NO_B_FRAMES = {"libx264": {"bf": "0"}, "libx265": {"x265-params": "bframes=0"}}


@pytest.mark.gpu
@pytest.mark.parametrize("codec,b_frames", [("libx264", False), ("libx265", False),
                                            ("libx264", True), ("libx265", True)],
                         ids=["h264", "hevc", "h264-b-frames", "hevc-b-frames"])
def test_nvdec_decodes_the_same_frames_as_pyav(tmp_path, codec, b_frames, monkeypatch):
    """NVDEC serves the frames PyAV serves; a stream with B-frames is left to PyAV, with a
    warning (H100, HEVC: NVDEC's frames by index came one display position late there)."""
    import av

    from robocache.data import cameras
    from robocache.data.cameras import decode_video_with

    _nvdec()
    monkeypatch.setattr(cameras, "_warned", set())
    # 144x176: NVDEC decodes HEVC from 144x144 up
    src = _two_cameras(tmp_path / "src", episodes=3, length=9, hw=(144, 176), codec=codec,
                       options=None if b_frames else NO_B_FRAMES[codec])
    video = next((src / "videos" / CAM).rglob("*.mp4"))
    with av.open(str(video)) as container:
        reordered = bool(container.streams.video[0].codec_context.has_b_frames)
    assert reordered == b_frames
    if reordered:
        with pytest.warns(UserWarning, match="B-frames"):
            got = decode_video_with(video, 0.0, 0.8, decoder="nvdec")
        assert got[3] == "pyav"
        return
    for start, end in ((0.0, 0.8), (0.9, 1.7), (1.8, 2.6)):  # each episode's span
        want, t_want, i_want, used = decode_video_with(video, start, end, decoder="pyav")
        got, t_got, i_got, used_nv = decode_video_with(video, start, end, decoder="nvdec")
        assert (used, used_nv) == ("pyav", "nvdec")
        np.testing.assert_array_equal(t_got, t_want)
        np.testing.assert_array_equal(i_got, i_want)
        assert got.shape == want.shape and got.dtype == np.uint8
        for k in range(len(got)):  # the same frame: nearest to its own PyAV frame
            errors = [np.mean((got[k].astype(float) - w) ** 2) for w in want]
            assert int(np.argmin(errors)) == k
        assert psnr(got, want) >= NVDEC_MIN_PSNR, psnr(got, want)
    m = build(src, tmp_path / "c", rate_hz=10.0, progress=False,
              camera_codec="jpeg", video_decoder="nvdec",
              decode_workers=2)
    assert m["counts"]["cached"] == 3 and m["decode"]["video_frames"] == {"nvdec": 2 * 3 * 9}
    build(src, tmp_path / "ref", rate_hz=10.0, progress=False,
          camera_codec="jpeg", video_decoder="pyav")
    a, b = _contents(tmp_path / "c"), _contents(tmp_path / "ref")
    assert a["data.lance"] == b["data.lance"] and a["manifest"] == b["manifest"]


@pytest.mark.gpu
def test_nvdec_decoder_moves_from_file_to_file(tmp_path, monkeypatch):
    """A thread's NVDEC decoder is created once and reconfigured for each next file (LeRobot
    v2.1: one short file per episode and camera); each file's frames are still its own, the
    nearest to their own PyAV frames, and the cache holds what the PyAV path's holds."""
    import json
    import threading

    nvc = pytest.importorskip("PyNvVideoCodec", reason="needs PyNvVideoCodec (NVDEC)")

    from robocache.data import cameras
    from robocache.data.cameras import write_video

    _nvdec()
    made, moved = [], []

    class Counted(nvc.SimpleDecoder):
        def __init__(self, *args, **kw):
            made.append(args[0])
            super().__init__(*args, **kw)

        def reconfigure_decoder(self, path):
            moved.append(path)
            return super().reconfigure_decoder(path)

    monkeypatch.setattr(nvc, "SimpleDecoder", Counted)
    monkeypatch.setattr(cameras, "_nvdec_local", threading.local())
    lengths = (6, 5, 7)
    root = _lerobot_state_only(tmp_path / "src", lengths, version="v2.1")
    info = json.loads((root / "meta" / "info.json").read_text())
    info["features"][CAM] = {"dtype": "video", "shape": [144, 176, 3],
                             "info": {"video.fps": 10.0}}
    (root / "meta" / "info.json").write_text(json.dumps(info))
    paths = []
    for i, n in enumerate(lengths):
        path = root / info["video_path"].format(episode_chunk=0, video_key=CAM, episode_index=i)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_video(path, _clip(n, 40 * i, (144, 176)), 10.0, "libx264", NO_B_FRAMES["libx264"])
        paths.append(path)
    for path, n in zip(paths, lengths, strict=True):
        end = (n - 1) / 10
        got, t_got, _, used = cameras.decode_video_with(path, 0.0, end, decoder="nvdec")
        want, t_want, _, _ = cameras.decode_video_with(path, 0.0, end, decoder="pyav")
        assert used == "nvdec" and np.array_equal(t_got, t_want) and len(got) == n
        for k in range(n):
            errors = [np.mean((got[k].astype(float) - w) ** 2) for w in want]
            assert int(np.argmin(errors)) == k
        assert psnr(got, want) >= NVDEC_MIN_PSNR
    assert made == [str(paths[0])] and moved == [str(p) for p in paths[1:]]
    m = build(root, tmp_path / "c", rate_hz=10.0, progress=False,
              camera_codec="jpeg", video_decoder="nvdec",
              decode_workers=1)
    assert m["decode"]["video_frames"] == {"nvdec": sum(lengths)}
    build(root, tmp_path / "ref", rate_hz=10.0, progress=False,
          camera_codec="jpeg", video_decoder="pyav")
    a, b = _contents(tmp_path / "c"), _contents(tmp_path / "ref")
    assert a["data.lance"] == b["data.lance"] and a["manifest"] == b["manifest"]


@pytest.mark.gpu
def test_nvdec_leaves_av1_to_pyav(tmp_path, monkeypatch):
    from robocache.data import cameras

    _nvdec()
    monkeypatch.setattr(cameras, "_warned", set())  # one warning per kind, per process
    with pytest.warns(UserWarning, match="av1"):
        m = build(FIXTURES / "lerobot_av1", tmp_path / "c", rate_hz=10.0, progress=False,
                  camera_codec="jpeg", video_decoder="nvdec")
    assert m["counts"]["cached"] == 2 and set(m["decode"]["video_frames"]) == {"pyav"}
    src = _two_cameras(tmp_path / "src", episodes=2, length=5, hw=(144, 176),
                       options=NO_B_FRAMES["libx264"])
    auto = build(src, tmp_path / "h", rate_hz=10.0, progress=False,
                 camera_codec="jpeg", video_decoder="auto")
    assert auto["decode"]["video_decoder"] == "auto"  # NVDEC for H.264
    assert auto["decode"]["video_frames"] == {"nvdec": 2 * 2 * 5}


@pytest.mark.gpu
@pytest.mark.parametrize("decoder", ["auto", "nvdec"])
def test_large_builds_decode_on_every_gpus_lane(tmp_path, decoder):
    """A large build with NVDEC (here forced by ``decode_processes``) sends its streams to a
    lane process per GPU (NVDEC, nvJPEG) and, with ``auto``, to the CPU workers too; the
    cache holds what the PyAV build holds, each frame within NVDEC's tolerance."""
    from robocache.data import cameras

    _nvdec()
    src = _two_cameras(tmp_path / "src", episodes=24, length=9, hw=(144, 176),
                       options=NO_B_FRAMES["libx264"])
    m = build(src, tmp_path / "c", rate_hz=10.0, progress=False,
              camera_codec="jpeg", video_decoder=decoder,
              decode_processes=True)
    by = m["decode"]["video_frames"]
    assert sum(by.values()) == 2 * 24 * 9 and m["counts"]["cached"] == 24
    assert set(by) == ({"nvdec", "pyav"} if decoder == "auto" else {"nvdec"}), by
    assert set(cameras._workers["pool"].lanes) == set(range(torch.cuda.device_count()))
    build(src, tmp_path / "ref", rate_hz=10.0, progress=False,
          camera_codec="jpeg", video_decoder="pyav")
    a, b = _contents(tmp_path / "c"), _contents(tmp_path / "ref")
    assert a["data.lance"] == b["data.lance"] and a["manifest"] == b["manifest"]
    got, want = served(tmp_path / "c"), served(tmp_path / "ref")
    assert got.shape == want.shape and psnr(got, want) >= NVDEC_MIN_PSNR


@pytest.fixture(scope="module")
def sharp():
    return dict(np.load(FIXTURES / "sharp_frames.npz"))


def test_jpeg_default_fidelity_is_40db_of_lerobots_decode_on_sharp_edges(tmp_path, sharp):
    """A LeRobot-written AV1 camera of sharp-edged content (fiducial, code block, colour
    bars) stored as JPEG at the default quality and chroma: every stored frame, decoded, is
    within 40 dB PSNR of LeRobot's own decode of it; 4:2:0 (Pillow's default) is not, and the
    manifest records the chroma."""
    m = build(FIXTURES / "lerobot_sharp_av1", tmp_path / "c", progress=False, device="cpu",
              camera_codec="jpeg")
    entry = m["streams"][CAM]
    assert (entry["codec"], entry["quality"], entry["chroma"]) == ("jpeg", 95, "444")
    got, want = served(tmp_path / "c"), sharp["lerobot"]
    assert got.shape == want.shape == (11, 64, 96, 3)
    worst = min(psnr(g, w) for g, w in zip(got, want, strict=True))
    assert worst >= 40.0, worst
    build(FIXTURES / "lerobot_sharp_av1", tmp_path / "s", progress=False, device="cpu",
          camera_codec="jpeg", camera_chroma="420")
    assert max(psnr(g, w) for g, w in zip(served(tmp_path / "s"), want, strict=True)) < 35.0


@pytest.mark.parametrize("option,value,match", [
    ("camera_chroma", "411", r"`camera_chroma` \(--camera-chroma\) must be one of"),
    ("camera_chroma", 444, r"`camera_chroma` \(--camera-chroma\) must be one of"),
    ("camera_quality", 0, r"`camera_quality` \(--camera-quality\) must be an integer in "
                          r"\[1, 100\]"),
    ("camera_quality", 101, r"`camera_quality` \(--camera-quality\) must be an integer"),
    ("camera_quality", 9.5, r"`camera_quality` \(--camera-quality\) must be an integer"),
    ("camera_codec", "webp", r"`camera_codec` \(--camera-codec\) must be one of"),
])
def test_camera_encoding_options_are_checked(tmp_path, option, value, match):
    with pytest.raises(DataError, match=match):
        build(FIXTURES / "lerobot_h264", tmp_path / "c", progress=False, device="cpu",
              **{option: value})
    assert not (tmp_path / "c").exists()


def test_ingest_cli_camera_chroma(tmp_path):
    import json

    from typer.testing import CliRunner

    from robocache.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["ingest", str(FIXTURES / "lerobot_h264"), str(tmp_path / "c"),
                              "--rate", "10", "--device", "cpu", "--camera-codec", "jpeg",
                              "--camera-chroma", "422", "--camera-quality", "90", "--json"])
    assert res.exit_code == 0, res.output
    entry = json.loads(res.stdout)["streams"][CAM]
    assert (entry["quality"], entry["chroma"]) == (90, "422")
    shown = runner.invoke(app, ["inspect", str(tmp_path / "c")])
    assert shown.exit_code == 0 and "jpeg q90 422" in shown.output
    bad = runner.invoke(app, ["ingest", str(FIXTURES / "lerobot_h264"), str(tmp_path / "d"),
                              "--camera-chroma", "410"])
    assert bad.exit_code == 2 and "--camera-chroma" in bad.output
    assert "Traceback" not in bad.output and not (tmp_path / "d").exists()


def test_source_jpeg_bytes_pass_through_untouched(tmp_path):
    """A source's own JPEG bytes (RLDS, LeRobot image features) are stored byte for byte,
    whatever the JPEG options; a resize re-encodes them."""
    import lance

    from robocache.data.formats import open_source

    rlds = FIXTURES.parent / "rlds" / "toy_rlds" / "jpeg" / "1.0.0"
    src = open_source(rlds, fps=10.0)
    jpegs = [name for name, s in src.specs.items() if s.encoding == "jpeg"]
    assert jpegs
    m = build(rlds, tmp_path / "c", progress=False, device="cpu", camera_chroma="420",
              camera_quality=20, source_options={"fps": 10.0})
    for name in jpegs:
        assert m["streams"][name]["quality"] is None and "chroma" not in m["streams"][name]
        table = lance.dataset(str(tmp_path / "c" / "frames" / f"{name}.lance")).to_table()
        for row in table.to_pylist():
            episode = src.read(row["episode_index"])
            assert row["encoded"] == bytes(episode.streams[name].data[row["frame"]])


def _sampling(data: bytes) -> int:
    """Pillow's name for a JPEG's chroma subsampling: 0 = 4:4:4, 1 = 4:2:2, 2 = 4:2:0."""
    import io

    from PIL import Image, JpegImagePlugin

    with Image.open(io.BytesIO(data)) as im:
        return JpegImagePlugin.get_sampling(im)


@pytest.mark.parametrize("chroma,sampling", [("444", 0), ("422", 1), ("420", 2)])
def test_stored_frames_have_the_chroma_asked_for(tmp_path, chroma, sampling):
    import lance

    build(FIXTURES / "lerobot_h264", tmp_path / "c", rate_hz=10.0, progress=False,
          device="cpu", camera_codec="jpeg", camera_chroma=chroma, decode_workers=2)
    table = lance.dataset(str(tmp_path / "c" / "frames" / f"{CAM}.lance")).to_table()
    assert {_sampling(b) for b in table.column("encoded").to_pylist()} == {sampling}


def test_jpeg_encode_grey_and_rgb():
    import io

    from PIL import Image

    from robocache.data import jpeg

    rgb = np.random.default_rng(0).integers(0, 256, (9, 13, 3), dtype=np.uint8)
    for frame, mode in ((rgb, "RGB"), (rgb[..., 0], "L"), (rgb[..., :1], "L")):
        with Image.open(io.BytesIO(jpeg.encode(frame, 100))) as im:
            assert im.mode == mode and im.size == (13, 9)
            assert psnr(np.asarray(im), frame.reshape(np.asarray(im).shape)) > 30


@pytest.mark.gpu
def test_nvdec_frames_are_nvjpeg_encoded_on_the_gpu(tmp_path, monkeypatch):
    """NVDEC ingest at the defaults (JPEG 4:4:4, the source's size): the frames never come
    to the host as pixels; nvJPEG encodes them 4:4:4, within the JPEG tolerance of the PyAV
    path's cache."""
    import lance

    from robocache.data import jpeg

    _nvdec()
    calls = []
    encode_cuda = jpeg.encode_cuda
    monkeypatch.setattr(jpeg, "encode_cuda", lambda b, q=95: calls.append(len(b)) or
                        encode_cuda(b, q))
    src = _two_cameras(tmp_path / "src", episodes=2, length=9, hw=(144, 176),
                       options=NO_B_FRAMES["libx264"])
    m = build(src, tmp_path / "gpu", rate_hz=10.0, progress=False,
              camera_codec="jpeg", video_decoder="nvdec")
    assert m["decode"]["video_frames"] == {"nvdec": 2 * 2 * 9} and sum(calls) == 2 * 2 * 9
    build(src, tmp_path / "cpu", rate_hz=10.0, progress=False,
          camera_codec="jpeg", video_decoder="pyav")
    table = lance.dataset(str(tmp_path / "gpu" / "frames" / f"{CAM}.lance")).to_table()
    assert {_sampling(b) for b in table.column("encoded").to_pylist()} == {0}
    assert psnr(served(tmp_path / "gpu"), served(tmp_path / "cpu")) >= 35.0


@pytest.mark.parametrize("vision,codec,chosen", [
    ((0, 26), None, "torchvision"), ((0, 28), (0, 16), "torchvision"),
    ((0, 29), (0, 16), "torchcodec"), ((0, 29), None, "torchvision"),
    (None, (0, 17), "torchcodec"), ((0, 29), (0, 15), "torchvision"), (None, None, None)])
def test_serving_decoder_follows_torchvisions_deprecation(monkeypatch, vision, codec, chosen):
    """torchvision's nvJPEG batch decode before 0.29; TorchCodec's (0.16+) from then on, or
    when torchvision is absent; neither: None (Pillow decodes, with a warning)."""
    import sys
    import types
    import warnings

    from robocache.data import cameras

    fakes = {"torchvision": vision, "torchcodec": codec}
    monkeypatch.setattr(cameras, "_version", fakes.get)
    for module, name in (("torchvision.io", "torchvision"),
                         ("torchcodec.decoders", "torchcodec")):
        fake = types.ModuleType(module)
        fake.decode_jpeg = name
        monkeypatch.setitem(sys.modules, module, fake)
    cameras._nvjpeg.cache_clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert cameras._nvjpeg() == chosen
        assert (chosen is None) == any("nvJPEG" in str(w.message) for w in caught)
    finally:
        cameras._nvjpeg.cache_clear()


# an ingest that reads an episode every 0.5 s, its videos decoded in 2 worker processes
KILLED_BUILD = """
import sys, time
from robocache.data.cache import build
from robocache.data.formats import open_source
src = open_source(sys.argv[1])
src.read = lambda i, read=src.read: time.sleep(0.5) or read(i)
build(src, sys.argv[2], rate_hz=10.0, progress=False, device="cpu", decode_workers=2,
      camera_codec="jpeg")
"""


def test_killed_ingest_leaves_no_worker_holding_the_cache(tmp_path):
    """kill -9 of an ingest whose videos decode in worker processes: the workers exit with it
    (none keeps the cache's lock), and the next run resumes."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from robocache.data.lock import holder

    src = _two_cameras(tmp_path / "src", episodes=6)
    dest = tmp_path / "c"
    before = _shipped_files()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_BUILD, str(src), str(dest)], env=env)
    deadline = time.monotonic() + 60
    while not list((dest / "data.lance" / "_versions").glob("*.manifest")):
        assert proc.poll() is None and time.monotonic() < deadline, "no episode was cached"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while holder(dest) is not None:
        assert time.monotonic() < deadline, f"the lock outlived the ingest: {holder(dest)}"
        time.sleep(0.05)
    while _shipped_files() - before:  # the workers' unread results: removed by the tracker
        assert time.monotonic() < deadline + 20, _shipped_files() - before
        time.sleep(0.05)
    m = build(src, dest, rate_hz=10.0, progress=False, device="cpu", decode_workers=2,
              camera_codec="jpeg")
    assert m["counts"]["cached"] == 6 and m["counts"]["quarantined"] == 0


def _crash_once(marker: str, where: str, threads: int) -> str:
    """A worker task that kills its process the first time (``marker`` records it)."""
    import os

    if not os.path.exists(marker):
        open(marker, "w").close()
        os._exit(3)
    return f"{where}: ok"


def _crash_always(path: str, where: str, threads: int) -> str:
    import os

    os._exit(3)


def test_a_dead_camera_worker_is_replaced_and_its_task_retried_once(tmp_path):
    """A worker process that dies breaks the pool: the task runs once more in a new pool; a
    task that kills it again raises DataError naming its stream; the pool works after."""
    from robocache.data.cameras import CameraWorkers

    workers = CameraWorkers(2, threads=1).start()
    try:
        marker = str(tmp_path / "crashed")
        assert workers.result(workers.submit(_crash_once, marker, "episode 0")) == \
            "episode 0: ok"
        with pytest.raises(DataError, match="episode 1: a camera worker process died "
                                            "decoding x.mp4"):
            workers.result(workers.submit(_crash_always, "x.mp4", "episode 1"))
        assert workers.result(workers.submit(_crash_once, marker, "episode 2")) == \
            "episode 2: ok"
    finally:
        workers.close()


def _slow_pid(seconds: float) -> int:
    import os
    import time

    time.sleep(seconds)
    return os.getpid()


# four tasks of one process meet here (made on import, so in the lane's process too)
_MEET = threading.Barrier(4)


def _meet() -> int:
    """Wait until four tasks of this process are all running (a minute at most: tasks run
    one after another fail here), then give this process's id."""
    import os

    _MEET.wait(60)
    return os.getpid()


def _fail(message: str):
    raise DataError(message)


def _unpicklable_error():
    class Local(Exception):
        pass

    raise Local("made here")


def test_a_lane_runs_its_tasks_on_threads_of_one_process():
    """A lane runs many tasks at once in one process of its own; a task's DataError comes back
    as itself, an error that does not pickle as a DataError with its text; an initializer's
    error is what waiting for the lane raises."""
    import functools
    import os

    from robocache.data.lanes import Lane

    lane = Lane(4).start()
    try:
        lane.wait_ready(60)
        # four tasks that each wait for the others: they run at once, not in turn
        pids = [f.result(90) for f in [lane.submit(_meet) for _ in range(4)]]
        assert len(set(pids)) == 1 and pids[0] != os.getpid()
        with pytest.raises(DataError, match="episode 3: bad"):
            lane.submit(_fail, "episode 3: bad").result(60)
        with pytest.raises(DataError, match="Local: made here"):
            lane.submit(_unpicklable_error).result(60)
    finally:
        lane.close()
    with pytest.raises(Exception, match="ended with exit code 0"):
        lane.submit(_slow_pid, 0).result(60)
    failing = Lane(1, initializer=functools.partial(_fail, "no device here")).start()
    with pytest.raises(DataError, match="no device here"):
        failing.wait_ready(60)
    failing.close()


def test_a_lane_that_dies_fails_its_tasks_and_later_ones():
    """Killing a lane's process fails the tasks in flight and every later one with
    BrokenProcessPool; the lane is not alive any more."""
    import os
    import signal
    from concurrent.futures.process import BrokenProcessPool

    from robocache.data.lanes import Lane

    lane = Lane(2).start()
    try:
        lane.wait_ready(60)
        pid = lane.submit(_slow_pid, 0).result(60)
        running = lane.submit(_slow_pid, 30)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(BrokenProcessPool, match="exit code -9"):
            running.result(60)
        assert not lane.alive
        with pytest.raises(BrokenProcessPool):
            lane.submit(_slow_pid, 0).result(60)
    finally:
        lane.close()


LANE_OWNER = """
import os, sys, time
from robocache.data.lanes import Lane
if __name__ == "__main__":
    lane = Lane(1).start()
    lane.wait_ready(60)
    print(lane.submit(os.getpid).result(60), flush=True)
    time.sleep(600)
"""


def test_a_killed_build_leaves_no_lane_behind(tmp_path):
    """kill -9 of the process that started a lane: the lane's process (a fork server's child,
    not the killed process's) ends with it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "owner.py"
    script.write_text(LANE_OWNER)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    owner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True,
                             env=env)
    lane_pid = int(owner.stdout.readline())
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    deadline = time.monotonic() + 30
    while _running(lane_pid):
        assert time.monotonic() < deadline, "the lane outlived the process that started it"
        time.sleep(0.05)


def _running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie."""
    try:
        return "zombie" not in Path(f"/proc/{pid}/status").read_text().lower()
    except OSError:
        return False


def test_streams_a_lane_does_not_decode_go_to_the_cpu_workers(tmp_path):
    """With a lane that NVDEC cannot serve here (no GPU) or that dies, every stream still
    comes back from the CPU workers, byte for byte as the thread path encodes it, each
    submission waiting for a free slot (one lane slot, one process here)."""
    import os
    import signal

    from robocache.data import cameras
    from robocache.data.cameras import CameraWorkers, FrameFormat, write_video
    from robocache.data.lanes import Lane

    video = tmp_path / "v.mp4"
    write_video(video, _clip(9, 3), 10.0, "libx264")
    task = (video, 0.0, 0.8, 1e-4, FrameFormat(), None, (48, 64, 3), "episode 0: stream 'c'")
    want, t_want, i_want = cameras._pyav_stream(*task, threads=1)
    workers = CameraWorkers(1, threads=1).start()
    lane = workers.lanes[0] = Lane(1).start()
    workers._free = {0: 1, "cpu": 1}
    try:
        lane.wait_ready(60)
        handles = [workers.submit_stream(task, "auto") for _ in range(4)]
        assert {h[0] for h in handles} == {0, "cpu"}
        for h in handles:
            (packed, offsets), t, index, used = workers.stream_result(h)
            got = [bytes(memoryview(packed)[a:b]) for a, b in zip(offsets[:-1], offsets[1:],
                                                                      strict=True)]
            assert used == "pyav" and got == want
            assert np.array_equal(t, t_want) and np.array_equal(index, i_want)
        assert workers._free == {0: 1, "cpu": 1}
        os.kill(lane.submit(_slow_pid, 0).result(60), signal.SIGKILL)
        with pytest.raises(Exception, match="exit code -9"):
            lane.submit(_slow_pid, 30).result(60)
        handles = [workers.submit_stream(task, "nvdec") for _ in range(2)]  # lanes only: none
        assert [h[0] for h in handles] == ["cpu", "cpu"]
        assert all(workers.stream_result(h)[-1] == "pyav" for h in handles)
    finally:
        workers.close()
    assert not workers.lanes


@pytest.mark.parametrize("nvdec", [False, True], ids=["no-nvdec", "nvdec-here"])
def test_preparation_picks_lanes_processes_or_threads(monkeypatch, nvdec):
    """Lanes only for videos NVDEC decodes here in a large build; whole-episode processes for
    a large build whose videos PyAV decodes (``auto`` without NVDEC too) or that has none."""
    from robocache.data.build import read
    from robocache.data.build.config import CacheConfig

    monkeypatch.setattr(read, "nvdec_available", lambda: nvdec)
    many, few = read.PROCESS_EPISODES, 3

    def way(decoder, episodes, videos=True, **kw):
        config = CacheConfig(video_decoder=decoder, decode_workers=4, **kw)
        return read.preparation(config, episodes, videos)

    assert way("pyav", many) == "processes" and way("pyav", few) == "threads"
    assert way("auto", many) == ("lanes" if nvdec else "processes")
    assert way("auto", few) == "threads"
    assert way("auto", many, videos=False) == "processes"  # numeric: NVDEC has nothing to do
    assert way("auto", few, decode_processes=True) == ("lanes" if nvdec else "processes")
    assert way("nvdec", many, decode_processes=False) == "threads"
    assert way("pyav", many, decode_processes=False) == "threads"


def test_node_workers_splits_the_cores_between_lanes_and_processes(monkeypatch):
    from robocache.data import cameras

    assert cameras.node_workers(16, "pyav") == (16, ())
    monkeypatch.setattr(cameras, "nvdec_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert cameras.node_workers(64, "auto") == (64 - 4 * cameras.LANE_CORES, (0, 1, 2, 3))
    assert cameras.node_workers(64, "nvdec") == (64, (0, 1, 2, 3))
    assert cameras.node_workers(4, "auto") == (1, (0, 1, 2, 3))


def _shipped_files() -> set[str]:
    from robocache.data import cameras

    root = Path(cameras._SHM_DIR)
    return {p.name for p in root.glob("robocache-frames-*")} if root.is_dir() else set()


@pytest.mark.parametrize("shm", [True, False])
def test_worker_frames_come_back_through_shared_memory_or_the_pipe(tmp_path, monkeypatch, shm):
    """A worker's encoded stream comes back byte for byte as the thread path encodes it:
    through a shared-memory file that is removed once read, or through the result pipe where
    there is no /dev/shm; a result nobody reads (another stream failed first) is removed when
    it comes. (A folder of this test's own stands for /dev/shm: tests running beside it
    create their own files there.)"""
    import time

    from robocache.data import cameras
    from robocache.data.cameras import CameraWorkers, FrameFormat, write_video

    (tmp_path / "shm").mkdir()
    monkeypatch.setattr(cameras, "_SHM_DIR", str(tmp_path / ("shm" if shm else "no-shm")))
    video = tmp_path / "v.mp4"
    write_video(video, _clip(9, 3), 10.0, "libx264")
    task = (video, 0.0, 0.8, 1e-4, FrameFormat(), None, (48, 64, 3), "episode 0: stream 'c'")
    want, t_want, i_want = cameras._pyav_stream(*task, threads=1)
    before = _shipped_files()
    workers = CameraWorkers(2, threads=1).start()
    try:
        raw = workers.result(workers.submit(cameras._pyav_shipped, *task))
        assert isinstance(raw[0][0], str) == shm
        (packed, offsets), t, index = cameras._received(raw[0]), raw[1], raw[2]
        got = [bytes(memoryview(packed)[a:b]) for a, b in zip(offsets[:-1], offsets[1:],
                                                                  strict=True)]
        assert got == want and np.array_equal(t, t_want) and np.array_equal(index, i_want)
        assert _shipped_files() == before
        workers.submit(cameras._pyav_shipped, *task)[-1].add_done_callback(cameras._discard)
        deadline = time.monotonic() + 30
        while _shipped_files() != before:
            assert time.monotonic() < deadline, _shipped_files() - before
            time.sleep(0.05)
    finally:
        workers.close()


def test_a_worker_result_that_vanished_is_a_data_error(tmp_path, monkeypatch):
    """A shared-memory file removed before the parent reads it (e.g. by a cleaner of /dev/shm)
    quarantines its episode with a reason that names it, instead of failing the build."""
    from robocache.data import cameras

    monkeypatch.setattr(cameras, "_SHM_DIR", str(tmp_path))
    name, offsets = cameras._ship([b"abc", b"de"])
    assert (tmp_path / name).read_bytes() == b"abcde"
    (tmp_path / name).unlink()
    with pytest.raises(DataError, match=f"{name} cannot be read.*--retry-quarantined"):
        cameras._received((name, offsets))


@pytest.mark.gpu
def test_nvjpeg_encode_is_444_and_40db_on_sharp_edges(sharp):
    """The GPU encoder (torchvision's nvJPEG) writes 4:4:4; on the sharp-edged fixture its q95
    frames are within 40 dB PSNR of LeRobot's decode, as the CPU encoder's are."""
    import io

    from PIL import Image

    from robocache.data import jpeg
    from robocache.data.cameras import decode_video

    if not jpeg.gpu_available():
        pytest.skip("needs torchvision (nvJPEG)")
    video = next((FIXTURES / "lerobot_sharp_av1" / "videos").rglob("*.mp4"))
    decoded = decode_video(video, 0.0, 1.0)[0]
    data = jpeg.encode_cuda(torch.from_numpy(decoded).cuda(), 95)
    assert len(data) == len(decoded) and {_sampling(d) for d in data} == {0}
    back = [np.asarray(Image.open(io.BytesIO(d)).convert("RGB")) for d in data]
    assert min(psnr(b, w) for b, w in zip(back, sharp["lerobot"], strict=True)) >= 40.0


def _build_in(src: str, dest: str) -> int:
    return build(src, dest, rate_hz=10.0, progress=False, device="cpu",
                 decode_workers=2, camera_codec="jpeg")["counts"]["cached"]


def test_ingest_in_a_daemonic_process_decodes_on_threads(tmp_path):
    """A build inside a multiprocessing.Pool worker (daemonic: no children allowed) decodes
    its videos on the reading threads instead of worker processes."""
    import multiprocessing

    src = _two_cameras(tmp_path / "src", episodes=3)
    # spawn: a forked child of a process that has used Lance (earlier tests) can hang in it
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        assert pool.apply(_build_in, (str(src), str(tmp_path / "c"))) == 3
