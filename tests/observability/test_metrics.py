"""Metrics, exporter, pushgateway client, logs, and the deploy files (dashboard PromQL, rules)."""

from __future__ import annotations

import io
import json
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from promhelpers import run_observed, sample_key, scrape

import robocache
from robocache.data.cache import build
from robocache.errors import DataError
from robocache.observability import Pusher, logs, metrics, nvtx, observe
from robocache.observability.metrics import GPU_METRICS

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "observability"
NAME = re.compile(r"\brobocache_[a-z0-9_]+")


def test_scraped_values_equal_the_run(exporter, sample_source, tmp_path):
    manifest, loaded, _ = run_observed(sample_source, tmp_path / "cache", workers=0)
    values = scrape(exporter.server_port)
    ds, c = sample_source.name, manifest["counts"]

    def v(name, **labels):
        return values[sample_key(name, labels)]

    assert v("robocache_ingest_episodes_read_total", dataset=ds) == c["read"] == 7
    assert v("robocache_ingest_episodes_cached_total", dataset=ds) == c["cached"] == 6
    assert v("robocache_ingest_episodes_quarantined_total", dataset=ds,
             reason="DataError") == c["quarantined"] == 1
    assert v("robocache_ingest_steps_written_total", dataset=ds) == c["rows"]
    assert v("robocache_ingest_stage_seconds_count", dataset=ds, stage="align") == 6
    assert v("robocache_ingest_episodes_planned", dataset=ds) == 7
    lab = {"dataset": ds, "rank": "0"}
    assert v("robocache_loader_batches_total", **lab) == loaded["batches"] == c["rows"] // 64
    assert v("robocache_loader_samples_total", **lab) == loaded["samples"] == \
        loaded["batches"] * 64
    assert v("robocache_loader_wait_seconds_count", **lab) == loaded["batches"]
    assert v("robocache_loader_wait_seconds_bucket", le="+Inf", **lab) == loaded["batches"]
    assert v("robocache_loader_wait_seconds_sum", **lab) == pytest.approx(loaded["wait_seconds"])
    assert 0 < v("robocache_loader_stall_ratio", **lab) <= 1
    assert v("robocache_loader_first_batch_seconds", **lab) > 0
    assert v("robocache_op_calls_total", op="align") >= 1  # ingest aligns episodes in batches
    assert v("robocache_camera_frames_decoded_total", decoder="cpu") > 0  # the sample's cameras
    assert v("robocache_build_info", version=robocache.__version__) == 1


def test_exporter_serves_while_workers_load(exporter, sample_source, tmp_path):
    """DataLoader worker processes gather; the exporter thread of this process keeps serving
    (scraped between batches and from another thread), and the totals are the consumer's."""
    hits, stop = [], threading.Event()

    def poll():
        while not stop.is_set():
            hits.append(len(scrape(exporter.server_port)))
            time.sleep(0.02)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        _, loaded, scrapes = run_observed(sample_source, tmp_path / "cache", workers=2,
                                          batches_per_scrape=5, port=exporter.server_port)
    finally:
        stop.set()
        poller.join()
    key = sample_key("robocache_loader_batches_total",
                     {"dataset": sample_source.name, "rank": "0"})
    seen = [s.get(key, 0) for s in scrapes]
    assert seen == sorted(seen) and len(seen) >= 3 and len(hits) >= 3
    assert scrape(exporter.server_port)[key] == loaded["batches"] > 0


def test_ops_are_counted_without_sync(exporter):
    before = metrics.op_summary().get("resample", {"calls": 0, "bytes": 0})
    data, t = torch.randn(2, 10, 3), torch.arange(10.0).expand(2, 10)
    robocache.resample(data, t, torch.linspace(0, 9, 5))
    after = metrics.op_summary()["resample"]
    assert after["calls"] == before["calls"] + 1
    # data + times + targets in, [2, 5, 3] out
    assert after["bytes"] - before["bytes"] == (60 + 20) * 4 + 5 * 4 + 30 * 4


def test_off_costs_nothing(tmp_path):
    """Off: the loader's iterator is returned untouched and ops skip the counter."""
    metrics.disable()
    assert nvtx._count is None
    it = iter([])

    class Loader:
        pass

    assert metrics.watch_loader(Loader(), it) is it


