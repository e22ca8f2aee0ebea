"""How many more bytes this process may really allocate, on the host or on a GPU.

On the host the smallest of: the address-space and data-segment limits (``RLIMIT_AS``,
``RLIMIT_DATA``, e.g. ``ulimit -v``) less what the process already maps; the memory cgroup's
limit (v2 ``memory.max``, v1 ``memory.limit_in_bytes``, on the process's cgroup and its
ancestors) less its usage; and the memory the kernel can still hand out (``MemAvailable`` plus
free swap). On a CUDA device: the free device memory plus what PyTorch's caching allocator
holds unused. Each comes with the name of the limit, for messages.
"""

from __future__ import annotations

import os
import resource
from pathlib import Path

import torch

CGROUP = Path("/sys/fs/cgroup")


def _proc_kib(path: str, field: str) -> int | None:
    """A ``field:  N kB`` line of a /proc file, in bytes."""
    try:
        for line in Path(path).read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def _rlimits() -> list[tuple[int, str]]:
    out = []
    for name, used in (("RLIMIT_AS", "VmSize"), ("RLIMIT_DATA", "VmData")):
        soft = resource.getrlimit(getattr(resource, name))[0]
        if soft != resource.RLIM_INFINITY:
            out.append((soft - (_proc_kib("/proc/self/status", used) or 0), name))
    return out


def cgroup_limits(membership: Path = Path("/proc/self/cgroup"),
                  mount: Path = CGROUP) -> list[tuple[int, str]]:
    """``(limit - usage, file)`` of every memory cgroup limit over this process (its cgroups
    listed in ``membership``, the hierarchy mounted at ``mount``). In a container the listed
    path may not exist under the mount (which then is the container's own cgroup): the walk up
    to the mount finds it."""
    try:
        lines = membership.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        if controllers == "":  # v2: limits on the cgroup and each ancestor
            files, root = ("memory.max", "memory.current"), mount
            if (mount / "unified").is_dir():  # hybrid layout: v2 mounted beside v1
                root = mount / "unified"
        elif "memory" in controllers.split(","):
            files, root = ("memory.limit_in_bytes", "memory.usage_in_bytes"), mount / "memory"
        else:
            continue
        here = root / rel.lstrip("/")
        for d in [here, *here.parents]:
            if d == root.parent:
                break
            limit, used = _read_int(d / files[0]), _read_int(d / files[1])
            if limit is not None and limit < 1 << 60:  # v1 writes ~2^63 for no limit
                out.append((limit - (used or 0), str(d / files[0])))
    return out


def _physical() -> tuple[int, str]:
    avail = _proc_kib("/proc/meminfo", "MemAvailable")
    if avail is None:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"), "free memory"
    return avail + (_proc_kib("/proc/meminfo", "SwapFree") or 0), "available memory and swap"


def available_bytes(device: torch.device) -> tuple[int, str]:
    """``(bytes, what limits them)``: how much more this process may allocate on ``device``
    (see the module docstring); never negative."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        unused = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return free + unused, f"free memory of {device}"
    have, why = min([_physical(), *_rlimits(), *cgroup_limits()])
    return max(0, have), why


# glibc's mallopt parameter for the size from which an allocation is its own mapping
M_MMAP_THRESHOLD = -3
# A batch's buffers (decoded frames, their float copies) from this size on are their own
# mappings, given back to the system when freed. glibc otherwise raises its threshold after
# the first large free and keeps such buffers in the heap: DataLoader workers serving batches
# of 32 two-camera 240x320 float frames grew to 1.0-1.5 GB each within 90 batches; with the
# threshold fixed they stayed at 240-300 MB, at the same samples/s within the 2-core host's
# noise (175-263 against 152-234).
WORKER_MMAP_THRESHOLD = 4 << 20
_HEAP_SET: set[int] = set()


def bound_heap() -> None:
    """In this process (once), keep large freed buffers out of glibc's heap
    (:data:`WORKER_MMAP_THRESHOLD`); a no-op where the C library is not glibc."""
    if os.getpid() in _HEAP_SET:
        return
    _HEAP_SET.add(os.getpid())
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").mallopt(M_MMAP_THRESHOLD, WORKER_MMAP_THRESHOLD)
    except (OSError, AttributeError):  # not glibc: its allocator's own policy stands
        pass
