"""Optional packages: a missing one is a MissingDependencyError naming the pip command."""

import pytest

from robocache._optional import require
from robocache.errors import MissingDependencyError


def test_require_imports_an_installed_module():
    assert require("json", "data", "Reading JSON").dumps([1]) == "[1]"


def test_require_names_the_package_and_the_extra():
    with pytest.raises(MissingDependencyError, match=r"The Lance cache needs the optional "
                       r"package 'pylance'.*pip install 'robocache\[data\]'"):
        require("robocache_no_such_module", "data", "The Lance cache", "pylance")


def test_require_defaults_to_the_top_level_module_name():
    with pytest.raises(MissingDependencyError, match="'robocache_missing'"):
        require("robocache_missing.sub", "data", "Something")


@pytest.mark.parametrize("blocked,code", [
    ("pyarrow", "from robocache.data.formats import lerobot"),
    ("lance", "from robocache.data import RobotDataset; RobotDataset('data/sample')"),
], ids=["pyarrow-lerobot-reader", "lance-dataset"])
def test_a_missing_data_package_names_the_pip_command(blocked, code):
    """Without the package (blocked from importing), the data path raises one
    MissingDependencyError naming it and `pip install 'robocache[data]'`."""
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.modules[{blocked!r}] = None\n{code}"],
        capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("robocache.errors.MissingDependencyError"), last
    assert "pip install 'robocache[data]'" in last