def test_gpu_series_only_with_a_gpu(exporter):
    names = {k.split("{")[0] for k in scrape(exporter.server_port)}
    gpu = {n for n in names if n.startswith("robocache_gpu_")}
    if torch.cuda.is_available():
        assert "robocache_gpu_memory_used_bytes" in gpu
    else:
        assert gpu == set()


def test_json_log_events(sample_source, tmp_path):
    out = io.StringIO()
    logs.configure("json", stream=out)
    try:
        m = build(sample_source, tmp_path / "c", rate_hz=50, device="cpu", progress=False,
                  episodes=[0, 1, 99])
    finally:
        logs.reset()
    events = [json.loads(line) for line in out.getvalue().splitlines()]
    # an episode is reported cached when its batch is committed, quarantined at once
    episodes = {e["episode"]: e for e in events if e["event"] == "ingest.episode"}
    assert {i: e["status"] for i, e in episodes.items()} == \
        {0: "cached", 1: "cached", 99: "quarantined"}
    assert episodes[99]["reason"] == "DataError"
    assert episodes[99]["metric"] == "robocache_ingest_episodes_quarantined_total"
    summary = events[-1]
    assert summary["event"] == "ingest.summary" and summary["cached"] == m["counts"]["cached"]


def test_bad_input_is_one_line():
    with pytest.raises(DataError, match="--pushgateway"):
        Pusher("not a url", job="j")
    with pytest.raises(DataError, match="--pushgateway"):
        Pusher("ftp://host:9091", job="j")
    with pytest.raises(DataError, match="--log-format"):
        logs.configure("xml")
    with pytest.raises(DataError, match="--metrics-port"), observe("j", metrics_port=70000):
        pass


def test_failure_inside_observe_is_reraised_as_is(monkeypatch):
    """The command's own error reaches its one-line handler unchanged, with or without click
    installed (typer no longer depends on it)."""
    monkeypatch.setitem(__import__("sys").modules, "click", None)  # as in a typer-only install
    with pytest.raises(DataError, match="bad"), observe("robocache_test"):
        raise DataError("bad")


def test_port_in_use_warns_and_continues(caplog):
    from robocache.observability import start_exporter

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with caplog.at_level("WARNING", logger="robocache"):
            assert start_exporter(port, "127.0.0.1") is None
    metrics.disable()
    assert len(caplog.records) == 1 and "continues" in caplog.records[0].getMessage()


def test_unreachable_pushgateway_warns_once_bounded(caplog):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    t0 = time.perf_counter()
    with caplog.at_level("WARNING", logger="robocache"), Pusher(url, "j", interval_s=0.05) as p:
        time.sleep(0.3)
    metrics.disable()
    assert time.perf_counter() - t0 < 10
    assert p.failures >= 3 and p.pushes == 0
    assert len(caplog.records) == 1 and "continues" in caplog.records[0].getMessage()


def exported_names(exporter_port: int) -> set[str]:
    """Every sample name the code exports (after a run) plus the GPU gauges (absent here)."""
    names = {k.split("{")[0] for k in scrape(exporter_port)}
    return names | {f"robocache_gpu_{k}" for k in GPU_METRICS}


def promql(path: Path) -> list[str]:
    if path.suffix == ".json":
        dash = json.loads(path.read_text())
        return [t["expr"] for p in dash["panels"] for t in p["targets"]]
    import yaml

    return [r["expr"] for g in yaml.safe_load(path.read_text())["groups"] for r in g["rules"]]


def test_dashboard_and_rules_name_exported_metrics(exporter, sample_source, tmp_path):
    run_observed(sample_source, tmp_path / "cache", workers=0)
    names = exported_names(exporter.server_port)
    dashboard = DEPLOY / "grafana" / "dashboards" / "robocache.json"
    for path in (dashboard, DEPLOY / "rules.yml"):
        exprs = promql(path)
        assert exprs
        for expr in exprs:
            unknown = set(NAME.findall(expr)) - names
            assert not unknown, f"{path.name}: {expr!r} names {unknown}, not exported"
    panels = json.loads(dashboard.read_text())["panels"]
    assert all(p["datasource"]["uid"] == "robocache-prometheus" for p in panels)


