"""The native-rate cache: every source frame stored bit-exactly, in its own dtype, none dropped;
off-grid timestamps quarantined; previous/nearest exact at grid instants."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import lance
import numpy as np
import pytest

from robocache.data.cache import build, column_name
from robocache.data.episode import Episode, Stream, StreamSpec
from robocache.data.formats import open_source
from robocache.data.formats.lerobot import write_lerobot
from robocache.errors import DataError

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "tests" / "fixtures" / "lerobot" / "tiny"
SAMPLE = ROOT / "data" / "sample" / "panda_multirate"
SPECS = {
    "observation.state": StreamSpec("observation.state", "numeric", "float32", (3,), 30.0),
    "mode": StreamSpec("mode", "numeric", "int64", (1,), 30.0),
    "contact": StreamSpec("contact", "numeric", "bool", (2,), 30.0),
}


def episode(index: int, n: int, rng, times: np.ndarray | None = None) -> Episode:
    # float32 timestamps as LeRobot writes them: 258 * (1/30) in float32 is 8.6333332
    t = np.arange(n, dtype=np.float64) / 30 if times is None else times
    t = t.astype(np.float32).astype(np.float64)
    data = {"observation.state": rng.normal(size=(n, 3)).astype(np.float32),
            "mode": rng.integers(-2**40, 2**40, (n, 1)),
            "contact": rng.integers(0, 2, (n, 2)).astype(bool)}
    return Episode(index, {k: Stream(SPECS[k], t, v) for k, v in data.items()},
                   {"tasks": [f"task {index % 2}"]})


def cached_rows(dest: Path) -> dict:
    table = lance.dataset(str(dest / "data.lance")).to_table()
    order = np.lexsort((table.column("step").to_numpy(), table.column("episode_index").to_numpy()))
    return {c: table.column(c).combine_chunks().take(order) for c in table.column_names}


def assert_native_exact(source: Path, dest: Path) -> int:
    """Every frame of every stream at the source's fps is in the cache, bit for bit."""
    src = open_source(source)
    rows = cached_rows(dest)
    ep = rows["episode_index"].to_numpy()
    compared = 0
    for e in src.episode_indices():
        episode = src.read(e)
        sel = np.flatnonzero(ep == e)
        for name, spec in src.specs.items():
            if spec.kind != "numeric" or spec.rate_hz != src.fps:
                continue
            want = episode.streams[name].data.reshape(len(episode.streams[name]), -1)
            col = rows[column_name(name)].take(sel)
            got = col.flatten().to_numpy(zero_copy_only=False).reshape(len(sel), -1)
            assert got.dtype == want.dtype, name
            assert got.shape == want.shape, (e, name)
            assert np.array_equal(got.view(np.uint8), want.view(np.uint8)), (e, name)
            assert not rows[f"{column_name(name)}_is_pad"].take(sel).to_numpy(
                zero_copy_only=False).any()
            compared += want.size
    return compared


def test_native_rate_keeps_every_frame_bit_exact(tmp_path, rng):
    eps = [episode(i, n, rng) for i, n in enumerate((259, 7, 1, 32))]
    write_lerobot(tmp_path / "src", eps, SPECS, fps=30.0)
    m = build(tmp_path / "src", tmp_path / "cache", progress=False, device="cpu")
    assert m["rate_hz"] == 30.0 and m["native"]
    assert m["counts"]["rows"] == 259 + 7 + 1 + 32
    assert assert_native_exact(tmp_path / "src", tmp_path / "cache") > 0
    manifest = json.loads((tmp_path / "cache" / "manifest.json").read_text())
    assert manifest["streams"]["mode"]["dtype"] == "int64"


@pytest.mark.parametrize("source", [TINY, SAMPLE], ids=["lerobot-tiny", "sample"])
def test_bundled_datasets_round_trip_at_native_rate(tmp_path, source):
    build(source, tmp_path / "cache", progress=False, device="cpu")
    assert assert_native_exact(source, tmp_path / "cache") > 0


@pytest.mark.parametrize("method", ["previous", "nearest", "linear"])
def test_explicit_rate_equal_to_source_is_exact(tmp_path, rng, method):
    """At 30 Hz given explicitly (resampled), float32 timestamps 1 ulp off the grid snap onto
    it: previous/nearest return the sample at the instant, never a neighbour, and the last
    frame of a 259-frame episode is kept."""
    eps = [episode(i, n, rng) for i, n in enumerate((259, 31))]
    write_lerobot(tmp_path / "src", eps, SPECS, fps=30.0)
    build(tmp_path / "src", tmp_path / "cache", rate_hz=30.0, progress=False, device="cpu",
          methods={"observation.state": method, "mode": "nearest"})
    assert assert_native_exact(tmp_path / "src", tmp_path / "cache") > 0


def test_off_grid_timestamp_quarantines_with_row_and_offset(tmp_path, rng):
    t = np.arange(20) / 30
    t[7] += 0.003
    eps = [episode(0, 20, rng), episode(1, 20, rng, t)]
    write_lerobot(tmp_path / "src", eps, SPECS, fps=30.0)
    m = build(tmp_path / "src", tmp_path / "cache", progress=False, device="cpu")
    assert m["counts"]["cached"] == 1 and m["counts"]["quarantined"] == 1
    reason = m["quarantined"][0]["reason"]
    assert "row 7" in reason and "+3.0" in reason and "tolerance_s" in reason
    # a looser tolerance accepts it (and snaps the frame onto its step)
    m = build(tmp_path / "src", tmp_path / "c2", progress=False, device="cpu",
              grid_tolerance_s=0.01)
    assert m["counts"]["cached"] == 2


def test_bad_fps_and_tolerance(tmp_path, rng):
    write_lerobot(tmp_path / "src", [episode(0, 5, rng)], SPECS, fps=30.0)
    with pytest.raises(DataError, match="grid_tolerance_s"):
        build(tmp_path / "src", tmp_path / "c", progress=False, grid_tolerance_s=0.0)
    for fps in (None, 0, -30):
        bad = with_fps(tmp_path / "src", tmp_path / f"bad{fps}", fps)
        with pytest.raises(DataError, match="meta/info.json"):
            build(bad, tmp_path / f"c{fps}", progress=False)



def test_explicit_rate_cache_is_not_resumed_as_native(tmp_path, rng):
    write_lerobot(tmp_path / "src", [episode(0, 5, rng)], SPECS, fps=30.0)
    build(tmp_path / "src", tmp_path / "c", rate_hz=30.0, progress=False, device="cpu")
    with pytest.raises(DataError, match="different native"):  # same rate_hz, not native
        build(tmp_path / "src", tmp_path / "c", progress=False, device="cpu")
    m = build(tmp_path / "src", tmp_path / "c", progress=False, device="cpu", overwrite=True)
    assert m["native"] is True and m["rate_hz"] == 30.0

def with_fps(source: Path, dest: Path, fps) -> Path:
    """A copy of the LeRobot dataset ``source`` whose info.json has ``fps`` (None: none)."""
    shutil.copytree(source, dest)
    info = json.loads((dest / "meta" / "info.json").read_text())
    info.pop("fps") if fps is None else info.update(fps=fps)
    (dest / "meta" / "info.json").write_text(json.dumps(info))
    return dest
