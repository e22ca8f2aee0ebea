"""Optional packages: imported where a feature needs them, with the pip command when missing."""

from __future__ import annotations

import importlib
from types import ModuleType

from robocache.errors import MissingDependencyError


def require(module: str, extra: str, feature: str, package: str | None = None) -> ModuleType:
    """Import `module` for `feature`, or raise `MissingDependencyError` naming `package`
    (default: the module's top-level name) and the ``robocache[extra]`` that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingDependencyError(package or module.split(".")[0], extra, feature) from e
