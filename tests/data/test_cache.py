"""Cache build: aligned values, stats, quarantine with reconciled counts, resume after a kill."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from data_episodes import SPECS, make_episode

from robocache.data.cache import build, column_name
from robocache.data.formats.lerobot import write_lerobot
from robocache.errors import DataError

RATE = 40.0


def load(dest: Path) -> dict[int, dict]:
    table = lance.dataset(str(dest / "data.lance")).to_table()
    out = {}
    for ep in np.unique(table.column("episode_index").to_numpy()):
        rows = table.filter(pa.compute.equal(table.column("episode_index"), ep))
        out[int(ep)] = {c: rows.column(c).to_pylist() for c in rows.column_names}
    return out


def test_aligned_values_match_numpy(tmp_path, episodes):
    write_lerobot(tmp_path / "src", episodes, SPECS, fps=25.0, version="v3.0")
    manifest = build(tmp_path / "src", tmp_path / "cache", rate_hz=RATE, progress=False,
                     device="cpu")
    assert manifest["counts"] == {"read": 5, "cached": 5, "quarantined": 0, "skipped": 0,
                                  "new": 5, "rows": manifest["counts"]["rows"]}
    cached = load(tmp_path / "cache")
    for ep in episodes:
        rows = cached[ep.index]
        t = np.asarray(rows["timestamp"])
        # float32 timestamps at rest in LeRobot
        times = {k: s.times.astype(np.float32).astype(np.float64) for k, s in ep.streams.items()}
        start = max(times[k][0] for k in ("observation.state", "action", "observation.pose"))
        end = min(times[k][-1] for k in ("observation.state", "action", "observation.pose"))
        np.testing.assert_allclose(t, start + np.arange(len(t)) / RATE, atol=1e-7)
        assert t[-1] <= end + 1e-9 and t[-1] + 1 / RATE > end - 1e-6
        assert rows["step"] == list(range(len(t)))
        for name in ("observation.state", "observation.pose"):
            got = np.asarray(rows[column_name(name)])
            want = np.stack([np.interp(t, times[name], ep.streams[name].data[:, d])
                             for d in range(SPECS[name].dim)], 1)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
            assert not any(rows[f"{column_name(name)}_is_pad"])
        cam = column_name("observation.images.cam")
        frame = np.asarray(rows[f"{cam}/frame"])
        tc = times["observation.images.cam"]
        nearest = np.abs(t[:, None] - tc[None]).argmin(1)
        inside = (t >= tc[0]) & (t <= tc[-1])
        np.testing.assert_array_equal(frame[inside], nearest[inside])
        np.testing.assert_allclose(np.asarray(rows[f"{cam}/offset"])[inside],
                                   (tc[nearest] - t)[inside], atol=1e-6)
        note = column_name("language.note")
        te = times["language.note"]
        last = np.searchsorted(te, t, side="right") - 1
        want = [None if i < 0 else ep.streams["language.note"].data[i] for i in last]
        assert rows[note] == want
        assert rows[f"{note}_is_pad"] == [i < 0 for i in last]
        assert rows["task"][0] == ep.meta["tasks"][0]
    stats = json.loads((tmp_path / "cache" / "stats.json").read_text())
    allrows = np.concatenate([np.asarray(cached[i][column_name("action")]) for i in cached])
    np.testing.assert_allclose(stats["action"]["mean"], allrows.mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(stats["action"]["std"], allrows.std(0), rtol=1e-4)
    np.testing.assert_allclose(stats["action"]["q01"], np.quantile(allrows, 0.01, 0), rtol=1e-5)
    np.testing.assert_allclose(stats["action"]["max"], allrows.max(0))
    frames = lance.dataset(str(tmp_path / "cache" / "frames" /
                               "observation.images.cam.lance")).to_table()
    assert frames.num_rows == sum(len(e.streams["observation.images.cam"]) for e in episodes)


def corrupt(root: Path, index: int, defect: str) -> None:
    """Break one v2.1 episode file in place."""
    path = root / f"data/chunk-000/episode_{index:06d}.parquet"
    if defect == "truncated":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        return
    table = pq.read_table(path)
    if defect == "missing_key":
        table = table.drop_columns(["observation.pose"])
    elif defect in ("nan_timestamp", "non_monotonic"):
        ts = table.column("timestamp").to_numpy().copy()
        if defect == "nan_timestamp":
            ts[3] = np.nan
        else:
            ts[[2, 5]] = ts[[5, 2]]
        table = table.set_column(table.column_names.index("timestamp"), "timestamp",
                                 pa.array(ts))
    elif defect == "shape":
        rows = [None if r is None else r + r for r in table.column("action").to_pylist()]
        table = table.set_column(table.column_names.index("action"), "action",
                                 pa.array(rows, pa.list_(pa.float32())))
    pq.write_table(table, path)


def test_quarantine_reconciles(tmp_path, rng):
    defects = {1: "missing_key", 2: "nan_timestamp", 4: "non_monotonic", 5: "shape",
               7: "truncated"}
    eps = [make_episode(i, rng) for i in range(9)]
    write_lerobot(tmp_path / "src", eps, SPECS, fps=25.0, version="v2.1")
    for index, defect in defects.items():
        corrupt(tmp_path / "src", index, defect)
    m = build(tmp_path / "src", tmp_path / "cache", rate_hz=RATE, progress=False, device="cpu")
    c = m["counts"]
    assert c["read"] == 9 == c["cached"] + c["quarantined"]
    assert c["quarantined"] == len(defects)
    assert {q["index"] for q in m["quarantined"]} == set(defects)
    reasons = {q["index"]: q["reason"] for q in m["quarantined"]}
    assert "observation.pose" in reasons[1] and "missing" in reasons[1]
    assert "NaN" in reasons[2]
    assert "decrease" in reasons[4]
    assert "shape" in reasons[5] or "values in" in reasons[5]
    assert reasons[7]  # pyarrow's message for the truncated file
    assert sorted(load(tmp_path / "cache")) == [0, 3, 6, 8]
    assert json.loads((tmp_path / "cache" / "manifest.json").read_text())["quarantined"] == \
        m["quarantined"]


def test_rerun_is_idempotent_and_config_is_checked(tmp_path, episodes):
    write_lerobot(tmp_path / "src", episodes, SPECS, fps=25.0)
    build(tmp_path / "src", tmp_path / "cache", rate_hz=RATE, progress=False, episodes=[0, 2])
    first = load(tmp_path / "cache")
    m = build(tmp_path / "src", tmp_path / "cache", rate_hz=RATE, progress=False)
    assert (m["counts"]["skipped"], m["counts"]["new"], m["counts"]["cached"]) == (2, 3, 5)
    again = build(tmp_path / "src", tmp_path / "cache", rate_hz=RATE, progress=False)
    assert (again["counts"]["skipped"], again["counts"]["new"]) == (5, 0)
    final = load(tmp_path / "cache")
    assert final[0] == first[0] and final[2] == first[2]
    assert again["counts"]["rows"] == sum(len(v["step"]) for v in final.values())
    with pytest.raises(DataError, match="different rate_hz"):
        build(tmp_path / "src", tmp_path / "cache", rate_hz=10.0, progress=False)
    m = build(tmp_path / "src", tmp_path / "cache", rate_hz=10.0, progress=False,
              overwrite=True)
    assert m["counts"]["new"] == 5
    with pytest.raises(DataError, match="`keys`"):
        build(tmp_path / "src", tmp_path / "c2", keys=["nope"], progress=False)
    with pytest.raises(DataError, match="rate_hz"):
        build(tmp_path / "src", tmp_path / "c3", rate_hz=0.0, progress=False)


SLOW_BUILD = """
import sys, time
from robocache.data.cache import build
from robocache.data.formats import open_source
src = open_source(sys.argv[1])
read = src.read
def slow(i):
    time.sleep(0.05)
    return read(i)
