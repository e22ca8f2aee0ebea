"""LeRobot's training entry point (``lerobot-train``) with RoboCache serving the dataset.

    $ python -m robocache.lerobot_train --dataset.repo_id=user/pusht --policy.type=act \\
          --robocache.camera_codec=jpeg ...

The one change from LeRobot: ``python -m robocache.lerobot_train`` instead of
``lerobot-train``, in LeRobot's own environment with robocache installed. Every argument is
``lerobot-train``'s, plus ``--robocache.camera_codec=auto|jpeg|png|video`` (how video frames are
stored in the cache: ``auto``, the default, keeps the videos' packets, about their bytes, and
decodes each batch's frames from them, exactly the frames LeRobot decodes, NVDEC on a GPU for
H.264/HEVC and CPU threads for AV1; ``jpeg`` decodes them once into JPEG frames, the fastest to
serve at many times the bytes; ``png`` lossless frames), ``--robocache.camera_quality=1..100``
and ``--robocache.camera_chroma=444|422|420`` (JPEG's; ``420`` and a lower quality: the
smallest cache) and ``--robocache.cache=DIR`` (the cache directory; default
:func:`robocache.data.lerobot_dataset.default_cache_dir`). Batches
are gathered in LeRobot's DataLoader workers (``__getitems__``: one gather per batch) and
moved to the GPU by LeRobot's loop. LeRobot's dataset factory then builds
:class:`robocache.LeRobotDataset` where it built its own, and LeRobot's training loop
(sampler, DataLoader, policy, optimizer, logging, checkpoints) runs unchanged.

In Python, :func:`use_robocache` does the same before calling LeRobot's ``train``.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

_OPTIONS = ("camera_codec", "camera_quality", "camera_chroma", "cache")


def _lerobot(module: str) -> ModuleType:
    """Import LeRobot's ``module``, or fail with how to install LeRobot."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ImportError(f"robocache.lerobot_train runs LeRobot's training, and {module} does "
                          f"not import ({e}); install LeRobot (Python >= 3.12): pip install "
                          "'lerobot[training]==0.6.1', and robocache in the same "
                          "environment.") from e


def use_robocache(**options: Any) -> None:
    """Make LeRobot's dataset factory (``lerobot.datasets.factory``, what ``lerobot-train``
    builds its datasets with) build :class:`robocache.LeRobotDataset` with ``options``
    (``camera_codec``, ``camera_quality``, ``camera_chroma``, ``cache``: its keyword
    arguments).

    Raises:
        TypeError: an option other than those.
        ImportError: LeRobot is not installed (the message says how to install it).
    """
    from robocache.data.lerobot_dataset import LeRobotDataset

    bad = sorted(set(options) - set(_OPTIONS))
    if bad:
        raise TypeError(f"unknown RoboCache options {bad}; known: {list(_OPTIONS)}.")
    factory = _lerobot("lerobot.datasets.factory")
    factory.LeRobotDataset = functools.partial(LeRobotDataset, **options)


def split_argv(argv: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """``--robocache.NAME=VALUE`` options (as a dict; ``camera_quality`` an int) and the other
    arguments, in order.

    Raises:
        SystemExit: an unknown ``--robocache.`` option, one without ``=VALUE``, a
            ``camera_codec`` not among the accepted ones or a ``camera_quality`` that is not
            an integer (exit code 2, one line naming it).
    """
    options, rest = {}, []
    for arg in argv:
        if not arg.startswith("--robocache."):
            rest.append(arg)
            continue
        name, eq, value = arg[len("--robocache."):].partition("=")
        if name not in _OPTIONS or not eq:
            raise SystemExit(f"error: {arg!r}: use --robocache.NAME=VALUE with NAME one of "
                             f"{', '.join(_OPTIONS)}.")
        if name == "camera_codec":
            from robocache.data.build.config import check_camera_codec
            from robocache.errors import DataError

            try:
                check_camera_codec(value, "--robocache.camera_codec")
            except DataError as e:
                raise SystemExit(f"error: {e}") from None
        if name == "camera_quality":
            if not value.isdigit():
                raise SystemExit(f"error: {arg!r}: camera_quality must be an integer in "
                                 "[1, 100], e.g. --robocache.camera_quality=90.")
            value = int(value)
        options[name] = value
    return options, rest


def main(argv: Sequence[str] | None = None) -> None:
    """``lerobot-train`` with :func:`use_robocache` (arguments: see the module docstring)."""
    options, rest = split_argv(sys.argv[1:] if argv is None else argv)
    use_robocache(**options)
    train = _lerobot("lerobot.scripts.lerobot_train")
    sys.argv = [sys.argv[0], *rest]
    train.main()


if __name__ == "__main__":
    main()
