"""Bad options and signals on the command line: one line, exit 2 before any work, nothing left
behind; errors that stay one line whatever the library below says; SIGTERM stops like Ctrl-C."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import faultlib as fl
import numpy as np
import pytest
from typer.testing import CliRunner

from robocache.cli import app
from robocache.cli._errors import one_line
from robocache.data import cache
from robocache.data.build import align as build_align
from robocache.data.lock import holder

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "rlds" / "toy_rlds"


def refused(r: fl.Result, *named: str) -> bool:
    return (r.code == 2 and r.one_line and not r.traceback
            and all(n in r.stderr for n in named))


@pytest.mark.parametrize(("option", "named"), [
    (("--tolerance", "-1"), "--tolerance"), (("--tolerance", "nan"), "--tolerance"),
    (("--rate", "1e9", "--grid-tolerance", "1e-10"), "GiB of aligned columns"),
    (("--rate", "1e-9"), "--rate"), (("--rate", "1e9"), "or a lower --rate"),
    (("--split", "val"), "(--split) is an option of rlds"),
    (("--decode-workers", "100000"), "--decode-workers"),
    (("--camera-size", "100000x100000"), "at most 8192 pixels"),
    (("--grid-tolerance", "1e9"), "--grid-tolerance"),
    (("--rate", "10", "--grid-tolerance", "0.06"), "half the 0.1 s period"),
], ids=["tolerance-1", "tolerance-nan", "rate-1e9", "rate-1e-9", "rate-1e9-grid",
        "split-lerobot",
        "decode-workers-1e5", "camera-size-1e5", "grid-tolerance-1e9-native",
        "grid-tolerance-past-half-a-step"])
def test_ingest_refuses_before_any_work(pristine, tmp_path, option, named):
    src = pristine["lerobot-v3.0"][0]
    before = fl.tree_hash(src)
    dest = tmp_path / "cache"
    r = fl.cli("ingest", src, dest, "--device", "cpu", "--no-progress", *option)
    fl.record(f"ingest (LeRobot source) {' '.join(option)}",
              f"refused before any work, exit {r.code}, DEST not created",
              lost=dest.exists() or fl.tree_hash(src) != before, traceback=r.traceback)
    assert refused(r, named), r.stderr
    assert not dest.exists()


@pytest.mark.parametrize("fps", ["1e-12", "1e6", "0"])
def test_fps_out_of_range_is_refused_by_ingest_inspect_and_view(pristine, tmp_path, fps):
    """--fps of a source without timestamps within [0.001, 100000] Hz: 1e-12 Hz (a 30-frame
    episode a million years long) or 1e6 Hz is a unit mistake, refused in one line."""
    src = pristine["zarr"][0]
    dest = tmp_path / "cache"
    r = fl.cli("ingest", src, dest, "--rate", fl.RATE, "--device", "cpu", "--no-progress",
               "--fps", fps)
    seen = fl.cli("inspect", src, "--fps", fps)
    shown = fl.cli("view", src, "--fps", fps, "--save", tmp_path / "v.rrd")
    fl.record(f"ingest, inspect and view (zarr source) --fps {fps}",
              f"refused naming --fps and its range, exit {r.code}, {seen.code}, {shown.code}; "
              "DEST not created", lost=dest.exists(),
              traceback=r.traceback or seen.traceback or shown.traceback)
    for one in (r, seen, shown):
        assert refused(one, "--fps", "[0.001, 100000]"), one.stderr
    assert not dest.exists() and not (tmp_path / "v.rrd").exists()


def test_the_library_refuses_the_same_options_before_any_work(pristine, tmp_path):
    src = pristine["lerobot-v3.0"][0]
    dest = tmp_path / "cache"
    from robocache._forkserver import max_workers
    from robocache.errors import DataError

    for options, named in (({"decode_workers": 100000}, "`decode_workers`"),
                           ({"decode_workers": max_workers() + 1}, f"pass {max_workers()}"),
                           ({"camera_size": (100000, 100000)}, "at most 8192"),
                           ({"grid_tolerance_s": 0.05, "rate_hz": 10.0}, "`grid_tolerance_s`"),
                           ({"source_options": {"fps": 1e-12}}, "`fps`")):
        with pytest.raises(DataError, match=re.escape(named)):
            cache.build(src, dest, device="cpu", progress=False, **options)
        assert not dest.exists(), options
    fl.record("cache.build(decode_workers=100000 or 4 per core + 1, camera_size=(1e5, 1e5), "
              "grid_tolerance_s=0.05 at 10 Hz, fps=1e-12)",
              "DataError naming the option and the bound, before DEST is created")


@pytest.mark.parametrize(("option", "named"), [
    (("--workers", "100000"), "has 2 CPU(s)"), (("--num-gpus", "4"), "has 0 GPU(s)"),
    (("--address", "127.0.0.1:9"), "no Ray cluster answers"),
    (("--grid-tolerance", "1e9"), "--grid-tolerance")],
    ids=["workers-1e5", "num-gpus-4", "no-cluster", "grid-tolerance-1e9"])
def test_preprocess_refuses_before_creating_dest(pristine, tmp_path, monkeypatch, option,
                                                 named):
    """Refused by the cluster it joins (too many CPU actors, whose surplus Ray would wait for
    for ever; more GPUs than it has; no cluster at --address) or by the options: before DEST
    is created, where a refusal used to leave a cache `inspect` calls interrupted. The
    cluster here: 2 CPUs, no GPU (no Ray is started)."""
    import importlib

    ray = pytest.importorskip("ray")
    preprocess = importlib.import_module("robocache.distributed.preprocess")
    connect = preprocess.connect
    monkeypatch.setattr(preprocess, "connect",
                        lambda address: connect(address) if address else None)
    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr(ray.data, "from_items", lambda *a, **k: pytest.fail("work started"))
    src, dest = pristine["lerobot-v3.0"][0], tmp_path / "cache"
    r = fl.cli("preprocess", src, dest, "--rate", fl.RATE, "--no-progress", *option)
    fl.record(f"preprocess {' '.join(option)}", f"refused before DEST is created, exit "
              f"{r.code}", lost=dest.exists(), traceback=r.traceback)
    assert refused(r, named), r.stderr
    assert not dest.exists()


def test_preprocess_prints_no_ray_error_line(pristine, tmp_path):
    """A preprocess that works prints its summary and no Ray line: Ray's core worker logged
    an "E ... core_worker.cc: Actor ... has constructor arguments in the object store and
    max_restarts > 0" line for the first actor pool of every run (Ray Data's own arguments),
    now spent on an actor of ours while fd 2 is caught."""
    pytest.importorskip("ray")
    from robocache.distributed.preprocess import RESTART_NOTE

    src, dest = pristine["lerobot-v3.0"][0], tmp_path / "cache"
    r = fl.cli_process("preprocess", src, dest, "--rate", fl.RATE, "--no-progress",
                       "--workers", "1", timeout=300)
    ray_errors = [x for x in r.stderr.splitlines() if re.match(r"\[[^]]* E \d+ \d+\]", x)
                  or RESTART_NOTE in x]
    fl.record("preprocess that works", "its summary only, no Ray error line (Ray printed an "
              "\"E ... constructor arguments in the object store\" line)",
              traceback=r.traceback)
    assert r.code == 0 and not r.traceback, r.stderr
    assert not ray_errors and "cached" in r.stdout, r.stderr
    assert fl.same_as_clean(dest, pristine["lerobot-v3.0"][1], range(fl.EPISODES))


def test_a_resume_with_another_tolerance_is_refused(pristine, tmp_path):
    src, dest = pristine["lerobot-v3.0"][0], tmp_path / "cache"
    first = fl.cli("ingest", src, dest, "--rate", fl.RATE, "--device", "cpu", "--no-progress",
                   "--tolerance", "0.05")
    before = fl.tree_hash(dest)
    again = fl.cli("ingest", src, dest, "--rate", fl.RATE, "--device", "cpu", "--no-progress",
                   "--tolerance", "0.1")
    untouched = fl.tree_hash(dest) == before
    same = fl.cli("ingest", src, dest, "--rate", fl.RATE, "--device", "cpu", "--no-progress",
                  "--tolerance", "0.05")
    fl.record("resume with another --tolerance", f"refused naming tolerance_s, exit {again.code}",
              traceback=again.traceback)
    assert first.code == 0 and same.code == 0
    assert refused(again, "tolerance_s", "(0.05 vs 0.1)") and untouched


def test_an_episode_whose_grid_is_too_big_is_quarantined_with_the_bytes(pristine, tmp_path,
                                                                        monkeypatch):
    """The rate passes (a second of an episode fits), each 2.9 s episode at 100 Hz does not."""
    monkeypatch.setattr(build_align, "MAX_GRID_BYTES", 10_000)
    m = cache.build(pristine["lerobot-v3.0"][0], tmp_path / "cache", rate_hz=100.0,
                    device="cpu", progress=False)
    assert m["counts"]["cached"] == 0 and len(m["quarantined"]) == fl.EPISODES
    assert "291 steps" in m["quarantined"][0]["reason"]
    assert "GiB of aligned columns" in m["quarantined"][0]["reason"]


@pytest.mark.parametrize("option", [("--batches", "-1"), ("--batch-size", "0"),
                                    ("--camera-batches", "-2"),
                                    ("--batch-size", "1000000000")])
def test_demo_refuses_before_the_ingest(tmp_path, monkeypatch, option):
    import tempfile

    from robocache.cli import demo

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(demo, "run_demo", lambda *a, **k: pytest.fail("ingest started"))
    r = fl.cli("demo", *option)
    fl.record(f"demo {' '.join(option)}", f"refused before the ingest, exit {r.code}",
              lost=any(tmp_path.iterdir()), traceback=r.traceback)
    assert refused(r, option[0]) and not any(tmp_path.iterdir())


def test_demo_serving_stops_at_an_epoch_without_a_batch():
    """A batch larger than the cache (past the estimate the demo checks first) stops with
    the sizes, where it served nothing for ever."""
    from types import SimpleNamespace

    import torch

    from robocache.cli.demo import _serve
    from robocache.errors import DataError

    class Empty(list):
        device = torch.device("cpu")
        sampler = SimpleNamespace(batch_size=3000, num_samples=2342)

    with pytest.raises(DataError, match=r"--batch-size\) 3000 is more than the 2342 samples"):
        _serve(Empty(), 10)


def test_the_demo_estimate_bounds_the_samples_of_its_cache(tmp_path):
    """The estimate the demo refuses --batch-size by is no less than the cache's samples."""
    from robocache.cli.demo import RATE, samples_at_most
    from robocache.data import RobotDataset
    from robocache.data.sample import sample_path

    src = fl.write_camera_source(tmp_path / "src")
    cache.build(src, tmp_path / "c", rate_hz=RATE, device="cpu", progress=False)
    samples = len(RobotDataset(tmp_path / "c", history=2, horizon=16, keys=["state"]))
    most = samples_at_most(src)
    assert samples <= most <= samples + 2 * fl.EPISODES
    assert samples_at_most(tmp_path / "nothing") is None
    assert 2000 < samples_at_most(sample_path()) < 2500  # the bundled sample: 2342 at 50 Hz


