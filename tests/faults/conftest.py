"""Fixtures of the fault-injection suite: pristine sources of every format and their clean
caches (built once per session), and the reliability table (``--fault-table PATH``)."""

from __future__ import annotations

import re
from pathlib import Path

import faultlib
import pytest

from robocache.data.cache import build


@pytest.fixture(scope="session")
def pristine(tmp_path_factory):
    """format -> (source path, clean cache path); the sources are never modified."""
    root = tmp_path_factory.mktemp("pristine")
    out = {}
    for kind in faultlib.FORMATS:
        src = faultlib.write_source(kind, root / "src", seed=0)
        clean = root / "clean" / kind
        build(src, clean, rate_hz=faultlib.RATE, device="cpu", progress=False,
              source_options={"fps": faultlib.FPS} if kind in ("zarr", "robomimic") else {})
        out[kind] = (src, clean)
    return out


def pytest_sessionfinish(session):
    path = session.config.getoption("--fault-table", None)
    if not path or not faultlib.ROWS:
        return
    doc = Path(path)
    table = faultlib.table_markdown(faultlib.ROWS)
    text = doc.read_text()
    doc.write_text(re.sub(r"(<!-- fault-table -->\n).*?(<!-- /fault-table -->)",
                          lambda m: m.group(1) + table + m.group(2), text, flags=re.S))
