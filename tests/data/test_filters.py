"""Filters at load time: keep ranges (openpi's DROID format, from a fixture written in it, and
RoboCache's in steps or seconds) serve exactly the kept steps, each kept range windowed on
its own (windows padded at a cut, never across it); an audit report drops flagged episodes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from audit_episodes import PLANTED, RATE, SPECS, planted_episodes

from robocache.data import MixedDataset, RobotDataset
from robocache.data.audit import FLAGS, audit
from robocache.data.cache import build
from robocache.data.filters import merge_ranges
from robocache.data.formats.lerobot import write_lerobot
from robocache.errors import DataError

FIXTURES = Path(__file__).parent.parent / "fixtures" / "keep_ranges"
KEYS = ["observation.state", "action", "observation.images.cam"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("filters")
    write_lerobot(root / "src", planted_episodes(), SPECS, fps=RATE)
    build(root / "src", root / "cache", tolerance_s=0.06, progress=False, device="cpu",
          camera_codec="png")
    return root / "cache"


def _rows(cache):
    """(episode, step) -> row of the cache, straight from Lance."""
    import lance

    t = lance.dataset(str(cache / "data.lance")).to_table(
        columns=["episode_index", "step", "timestamp", "observation/state", "action",
                 "observation/state_is_pad", "action_is_pad"])
    return {(e, s): rest for e, s, *rest in zip(
        *(t.column(c).to_pylist() for c in t.column_names), strict=True)}


def _expected(path: Path) -> dict[int, list[tuple[int, int]]]:
    """openpi's semantics, written out: per listed episode the steps ``start <= k < end``
    (end moved back by metadata.filter_last_n_in_ranges); the others dropped."""
    data = json.loads(path.read_text())
    keys = json.loads((FIXTURES / "episode_keys.json").read_text())
    trim = 0
    if "keep_ranges" in data:
        trim = data["metadata"]["filter_last_n_in_ranges"]
        data = data["keep_ranges"]
    return {keys[k]: [(a, b - trim) for a, b in v] for k, v in data.items()}


def _check_windows(ds, cache, segments):
    """Every sample's window against a loop over the kept segments: rows clamp to the
    segment, padded outside it."""
    rows = _rows(cache)
    order = [(e, k) for e, rs in sorted(segments.items()) for a, b in rs for k in range(a, b)]
    seg_of = {}
    for e, rs in segments.items():
        for a, b in rs:
            for k in range(a, b):
                seg_of[(e, k)] = (a, b)
    assert len(ds) == len(order)
    idx = torch.arange(len(ds))
    batch = ds[idx]
    for i, (e, k) in enumerate(order):
        assert int(batch["episode_index"][i]) == e
        assert float(batch["timestamp"][i]) == rows[(e, k)][0]
        a, b = seg_of[(e, k)]
        for j, off in enumerate(range(-(ds.history - 1), 1)):
            src = min(max(k + off, a), b - 1)
            np.testing.assert_array_equal(batch["observation.state"][i, j].numpy(),
                                          np.float32(rows[(e, src)][1]))
            assert bool(batch["observation.state_is_pad"][i, j]) == (
                k + off < a or rows[(e, src)][3])
        for j in range(ds.horizon):
            src = min(k + j, b - 1)
            np.testing.assert_array_equal(batch["action"][i, j].numpy(),
                                          np.float32(rows[(e, src)][2]))
            assert bool(batch["action_is_pad"][i, j]) == (k + j >= b or rows[(e, src)][4])


@pytest.mark.parametrize("name", ["droid_keep_ranges.json", "droid_keep_ranges_metadata.json"])
def test_openpi_keep_ranges_serve_exactly_the_kept_frames(cache, name):
    path = FIXTURES / name
    ds = RobotDataset(cache, history=3, horizon=6, keys=KEYS, keep_ranges=path,
                      episode_keys=FIXTURES / "episode_keys.json")
    want = {e: merge_ranges((max(0, a), min(151, b)) for a, b in r)
            for e, r in _expected(path).items()}
    want = {e: r for e, r in want.items() if r}
    assert sorted(int(e) for e in ds.episode_ids) == sorted(want)
    _check_windows(ds, cache, want)
    frames = ds[torch.arange(len(ds))]["observation.images.cam"]
    assert frames.shape[:2] == (len(ds), 3)


def test_own_format_in_steps_and_seconds(cache):
    steps = {"format": "robocache-keep-ranges/1", "unit": "steps", "unlisted": "keep",
             "episodes": {"1": [[10, 20], [15, 40]], "2": [], "3": [[0, 5]]}}
    ds = RobotDataset(cache, history=2, horizon=4, keys=KEYS, keep_ranges=steps)
    segments = {e: [(0, 151 if e != 9 else 11)] for e in range(16) if e != 2}
    segments.update({1: [(10, 40)], 3: [(0, 5)]})
    _check_windows(ds, cache, segments)
    assert ds.kept_ranges == {1: [(10, 40)], 3: [(0, 5)]}
    seconds = {"format": "robocache-keep-ranges/1", "unit": "seconds",
               "episodes": {"4": [[0.4, 0.8], [2.0, 2.02]]}}
    ds = RobotDataset(cache, history=1, horizon=2, keys=KEYS, keep_ranges=seconds)
    # k / 25 in [0.4, 0.8): steps 10..19; [2.0, 2.02): step 50
    _check_windows(ds, cache, {4: [(10, 20), (50, 51)]})


def test_audit_report_drops_flagged_episodes(cache, tmp_path):
    report = audit(cache, device="cpu")
    path = tmp_path / "audit.json"
    path.write_text(json.dumps(report))
    with pytest.raises(DataError, match="no episode"):  # every episode has a planted defect
        RobotDataset(cache, keys=KEYS, audit=path)
    numeric = [f for f in FLAGS if not f.startswith("camera_")]
    ds = RobotDataset(cache, keys=KEYS, audit=path, drop_flags=numeric)
    assert sorted(ds.episode_ids.tolist()) == sorted(
        e for e in range(16) if not PLANTED.get(e, set()) & set(numeric))
    ds = RobotDataset(cache, keys=KEYS, audit=report, drop_flags=["short", "jump"])
    assert sorted(ds.episode_ids.tolist()) == sorted(set(range(16)) - {3, 9})
    both = RobotDataset(cache, keys=KEYS, audit=report, drop_flags=["jump"],
                        keep_ranges={"format": "robocache-keep-ranges/1", "episodes": {
                            "3": [[0, 10]], "5": [[0, 10]], "6": [[0, 20]]}})
    assert both.episode_ids.tolist() == [5, 6] and len(both) == 30
    mixed = MixedDataset([both, ds])
    assert len(mixed.datasets) == 2


def test_refusals(cache, tmp_path):
    with pytest.raises(DataError, match="not an episode index"):
        RobotDataset(cache, keep_ranges=FIXTURES / "droid_keep_ranges.json")
    with pytest.raises(DataError, match="keeps no step"):
        RobotDataset(cache, keep_ranges={"99": [[0, 10]]})
    with pytest.raises(DataError, match="pairs"):
        RobotDataset(cache, keep_ranges={"1": [[0, 10, 3]]})
    with pytest.raises(DataError, match="unknown keep-ranges format"):
        RobotDataset(cache, keep_ranges={"format": "other/1", "episodes": {}})
    with pytest.raises(DataError, match="not a readable JSON"):
        RobotDataset(cache, keep_ranges=tmp_path / "missing.json")
    with pytest.raises(DataError, match="pass `keep_ranges` too"):
        RobotDataset(cache, episode_keys={"a": 1})
    with pytest.raises(DataError, match="pass `audit` too"):
        RobotDataset(cache, drop_flags=["idle"])
    with pytest.raises(DataError, match="no episode"):
        RobotDataset(cache, episodes=[9], audit={"format": "robocache-audit/1", "episodes": [
            {"index": 9, "flags": ["short"]}]})


def test_openpi_ranges_need_the_source_rate(tmp_path):
    write_lerobot(tmp_path / "src", planted_episodes()[:3], SPECS, fps=RATE)
    build(tmp_path / "src", tmp_path / "cache", rate_hz=20.0, progress=False, device="cpu",
          camera_codec="png")
    with pytest.raises(DataError, match="source's frames"):
        RobotDataset(tmp_path / "cache", keep_ranges={"0": [[0, 10]]})
    ds = RobotDataset(tmp_path / "cache", keep_ranges={
        "format": "robocache-keep-ranges/1", "unit": "seconds", "episodes": {"0": [[0, 0.5]]}})
    assert len(ds) == 10  # k / 20 in [0, 0.5)


def test_merge_ranges():
    assert merge_ranges([(5, 9), (0, 3), (3, 4), (8, 12), (20, 20)]) == [(0, 4), (5, 12)]


def test_inspect_says_what_the_filters_serve(cache, tmp_path):
    from typer.testing import CliRunner

    from robocache.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["inspect", str(cache), "--json", "--keep-ranges",
                              str(FIXTURES / "droid_keep_ranges.json"), "--episode-keys",
                              str(FIXTURES / "episode_keys.json")])
    assert res.exit_code == 0, res.output
    ds = RobotDataset(cache, keys=KEYS, keep_ranges=FIXTURES / "droid_keep_ranges.json",
                      episode_keys=FIXTURES / "episode_keys.json")
    f = json.loads(res.output)["filter"]
    assert (f["episodes"], f["steps"], f["segments"]) == (len(ds.episode_ids), len(ds),
                                                           len(ds.offsets) - 1)
    report = tmp_path / "audit.json"
    report.write_text(json.dumps(audit(cache, device="cpu")))
    res = runner.invoke(app, ["inspect", str(cache), "--audit", str(report), "--drop-flag",
                              "short"])
    assert res.exit_code == 0 and "15 of 16 episodes" in res.output, res.output
    res = runner.invoke(app, ["inspect", str(cache), "--drop-flag", "short"])
    assert res.exit_code == 2 and "--audit" in res.output
    res = runner.invoke(app, ["inspect", str(cache), "--keep-ranges",
                              str(FIXTURES / "droid_keep_ranges.json")])
    assert res.exit_code == 2 and "--episode-keys" in res.output


def _open_in_child(cache, ranges, out):
    ds = RobotDataset(cache, keys=["action"], keep_ranges=ranges)
    out.put((len(ds), str(ds.served.path)))


def test_a_process_forked_after_lance_opens_the_same_filtered_index(cache):
    """A dataset made in a process forked after Lance ran goes through the reader process:
    the keep ranges go with the request (the same served index, not the unfiltered one)."""
    import multiprocessing as mp

    ranges = {"format": "robocache-keep-ranges/1", "unlisted": "keep",
              "episodes": {"1": [[10, 20], [30, 40]]}}
    ds = RobotDataset(cache, keys=["action"], keep_ranges=ranges)
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_open_in_child, args=(cache, ranges, out))
    child.start()
    got = out.get(timeout=120)
    child.join(timeout=60)
    assert got == (len(ds), str(ds.served.path)) and child.exitcode == 0
