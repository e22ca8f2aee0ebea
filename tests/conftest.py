"""Test configuration: GPU marker, Triton's CPU interpreter when there is no CUDA device, and
one seed per test.

Kernel tests run the Triton launchers on ``kernel_device``: CUDA when present, otherwise CPU
tensors through ``TRITON_INTERPRET=1`` (set here before any kernel module is imported).

Every test gets a seed (fresh per test, or ``--seed N`` for all): it seeds torch, NumPy's and
Python's global generators and ``helpers.seeded()``; a failing test prints it with the command
that replays it.
"""

from __future__ import annotations

import os
import random
import secrets
import tempfile

import helpers
import numpy as np
import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
# served indexes (robocache.data.served) of this session's caches: in a folder of its own,
# never the user's ~/.cache
os.environ.setdefault("ROBOCACHE_SERVE_DIR", tempfile.mkdtemp(prefix="robocache-serve-"))
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_addoption(parser):
    parser.addoption("--seed", type=int, default=None,
                     help="Seed of every random test (default: a fresh one per test, printed "
                          "when a test fails).")
    parser.addoption("--fault-table", default=None, metavar="PATH",
                     help="Write the fault-injection cases' table into PATH (between its "
                          "<!-- fault-table --> markers).")


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def pytest_make_parametrize_id(config, val, argname):
    """Readable test ids: dtypes by name (``float32``), shapes and tensors as ``3x5``, keyword
    dicts as ``k=v,...``, argument tuples by their parts; anything else as pytest writes it."""
    return _id(val)


def _id(val, depth: int = 0) -> str | None:
    if isinstance(val, torch.dtype):
        return str(val).removeprefix("torch.")
    if isinstance(val, torch.Tensor):
        return "x".join(map(str, val.shape)) or "scalar"
    if isinstance(val, (tuple, list, torch.Size)) and depth < 2:
        if val and all(isinstance(v, int) and not isinstance(v, bool) for v in val):
            return "x".join(map(str, val))
        parts = [_id(v, depth + 1) or _plain(v) for v in val]
        return ",".join(parts) if parts else "none"
    if isinstance(val, dict) and depth < 2:
        return ",".join(f"{k}={_id(v, depth + 1) or _plain(v)}" for k, v in val.items()) or "none"
    return None


def _plain(val) -> str:
    if callable(val):
        return getattr(val, "__name__", type(val).__name__)
    text = str(val)
    return text if len(text) <= 24 else text[:21] + "..."


@pytest.fixture
def kernel_device() -> str:
    """Where Triton kernels run in this session: 'cuda', or 'cpu' through the interpreter."""
    return "cuda" if HAS_CUDA else "cpu"


@pytest.fixture(autouse=True)
def seed(request) -> int:
    """This test's seed: ``--seed`` or a fresh one; all the test's randomness derives from it."""
    value = request.config.getoption("--seed")
    value = secrets.randbits(32) if value is None else value
    request.node.user_properties.append(("seed", value))
    helpers.use_seed(value)
    torch.manual_seed(value)
    np.random.seed(value)
    random.seed(value)
    return value


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.failed:
        value = dict(item.user_properties).get("seed")
        if value is not None:
            report.sections.append(("seed", f"seed {value}: replay with "
                                            f"pytest --seed {value} '{item.nodeid}'"))
    return report


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """The session's S3 server (skipped where moto is not installed)."""
    from s3server import S3Server

    server = S3Server(tmp_path_factory.mktemp("s3") / "moto.log")
    yield server
    server.stop()
