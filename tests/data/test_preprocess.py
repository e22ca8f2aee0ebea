"""Ray preprocess and shard merge: the same cache as ingest, resumable, one-line errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lance
import numpy as np
import pyarrow as pa
import pytest
from data_episodes import SPECS, make_episode
from helpers import assert_quantiles_within_bin, assert_same_stats
from test_cache import corrupt
from typer.testing import CliRunner

from robocache.cli import app
from robocache.data.cache import (
    CacheConfig,
    align_episode,
    build,
    load_episode,
    open_specs,
    write_episode,
)
from robocache.data.formats.lerobot import write_lerobot
from robocache.errors import DataError, DeviceError, MissingDependencyError
from robocache.observability import metrics

ray = pytest.importorskip("ray")
RATE = 40.0
DEFECTS = {1: "missing_key", 4: "nan_timestamp"}


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=4, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """7 episodes of v2.1 LeRobot, two of them broken."""
    root = tmp_path_factory.mktemp("src")
    rng = np.random.default_rng(7)
    write_lerobot(root, [make_episode(i, rng, duration=1.0) for i in range(7)], SPECS,
                  fps=25.0, version="v2.1")
    for index, defect in DEFECTS.items():
        corrupt(root, index, defect)
    return root


def table(path: Path) -> pa.Table:
    t = lance.dataset(str(path)).to_table()
    key = "step" if "step" in t.column_names else "frame"
    return t.sort_by([("episode_index", "ascending"), (key, "ascending")])


def assert_same_cache(a: Path, b: Path) -> None:
    """Same rows, frames, episodes, quarantine, counts and stats (mean and std to float64
    rounding; the quantiles, read off the histogram, do not depend on how rows were split)."""
    assert table(a / "data.lance").equals(table(b / "data.lance"))
    cam = "frames/observation.images.cam.lance"
    assert table(a / cam).equals(table(b / cam))
    ma, mb = (json.loads((p / "manifest.json").read_text()) for p in (a, b))
    for key in ("format", "source", "rate_hz", "native", "streams", "episodes", "quarantined"):
        assert ma[key] == mb[key], key
    assert {k: v for k, v in ma["counts"].items() if k not in ("new", "skipped")} == \
        {k: v for k, v in mb["counts"].items() if k not in ("new", "skipped")}
    assert_same_stats(*(json.loads((p / "stats.json").read_text()) for p in (a, b)))


def test_preprocess_equals_ingest_and_resumes(tmp_path, source, local_ray):
    """The same cache as ingest, resumed, with ingest's metrics; ``progress`` as a callable
    gets ``(description, episodes)`` as episodes finish, every episode of the source once
    (cached, skipped, or quarantined singly), in ingest and in preprocess (checked here, on
    the runs the rest needs: a run of its own cost a Ray Data execution, 12 s)."""
    from robocache.distributed import preprocess

    seen: dict[str, list] = {"ingest": [], "ray": []}
    ingested = build(source, tmp_path / "ingest", rate_hz=RATE, device="cpu",
                     progress=lambda desc, n: seen["ingest"].append((desc, n)))
    assert ingested["counts"]["quarantined"] == len(DEFECTS)
    # a worker died after writing episode 0's files: never committed, so never seen twice
    first = build(source, tmp_path / "ray", rate_hz=RATE, device="cpu", progress=False,
                  episodes=[2, 3])
    src, specs = open_specs(source, CacheConfig())
    episode = load_episode(src, 0, specs)
    write_episode(tmp_path / "ray", episode,
                  align_episode(episode, specs, CacheConfig(rate_hz=RATE), "cpu"), specs)
    prometheus_client = pytest.importorskip("prometheus_client")
    metrics.enable()

    def count(name, **labels):
        return prometheus_client.REGISTRY.get_sample_value(
            f"robocache_ingest_{name}_total", {"dataset": source.name, **labels}) or 0.0

    before = {k: count(k) for k in ("episodes_cached", "episodes_skipped", "steps_written")}
    bad = count("episodes_quarantined", reason="DataError")
    try:
        m = preprocess(source, tmp_path / "ray", rate_hz=RATE,
                       progress=lambda desc, n: seen["ray"].append((desc, n)))
    finally:
        metrics.disable()
    for calls in seen.values():
        assert sum(n for _, n in calls) == 7 and all(isinstance(d, str) for d, _ in calls)
        assert sorted(d for d, _ in calls if "quarantined" in d) == [
            f"episode {i} quarantined" for i in sorted(DEFECTS)]
    assert sorted(d for d, _ in seen["ray"] if "cached)" in d) == [
        "episode 2 (cached)", "episode 3 (cached)"]
    assert (m["counts"]["skipped"], m["counts"]["new"]) == (2, 3)
    # the metrics of ingest, reported by the driver (sizes measured in the actors)
    assert count("episodes_cached") - before["episodes_cached"] == 3
    assert count("episodes_skipped") - before["episodes_skipped"] == 2
    # the broken episodes, labelled with the exception raised in the Ray task
    assert count("episodes_quarantined", reason="DataError") - bad == len(DEFECTS)
    new_rows = sum(e["rows"] for e in m["episodes"] if e["index"] not in (2, 3))
    assert count("steps_written") - before["steps_written"] == new_rows
    assert first["counts"]["cached"] == 2
    assert m["device"] == "cpu x4 (ray)"  # one CPU actor per CPU of the Ray
    assert_same_cache(tmp_path / "ingest", tmp_path / "ray")
    assert m["episode_digests"] == ingested["episode_digests"]  # read in the Ray tasks too
    assert len(m["episode_digests"]) == m["counts"]["cached"]
    again = preprocess(source, tmp_path / "ray", rate_hz=RATE, progress=False)
    assert (again["counts"]["skipped"], again["counts"]["new"]) == (5, 0)
    assert_same_cache(tmp_path / "ingest", tmp_path / "ray")



def test_preprocess_at_native_rate_equals_ingest(tmp_path, source, local_ray, monkeypatch):
    from robocache.data.build import run
    from robocache.distributed import preprocess

    build(source, tmp_path / "ingest", device="cpu", progress=False)  # rate_hz="native"
    for name in ("_compute_stats", "_episode_summary"):  # the actors' tallies stand in
        monkeypatch.setattr(run, name, lambda *a, _n=name: pytest.fail(f"{_n}: rows read"))
    m = preprocess(source, tmp_path / "ray", progress=False)
    assert m["native"] is True
    assert_same_cache(tmp_path / "ingest", tmp_path / "ray")


def test_v3_files_are_read_once_per_group_and_equal_ingest(tmp_path, local_ray, monkeypatch):
    """A LeRobot v3.0 source of several data files (the benchmark's generator): each read
    task reads the episodes of one file, and the cache is ingest's."""
    from robocache.distributed import preprocess
    from robocache.distributed.preprocess import read_groups

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import preprocess_data as D

    monkeypatch.setattr(D, "PER_FILE", 3)
    root, _ = D.make_dataset(tmp_path / "src", 7, seconds=1.0, camera=True, workers=1)
    src, _ = open_specs(root, CacheConfig())
    monkeypatch.setattr(sys.modules[read_groups.__module__], "READ_EPISODES", 2)
    assert read_groups(src, list(range(7))) == [[0, 1, 2], [3, 4, 5], [6]]
    # a group of another file is filled up to READ_EPISODES
    assert read_groups(src, [0, 2, 3, 6]) == [[0, 2], [3, 6]]
    assert read_groups(src, list(range(7)), tasks=4) == [[0, 1], [2, 3], [4, 5], [6]]
    # as many files as tasks or more: a file is never split
    assert read_groups(src, list(range(7)), tasks=3) == [[0, 1, 2], [3, 4, 5], [6]]
    build(root, tmp_path / "ingest", rate_hz=RATE, device="cpu", progress=False)
    m = preprocess(root, tmp_path / "ray", rate_hz=RATE, progress=False)
    assert m["counts"]["cached"] == 7
    assert_same_cache(tmp_path / "ingest", tmp_path / "ray")


@pytest.mark.gpu
@pytest.mark.parametrize("actors_per_gpu", [None, 2])
def test_gpu_actors_match_ingest_on_cuda(tmp_path, source, local_ray, actors_per_gpu):
    """One actor on the GPU (the default), or two sharing it."""
    from robocache.distributed import preprocess

    build(source, tmp_path / "ingest", rate_hz=RATE, device="cuda", progress=False)
    m = preprocess(source, tmp_path / "ray", rate_hz=RATE, num_gpus=1, progress=False,
                   actors_per_gpu=actors_per_gpu)
    assert m["device"] == "cuda x1 (ray)"
    assert_same_cache(tmp_path / "ingest", tmp_path / "ray")
    with pytest.raises(DeviceError, match="no CPU left to read"):  # 4 actors hold the 4 CPUs
        preprocess(source, tmp_path / "full", rate_hz=RATE, num_gpus=1, actors_per_gpu=4,
                   progress=False)
    assert not (tmp_path / "full" / "data.lance").exists()


def test_shards_merge_into_the_ingest_cache(tmp_path, source):
    from robocache.distributed import merge

    build(source, tmp_path / "all", rate_hz=RATE, device="cpu", progress=False)
    parts = [tmp_path / f"part-{i}" for i in range(3)]
    seen = []
    for i, part in enumerate(parts):
        m = build(source, part, rate_hz=RATE, device="cpu", progress=False, shard=f"{i}/3")
        assert m["shard"] == [i, 3]
        seen += [e["index"] for e in m["episodes"]] + [q["index"] for q in m["quarantined"]]
    assert sorted(seen) == list(range(7))  # disjoint and complete
    merged = merge(parts[::-1], tmp_path / "merged", progress=False)
    assert merged["counts"]["new"] == 5 and "shard" not in merged
    whole = json.loads((tmp_path / "all" / "manifest.json").read_text())
    assert all(merged[k] == whole[k] for k in ("source_files", "episode_digests"))  # the record
    assert_same_cache(tmp_path / "all", tmp_path / "merged")
    stats = json.loads((tmp_path / "merged" / "stats.json").read_text())["action"]
    rows = np.concatenate(table(tmp_path / "all" / "data.lance").column("action")
                          .to_numpy(zero_copy_only=False)).reshape(-1, 2)
    assert_quantiles_within_bin(stats, rows)
    again = merge(parts, tmp_path / "merged", progress=False)  # resume: nothing twice
    assert again["counts"]["new"] == 0
    assert_same_cache(tmp_path / "all", tmp_path / "merged")
    with pytest.raises(DataError, match="every shard i/3"):
        merge(parts[:2], tmp_path / "m2", progress=False)
    with pytest.raises(DataError, match="different rate_hz"):
        build(source, tmp_path / "other", rate_hz=10.0, progress=False, shard="0/3")
        merge([parts[0], tmp_path / "other"], tmp_path / "m3", progress=False)


def run_cli(*args: str):
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output.strip()


def test_bad_input_is_one_line(tmp_path, source, local_ray, monkeypatch):
    code, out = run_cli("preprocess", str(source), str(tmp_path / "a"), "--shard", "3/2")
    assert code == 2 and out.count("\n") == 0 and "i/n with 0 <= i < n" in out
    code, out = run_cli("ingest", str(source), str(tmp_path / "b"), "--shard", "x")
    assert code == 2 and "`shard`" in out
    code, out = run_cli("preprocess", str(source), str(tmp_path / "c"), "--num-gpus", "4")
    assert code == 2 and out.count("\n") == 0 and "has 0 GPU(s)" in out
    for flag in ("--workers", "--actors-per-gpu"):
        code, out = run_cli("preprocess", str(source), str(tmp_path / flag), flag, "0")
        assert code == 2 and out.count("\n") == 0 and f"({flag}) is 0" in out
        assert not (tmp_path / flag).exists()  # refused before the destination is made
    code, out = run_cli("merge", str(tmp_path / "nothing"), str(tmp_path / "d"))
    assert code == 2 and "not a RoboCache cache" in out
    monkeypatch.setitem(sys.modules, "ray", None)
    code, out = run_cli("preprocess", str(source), str(tmp_path / "e"))
    assert code == 2 and "pip install 'robocache[ray]'" in out and out.count("\n") == 0
    from robocache.distributed.preprocess import _ray

    with pytest.raises(MissingDependencyError):
        _ray()


def test_unanswered_address_is_one_line(tmp_path, source):
    from robocache.distributed.preprocess import connect

    code, out = run_cli("preprocess", str(source), str(tmp_path / "a"), "--address",
                        "ray://127.0.0.1:9")
    assert code == 2 and out.count("\n") == 0 and "no Ray cluster answers" in out
    with pytest.raises(ConnectionError, match="--address"):
        connect("127.0.0.1:9")
