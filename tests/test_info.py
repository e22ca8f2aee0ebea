"""`robocache info` and the host/version facts behind it (`robocache._env`)."""

from __future__ import annotations

import json
import subprocess
import sys

from typer.testing import CliRunner

from robocache import _env
from robocache.cli import app


def test_info_json_lists_versions_and_extras():
    out = CliRunner().invoke(app, ["info", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["torch"] == _env.versions()["torch"]
    assert set(data["extras"]) == set(_env.OPTIONAL)
    assert data["kernels"] in ("triton (CUDA)", "pytorch reference (CPU)")


def test_info_module_imports_nothing_heavy():
    code = ("import sys, robocache.cli.info\n"
            "heavy = {'torch', 'triton', 'pyarrow', 'lance'} & set(sys.modules)\n"
            "assert not heavy, heavy")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_commit_override(monkeypatch):
    monkeypatch.setenv("ROBOCACHE_COMMIT", "abc123")
    assert _env.git_commit() == "abc123"