src.read = slow
build(src, sys.argv[2], rate_hz=40.0, progress=False, device="cpu")
"""


def test_kill_and_resume(tmp_path, rng):
    eps = [make_episode(i, rng, duration=1.0) for i in range(40)]
    write_lerobot(tmp_path / "src", eps, SPECS, fps=25.0, version="v3.0")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", SLOW_BUILD, str(tmp_path / "src"),
                             str(tmp_path / "cache")], env=env)
    versions = tmp_path / "cache" / "data.lance" / "_versions"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if versions.exists() and len(list(versions.glob("*.manifest"))) >= 3:
            break
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    partial = set(load(tmp_path / "cache")) if versions.exists() else set()
    assert 0 < len(partial) < 40, "the kill should land mid-run"
    m = build(tmp_path / "src", tmp_path / "cache", rate_hz=RATE, progress=False, device="cpu")
    assert m["counts"]["skipped"] == len(partial)
    assert m["counts"]["cached"] == 40 and m["counts"]["quarantined"] == 0
    resumed = load(tmp_path / "cache")
    build(tmp_path / "src", tmp_path / "clean", rate_hz=RATE, progress=False, device="cpu")
    clean = load(tmp_path / "clean")
    assert sorted(resumed) == list(range(40))
    for i in range(40):  # no duplicate and no missing step
        assert resumed[i]["step"] == clean[i]["step"]
        np.testing.assert_array_equal(resumed[i]["action"], clean[i]["action"])
    frames = lance.dataset(str(tmp_path / "cache" / "frames" /
                               "observation.images.cam.lance")).to_table()
    assert frames.num_rows == sum(len(e.streams["observation.images.cam"]) for e in eps)


def test_what_a_cache_owns_never_leads_outside_it(tmp_path):
    from robocache.data.owned import owned

    cache = tmp_path / "cache"
    (cache / "data.lance").mkdir(parents=True)
    (tmp_path / "outside.txt").write_text("not the cache's")
    (cache / "manifest.json").write_text(json.dumps({
        "format": "robocache-cache/1", "stats_path": "../outside.txt",
        "streams": {"../../x": {"kind": "image"}, "cam": {"kind": "video"}}}))
    (cache / "frames" / "cam.lance").mkdir(parents=True)
    (cache / "frames" / "mine.txt").write_text("keep")
    assert sorted(p.relative_to(cache).as_posix() for p in owned(cache)) == \
        ["data.lance", "frames/cam.lance", "manifest.json"]
