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
from helpers import assert_quantiles_within_bin, assert_same_stats

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
    assert_quantiles_within_bin(stats["action"], allrows)
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
build(src, sys.argv[2], rate_hz=40.0, progress=False, device="cpu", batch_rows=100)
"""


def version(uri) -> int:
    """The latest committed version of the Lance dataset at ``uri`` (0: none yet)."""
    try:
        return lance.dataset(str(uri)).version
    except (OSError, ValueError):
        return 0


def test_kill_and_resume(tmp_path, rng):
    eps = [make_episode(i, rng, duration=1.0) for i in range(40)]
    write_lerobot(tmp_path / "src", eps, SPECS, fps=25.0, version="v3.0")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", SLOW_BUILD, str(tmp_path / "src"),
                             str(tmp_path / "cache")], env=env)
    versions = tmp_path / "cache" / "data.lance" / "_versions"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if versions.exists() and version(tmp_path / "cache" / "data.lance") >= 3:
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


def test_batches_bound_fragments_and_versions_and_keep_a_readers_files(tmp_path, rng):
    """Many episodes per fragment; old versions removed as the build goes; a reader holding
    the version of a complete cache reads on while a later build of more episodes commits,
    compacts and removes versions."""
    eps = [make_episode(i, rng, duration=1.0) for i in range(30)]
    write_lerobot(tmp_path / "src", eps, SPECS, fps=25.0, version="v3.0")
    dest = tmp_path / "cache"
    first = build(tmp_path / "src", dest, rate_hz=RATE, progress=False, device="cpu",
                  episodes=list(range(10)))
    held = {rel: lance.dataset(str(dest / rel)) for rel in
            ("data.lance", "frames/observation.images.cam.lance")}
    before = {rel: ds.to_table() for rel, ds in held.items()}
    # ~40 rows an episode: a batch of 3 episodes, 7 commits, small fragments compacted
    m = build(tmp_path / "src", dest, rate_hz=RATE, progress=False, device="cpu",
              batch_rows=100)
    assert first["counts"]["cached"] == 10 and m["counts"]["cached"] == 30
    for rel, ds in held.items():
        assert ds.to_table().equals(before[rel]), rel
    data = lance.dataset(str(dest / "data.lance"))
    assert len(data.versions()) == 1  # the others removed at the end
    # the first build's fragment stays as it was; this build's batches are at most 7
    assert len(data.get_fragments()) <= 1 + 7
    assert sorted(load(dest)) == list(range(30))
    clean = build(tmp_path / "src", tmp_path / "clean", rate_hz=RATE, progress=False,
                  device="cpu")
    assert clean["counts"]["cached"] == 30
    assert len(lance.dataset(str(tmp_path / "clean" / "data.lance")).get_fragments()) == 1
    got, want = load(dest), load(tmp_path / "clean")
    for i in range(30):
        assert got[i] == want[i]


def test_processes_build_the_same_cache_as_threads(tmp_path, rng):
    eps = [make_episode(i, rng, duration=1.0) for i in range(12)]
    eps[5].streams["action"].times[3] = np.nan  # quarantined in a worker process
    write_lerobot(tmp_path / "src", eps, SPECS, fps=25.0, version="v3.0")
    a = build(tmp_path / "src", tmp_path / "threads", rate_hz=RATE, progress=False,
              device="cpu", decode_processes=False)
    b = build(tmp_path / "src", tmp_path / "procs", rate_hz=RATE, progress=False,
              device="cpu", decode_processes=True, decode_workers=2, batch_rows=100)
    assert a["counts"] == b["counts"] and a["quarantined"] == b["quarantined"]
    assert a["episodes"] == b["episodes"] and a["counts"]["quarantined"] == 1
    # the source's record: digests of episodes read in a worker process too
    assert a["episode_digests"] == b["episode_digests"] and len(a["episode_digests"]) == 11
    for rel in ("data.lance", "frames/observation.images.cam.lance"):
        ta, tb = (lance.dataset(str(tmp_path / d / rel)).to_table() for d in ("threads", "procs"))
        assert ta.equals(tb), rel
    assert_same_stats(*(json.loads((tmp_path / d / "stats.json").read_text())
                        for d in ("threads", "procs")))


def test_a_fresh_build_in_processes_tallies_its_rows_instead_of_reading_them_again(
        tmp_path, rng, monkeypatch):
    from robocache.data.build import run, stats

    eps = [make_episode(i, rng, duration=1.0 + 0.25 * (i % 3)) for i in range(9)]
    eps[4].streams["action"].times[2] = np.nan  # quarantined in a worker process
    write_lerobot(tmp_path / "src", eps, SPECS, fps=25.0, version="v3.0")
    passes = []

    def counted(name):
        def read_again(*a, **k):
            passes.append(name)
            return getattr(stats, name)(*a, **k)
        return read_again

    for name in ("_compute_stats", "_episode_summary"):
        monkeypatch.setattr(run, name, counted(name))
    opts = dict(rate_hz=RATE, progress=False, device="cpu", decode_processes=True,
                decode_workers=2, batch_rows=60)
    m = build(tmp_path / "src", tmp_path / "c", **opts, episodes=list(range(6)))
    assert passes == [] and m["counts"]["cached"] == 5  # the workers' tallies
    uri = tmp_path / "c" / "data.lance"
    specs = {n: s for n, s in SPECS.items() if n in m["streams"]}
    assert m["episodes"] == stats._episode_summary(uri)
    assert_same_stats(json.loads((tmp_path / "c" / "stats.json").read_text()),
                      stats._compute_stats(uri, specs))
    m = build(tmp_path / "src", tmp_path / "c", **opts)  # resumed: rows no tally counted
    assert sorted(passes) == ["_compute_stats", "_episode_summary"]
    assert m["counts"]["cached"] == 8 and m["episodes"] == stats._episode_summary(uri)


def test_episode_digests_new_and_earlier_caches(rng):
    from robocache.data.source_identity import episode_digest, same_digest

    ep = make_episode(3, rng, duration=1.0)
    new, old = episode_digest(ep), episode_digest(ep, "blake2b")
    assert new.startswith("sha256:") and len(new) == 7 + 32 and len(old) == 32 and ":" not in old
    assert same_digest(new, ep) and same_digest(old, ep)  # an earlier cache's BLAKE2b too
    ep.streams["action"].times[2] += 1e-6  # one timestamp moved
    assert not same_digest(new, ep) and not same_digest(old, ep) and not same_digest(None, ep)


def test_the_digest_hashes_per_frame_tasks_as_their_list_repr():
    from robocache.data.source_identity import _list_repr

    one = "pick the cube"
    for values in ([one] * 700, np.array([one] * 9, dtype=object), [one, "place", one],
                   [one, np.str_(one)], np.array(["a", "a"]), [], ["it's", "it's"]):
        assert _list_repr(values) == repr(list(values)).encode()


@pytest.mark.parametrize("shuffled", [False, True])
def test_episode_summary_equals_a_sort_of_every_row(tmp_path, rng, shuffled):
    from robocache.data.build.stats import _episode_summary

    rows = [(e, 0.5 * e + 0.02 * k, f"task {e % 3}") for e in range(40)
            for k in range(int(rng.integers(1, 30)))]
    if shuffled:  # a resumed or merged cache: episodes out of order, steps too
        rows = [rows[i] for i in rng.permutation(len(rows))]
    table = pa.table({"episode_index": [r[0] for r in rows], "timestamp": [r[1] for r in rows],
                      "task": [r[2] for r in rows]})
    lance.write_dataset(table, str(tmp_path / "data.lance"), max_rows_per_file=100)
    want = []
    for e in sorted({r[0] for r in rows}):
        ts = sorted(r[1] for r in rows if r[0] == e)
        want.append({"index": e, "rows": len(ts), "start_s": ts[0],
                     "duration_s": ts[-1] - ts[0], "task": f"task {e % 3}"})
    assert _episode_summary(tmp_path / "data.lance") == want


@pytest.mark.parametrize("episodes,per_file,workers", [(62000, 500, 64), (5000, 500, 2),
                                                        (777, 100, 8), (40000, 1000, 64),
                                                        (500, 500, 64), (6, 1, 2)])
def test_worker_tasks_keep_a_files_episodes_together(episodes, per_file, workers):
    from robocache.data.build.read import CHUNK, FILE_EPISODES, chunks

    indices = list(range(100, 100 + episodes))
    keys = [f"file-{(i - 100) // per_file}" for i in indices]
    tasks = chunks(indices, keys, workers)
    assert [i for t in tasks for i in t] == indices  # every episode once, in order
    # a file read by one task when it fits one (and each worker has work), else by few
    files = {k: {n for n, t in enumerate(tasks) for i in t if keys[i - 100] == k}
             for k in set(keys)}
    whole = per_file <= min(FILE_EPISODES, episodes // workers)
    assert all(len(f) == 1 for f in files.values()) or not whole
    assert len(tasks) >= min(workers, episodes // CHUNK[0])  # the cores get work
    assert max(map(len, tasks)) <= max(FILE_EPISODES, CHUNK[1])
    # no file: tasks of a quarter of each worker's share, within CHUNK
    plain = chunks(indices, None, workers)
    size = min(max(episodes // (4 * workers), CHUNK[0]), CHUNK[1])
    assert [i for t in plain for i in t] == indices
    assert all(len(t) == size for t in plain[:-1])


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("rate", [RATE, "native"])
def test_align_batch_equals_each_episode_alone(rng, rate, device):
    from robocache.data.build.align import align_batch
    from robocache.data.cache import CacheConfig, align_episode
    from robocache.data.episode import Stream

    eps = [make_episode(i, rng) for i in range(6)]
    note = eps[2].streams["language.note"]  # an episode without events
    eps[2].streams["language.note"] = Stream(note.spec, note.times[:0], note.data[:0])
    a = eps[4].streams["action"]  # no overlap (native: off the grid): quarantined alone
    eps[4].streams["action"] = Stream(a.spec, a.times + 100.013, a.data)
    config = CacheConfig(rate_hz=rate)
    fps = 25.0 if rate == "native" else None
    batched = align_batch(eps, SPECS, config, device, fps)
    for ep, got in zip(eps, batched, strict=True):
        if ep.index == 4:
            assert isinstance(got, DataError)
            with pytest.raises(DataError, match="overlap" if rate != "native" else "grid"):
                align_episode(ep, SPECS, config, device, fps)
            continue
        want = align_episode(ep, SPECS, config, device, fps)
        assert got.keys() == want.keys()
        for k in want:
            assert np.array_equal(got[k], want[k]) or (
                want[k].dtype.kind == "f" and np.array_equal(got[k], want[k], equal_nan=True)), k


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


def _snap_one(times, t, tol, all_or_none):
    """The snapping rule written plainly for one stream (nearest grid instant by distance,
    ties to the earlier one; moved when within ``tol``)."""
    if len(t) == 0 or len(times) == 0:
        return times
    out = np.array(times, dtype=np.float64)
    close = np.zeros(len(times), bool)
    for i, x in enumerate(times):
        d = np.abs(t - x)
        k = int(np.argmin(d))  # first of the equally near: the earlier instant
        if d[k] <= tol:
            out[i], close[i] = t[k], True
    return times if all_or_none and not close.all() else out


@pytest.mark.parametrize("all_or_none", [False, True])
def test_snap_many_equals_each_stream_snapped_alone(all_or_none):
    """Many streams at once, and each alone: the snapping rule written plainly."""
    from robocache.data.build.align import snap_many

    rng = np.random.default_rng(3)
    grids, times = [], []
    for n in (1, 2, 7, 31, 0, 5):  # one-instant, two-instant and empty grids
        t = np.sort(rng.uniform(0, 1, n)) if n != 31 else np.arange(n) / 30.0
        grids.append(t)
        m = int(rng.integers(0, 40))
        x = np.sort(rng.uniform(-0.1, 1.1, m))
        if n and m:  # some samples within the tolerance of an instant, some exactly on one
            pick = rng.integers(0, n, m // 2)
            x[: m // 2] = t[pick] + rng.uniform(-2e-4, 2e-4, m // 2)
            x[0] = t[0]
        times.append(np.sort(x))
    times.append(grids[2] + 5e-5)  # a stream on its grid: moved whole even with all_or_none
    grids.append(grids[2])
    got = snap_many(times, grids, 1e-4, all_or_none)
    for x, t, g in zip(times, grids, got, strict=True):
        np.testing.assert_array_equal(g, _snap_one(x, t, 1e-4, all_or_none))
        # one stream alone takes NumPy's search (the online observer's per-tick call)
        np.testing.assert_array_equal(snap_many([x], [t], 1e-4, all_or_none)[0], g)


def test_stats_merge_chunks_in_table_order_whatever_the_threads(tmp_path, episodes,
                                                                 monkeypatch):
    """Statistics over chunks of STATS_BATCH_ROWS rows in the table's order (several
    fragments, chunks across them), computed on threads: those of the chunks one by one."""
    import torch

    import robocache
    from robocache.data.build import stats as S
    from robocache.data.formats import open_source

    write_lerobot(tmp_path / "src", episodes, SPECS, fps=25.0, version="v3.0")
    build(tmp_path / "src", tmp_path / "cache", rate_hz=RATE, progress=False, device="cpu",
          batch_rows=30)  # several fragments
    uri = tmp_path / "cache" / "data.lance"
    assert len(lance.dataset(str(uri)).get_fragments()) > 1
    monkeypatch.setattr(S, "STATS_BATCH_ROWS", 37)
    specs = open_source(tmp_path / "src").specs
    got = [S._compute_stats(uri, specs, threads=t) for t in (1, 3)]
    table = lance.dataset(str(uri)).to_table()
    for name, spec in specs.items():
        if spec.kind != "numeric":
            continue
        col = column_name(name)
        parts = []
        for start in range(0, table.num_rows, 37):
            chunk = table.slice(start, 37)
            keep = ~chunk.column(f"{col}_is_pad").to_numpy(zero_copy_only=False)
            values = np.array(chunk.column(col).to_pylist(), np.float32).reshape(-1, spec.dim)
            if keep.any():
                parts.append(robocache.compute_stats(torch.from_numpy(values[keep])))
        want = robocache.merge_stats(parts).to_dict()
        assert got[0][name] == want and got[1][name] == want


def test_manifest_json_keeps_long_fields_on_one_line():
    from robocache.data.build.manifest import LONG_FIELD, _dumps

    obj = {"format": "x", "streams": {"a": {"shape": [3, 4]}}, "empty": {}, "none": None,
           "episodes": [{"index": i, "rows": 5} for i in range(LONG_FIELD + 1)],
           "episode_digests": {str(i): f"sha256:{i:032x}" for i in range(LONG_FIELD + 1)}}
    text = _dumps(obj, 2)
    assert json.loads(text) == obj and _dumps([1, 2], 2) == json.dumps([1, 2], indent=2)
    lines = text.splitlines()
    assert sum(line.startswith('  "episodes": [{') for line in lines) == 1  # one line
    assert '    "a": {' in lines  # short fields indented as json.dumps indents them


def test_cli_ingest_starts_the_fork_server_before_importing_torch(tmp_path):
    """`robocache ingest` starts the build's fork server before it imports torch, so that the
    server's imports run beside its own."""
    root = Path(__file__).resolve().parents[2]
    code = (
        "import sys\n"
        "import robocache._forkserver as F\n"
        "seen = []\n"
        "F.start_worker_server = lambda: seen.append('torch' in sys.modules)\n"
        "from robocache.cli import main\n"
        f"sys.argv = ['robocache', 'ingest', {str(root / 'data/sample/panda_multirate')!r}, "
        f"{str(tmp_path / 'cache')!r}, '--rate', '50', '--device', 'cpu']\n"
        "try:\n    main()\nexcept SystemExit as e:\n    print('exit', e.code)\n"
        "print(seen)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=root, timeout=300)
    assert out.stdout.strip().splitlines()[-2:] == ["exit 0", "[False]"], out.stderr[-2000:]
