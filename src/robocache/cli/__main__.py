"""``python -m robocache.cli``: the ``robocache`` command without the console script."""

from robocache.cli import main

main()
