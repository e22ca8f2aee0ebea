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