def test_dashboard_is_generated_from_code():
    pytest.importorskip("grafana_foundation_sdk", reason="the dev extra builds the dashboard")
    import importlib.util

    spec = importlib.util.spec_from_file_location("dashboard", DEPLOY / "dashboard.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    committed = json.loads((DEPLOY / "grafana" / "dashboards" / "robocache.json").read_text())
    assert module.build() == committed, "regenerate: python deploy/observability/dashboard.py"


@pytest.mark.skipif(shutil.which("promtool") is None,
                    reason="promtool not installed (Debian: apt-get install prometheus)")
def test_promtool_checks_rules_and_config():
    for args in (["check", "rules", "rules.yml"], ["check", "config", "prometheus.yml"],
                 ["test", "rules", "rules_test.yml"]):
        r = subprocess.run(["promtool", *args], cwd=DEPLOY, capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr


def test_wait_buckets_follow_le_and_survive_flushes():
    from robocache.observability.metrics import WAIT_BUCKETS, LoaderStats

    zeros = np.zeros(len(WAIT_BUCKETS) + 1, np.int64)
    counts, total = LoaderStats._bucketed(zeros, 0.0, [1e-4, 1.0001e-4, 10.0, 11.0])
    assert counts.nonzero()[0].tolist() == [1, 2, len(WAIT_BUCKETS) - 1, len(WAIT_BUCKETS)]
    assert total == pytest.approx(21.0002)
    stats = LoaderStats("d", "0")
    stats.FLUSH_WAITS = 3
    batch = {"index": torch.zeros(5)}
    assert sum(1 for _ in stats.watch(iter([batch] * 10), None)) == 10
    counts, total = stats.waits()
    assert counts.sum() == 10 and stats.samples == 50 and 0 < total <= stats.step_sum


def test_cli_options(sample_source, tmp_path):
    """``--log-format json`` gives JSON events on stderr; a bad ``--pushgateway`` is one line and
    exit code 2 before anything runs; an unreachable one warns and the ingest succeeds."""
    from typer.testing import CliRunner

    from robocache.cli import app

    run = CliRunner().invoke
    bad = run(app, ["ingest", str(sample_source), str(tmp_path / "a"), "--pushgateway", "x"])
    assert bad.exit_code == 2 and not (tmp_path / "a").exists()
    assert bad.stderr.strip().count("\n") == 0 and "--pushgateway" in bad.stderr
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    try:
        ok = run(app, ["ingest", str(sample_source), str(tmp_path / "b"), "--no-progress",
                       "--device", "cpu", "--log-format", "json", "--pushgateway", url])
    finally:
        logs.reset()
        metrics.disable()
    assert ok.exit_code == 0, ok.output
    events = [json.loads(line) for line in ok.stderr.splitlines()]
    assert [e["event"] for e in events].count("ingest.episode") == 6
    assert [e["event"] for e in events if e["level"] == "warning"] == ["pushgateway.unreachable"]


@pytest.mark.gpu
def test_cuda_loaders_and_gpu_series(exporter, sample_source, tmp_path):
    from robocache.data import RobotDataset, RobotLoader

    build(sample_source, tmp_path / "c", rate_hz=50, progress=False)
    ds = RobotDataset(tmp_path / "c", history=2, horizon=16)
    served = [sum(1 for _ in RobotLoader(ds, 64, device="cuda", num_workers=w)) for w in (0, 2)]
    values = scrape(exporter.server_port)
    lab = {"dataset": sample_source.name, "rank": "0"}
    assert values[sample_key("robocache_loader_batches_total", lab)] == sum(served)
    assert values[sample_key("robocache_loader_h2d_bytes_total", lab)] > 0  # workers path
    assert values[sample_key("robocache_loader_prefetch_depth", lab)] == 8  # 2 workers x 4
    assert values[sample_key("robocache_gpu_memory_used_bytes", {"gpu": "0"})] > 0
    assert values[sample_key("robocache_gpu_torch_allocated_bytes", {"gpu": "0"})] > 0


def test_failure_is_an_error_event_only_when_logging_is_configured(capsys):
    with pytest.raises(DataError), observe("j"):
        raise DataError("boom.")
    assert capsys.readouterr().err == ""
    out = io.StringIO()
    try:
        with pytest.raises(DataError), observe("j", log_format="json"):
            logs.configure("json", stream=out)
            raise DataError("boom.")
    finally:
        logs.reset()
    event = json.loads(out.getvalue())
    assert event["event"] == "error" and event["error"] == "DataError: boom."