@pytest.mark.parametrize("fails", [False, True], ids=["ok", "failing"])
def test_demo_leaves_no_temporary_directory(tmp_path, monkeypatch, fails):
    import tempfile

    from robocache.cli import demo
    from robocache.errors import DataError

    def run_demo(dest, **kwargs):
        (dest / "cache").mkdir()
        if fails:
            raise DataError("the sample is unreadable")
        return {"samples_per_s": 1.0}

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(demo, "run_demo", run_demo)
    r = fl.cli("demo", "--json")
    assert r.code == (2 if fails else 0) and not any(tmp_path.iterdir())


def test_inspect_refuses_a_negative_episode_count(pristine):
    r = fl.cli("inspect", pristine["lerobot-v3.0"][0], "--episodes", "-3")
    fl.record("inspect --episodes -3", f"refused, exit {r.code}", traceback=r.traceback)
    assert refused(r, "--episodes")


def test_inspect_on_a_tfds_data_dir_points_at_the_version_folder(tmp_path):
    import shutil

    shutil.copytree(FIXTURES / "png", tmp_path / "tfds" / "toy_rlds")
    r = fl.cli("inspect", tmp_path / "tfds")
    fl.record("inspect on a TFDS data dir", f"names the name/version folder, exit {r.code}",
              traceback=r.traceback)
    assert refused(r, str(tmp_path / "tfds" / "toy_rlds" / "1.0.0"))


