"""Scraping helpers of the observability tests."""

from __future__ import annotations

import socket
import urllib.request


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
