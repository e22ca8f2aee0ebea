"""Facts about this host and its software: versions, CPU, the checkout's commit.

One home for what `robocache info`, `robocache doctor` and the benchmark metadata report.
Standard library only at import, so `robocache info` stays light; `versions` imports torch.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

# Optional packages the extras install (`robocache info` lists which are present).
OPTIONAL = ("pyarrow", "pylance", "zarr", "h5py", "pillow", "av", "ray", "prometheus-client",
            "nvidia-ml-py", "matplotlib", "scipy")


def dist_version(dist: str) -> str | None:
    """Installed version of the distribution `dist`, or None."""
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def cpu_model() -> str:
    """The CPU's marketing name (/proc/cpuinfo on Linux)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def host() -> dict[str, Any]:
    """Host name, platform, CPU model, logical and usable cores, memory."""
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu_model": cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "memory_bytes": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        if hasattr(os, "sysconf") else None,
    }


def versions() -> dict[str, Any]:
    """Python, RoboCache, torch, its CUDA runtime and Triton versions (imports torch)."""
    import torch

    import robocache

    return {"python": platform.python_version(), "robocache": robocache.__version__,
            "torch": torch.__version__, "cuda_runtime": torch.version.cuda,
            "triton": dist_version("triton")}


def git_commit() -> str | None:
    """The checkout's commit; ``ROBOCACHE_COMMIT`` names it where the tree was copied without
    its history."""
    if os.environ.get("ROBOCACHE_COMMIT"):
        return os.environ["ROBOCACHE_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                             timeout=5, cwd=Path(__file__).resolve().parent)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None
