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


def test_the_error_survives_pickling():
    """Raised in a worker process, it reaches the parent whole (not a broken pool)."""
    import pickle

    e = pickle.loads(pickle.dumps(MissingDependencyError("simplejpeg", "data", "Encoding")))
    assert isinstance(e, MissingDependencyError) and "'simplejpeg'" in str(e)


@pytest.mark.parametrize("blocked,code", [
    ("pyarrow", "from robocache.data.formats import lerobot"),
    ("lance", "from robocache.data import RobotDataset; RobotDataset('data/sample')"),
    ("simplejpeg", "import sys; from robocache.data.cache import build; "
     "build('tests/fixtures/lerobot/train', sys.argv[1], progress=False, "
     "camera_codec='jpeg')"),
], ids=["pyarrow-lerobot-reader", "lance-dataset", "simplejpeg-build"])
def test_a_missing_data_package_names_the_pip_command(blocked, code, tmp_path):
    """Without the package (blocked from importing), the data path raises one
    MissingDependencyError naming it and `pip install 'robocache[data]'`."""
    import subprocess
    import sys

    dest = tmp_path / "cache"  # a JPEG build is refused before it writes anything
    run = subprocess.run(
        [sys.executable, "-c", f"import sys; sys.modules[{blocked!r}] = None\n{code}",
         str(dest)], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and not dest.exists()
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("robocache.errors.MissingDependencyError"), last
    assert "pip install 'robocache[data]'" in last


#: Packages a test may use that ``pip install -e ".[dev]"`` does not install.
OUTSIDE_DEV = ("torchvision", "PyNvVideoCodec", "nvidia", "lerobot", "torchcodec",
               "tensorflow", "tensorflow_datasets")
#: What guards an import of one of them in the test (function) that imports it.
GUARDS = ("importorskip(", "find_spec(", "except ImportError", "except ModuleNotFoundError")


def _imports(node, scope=None):
    """Each import under ``node`` and the function it is in (None: the module)."""
    import ast

    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.Import, ast.ImportFrom)):
            yield child, scope
        yield from _imports(child, child if isinstance(
            child, (ast.FunctionDef, ast.AsyncFunctionDef)) else scope)


def test_every_test_importing_a_package_outside_dev_skips_for_it_by_name():
    """An import of a package ``.[dev]`` leaves out sits in a test (or module) that skips
    without it, by name (``pytest.importorskip("torchvision...")``) or checks for it first:
    a GPU machine without the package skips those tests instead of failing them."""
    import ast
    from pathlib import Path

    root = Path(__file__).parent
    bare = []
    for path in sorted(root.rglob("*.py")):
        if "fixtures" in path.parts or path.name == Path(__file__).name:
            continue
        text = path.read_text()
        tree = ast.parse(text)
        for node, scope in _imports(tree):
            source = text if scope is None else ast.get_source_segment(text, scope) or ""
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""]
            for name in names:
                top = name.split(".")[0]
                if top in OUTSIDE_DEV and not any(
                        g in source and (g != "importorskip(" or f'"{top}' in source)
                        for g in GUARDS):
                    bare.append(f"{path.relative_to(root)}:{node.lineno} imports {name}")
    assert not bare, bare
