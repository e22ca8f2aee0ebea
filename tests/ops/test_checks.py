"""The shared size check: what this process may allocate (rlimits, cgroups, memory), and the
refusal naming the argument (under a real rlimit: tests/faults/test_bad_input.py)."""

from __future__ import annotations

import pytest
import torch

from robocache import _memory
from robocache.errors import ShapeError
from robocache.ops._checks import CHECKED_BYTES, check_fits


def test_cgroup_limits_v1_v2_and_the_container_walk_up(tmp_path):
    mount = tmp_path / "cgroup"
    v2 = mount / "job" / "step"
    v2.mkdir(parents=True)
    (mount / "job" / "memory.max").write_text(f"{8 << 30}\n")
    (mount / "job" / "memory.current").write_text(f"{3 << 30}\n")
    (v2 / "memory.max").write_text("max\n")  # no limit of its own: the parent's counts
    (v2 / "memory.current").write_text("1\n")
    v1 = mount / "memory"
    v1.mkdir()
    (v1 / "memory.limit_in_bytes").write_text(f"{6 << 30}\n")  # the container's own cgroup
    (v1 / "memory.usage_in_bytes").write_text(f"{1 << 30}\n")
    membership = tmp_path / "cgroup.list"
    membership.write_text("4:memory:/not/mounted/here\n3:cpu:/\n0::/job/step\n")
    got = sorted(_memory.cgroup_limits(membership, mount))
    assert got == sorted([(5 << 30, str(v1 / "memory.limit_in_bytes")),
                          (5 << 30, str(mount / "job" / "memory.max"))])
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert len(_memory.cgroup_limits(membership, mount)) == 1


def test_check_fits_names_the_limit_and_skips_small_requests(monkeypatch):
    monkeypatch.setattr(_memory, "available_bytes", lambda device: (1000, "RLIMIT_DATA"))
    check_fits("op", "a small thing", CHECKED_BYTES - 1, torch.device("cpu"), "fix")
    with pytest.raises(ShapeError, match=r"op: a big thing needs [\d,]+ bytes, more than the 1,000 "
                                         r"bytes .* \(limited by RLIMIT_DATA\); pass less"):
        check_fits("op", "a big thing", CHECKED_BYTES, torch.device("cpu"), "pass less")


@pytest.mark.gpu
def test_cuda_sizes_are_checked_against_the_free_device_memory():
    import robocache

    free, _ = torch.cuda.mem_get_info()
    t = torch.linspace(0, 1, 10, dtype=torch.float64, device="cuda")
    target = torch.zeros(1, dtype=torch.float64, device="cuda").expand(free // 4)
    with pytest.raises(ShapeError, match=r"resample: .*free memory of cuda.*`target_times`"):
        robocache.resample(torch.randn(1, 10, 1, device="cuda"), t, target)
