"""robocache.data.mp4: an MP4's video samples read from its boxes, against PyAV's demuxer."""

from __future__ import annotations

import numpy as np
import pytest

av = pytest.importorskip("av")

from robocache.data.mp4 import video_track  # noqa: E402


def _encode(path, codec: str, n: int = 24, options=None, audio: bool = False,
            container_options=None, fmt=None, fresh: bool = False):
    """``n`` frames of moving noise (48x64) encoded by ``codec`` into ``path``; ``fresh``:
    new noise every frame (every frame coded as a keyframe, B-frames configured)."""
    rng = np.random.default_rng(0)
    base = rng.integers(0, 256, (48, 128 if not fresh else 64 + n, 3), dtype=np.uint8)
    with av.open(str(path), "w", format=fmt, options=container_options or {}) as c:
        s = c.add_stream(codec, rate=30, options=options or {})
        s.width, s.height, s.pix_fmt = 64, 48, "yuv420p"
        a = c.add_stream("aac", rate=8000) if audio else None
        for i in range(n):
            pixels = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) if fresh else \
                base[:, i:i + 64]
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(pixels), "rgb24")
            for p in s.encode(frame):
                c.mux(p)
            if a is not None:
                samples = np.zeros((1, 266), np.float32)
                af = av.AudioFrame.from_ndarray(samples, format="fltp", layout="mono")
                af.sample_rate, af.pts = 8000, i * 266
                for p in a.encode(af):
                    c.mux(p)
        for p in s.encode():
            c.mux(p)
        if a is not None:
            for p in a.encode():
                c.mux(p)
    return path


def _demuxed(path):
    """PyAV's packets of the first video stream: pts, dts, keyframe flags, bytes."""
    with av.open(str(path)) as c:
        s = c.streams.video[0]
        got = [(p.pts, p.dts, p.is_keyframe, bytes(p)) for p in c.demux(s) if p.size]
    pts, dts, key, data = zip(*got, strict=True)
    return np.array(pts), np.array(dts), np.array(key), list(data), s.time_base


