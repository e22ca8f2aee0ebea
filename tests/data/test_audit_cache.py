"""robocache audit: every planted defect flagged on its episode and nothing else; the report
the same whatever the scan's batches; thresholds as options; the cache never written; the
CLI's table, JSON, plots and exit codes."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from audit_episodes import EPISODES, PLANTED, RATE, SPECS, planted_episodes
from typer.testing import CliRunner

import robocache.data.audit as A
from robocache.cli import app
from robocache.data.cache import build
from robocache.data.formats.lerobot import write_lerobot
from robocache.errors import DataError


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    root = tmp_path_factory.mktemp("audit")
    write_lerobot(root / "src", planted_episodes(), SPECS, fps=RATE)
    # at the source's rate (the default): a stream's missing samples are padded steps
    build(root / "src", root / "cache", tolerance_s=0.06, progress=False, device="cpu",
          camera_codec="png")
    return root / "cache"


def _files(path):
    return {str(p.relative_to(path)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(path.rglob("*")) if p.is_file()}


def test_each_planted_defect_is_flagged_on_its_episode_only(planted):
    before = _files(planted)
    report = A.audit(planted, device="cpu")
    assert _files(planted) == before  # read only
    got = {r["index"]: set(r["flags"]) for r in report["episodes"]}
    assert sorted(got) == list(range(EPISODES))
    for index in range(EPISODES):
        assert got[index] == PLANTED.get(index, set()), (index, report["episodes"][index])
    assert report["flagged"] == len(PLANTED)
    assert report["counts"]["near_duplicate"] == 3 and report["counts"]["duplicate"] == 1
    why = {r["index"]: r["why"] for r in report["episodes"]}
    assert "episode 0" in why[6]["duplicate"]
    assert "observation.state" in why[13]["stream_gap"]
    assert "observation.images.cam" in why[14]["stream_gap"]
    assert "10 of 60 frames black" in why[1]["camera_black"]
    assert "10 of 60 frames uniform" in why[2]["camera_constant"]
    assert "1.4 s" in why[15]["camera_duplicate"]  # 14 repeats of the 10 Hz frame
    assert report["streams"]["grippers"] == ["observation.gripper"]
    assert json.loads(json.dumps(report)) == report  # JSON as it is
    assert report["format"] == A.REPORT_FORMAT and report["version"] >= 1


def test_report_does_not_depend_on_batches(planted, monkeypatch):
    want = A.audit(planted, device="cpu")
    monkeypatch.setattr(A, "SCAN_ROWS", 97)
    monkeypatch.setattr(A, "CHUNK_ROWS", 250)
    monkeypatch.setattr(A, "NEAR_BLOCK", 3)
    monkeypatch.setattr(A, "FRAME_BATCH", 7)
    got = A.audit(planted, device="cpu")
    assert got["episodes"] == want["episodes"]


@pytest.fixture(scope="module", params=["libx264", "libsvtav1"])
def video_cache(request, tmp_path_factory):
    """Cameras kept as video: episode 1 with 10 black frames, 2 with 10 uniform ones, 3 with
    one frame shown 20 times; 0 clean."""
    pytest.importorskip("av", reason="video cameras need PyAV (pip install 'robocache[video]')")
    from robocache.data.cameras import add_video_feature
    from robocache.data.episode import Episode, Stream, StreamSpec

    root = tmp_path_factory.mktemp("video")
    rng = np.random.default_rng(3)
    spec = StreamSpec("observation.state", "numeric", "float32", (2,), 10.0)
    n = 40
    eps = [Episode(i, {spec.name: Stream(spec, np.arange(n) / 10.0, np.cumsum(
        rng.normal(size=(n, 2)), 0).astype(np.float32))}, {"tasks": ["stack"]})
        for i in range(4)]
    write_lerobot(root / "src", eps, {spec.name: spec}, fps=10.0, version="v3.0")
    y, x = np.mgrid[0:48, 0:64]
    clips = []
    for e in range(4):
        clip = np.stack([np.stack([x * 3 + 9 * i + 40 * e, y * 4 + 5 * i, 100 + 3 * i + 0 * x],
                                  -1) for i in range(n)]) + rng.integers(0, 30, (n, 48, 64, 3))
        clip = clip.clip(0, 255).astype(np.uint8)
        clip[10:20] = {1: 0, 2: 128}.get(e, clip[10:20])
        if e == 3:
            clip[5:25] = clip[5]
        clips.append(clip)
    add_video_feature(root / "src", "observation.images.cam", clips, codec=request.param)
    build(root / "src", root / "cache", rate_hz=10.0, progress=False, device="cpu",
          camera_codec="video")
    return root / "cache"


def test_cameras_kept_as_video_are_checked_as_served(video_cache, monkeypatch):
    """Every frame decoded through serving's decoder: the counts are those of the frames a
    RobotDataset serves, whatever the batches (a GOP cut by a batch waits for the rest)."""
    from robocache.data import RobotDataset

    before = _files(video_cache)
    report = A.audit(video_cache, device="cpu")
    assert _files(video_cache) == before
    assert [r["flags"] for r in report["episodes"]] == \
        [[], ["camera_black"], ["camera_constant"], ["camera_duplicate"]]
    cam = "observation.images.cam"
    ds = RobotDataset(video_cache, keys=[cam], image_dtype=torch.uint8)
    served = ds[torch.arange(len(ds))][cam].reshape(len(ds), -1).float() / 255
    for r in report["episodes"][1:]:
        a, b = int(ds.offsets[r["index"]]), int(ds.offsets[r["index"] + 1])
        frames = served[a:b]
        same = (frames[1:] == frames[:-1]).all(1).tolist()
        run = longest = 0
        for s in same:
            run = run + 1 if s else 0
            longest = max(longest, run)
        got = r["cameras"][cam]
        assert got["frames"] == b - a == 40
        assert got["black"] == int((frames.mean(1) <= 0.03).sum())
        assert got["constant"] == int(((frames.std(1, correction=0) <= 0.01)
                                       & (frames.mean(1) > 0.03)).sum())
        assert got["repeated_s"] == pytest.approx(longest * 0.1)
    assert report["episodes"][3]["cameras"][cam]["repeated_s"] > 1.0
    for batch in (1, 3):  # GOPs of 2 frames cut by every batch, or by every other
        monkeypatch.setattr(A, "FRAME_BATCH", batch)
        assert A.audit(video_cache, device="cpu")["episodes"] == report["episodes"]
    monkeypatch.setattr(A, "STAT_PIXELS", 200)  # every 4th pixel of every 4th row
    assert A.audit(video_cache, device="cpu")["episodes"] == report["episodes"]


@pytest.mark.gpu
def test_the_gpu_audit_of_video_cameras_equals_the_cpu_audit(video_cache):
    """Decoded on CPU threads either way, checked on the GPU: the same counts."""
    cpu = A.audit(video_cache, device="cpu")
    gpu = A.audit(video_cache, device="cuda")
    assert [r.get("cameras") for r in gpu["episodes"]] == \
        [r.get("cameras") for r in cpu["episodes"]]
    assert [r["flags"] for r in gpu["episodes"]] == [r["flags"] for r in cpu["episodes"]]


def test_a_damaged_video_packet_fails_the_audit_naming_its_frame(video_cache, tmp_path):
    import lance

    cache = tmp_path / "cache"
    shutil.copytree(video_cache, cache)
    lance.dataset(str(cache / "frames" / "observation.images.cam.lance")).update(
        {"encoded": "X'00000001ff'"}, where="episode_index = 2 AND frame = 0")
    with pytest.raises(DataError, match="'observation.images.cam', episode 2, frame 0"):
        A.audit(cache, device="cpu")
    assert not A.audit(cache, A.AuditConfig(cameras=False), device="cpu")["flagged"]


def test_thresholds_are_options(planted):
    base = A.audit(planted, device="cpu")
    loose = A.audit(planted, A.AuditConfig(jump=2.0, range_margin=3.0, idle_s=10.0,
                                           frozen_s=5.0, min_steps=5, near_duplicate=0.0,
                                           known_tasks=[f"pick the cube {k}" for k in range(3)]
                                           + ["unknown"]),
                    device="cpu")
    flags = {r["index"]: set(r["flags"]) for r in loose["episodes"]}
    assert not flags[3] and not flags[4] and not flags[5] and not flags[9] and not flags[12]
    assert flags[0] == set() and flags[6] == {"duplicate"}
    assert flags[11] == set()
    strict = A.audit(planted, A.AuditConfig(known_tasks=["pick the cube 0"]), device="cpu")
    assert "task_unknown" in strict["episodes"][1]["flags"]  # not a known task
    assert loose["thresholds"]["jump"] == 2.0 and base["thresholds"]["jump"] == 0.5
    blind = A.audit(planted, A.AuditConfig(cameras=False), device="cpu")
    assert not any(f.startswith("camera_") for r in blind["episodes"] for f in r["flags"])
    assert blind["episodes"][14]["flags"] == ["stream_gap"]  # the timing checks still run
    lenient = A.audit(planted, A.AuditConfig(camera_fraction=0.5, frozen_s=2.0), device="cpu")
    assert {"camera_black", "camera_constant", "camera_duplicate"}.isdisjoint(
        f for r in lenient["episodes"] for f in r["flags"])
    with pytest.raises(DataError, match="jump"):
        A.audit(planted, A.AuditConfig(jump=-1.0))
    with pytest.raises(DataError, match="min_steps"):
        A.audit(planted, A.AuditConfig(min_steps=2.5))
    with pytest.raises(DataError, match="idle_keys"):
        A.audit(planted, A.AuditConfig(idle_keys=["nope"]))


def test_nonfinite_values_are_flagged(planted, tmp_path):
    """A build quarantines NaN; a cache written otherwise (or damaged) may still hold one."""
    import lance
    import pyarrow as pa

    cache = tmp_path / "cache"
    shutil.copytree(planted, cache)
    table = lance.dataset(str(cache / "data.lance")).to_table()
    col = table.column("action").combine_chunks()
    values = col.flatten().to_numpy().copy()
    ep = table.column("episode_index").to_numpy()
    row = int(np.flatnonzero(ep == 2)[10])
    values[row * 2] = np.nan
    fixed = pa.FixedSizeListArray.from_arrays(pa.array(values, pa.float32()), 2)
    table = table.set_column(table.schema.get_field_index("action"), "action", fixed)
    lance.write_dataset(table, str(cache / "data.lance"), mode="overwrite")
    report = A.audit(cache, device="cpu")
    r = report["episodes"][2]
    assert "nonfinite" in r["flags"] and r["streams"]["action"]["nonfinite"] == 1
    assert report["version"] == 2


def test_flagged_reads_a_report(planted, tmp_path):
    report = A.audit(planted, device="cpu")
    path = tmp_path / "audit.json"
    path.write_text(json.dumps(report))
    assert A.flagged(path) == set(PLANTED)
    assert A.flagged(report, ["short", "idle"]) == {5, 9}
    with pytest.raises(DataError, match="unknown audit flags"):
        A.flagged(report, ["wobbly"])
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(DataError, match="not an audit report"):
        A.flagged(tmp_path / "bad.json")


def test_cli_table_json_plot_and_exit_codes(planted, tmp_path):
    runner = CliRunner()
    res = runner.invoke(app, ["audit", str(planted), "--device", "cpu"])
    assert res.exit_code == 3, res.output
    assert f"{EPISODES} episodes checked" in res.output and "gripper_unused" in res.output
    out = tmp_path / "report.json"
    res = runner.invoke(app, ["audit", str(planted), "--json", "--out", str(out),
                              "--plot", str(tmp_path / "plots"), "--plot-count", "2",
                              "--min-steps", "3"])
    assert res.exit_code == 3, res.output
    report = json.loads(res.output)
    assert json.loads(out.read_text())["episodes"] == report["episodes"]
    assert report["counts"]["short"] == 0
    assert len(report["plots"]) == 2 and all(p.endswith(".png") for p in report["plots"])
    assert all(p.stat().st_size > 1000 for p in (tmp_path / "plots").glob("episode-*.png"))
    clean = runner.invoke(app, ["audit", str(planted), "--idle-key", "action", "--jump", "9",
                                "--range-margin", "9", "--frozen-s", "9", "--idle-s", "9",
                                "--gripper-span", "0", "--min-steps", "1", "--no-cameras",
                                "--near-duplicate", "0", "--gap-periods", "99", "--json"])
    assert json.loads(clean.output)["counts"]["jump"] == 0
    # refusals: one line, exit 2
    for args, words in ([str(tmp_path), "--jump", "1"], "unknown dataset format"), \
            ([str(planted), "--fps", "10"], "are for a source"), \
            ([str(planted), "--jump", "-1"], "jump"), \
            ([str(planted), "--plot", str(planted / "p")], "never written"), \
            ([str(planted), "--idle-key", "nope"], "idle_keys"):
        res = runner.invoke(app, ["audit", *args])
        assert res.exit_code == 2 and words in res.output, (args, res.output)
        assert res.output.count("\n") == 1


def test_a_source_is_ingested_into_a_temporary_cache_and_audited(tmp_path):
    """The source only read, its temporary cache removed; episodes the ingest quarantines
    listed with their reason."""
    eps = planted_episodes()[:6]
    bad = eps[2].streams["action"].data.copy()
    bad[5, 0] = np.nan  # an ingest quarantines NaN values
    eps[2].streams["action"] = type(eps[2].streams["action"])(
        eps[2].streams["action"].spec, eps[2].streams["action"].times, bad)
    write_lerobot(tmp_path / "src", eps, SPECS, fps=RATE)
    before = _files(tmp_path / "src")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    report = A.audit_source(tmp_path / "src", scratch=scratch, device="cpu")
    assert _files(tmp_path / "src") == before and not any(scratch.iterdir())
    assert report["source"] == str(tmp_path / "src") and report["cache"] is None
    flags = {r["index"]: r["flags"] for r in report["episodes"]}
    assert flags[2] == ["quarantined"] and "NaN" in report["episodes"][-1]["why"]["quarantined"]
    assert flags[3] == ["jump"] and flags[1] == ["camera_black"]
    assert report["episodes_checked"] == 5 and report["counts"]["quarantined"] == 1
    res = CliRunner().invoke(app, ["audit", str(tmp_path / "src"), "--scratch", str(scratch),
                                   "--device", "cpu"])
    assert res.exit_code == 3 and "ingested for the audit" in res.output, res.output
    assert not any(scratch.iterdir())
    res = CliRunner().invoke(app, ["audit", str(tmp_path / "src"), "--plot", str(tmp_path)])
    assert res.exit_code == 2 and "--plot draws a cache" in res.output


def test_near_pairs_match_copies_with_noise_and_cut_short():
    """Signatures on a common time axis: a copy with noise and a copy cut short by a tenth
    match their original; a quarter of it, or another trajectory, do not."""
    rng = np.random.default_rng(0)
    p, d = 40, 3
    t = np.arange(p)[:, None] / 8
    base = 0.5 + 0.4 * np.sin(t + np.arange(d))
    other = 0.5 + 0.4 * np.sin(1.7 * t + 2 * np.arange(d))
    sigs = np.stack([base, base + rng.normal(0, 1e-3, base.shape), base, base, other])
    valid = np.ones((5, p), bool)
    valid[2, 36:] = False  # cut short by a tenth
    valid[3, 10:] = False  # a quarter
    sigs[~valid] = 0
    for dev in ("cpu",) + (("cuda",) if torch.cuda.is_available() else ()):
        pairs = {(a, b) for a, b, _ in A._near_pairs(sigs, valid, 0.01, 0.8,
                                                     torch.device(dev))}
        assert pairs == {(0, 1), (0, 2), (1, 2)}, dev


def test_near_pairs_match_copies_cut_at_their_start(monkeypatch):
    """Signatures sampled four times a step: a copy whose start was cut (it begins 2.5
    samples later) is found through the shifted comparisons, closer than either neighbouring
    shift alone through the refinement; without shifts, or against another trajectory, not."""
    p, phases, d = 40, 4, 3
    t = np.arange(p * phases)[:, None] / 3.0
    f = lambda t: 0.5 + 0.4 * np.sin(t + np.arange(d))  # noqa: E731
    sigs = np.stack([f(t), f(t + 2.5 / 3.0), f(1.9 * t + 1)])
    valid = np.ones(sigs.shape[:2], bool)
    cpu = torch.device("cpu")
    assert A._near_pairs(sigs, valid, 0.01, 0.8, cpu, shifts=0, phases=phases) == []
    pairs = A._near_pairs(sigs, valid, 0.05, 0.8, cpu, shifts=8, phases=phases)
    assert [(a, b) for a, b, _ in pairs] == [(0, 1)]
    # each whole shift is half a sample off (about 0.05 here); the parabola's minimum is not
    assert pairs[0][2] < 0.01
    monkeypatch.setattr(A, "_vertex", lambda a, b, c: b)
    raw = A._near_pairs(sigs, valid, 0.05, 0.8, cpu, shifts=8, phases=phases)
    assert raw[0][2] > 0.04


@pytest.mark.gpu
def test_the_gpu_audit_flags_what_the_cpu_audit_flags(planted):
    cpu = A.audit(planted, device="cpu")
    gpu = A.audit(planted, device="cuda")
    assert gpu["device"].startswith("cuda")
    assert [r["flags"] for r in gpu["episodes"]] == [r["flags"] for r in cpu["episodes"]]
    for a, b in zip(gpu["episodes"], cpu["episodes"], strict=True):
        assert a["metrics"].get("digest") == b["metrics"].get("digest")
        for k in ("idle_s", "frozen_s", "max_step", "nonfinite", "out_of_range"):
            assert a["metrics"].get(k, 0) == pytest.approx(b["metrics"].get(k, 0), rel=1e-5,
                                                           abs=1e-6), k


def test_a_cache_in_an_object_store_audits_as_on_disk(planted, s3_server):
    from robocache.data.location import Location
    from robocache.data.publish import publish

    uri = f"s3://{s3_server.bucket()}/audited"
    publish(planted, Location(uri, s3_server.options()))
    remote = A.audit(uri, storage_options=s3_server.options(), device="cpu")
    local = A.audit(planted, device="cpu")
    assert remote["cache"] == uri
    assert [(r["index"], r["flags"], r["why"]) for r in remote["episodes"]] == \
        [(r["index"], r["flags"], r["why"]) for r in local["episodes"]]
    flags = [x for k, v in s3_server.options().items() for x in ("--storage-option", f"{k}={v}")]
    res = CliRunner().invoke(app, ["audit", uri, "--json", "--device", "cpu", *flags])
    assert res.exit_code == 3 and json.loads(res.output)["flagged"] == local["flagged"]


@pytest.fixture(scope="module")
def three_cameras(tmp_path_factory):
    """Three PNG cameras at the grid's rate, a defect on a different episode of each: camera 0
    black frames in episode 1, camera 1 one frame shown 1.6 s in episode 3, camera 2 uniform
    frames in episode 2."""
    from robocache.data.episode import Episode, Stream, StreamSpec

    root = tmp_path_factory.mktemp("three")
    rate, n = 10.0, 30
    cams = [f"observation.images.cam{c}" for c in range(3)]
    specs = {"observation.state": StreamSpec("observation.state", "numeric", "float32", (2,),
                                             rate),
             **{c: StreamSpec(c, "image", "uint8", (6, 8, 3), rate) for c in cams}}
    rng = np.random.default_rng(11)
    eps = []
    for e in range(5):
        t = np.arange(n) / rate
        streams = {"observation.state": Stream(specs["observation.state"], t, np.cumsum(
            rng.normal(size=(n, 2)), 0).astype(np.float32))}
        for c, cam in enumerate(cams):
            x = rng.integers(20, 235, (n, 6, 8, 3), np.uint8)
            if (c, e) == (0, 1):
                x[5:15] = 0
            elif (c, e) == (1, 3):
                x[4:21] = x[4]
            elif (c, e) == (2, 2):
                x[10:20] = 128
            streams[cam] = Stream(specs[cam], t, x)
        eps.append(Episode(e, streams, {"tasks": ["stack"]}))
    write_lerobot(root / "src", eps, specs, fps=rate)
    build(root / "src", root / "cache", progress=False, device="cpu", camera_codec="png")
    return root / "cache", cams


def test_camera_checks_read_ahead_equal_the_served_frames(three_cameras, monkeypatch):
    """Batches read ahead across cameras on threads, decoded on another, checked here: each
    camera's counts are those of the frames a RobotDataset serves, checked one after the
    other, whatever the batches and the reads ahead; the batches read and not yet checked
    stay within READ_AHEAD + 1."""
    from robocache.data import RobotDataset
    from robocache.data.location import Location

    cache, cams = three_cameras
    location = Location(cache)
    manifest = location.manifest()
    cameras = {c: manifest["streams"][c] for c in cams}
    expected = A._episode_rows(manifest)
    ds = RobotDataset(cache, keys=cams, image_dtype=torch.uint8)
    served = ds[torch.arange(len(ds))]
    want = {}
    for cam in cams:
        frames = served[cam].reshape(len(ds), -1).float() / 255
        got = {k: np.zeros(len(expected), np.int64) for k in ("frames", "black", "constant",
                                                               "repeated")}
        for e in range(len(expected)):
            x = frames[int(ds.offsets[e]):int(ds.offsets[e + 1])]
            got["frames"][e] = len(x)
            got["black"][e] = int((x.mean(1) <= 0.03).sum())
            got["constant"][e] = int(((x.std(1, correction=0) <= 0.01)
                                      & (x.mean(1) > 0.03)).sum())
            run = 0
            for same in (x[1:] == x[:-1]).all(1).tolist():
                run = run + 1 if same else 0
                got["repeated"][e] = max(got["repeated"][e], run)
        want[cam] = got
    assert [int(want[c][k].sum()) for c, k in ((cams[0], "black"), (cams[2], "constant"))] \
        == [10, 10] and want[cams[1]]["repeated"][3] == 16

    real_read, real_ahead = A._read, A._ahead
    reads, behind = [0], []

    def read(*args):
        reads[0] += 1
        return real_read(*args)

    def ahead(items):  # the reads begun beyond the batches handed over, at each hand-over
        for i, item in enumerate(real_ahead(items)):
            behind.append(reads[0] - (i + 1))
            yield item

    monkeypatch.setattr(A, "_read", read)
    monkeypatch.setattr(A, "_ahead", ahead)
    for batch, read_ahead in ((1024, 1), (7, 4), (1, 16), (4, 2)):
        monkeypatch.setattr(A, "FRAME_BATCH", batch)
        monkeypatch.setattr(A, "READ_AHEAD", read_ahead)
        reads[0], behind[:] = 0, []
        got = A._pixels(location, manifest, cameras, expected, A.AuditConfig(),
                        torch.device("cpu"))
        assert list(got) == cams
        for cam in cams:
            for k in want[cam]:
                np.testing.assert_array_equal(got[cam][k], want[cam][k], err_msg=f"{cam} {k}")
        assert reads[0] == len(behind) == 3 * -(-150 // batch)
        assert max(behind) <= read_ahead + 1
    report = A.audit(cache, device="cpu")
    assert [r["flags"] for r in report["episodes"]] == \
        [[], ["camera_black"], ["camera_constant"], ["camera_duplicate"], []]
