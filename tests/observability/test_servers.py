"""Against real servers: Prometheus scrapes the exporter and a pushgateway receives the pushes
(Debian's ``prometheus`` and ``prometheus-pushgateway``, started on loopback ports here)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request

import pytest
from promhelpers import free_port, run_observed, sample_key

from robocache.observability import Pusher

PROMETHEUS, PUSHGATEWAY = shutil.which("prometheus"), shutil.which("prometheus-pushgateway")
pytestmark = pytest.mark.skipif(
    PROMETHEUS is None or PUSHGATEWAY is None,
    reason="needs the prometheus and prometheus-pushgateway binaries (Debian: apt-get install "
           "prometheus prometheus-pushgateway; .ci/run installs them where apt-get runs as root)")


def get(url: str) -> bytes:
    return urllib.request.urlopen(url, timeout=5).read()


def wait_until(fn, timeout: float = 30.0, what: str = ""):
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = fn()
            if value is not None:
                return value
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.25)


@pytest.fixture
def servers(tmp_path, exporter):
    """A pushgateway and a Prometheus (scraping the exporter every second) on loopback."""
    push_port, prom_port = free_port(), free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps({  # YAML is a superset of JSON
        "global": {"scrape_interval": "1s"},
        "scrape_configs": [
            {"job_name": "robocache",
             "static_configs": [{"targets": [f"127.0.0.1:{exporter.server_port}"]}]},
            {"job_name": "pushgateway", "honor_labels": True,
             "static_configs": [{"targets": [f"127.0.0.1:{push_port}"]}]}]}))
    procs = [subprocess.Popen([PUSHGATEWAY, f"--web.listen-address=127.0.0.1:{push_port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
             subprocess.Popen([PROMETHEUS, f"--config.file={config}",
                               f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                               f"--web.listen-address=127.0.0.1:{prom_port}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        push, prom = f"http://127.0.0.1:{push_port}", f"http://127.0.0.1:{prom_port}"
        wait_until(lambda: get(f"{push}/-/ready") or None, what="the pushgateway")
        wait_until(lambda: get(f"{prom}/-/ready") or None, what="Prometheus")
        yield push, prom
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def query(prom: str, expr: str) -> dict[str, float]:
    """Instant query: ``name{labels}`` -> value."""
    body = json.loads(get(f"{prom}/api/v1/query?" + urllib.parse.urlencode({"query": expr})))
    return {sample_key(r["metric"].pop("__name__", ""), r["metric"]): float(r["value"][1])
            for r in body["data"]["result"]}


def test_prometheus_and_pushgateway_see_the_run(servers, sample_source, tmp_path):
    push, prom = servers
    ds = sample_source.name
    with Pusher(push, job="robocache_test", interval_s=0.5, grouping={"instance": "ci"}):
        manifest, loaded, _ = run_observed(sample_source, tmp_path / "cache", workers=0)
    c = manifest["counts"]
    expected = {
        f'robocache_ingest_episodes_cached_total{{dataset="{ds}"}}': c["cached"],
        f'robocache_ingest_episodes_quarantined_total{{dataset="{ds}",reason="DataError"}}':
            c["quarantined"],
        f'robocache_ingest_episodes_read_total{{dataset="{ds}"}}': c["read"],
        f'robocache_loader_samples_total{{dataset="{ds}",rank="0"}}': loaded["samples"],
        f'robocache_loader_batches_total{{dataset="{ds}",rank="0"}}': loaded["batches"],
    }

    def scraped(job: str):
        got = {e: query(prom, f'{e[:-1]},job="{job}"}}') for e in expected}
        values = {e: next(iter(v.values())) for e, v in got.items() if v}
        return values if values == expected else None

    assert wait_until(lambda: scraped("robocache"), what="the exporter's values in Prometheus")
    # the final push, as the pushgateway holds it and as Prometheus scraped it from there
    pushed = json.loads(get(f"{push}/api/v1/metrics"))["data"]
    group = next(g for g in pushed if g["labels"].get("job") == "robocache_test")
    assert group["labels"]["instance"] == "ci" and group["labels"]["rank"] == "0"
    fam = group["robocache_loader_samples_total"]["metrics"]
    assert [float(m["value"]) for m in fam if m["labels"]["dataset"] == ds] == \
        [loaded["samples"]]
    assert wait_until(lambda: scraped("robocache_test"), what="the pushed values in Prometheus")
    assert c["read"] == c["cached"] + c["quarantined"] == 7