CASES = {
    "h264": ("libx264", {"g": "2", "bf": "0"}),
    # keyframes whose decode time is the next one's display time (an edit list shifts both)
    "h264-fresh": ("libx264", {"g": "2"}),
    "h264-bframes": ("libx264", {"g": "12", "bf": "2"}),
    "hevc": ("libx265", {"x265-params": "log-level=none:keyint=6:bframes=2:open-gop=0"}),
    "av1": ("libsvtav1", {"g": "2"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_samples_equal_pyav_demux(tmp_path, case):
    codec, options = CASES[case]
    if codec not in av.codecs_available:
        pytest.skip(f"PyAV's FFmpeg lacks {codec}")
    path = _encode(tmp_path / "v.mp4", codec, options=options, fresh=case.endswith("fresh"))
    pts, dts, key, data, tb = _demuxed(path)
    t = video_track(path)
    assert t is not None and t.timescale == tb.denominator and tb.numerator == 1
    np.testing.assert_array_equal(t.pts, pts)
    np.testing.assert_array_equal(t.dts, dts)
    np.testing.assert_array_equal(t.key, key)
    picked = np.array([5, 0, 3, len(pts) - 1])
    buf, starts = t.read(path, picked)
    assert [bytes(buf[starts[i]:starts[i + 1]]) for i in range(len(picked))] == \
        [data[i] for i in picked]


def test_interleaved_audio_samples_gathered(tmp_path):
    """Video samples between audio chunks: each read lands on its own bytes."""
    if "aac" not in av.codecs_available:
        pytest.skip("PyAV's FFmpeg lacks aac")
    path = _encode(tmp_path / "va.mp4", "libx264", options={"g": "2"}, audio=True)
    pts, _, _, data, _ = _demuxed(path)
    t = video_track(path)
    assert t is not None
    np.testing.assert_array_equal(t.pts, pts)
    index = np.arange(len(pts))
    buf, starts = t.read(path, index)
    assert [bytes(buf[starts[i]:starts[i + 1]]) for i in index] == data


def test_fragmented_and_other_containers_left_to_pyav(tmp_path):
    frag = _encode(tmp_path / "f.mp4", "libx264", options={"g": "2"},
                   container_options={"movflags": "frag_keyframe+empty_moov"})
    mkv = _encode(tmp_path / "v.mkv", "libx264", options={"g": "2"})
    assert video_track(frag) is None
    assert video_track(mkv) is None
    assert video_track(tmp_path / "missing.mp4") is None
    (tmp_path / "junk.mp4").write_bytes(b"\x00\x00\x00\x10moov" + b"\xff" * 8)
    assert video_track(tmp_path / "junk.mp4") is None


def test_truncated_file_raises_on_read(tmp_path):
    path = _encode(tmp_path / "v.mp4", "libx264", options={"g": "2"},
                   container_options={"movflags": "faststart"})  # moov before the samples
    raw = path.read_bytes()
    mdat = raw.find(b"mdat") - 4
    assert raw.find(b"moov") < mdat
    cut = tmp_path / "cut.mp4"  # the moov kept, the samples' bytes cut short
    cut.write_bytes(raw[:mdat + 16])
    t = video_track(cut)
    with pytest.raises(OSError, match="truncated"):
        t.read(cut, np.arange(len(t.pts)))


@pytest.mark.parametrize("case", ["h264", "h264-fresh", "h264-bframes", "av1"])
def test_packet_tables_from_the_sample_table_equal_pyavs(tmp_path, monkeypatch, case):
    """Every span of whole GOPs, and spans that are not, give the same table (or the same
    refusal) from the sample table as from PyAV's demuxer."""
    import pyarrow as pa

    from robocache.data import video_store
    from robocache.errors import DataError

    codec, options = CASES[case]
    if codec not in av.codecs_available:
        pytest.skip(f"PyAV's FFmpeg lacks {codec}")
    path = _encode(tmp_path / "v.mp4", codec, n=36, options=options,
                   fresh=case.endswith("fresh"))
    with av.open(str(path)) as c:  # the sample table is the one used
        assert video_store._indexed(path, c, c.streams.video[0]) is not None
    pts, _, key, _, tb = _demuxed(path)
    starts = sorted(float(p * tb) for p in pts[key])
    spans = [(a, b - 1 / 30) for a, b in zip(starts, starts[1:] + [36 / 30], strict=True)]
    spans += [(starts[0], 35 / 30), (starts[1], 35 / 30), (1 / 30, 20 / 30), (0.0, 20 / 30)]

    def table(mp4: bool, a: float, b: float):
        monkeypatch.setattr(video_store, "MP4_INDEX", mp4)
        try:
            got, t, index = video_store.packet_table(0, path, a, b, 1e-4, (48, 64, 3), "cam")
        except DataError as e:
            return str(e)
        return got, list(t), list(index)

    kept = 0
    for a, b in spans:
        fast, slow = table(True, a, b), table(False, a, b)
        if isinstance(slow, str):
            assert fast == slow
            continue
        kept += 1
        assert fast[1:] == slow[1:]
        assert isinstance(fast[0], pa.Table) and fast[0].equals(slow[0]), (a, b)
    assert kept >= 2


def test_keyframe_check_from_the_sample_table_equals_pyavs_seeks(tmp_path, monkeypatch):
    """The check of where episodes start gives the same answer from the sample table as from
    PyAV's seeks: starts on keyframes pass, one inside a group of pictures is named."""
    from types import SimpleNamespace

    from robocache.data import video_store
    from robocache.data.build.encode import keyframe_starts

    path = _encode(tmp_path / "v.mp4", "libx264", n=36, options={"g": "4", "bf": "2"})
    pts, _, key, _, tb = _demuxed(path)
    keys = sorted(float(p * tb) for p in pts[key])
    cases = {"keyframes": keys, "one inside": keys[:2] + [keys[2] + 1 / 30]}
    for mp4 in (True, False):
        monkeypatch.setattr(video_store, "MP4_INDEX", mp4)
        got = {name: keyframe_starts([(e, SimpleNamespace(path=path, from_timestamp=t))
                                      for e, t in enumerate(starts)])
               for name, starts in cases.items()}
        assert got["keyframes"] is None
        assert got["one inside"] is not None and got["one inside"].startswith("episode 2 ")
