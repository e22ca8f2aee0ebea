"""Video kept as video decoded by NVDEC: the packets rewritten as an Annex B stream (checked
with FFmpeg's own decoders), NV12 converted to RGB with swscale's arithmetic (checked against
PyAV's own conversion, pixel for pixel, for each matrix and range), and on a GPU the frames
served equal to the CPU path's."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

av = pytest.importorskip("av", reason="video cameras need PyAV (pip install 'robocache[video]')")

from robocache.data.cameras import write_video  # noqa: E402
from robocache.data.nvdec_packets import annexb, annexb_header  # noqa: E402
from robocache.reference.yuv import coefficients, nv12_to_rgb  # noqa: E402


def _clip(rng, n: int, h: int, w: int) -> np.ndarray:
    """Frames with flat areas, gradients and noise (every chroma value range is reached)."""
    frames = (rng.random((n, h, w, 3)) * 255).astype(np.uint8)
    frames[:, : h // 2] = np.linspace(0, 255, w, dtype=np.uint8)[None, None, :, None]
    frames[:, : h // 4, : w // 2] = [255, 0, 0]
    return frames


def _encode(path, frames, colorspace: int | None = None, full: bool = False, **options):
    with av.open(str(path), "w") as out:
        s = out.add_stream("libx264", 30, options={"g": "2", "crf": "20", **options})
        s.pix_fmt, s.height, s.width = "yuv420p", *frames.shape[1:3]
        if colorspace is not None:
            s.codec_context.colorspace = colorspace
        if full:
            s.codec_context.color_range = 2
        for f in frames:
            out.mux(s.encode(av.VideoFrame.from_ndarray(f, format="rgb24")))
        out.mux(s.encode())


def _nv12(frame) -> np.ndarray:
    """A PyAV frame's 4:2:0 planes as NV12 bytes (what NVDEC gives)."""
    h, w = frame.height, frame.width
    yuv = frame.to_ndarray(format="yuv420p")
    u = yuv[h:h + h // 4].reshape(h // 2, w // 2)
    v = yuv[h + h // 4:].reshape(h // 2, w // 2)
    return np.concatenate([yuv[:h].reshape(-1), np.stack([u, v], -1).reshape(-1)])


@pytest.mark.parametrize("colorspace, full", [(None, False), (1, False), (None, True),
                                              (1, True), (9, False)])
def test_nv12_to_rgb_is_pyavs_conversion(tmp_path, seed, colorspace, full):
    from av.video.reformatter import VideoReformatter

    rng = np.random.default_rng(seed)
    _encode(tmp_path / "v.mp4", _clip(rng, 3, 48, 96), colorspace, full)
    with av.open(str(tmp_path / "v.mp4")) as c:
        decoded = list(c.decode(video=0))
    want = np.stack([VideoReformatter().reformat(f, format="rgb24").to_ndarray()
                     for f in decoded])
    nv12 = torch.from_numpy(np.stack([_nv12(f) for f in decoded]))
    coeffs = torch.tensor([coefficients(f.colorspace, f.color_range == 2) for f in decoded])
    got = nv12_to_rgb(nv12, 48, 96, coeffs).permute(0, 2, 3, 1).numpy()
    np.testing.assert_array_equal(got, want)


def test_the_kernel_is_the_reference(kernel_device, seed):
    from robocache.kernels.yuv import nv12_to_rgb as kernel

    g = torch.Generator().manual_seed(seed)
    for n, h, w in [(1, 2, 2), (3, 6, 10), (2, 24, 34)]:
        nv12 = torch.randint(0, 256, (n, h * w * 3 // 2), generator=g, dtype=torch.uint8)
        coeffs = torch.tensor([coefficients(int(c), bool(r)) for c, r in
                               zip(torch.randint(0, 10, (n,), generator=g),
                                   torch.randint(0, 2, (n,), generator=g), strict=True)])
        got = kernel(nv12.to(kernel_device), h, w, coeffs.to(kernel_device))
        torch.testing.assert_close(got.cpu(), nv12_to_rgb(nv12, h, w, coeffs), rtol=0, atol=0)


@pytest.mark.parametrize("codec", ["libx264", "libx265"])
def test_annexb_stream_decodes_to_the_same_frames(tmp_path, seed, codec):
    """The packets rewritten for NVDEC, fed to FFmpeg's decoder without any configuration:
    the frames of the file, B-frames included."""
    rng = np.random.default_rng(seed)
    path = tmp_path / "v.mp4"
    write_video(path, _clip(rng, 12, 64, 96), 30.0, codec, {"g": "6", "bf": "2"})
    with av.open(str(path)) as c:
        stream = c.streams.video[0]
        name, extradata = stream.codec_context.name, bytes(stream.codec_context.extradata)
        packets = [(p.pts, bytes(p)) for p in c.demux(stream) if p.size]
    with av.open(str(path)) as c:
        want = [f.to_ndarray(format="yuv420p") for f in c.decode(video=0)]
    head, size = annexb_header(name, extradata)
    assert size == 4 and head.startswith(b"\0\0\0\1")
    ctx = av.CodecContext.create(name, "r")
    got = []
    for k, (pts, data) in enumerate(packets):
        packet = av.Packet((head if k == 0 else b"") + annexb(data, size))
        packet.pts = pts
        got += [(f.pts, f.to_ndarray(format="yuv420p")) for f in ctx.decode(packet)]
    got += [(f.pts, f.to_ndarray(format="yuv420p")) for f in ctx.decode(None)]
    got.sort(key=lambda x: x[0])
    assert len(got) == len(want)
    for (_, g), w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)


def test_annexb_leaves_annexb_alone():
    assert annexb_header("h264", b"\0\0\0\1\x67abc") == (b"\0\0\0\1\x67abc", 0)
    assert annexb(b"\0\0\0\1\x65xyz", 0) == b"\0\0\0\1\x65xyz"


@pytest.mark.gpu
@pytest.mark.parametrize("codec, options", [("libx264", None), ("libx265", None),
                                            ("libx264", {"g": "12", "bf": "3"}),
                                            ("libsvtav1", None)])
def test_nvdec_serves_the_cpu_paths_frames(tmp_path, seed, codec, options):
    """Every frame decoded on the GPU (NVDEC, then the colour kernel) equals the CPU path's
    (PyAV, then swscale) bit for bit, in any order and any grouping; a codec NVDEC does not
    decode here falls back to the CPU with one warning naming it."""
    pytest.importorskip("PyNvVideoCodec")
    from robocache.data.cameras import decode_all
    from robocache.data.frames import EncodedFrames
    from robocache.data.video_store import episode_packets, packet_table

    rng = np.random.default_rng(seed)
    path = tmp_path / "v.mp4"
    n, shape = 36, (160, 192, 3)  # NVDEC decodes HEVC from 144x144 up
    # a textured scene moving: the encoders use B-frames where asked (not on noise)
    scene = _clip(rng, 1, shape[0] // 8, shape[1] // 8)[0].repeat(8, 0).repeat(8, 1)
    write_video(path, np.stack([np.roll(scene, 5 * i, axis=1) for i in range(n)]), 30.0,
                codec, options)
    table, _, _ = packet_table(0, path, 0.0, (n - 1) / 30, 1e-4, shape, "cam")
    if options:  # frames decoded out of display order
        assert (np.diff(table.column("dts").to_numpy()[
            np.argsort(table.column("pts").to_numpy())]) < 0).any()
    wanted = np.arange(n)
    cpu = episode_packets(table, wanted, shape).decode(torch.arange(n))
    assert isinstance(cpu, torch.Tensor) and cpu.device.type == "cpu"
    order = torch.from_numpy(rng.permutation(n))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        packs = episode_packets(table, wanted, shape)
        gpu = packs.decode(order, "cuda")
        both = decode_all([(packs, order[:5]), (packs, order[5:])], "cuda")
    assert torch.equal(gpu.cpu(), cpu[order])
    assert torch.equal(torch.cat(both).cpu(), cpu[order])
    said = [str(w.message) for w in caught if "decoded on the CPU" in str(w.message)]
    assert (codec == "libsvtav1") == bool(said), said
    assert not isinstance(packs, EncodedFrames)


@pytest.mark.gpu
def test_videos_of_other_sizes_get_decoders_of_their_own(tmp_path, monkeypatch):
    """A decoder made for small frames is not handed a larger stream (NVDEC cannot
    reconfigure to it): small, then large, then small again, all on NVDEC, all exact."""
    pytest.importorskip("PyNvVideoCodec")
    from robocache.data import cameras
    from robocache.data.video_store import episode_packets, packet_table

    monkeypatch.setattr(cameras, "_warned", set())  # every fallback warns here
    rng = np.random.default_rng(0)
    for k, (h, w) in enumerate([(96, 128), (160, 192), (96, 128)]):
        path = tmp_path / f"v{k}.mp4"
        write_video(path, _clip(rng, 12, h, w), 30.0, "libx264")
        table, _, _ = packet_table(0, path, 0.0, 11 / 30, 1e-4, (h, w, 3), "cam")
        cpu = episode_packets(table, np.arange(12), (h, w, 3)).decode(torch.arange(12))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gpu = episode_packets(table, np.arange(12), (h, w, 3)).decode(torch.arange(12),
                                                                          "cuda")
        assert not [str(m.message) for m in caught if "on the CPU" in str(m.message)]
        assert torch.equal(gpu.cpu(), cpu)
