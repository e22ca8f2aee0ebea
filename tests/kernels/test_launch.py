"""`CachedLaunch`: the direct relaunch runs only on verified Triton releases; any other release
(simulated here) takes ``kernel[grid](...)`` on every call."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from robocache.kernels import _utils
from robocache.kernels._utils import CachedLaunch, fast_launch_supported, int_type


@pytest.mark.parametrize(("version", "ok"), [
    ("3.6.0", True), ("3.6.1+git8a2b", True), ("3.2.0", False), ("3.7.0", False),
    ("4.0", False), ("unknown", False), ("3", False),
])
def test_fast_launch_supported(version, ok):
    assert fast_launch_supported(version) is ok


class _Compiled:
    packed_metadata = ()


class _Kernel:
    """Stands in for a JITFunction: counts bound launches, returns a compiled-kernel stand-in."""

    def __init__(self):
        self.calls = 0
        self.args = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.calls += 1
            self.args.append(args)
            return _Compiled()
        return launch


@pytest.mark.parametrize("enabled", [True, False], ids=["verified", "unverified"])
def test_relaunch_only_when_enabled(monkeypatch, enabled):
    direct = []
    monkeypatch.setattr(CachedLaunch, "enabled", enabled)
    monkeypatch.setattr(_utils, "_launch_compiled", lambda c, g, a, d: direct.append(a))
    kernel, t = _Kernel(), torch.zeros(4)
    launch = CachedLaunch(kernel, (1,), num_warps=1)
    for _ in range(3):
        launch((t, 4), (t,))
    assert (kernel.calls, len(direct)) == ((1, 2) if enabled else (3, 0))


def test_constants_follow_the_arguments_on_both_paths(monkeypatch):
    direct = []
    monkeypatch.setattr(CachedLaunch, "enabled", True)
    monkeypatch.setattr(_utils, "_launch_compiled", lambda c, g, a, d: direct.append(a))
    kernel, t = _Kernel(), torch.zeros(4)
    launch = CachedLaunch(kernel, (1,), (16, True))
    launch((t, 4), (t,))
    launch((t, 4), (t,))
    assert kernel.args == [(t, 4, 16, True)] and direct == [(t, 4, 16, True)]


def test_misaligned_tensor_takes_the_bound_path(monkeypatch):
    direct = []
    monkeypatch.setattr(CachedLaunch, "enabled", True)
    monkeypatch.setattr(_utils, "_launch_compiled", lambda c, g, a, d: direct.append(a))
    kernel, t = _Kernel(), torch.zeros(8)
    launch = CachedLaunch(kernel, (1,))
    launch((t, 8), (t,))
    launch((t[1:], 7), (t[1:],))  # 4-byte offset: not 16-byte aligned
    assert (kernel.calls, len(direct)) == (2, 0)


def test_unverified_release_is_decided_at_import():
    code = ("import triton; triton.__version__ = '3.2.0'\n"
            "from robocache.kernels._utils import CachedLaunch\n"
            "assert CachedLaunch.enabled is False")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("value,kind", [
    (0, 0), (2**31 - 1, 0), (-(2**31), 0), (2**31, 1), (2**32 - 1, 1), (2**32, 2),
    (2**63 - 1, 2), (-(2**31) - 1, 2), (2**63, 3)])
def test_int_type_follows_tritons_integer_widths(value, kind):
    """i32, u32, i64, u64: the type Triton binds a Python int to (a cached launch's key)."""
    assert int_type(value) == kind


@pytest.mark.gpu
def test_cached_launch_feeds_attached_launch_hooks():
    """Without hooks a cached launch skips building launch metadata; a hook attached later
    (as a profiler attaches one) gets it on the next cached launch."""
    from triton import knobs

    import robocache

    seen = []
    x = torch.randn(64, 7, device="cuda")
    stats = robocache.compute_stats(x.cpu())
    for _ in range(2):  # the second call relaunches the compiled kernel
        robocache.normalize(x, stats)
    knobs.runtime.launch_enter_hook.add(seen.append)
    try:
        robocache.normalize(x, stats)
    finally:
        knobs.runtime.launch_enter_hook.remove(seen.append)
    assert len(seen) == 1 and seen[0] is not None


class _Launcher:
    """Stands in for Triton 3.6's CUDA launcher: ``run(...)`` and the ``launch`` it wraps."""

    def __init__(self, scratch: int):
        self.global_scratch_size, self.profile_scratch_size = scratch, 0
        self.launch_cooperative_grid, self.launch_pdl = False, True
        self.ran, self.launched = [], []

    def __call__(self, *args):
        self.ran.append(args)

    def launch(self, *args):
        self.launched.append(args)


@pytest.mark.parametrize("scratch", [0, 64], ids=["no-scratch", "scratch"])
def test_cached_launch_calls_the_compiled_launch_directly_without_scratch(monkeypatch, scratch):
    """Without scratch to allocate, a cached launch skips the launcher's Python wrapper and
    passes what it would: the cooperative-grid and PDL flags and two null scratch pointers."""
    compiled = _Compiled()
    compiled.run, compiled.function = _Launcher(scratch), "fn"
    compiled.launch_metadata = lambda grid, stream, *args: "meta"
    monkeypatch.setattr(_utils, "_current_stream", lambda: 1234)
    direct = _utils._direct_launcher(compiled)
    assert (direct is None) == bool(scratch)
    _utils._launch_compiled(compiled, (2, 1, 1), ("x", 7), direct)
    run = compiled.run
    if scratch:
        assert run.ran[0][:6] == (2, 1, 1, 1234, "fn", ()) and run.ran[0][-2:] == ("x", 7)
        assert not run.launched
    else:
        assert run.launched[0][:10] == (2, 1, 1, 1234, "fn", False, True, None, None, ())
        assert run.launched[0][-2:] == ("x", 7) and not run.ran


@pytest.mark.gpu
def test_current_stream_is_the_stream_triton_launches_on():
    """A cached launch finds the stream Triton's driver would: the current device's current
    stream, inside a stream context too."""
    from triton.runtime import driver

    def triton_stream():
        drv = driver.active
        return drv.get_current_stream(drv.get_current_device())

    assert _utils._current_stream() == triton_stream()
    with torch.cuda.stream(torch.cuda.Stream()):
        assert _utils._current_stream() == triton_stream() != 0