def test_rlds_inspect_lists_features_without_fps_and_ingest_asks_for_it(tmp_path):
    src = FIXTURES / "png" / "1.0.0"
    seen = fl.cli("inspect", src, "--json")
    facts = json.loads(seen.stdout)
    assert seen.code == 0 and facts["inspected"] == 0 and "observation" in json.dumps(
        facts["features"])
    r = fl.cli("ingest", src, tmp_path / "cache", "--rate", "10", "--no-progress")
    assert refused(r, "--fps") and not (tmp_path / "cache").exists()


def test_json_is_a_flag_in_the_help():
    out = CliRunner().invoke(app, ["inspect", "--help"]).output
    assert "--json " in out and "<bool>" not in out


def test_reasons_and_errors_stay_one_line_with_plain_numbers():
    from robocache.data.build.run import _reason

    class Src:
        pass

    e = ValueError("Parquet magic bytes not found\nin footer: t = np.float64(1.766) s")
    assert _reason(Src(), 0, e) == "ValueError: Parquet magic bytes not found in footer: " \
                                   "t = 1.766 s"
    rust = ("LanceError(IO): Generic LocalFileSystem error: No space left on device (os error "
            "28), /root/.cargo/registry/src/index.crates.io-1949cf8c6b5b557f/lance-table-0.38.3/"
            "src/io/commit.rs:1663:50")
    assert one_line(rust) == ("LanceError(IO): Generic LocalFileSystem error: No space left on "
                              "device (os error 28)")


