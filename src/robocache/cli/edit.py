"""``robocache edit``: delete or keep episodes, merge caches, rename tasks, split, statistics.

    $ robocache edit /data/droid.cache --delete 3,17,40-45
    $ robocache edit /data/droid.cache --drop-flagged audit.json --drop-flag jump
    $ robocache edit /data/droid.cache --rename-task "=unknown task" --split 0.05 --seed 1
    $ robocache edit /data/lab.cache --merge /data/lab-2025.cache --merge /data/sim.cache
    $ robocache inspect /data/droid.cache --versions

No frame is rewritten: deletions are Lance deletions, a task rename updates the rows of
``data.lance`` that carry it, a split is recorded in the manifest, a merged cache's rows and
frames are appended (copied from its directory); statistics are computed again from the rows
there are. Each edit is a new version of the cache (``inspect --versions``
lists them; ``RobotDataset(cache, version=n)`` serves an older one). See docs/curation.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from robocache.cli._errors import VERBOSE_OPTION_HELP, CommandError, cli_errors


def edit(
    cache: Annotated[Path, typer.Argument(help="The RoboCache cache to edit (a local "
                                               "directory).")],
    delete: Annotated[str, typer.Option(help="Episodes to delete: 3,5,10-20.")] = None,
    keep: Annotated[str, typer.Option(help="Delete every episode but these: 3,5,10-20.")]
    = None,
    drop_flagged: Annotated[Path, typer.Option(help="Delete the episodes this audit report "
                                                    "(robocache audit --json) flags.")] = None,
    drop_flag: Annotated[list[str], typer.Option(help="--drop-flagged: only episodes with "
                                                      "this flag (repeat; default any).")]
    = None,
    merge: Annotated[list[Path], typer.Option("--merge", help="Append the episodes of another "
                                              "cache of the same rate and schema (repeat); "
                                              "they are renumbered after this cache's.")]
    = None,
    rename_task: Annotated[list[str], typer.Option(help="OLD=NEW: rename a task (repeat; "
                                                        "'=NEW' names the empty task).")]
    = None,
    split: Annotated[float, typer.Option(help="Record a train/val split by episode: this "
                                              "fraction goes to val.")] = None,
    seed: Annotated[int, typer.Option(help="--split: the seed.")] = 0,
    recompute_stats: Annotated[bool, typer.Option("--recompute-stats", help="Compute the "
                                                  "statistics again (done anyway after a "
                                                  "deletion).")] = False,
    force: Annotated[bool, typer.Option("--force", help="Allow deleting every episode.")]
    = False,
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the cache's current writer "
                                                      "(an ingest or another edit) instead of "
                                                      "failing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the new version's summary as "
                                                         "JSON.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", help=VERBOSE_OPTION_HELP)] = False,
):
    """Edit a cache without rewriting its frames; each edit is a new version of the cache.

    Exit codes: 0 edited (the new version is current); 2 bad usage or input, the cache busy
    with another writer, deleting every episode without --force (one line on stderr: the
    problem and the fix; the cache is unchanged); 1 internal error (--verbose shows the
    traceback); 130 interrupted, 143 terminated (the previous version stays current).
    """
    from robocache.data.edit import Edit, describe, parse_episodes
    from robocache.data.edit import edit as run

    with cli_errors(verbose):
        chosen = [x for x in (delete, keep, drop_flagged) if x is not None]
        if len(chosen) > 1:
            raise CommandError("--delete, --keep and --drop-flagged each choose the episodes "
                               "to delete", "pass one of them")
        if drop_flag and drop_flagged is None:
            raise CommandError("--drop-flag selects flags of --drop-flagged's report",
                               "pass --drop-flagged REPORT too")
        renames = {}
        for item in rename_task or []:
            old, sep, new = item.partition("=")
            if not sep:
                raise CommandError(f"--rename-task {item!r} is not OLD=NEW",
                                   "pass e.g. --rename-task 'pick cube=pick the cube'")
            renames[old] = new
        doomed = parse_episodes(delete) if delete is not None else None
        if drop_flagged is not None:
            from robocache.data.audit import flagged
            from robocache.data.location import Location

            cached = {int(e["index"]) for e in Location(cache).manifest()["episodes"]}
            # (a report also lists the episodes the build quarantined: not in the cache)
            doomed = sorted(flagged(drop_flagged, drop_flag or None) & cached)
            if not doomed and not (renames or split is not None or recompute_stats):
                raise CommandError(f"{drop_flagged} flags no episode"
                                   + (f" with {', '.join(drop_flag)}" if drop_flag else ""),
                                   "nothing to delete")
            doomed = doomed or None
        change = Edit(delete=doomed, keep=parse_episodes(keep) if keep is not None else None,
                      merge=list(merge or []), rename_tasks=renames, split=split, seed=seed,
                      recompute_stats=recompute_stats, force=force)
        manifest = run(cache, change, wait=wait, log=lambda msg: typer.echo(msg, err=True))
    summary = {"cache": str(cache), "version": manifest["version"],
               "episodes": manifest["counts"]["cached"], "rows": manifest["counts"]["rows"],
               "edit": manifest["edit"], "splits": {k: len(v) for k, v in
                                                    (manifest.get("splits") or {}).items()}}
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
    else:
        typer.echo(f"{cache}: {describe(manifest)}")
