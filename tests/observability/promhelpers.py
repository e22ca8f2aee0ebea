"""Scraping helpers of the observability tests."""

from __future__ import annotations

import socket
import urllib.request

from robocache.data import RobotDataset, RobotLoader
from robocache.data.cache import build
from robocache.observability.metrics import loader_summary


def scrape(port: int) -> dict[str, float]:
    """``name{labels}`` -> value of every ``robocache_`` sample the exporter on ``port`` serves."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {sample_key(s.name, s.labels): s.value
            for fam in text_string_to_metric_families(text) if fam.name.startswith("robocache")
            for s in fam.samples}


def sample_key(name: str, labels: dict[str, str]) -> str:
    return name + "{" + ",".join(f"{k}={labels[k]}" for k in sorted(labels)) + "}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_observed(source, dest, workers: int, batches_per_scrape=None, port=None):
    """Ingest ``source`` (plus a missing episode: one quarantine), serve one epoch; returns the
    manifest, the loader summary and the scrapes taken while iterating."""
    manifest = build(source, dest, rate_hz=50, device="cpu", progress=False,
                     episodes=[0, 1, 2, 3, 4, 5, 99])
    loader = RobotLoader(RobotDataset(dest, history=2, horizon=16), 64, device="cpu",
                         num_workers=workers)
    scrapes = []
    for i, _batch in enumerate(loader):
        if port is not None and i % batches_per_scrape == 0:
            scrapes.append(scrape(port))
    return manifest, loader_summary(source.name)[f"{source.name}/0"], scrapes