def test_decreasing_timestamps_read_as_plain_numbers():
    from robocache.data.episode import Episode, Stream, check_episode
    from robocache.errors import DataError

    spec = fl.SPECS["state"]
    t = np.array([0.0, 0.2, 0.1])
    with pytest.raises(DataError) as e:
        check_episode(Episode(0, {"state": Stream(spec, t, np.zeros((3, 3), np.float32))}, {}),
                      {"state": spec})
    assert "(0.2 > 0.1)" in str(e.value)


def test_sigterm_stops_like_ctrl_c_and_the_run_resumes(pristine, tmp_path):
    src, clean = pristine["lerobot-v3.0"]
    dest = tmp_path / "cache"
    args = ["ingest", src, dest, "--rate", fl.RATE, "--device", "cpu", "--no-progress"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-c", fl.SLOW_CLI, *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not list((dest / "data.lance" / "_versions").glob("*.manifest")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
        time.sleep(0.02)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    stopped = fl.Result(proc.returncode, "", err)
    resumed = fl.cli(*args)
    ok = fl.same_as_clean(dest, clean, range(fl.EPISODES))
    fl.record("SIGTERM mid-ingest, then re-run", f"one line, exit {stopped.code}; re-run "
              f"resumes, exit {resumed.code}", lost=not ok, traceback=stopped.traceback)
    assert stopped.code == 143 and stopped.one_line and "terminated; re-run" in err, err
    assert holder(dest) is None and resumed.code == 0 and ok


@pytest.mark.parametrize("sig, code, said", [(signal.SIGTERM, 143, "terminated; re-run"),
                                             (signal.SIGINT, 130, "interrupted; re-run")])
def test_a_signal_whose_exception_a_library_wrapped_still_decides_the_exit(sig, code, said,
                                                                          capsys):
    """A signal's exception raised inside a library call comes back wrapped (Lance:
    ``ArrowInvalid: External error: Terminated``): still the signal's exit and line."""
    import typer

    from robocache.cli._errors import cli_errors

    if sig == signal.SIGINT and signal.getsignal(sig) is not signal.default_int_handler:
        pytest.skip("SIGINT has a handler of the test runner's here")
    with pytest.raises(typer.Exit) as ex, cli_errors():
        try:
            os.kill(os.getpid(), sig)
            time.sleep(5)  # the handler raises here
        except KeyboardInterrupt:
            raise ValueError("External error: Terminated: ") from None
    assert ex.value.exit_code == code and said in capsys.readouterr().err
    with pytest.raises(typer.Exit) as ex, cli_errors():  # a later failure is a failure again
        raise ValueError("boom")
    assert ex.value.exit_code == 1


def test_lerobot_dataset_workers_fork_without_lance_warning(tmp_path):
    """The workers never call Lance, so pylance's fork warning (once a worker) is not shown."""
    import warnings

    import torch

    import robocache

    root = Path(__file__).resolve().parents[1] / "fixtures" / "lerobot" / "tiny"
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ds = robocache.LeRobotDataset("robocache/tiny", root=root, cache=tmp_path / "cache")
        batches = list(torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2))
    assert len(batches) == -(-len(ds) // 8)
    assert not [w for w in seen if "fork-safe" in str(w.message)]
