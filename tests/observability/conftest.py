"""Fixtures: the bundled sample under a unique name, an exporter on a free loopback port."""

from __future__ import annotations

import uuid

import pytest

pytest.importorskip("prometheus_client", reason="metrics need the `metrics` extra")


@pytest.fixture
def sample_source(tmp_path):
    """The bundled sample, written under a name unique to this test (its ``dataset`` label)."""
    from robocache.data.sample import write_sample

    return write_sample(tmp_path / f"sample_{uuid.uuid4().hex[:8]}")


@pytest.fixture
def exporter():
    """Metrics on, an exporter on a free loopback port; stopped afterwards."""
    from robocache.observability import metrics, start_exporter

    server = start_exporter(0, "127.0.0.1")
    yield server
    server.shutdown()
    server.server_close()
    metrics.disable()
