"""Test configuration: GPU marker, and Triton's CPU interpreter when there is no CUDA device.

Kernel tests run the Triton launchers on ``kernel_device``: CUDA when present, otherwise CPU
tensors through ``TRITON_INTERPRET=1`` (set here before any kernel module is imported).
"""

from __future__ import annotations

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
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


@pytest.fixture
def kernel_device() -> str:
    """Where Triton kernels run in this session: 'cuda', or 'cpu' through the interpreter."""
    return "cuda" if HAS_CUDA else "cpu"
