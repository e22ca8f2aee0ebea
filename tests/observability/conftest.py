"""Fixtures: the bundled sample under a unique name, an exporter on a free loopback port."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client", reason="metrics need the `metrics` extra")


@pytest.fixture(scope="session")
def _sample(tmp_path_factory):
    from robocache.data.sample import sample_path, write_sample

    bundled = sample_path()
    if (bundled / "meta" / "info.json").exists():
        return bundled
    return write_sample(tmp_path_factory.mktemp("sample") / "panda")


@pytest.fixture
def sample_source(_sample, tmp_path):
    """The bundled sample, copied under a name unique to this test (its ``dataset`` label)."""
    return Path(shutil.copytree(_sample, tmp_path / f"sample_{uuid.uuid4().hex[:8]}"))


@pytest.fixture
def exporter():
    """Metrics on, an exporter on a free loopback port; stopped afterwards."""
    from robocache.observability import metrics, start_exporter

    server = start_exporter(0, "127.0.0.1")
    yield server
    server.shutdown()
    server.server_close()
    metrics.disable()
