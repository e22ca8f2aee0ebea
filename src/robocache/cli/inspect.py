"""``robocache inspect``: what a dataset (or a RoboCache cache) holds.

    $ robocache inspect data/sample/panda_multirate
    $ robocache inspect /tmp/panda.cache --json
    $ robocache inspect /tmp/panda.cache --plot episode0.png --plot-episode 0

For a source dataset: format, episodes, and per stream its kind, dtype, shape, declared rate,
the rate measured from its timestamps (median interval) and the samples read, over the first
``--episodes`` episodes. For a cache: its manifest summary; a cache may be in an object store
(``s3://BUCKET/PREFIX``, ``gs://``, ``az://``; settings with ``--storage-option KEY=VALUE`` or
the standard environment variables). ``--plot FILE.png`` also draws one episode's streams on
one time axis, before and after alignment (see docs/view.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from robocache.cli._errors import (
    VERBOSE_OPTION_HELP,
    CommandError,
    cache_argument,
    cli_errors,
    storage_option_flag,
    storage_options,
)


def _summarize_cache(location, shown: str) -> dict:
    """The manifest summary of the cache at ``location`` (a
    :class:`~robocache.data.location.Location`, named ``shown``); for an unfinished one
    (building, or killed while building), who is writing it (``None`` in an object store,
    which has no lock file) and the episodes committed so far."""
    import numpy as np

    from robocache.data.lock import holder

    manifest = location.manifest()
    facts = {"cache": shown, "status": manifest.get("status", "unknown"),
             **{k: manifest.get(k) for k in ("source", "rate_hz", "streams", "timing")},
             "quarantined": manifest.get("quarantined", [])}
    if facts["status"] == "complete":
        return {**facts, "counts": manifest["counts"], "cameras": _cameras(location, manifest)}
    done: set[int] = set()
    try:
        data = location.lance("data.lance")
    except FileNotFoundError:  # nothing committed yet
        data = None
    if data is not None:  # its one small column, a batch at a time
        with location.reading("data.lance"):
            for batch in data.to_batches(columns=["episode_index"], batch_size=1 << 16):
                done.update(np.unique(batch.column(0).to_numpy()).tolist())
    writer = holder(location.path) if location.path is not None else None
    return {**facts, "writer": writer, "episodes_cached": len(done)}


def _cameras(location, manifest: dict) -> dict:
    """Per camera stream: frames, codec, cache bytes per frame (on disk, index columns
    included) and the decoded bytes per frame (from the tables' metadata: no frame read)."""
    import numpy as np


    out = {}
    for name, s in manifest.get("streams", {}).items():
        if s["kind"] not in ("image", "video"):
            continue
        rel = f"frames/{name}.lance"
        try:
            ds = location.lance(rel)
        except FileNotFoundError:
            continue
        with location.reading(rel):
            frames = ds.count_rows()
            nbytes = sum(f.bytes_on_disk for f in ds.stats.data_stats().fields)
        out[name] = {"frames": frames, "codec": s.get("codec"), "quality": s.get("quality"),
                     "chroma": s.get("chroma"), "bytes_per_frame": nbytes / max(frames, 1),
                     "decoded_bytes_per_frame": int(np.prod(s["shape"]))
                     * np.dtype(s["dtype"]).itemsize}
    return out


def summarize(path: str | Path, episodes: int = 5, fps: float | None = None,
              split: str | None = None,
              storage_options: dict[str, Any] | None = None) -> dict:
    """The facts ``inspect`` prints, as a dict (reads at most ``episodes`` episodes).

    ``path`` is a dataset or a cache directory, or an object-store URI of a cache
    (``s3://BUCKET/PREFIX``: read with ``storage_options``, Lance's key names)."""
    import numpy as np

    from robocache.cli.ingest import source_options
    from robocache.data.cache import is_cache
    from robocache.data.formats import open_source
    from robocache.data.location import Location

    if isinstance(path, str) and "://" in path:  # only a cache lives in an object store
        return _summarize_cache(Location(path, storage_options), path)
    path = Path(path)
    if is_cache(path):
        return _summarize_cache(Location(path), str(path))
    src = open_source(path, **source_options(fps=fps, split=split))
    indices = src.episode_indices()
    read, unreadable = [], []
    # a source that cannot time its episodes (RLDS without --fps) lists its features only
    for i in indices[:0 if getattr(src, "rate_error", None) else episodes]:
        try:
            read.append(src.read(i))
        except Exception as e:  # a corrupt episode is reported, the others still inspected
            unreadable.append({"index": i, "reason": f"{type(e).__name__}: {e}"})
    streams = {}
    for name, spec in src.specs.items():
        intervals = [np.diff(ep.streams[name].times) for ep in read if name in ep.streams]
        intervals = np.concatenate(intervals) if intervals else np.zeros(0)
        measured = 1.0 / float(np.median(intervals)) if intervals.size and \
            np.median(intervals) > 0 else None
        streams[name] = {"kind": spec.kind, "dtype": spec.dtype, "shape": list(spec.shape),
                         "rate_hz": spec.rate_hz, "measured_hz": measured,
                         "samples": int(sum(len(ep.streams[name]) for ep in read
                                            if name in ep.streams))}
    durations = [ep.end - ep.start for ep in read]
    return {"path": str(path), "format": src.format, "episodes": len(indices),
            "timing": getattr(src, "timing", None), "inspected": len(read),
            "unreadable": unreadable, "duration_s": {
                "min": min(durations, default=0.0), "max": max(durations, default=0.0),
                "mean": float(np.mean(durations)) if durations else 0.0},
            "steps_inspected": sum(int(ep.meta.get("length", 0)) for ep in read),
            "tasks": sorted({t for ep in read for t in ep.meta.get("tasks", [])}),
            "streams": streams, **(src.describe() if hasattr(src, "describe") else {})}


def _print_cache(console, facts: dict) -> None:
    from robocache.data.lock import describe_holder

    source = f"{facts['source']['path']} ({facts['source']['format']})"
    head = f"[bold]{facts['cache']}[/]: RoboCache cache of {source} at {facts['rate_hz']} Hz"
    if facts["status"] == "complete":
        c = facts["counts"]
        console.print(f"{head} — {c['cached']} episodes, {c['rows']} steps, "
                      f"{c['quarantined']} quarantined")
    else:
        if facts["writer"] is not None:
            state = f"being built by {describe_holder(facts['writer'])}"
        elif "://" in facts["cache"]:  # an object store keeps no lock: no writer is known
            state = ("unfinished (a build may be at work elsewhere; if it was interrupted, "
                     "re-run the same ingest to resume it)")
        else:
            state = "unfinished (the build was interrupted; re-run the same ingest to resume it)"
        console.print(f"{head} — [yellow]{state}[/]: {facts['episodes_cached']} episodes cached "
                      f"so far, {len(facts['quarantined'])} quarantined")
    if facts.get("timing"):
        console.print(f"timing: {facts['timing']}")
    for name, c in facts.get("cameras", {}).items():
        stored = f"{c['codec']} q{c['quality']} {c['chroma']}" if c.get("chroma") \
            else c["codec"]
        console.print(f"camera {name}: {c['frames']} frames, {stored}, "
                      f"{c['bytes_per_frame']:,.0f} cache bytes per frame "
                      f"({c['decoded_bytes_per_frame']:,} decoded)")
    for q in facts["quarantined"]:
        console.print(f"  quarantined episode {q['index']}: {q['reason']}")


def _print_topics(console, facts: dict) -> None:
    """ROS bags: each topic of the episodes read with its type, messages, rate and the
    streams it maps to (or why it is not read); the folder's files that are not bags."""
    from rich.table import Table

    from robocache._console import print_table

    table = Table(title=f"topics of the {facts['inspected']} episodes read")
    for col in ("topic", "type", "messages", "Hz", "maps to"):
        table.add_column(col, justify="right" if col in ("messages", "Hz") else "left")
    for topic, t in sorted(facts["topics"].items()):
        names = t["streams"]
        maps = (", ".join(names[:4]) + (f", ... ({len(names)} streams)" if len(names) > 4
                                         else "")) if names else \
            f"[yellow]not read[/]: {t['not_read'] or 'no samples'}"
        table.add_row(topic, t["type"], str(t["messages"]),
                      "—" if t["rate_hz"] is None else f"{t['rate_hz']:.1f}", maps)
    print_table(table, console)
    for f in facts.get("not_bags", []):
        console.print(f"[yellow]not a bag[/] (not read): {f}")


def _versions(where, options) -> list[dict]:
    """The cache's versions (:func:`robocache.data.versions.history`)."""
    from robocache.data.location import Location
    from robocache.data.versions import history

    location = Location(where, options)
    return history(location, location.manifest())


def _filtered(where, options, keep_ranges, episode_keys, report, drop_flags) -> dict:
    """What RobotDataset serves of the cache at ``where`` with these filters: episodes, steps
    and segments (each kept range of an episode is one), from the manifest and the files."""
    from robocache.data import snapshot
    from robocache.data.filters import keep_ranges as read_ranges
    from robocache.data.filters import without_flagged
    from robocache.data.location import Location

    location = Location(where, options)
    manifest = snapshot.servable(location, location.manifest())
    rows = {int(e["index"]): int(e["rows"]) for e in manifest["episodes"]}
    chosen, ranges = sorted(rows), {}
    if keep_ranges is not None:
        chosen, ranges = read_ranges(keep_ranges, manifest, episode_keys)
    if report is not None:
        chosen = without_flagged(chosen, report, drop_flags or None)
    kept = {e: ranges.get(e, [(0, rows[e])]) for e in chosen}
    return {"episodes": len(kept), "of_episodes": len(rows),
            "steps": sum(b - a for r in kept.values() for a, b in r),
            "of_steps": sum(rows.values()), "segments": sum(len(r) for r in kept.values())}


def _window(text: str | None) -> tuple[float, float] | None:
    if text is None:
        return None
    start, sep, end = text.partition(":")
    try:
        if sep:
            return float(start), float(end)
    except ValueError:
        pass
    raise CommandError(f"--plot-window must be START:END in seconds; got {text!r}",
                       "pass e.g. --plot-window 2.0:2.5")


def _plot(path: str | Path, out: Path, episode: int | None, rate: str | None,
          window: str | None, fps: float | None, split: str | None,
          storage_options: dict[str, str] | None = None) -> str:
    """Draw the episode into ``out`` (a .png outside ``path``); returns the file written."""
    from robocache.cli.ingest import source_options
    from robocache.view.episodes import open_view
    from robocache.view.plot import plot_episode

    if out.suffix.lower() != ".png":
        raise CommandError(f"--plot must name a .png file; got {out}", "pass e.g. --plot ep.png")
    if isinstance(path, Path) and out.resolve().is_relative_to(path.resolve()):
        raise CommandError(f"--plot {out} lies inside {path}, which is never written",
                           "write the picture elsewhere")
    zoom = _window(window)
    opened = open_view(path, rate=rate, storage_options=storage_options,
                       **source_options(fps=fps, split=split))
    index = episode if episode is not None else (opened.episodes or [None])[0]
    if index is None and opened.unfinished:
        from robocache.view.episodes import RESUME

        raise CommandError(f"{path} is an unfinished cache: its ingest stopped (or is still "
                           "running) before any episode was committed", RESUME)
    if index is None:
        raise CommandError(f"{path} has no episode to plot", "ingest or fix the dataset")
    return str(plot_episode(opened, opened.episode(index), out, window=zoom))


def inspect(
    path: str = typer.Argument(..., help="Dataset directory/file, or a RoboCache cache (a "
                               "directory, or s3://BUCKET/PREFIX, gs://, az://)."),
    episodes: int = typer.Option(5, help="Episodes to read for measured rates and durations."),
    fps: float = typer.Option(None, help="Rate of sources without timestamps (zarr, HDF5, "
                              "RLDS)."),
    split: str = typer.Option(None, help="RLDS split: train, val, train[:95%], train[:10]+val."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
    plot: Path = typer.Option(None, "--plot", help="Also draw one episode's streams on one "
                              "time axis, native and aligned, into this .png file."),
    plot_episode: int = typer.Option(None, "--plot-episode", help="--plot: the episode "
                                     "(default: the first)."),
    plot_rate: str = typer.Option(None, "--plot-rate", help="--plot of a source: align it to "
                                  "this rate (Hz, or 'native') on the CPU, as ingest would."),
    plot_window: str = typer.Option(None, "--plot-window", help="--plot: the zoom, START:END "
                                    "seconds (default: 24 grid steps around the first event)."),
    keep_ranges: Path = typer.Option(None, "--keep-ranges", help="A cache: also say what a "
                                     "keep-ranges file (openpi's DROID format or RoboCache's) "
                                     "leaves to serve."),
    episode_keys: Path = typer.Option(None, "--episode-keys", help="--keep-ranges: a JSON "
                                      "mapping of the file's episode names to the cache's "
                                      "episode indices."),
    audit_report: Path = typer.Option(None, "--audit", help="A cache: also say what serving "
                                      "without the episodes this audit report flags leaves."),
    drop_flags: list[str] = typer.Option(None, "--drop-flag", help="--audit: drop only "
                                         "episodes with this flag (repeat; default any)."),
    versions: bool = typer.Option(False, "--versions", help="A cache: also list its "
                                  "versions (one per robocache edit)."),
    storage_option: list[str] = storage_option_flag(),
    verbose: bool = typer.Option(False, "--verbose", help=VERBOSE_OPTION_HELP),
):
    """Print what a dataset holds: episodes, streams, rates, shapes, durations; with --plot,
    also draw one episode's streams, native and aligned, on one time axis; with --keep-ranges
    or --audit, what a RobotDataset opened with those filters serves.

    Exit codes: 0 success;
    2 bad usage or input (one line on stderr: the problem and the fix);
    1 internal error (--verbose shows the traceback); 130 interrupted, 143 terminated.
    """
    from rich.table import Table

    from robocache._console import console as make_console
    from robocache._console import print_table

    with cli_errors(verbose):
        if episodes < 1:
            raise CommandError(f"--episodes must be >= 1; got {episodes}",
                               "pass the number of episodes to read, e.g. --episodes 5")
        where, options = cache_argument(path), storage_options(storage_option)
        facts = summarize(where, episodes, fps, split, options)
        if keep_ranges is not None or audit_report is not None:
            if "cache" not in facts:
                raise CommandError("--keep-ranges and --audit filter a cache, and "
                                   f"{path} is a source", "ingest it first, then inspect the "
                                   "cache")
            facts["filter"] = _filtered(where, options, keep_ranges, episode_keys,
                                        audit_report, drop_flags)
        if versions:
            if "cache" not in facts:
                raise CommandError(f"--versions lists a cache's versions, and {path} is a "
                                   "source", "pass a cache")
            facts["versions"] = _versions(where, options)
        if keep_ranges is None and audit_report is None and (
                episode_keys is not None or drop_flags):
            raise CommandError("--episode-keys goes with --keep-ranges and --drop-flag with "
                               "--audit", "pass the filter they belong to")
        if plot is not None:
            facts["plot"] = _plot(where, plot, plot_episode, plot_rate, plot_window, fps, split,
                                  options)
    if as_json:
        typer.echo(json.dumps(facts, indent=2))
        return
    console = make_console()
    if "plot" in facts:
        console.print(f"plot: {facts['plot']}")
    if "cache" in facts:
        _print_cache(console, facts)
        for v in facts.get("versions", []):
            from robocache.data.edit import _op

            what = "; ".join(_op(o) for o in v["edit"] or []) or "as built"
            mark = " (current)" if v["current"] else ""
            console.print(f"version {v['version']}{mark}: {v['episodes']} episodes, "
                          f"{v['rows']:,} steps, {v['created']}: {what}")
        if "filter" in facts:
            f = facts["filter"]
            console.print(f"filtered: {f['episodes']} of {f['of_episodes']} episodes, "
                          f"{f['steps']:,} of {f['of_steps']:,} steps served, in "
                          f"{f['segments']} segments (windows never cross a cut)")
        return
    d = facts["duration_s"]
    console.print(f"[bold]{facts['path']}[/]: {facts['format']}, {facts['episodes']} episodes "
                  f"(first {facts['inspected']} read: {d['min']:.2f}–{d['max']:.2f} s long)")
    console.print(f"timing: {facts['timing']}")
    for q in facts["unreadable"]:
        console.print(f"[yellow]unreadable[/] episode {q['index']}: {q['reason']}")
    table = Table()
    for col in ("stream", "kind", "dtype", "shape", "declared Hz", "measured Hz", "samples"):
        table.add_column(col, justify="right" if "Hz" in col or col == "samples" else "left")
    for name, s in facts["streams"].items():
        fmt = lambda v: "—" if v is None else f"{v:.1f}"
        table.add_row(name, s["kind"], s["dtype"], str(tuple(s["shape"])), fmt(s["rate_hz"]),
                      fmt(s["measured_hz"]), str(s["samples"]))
    print_table(table, console)
    if "splits" in facts:  # RLDS / TFDS: the feature tree, splits and shards
        console.print(f"split {facts['split']!r}: {facts['selected_episodes']} episodes; "
                      f"{facts['steps_inspected']} steps in the {facts['inspected']} read")
        for name, sp in facts["splits"].items():
            console.print(f"  split {name}: {sp['episodes']} episodes, {len(sp['shards'])} "
                          f"shards, {sp['bytes'] / 1e6:.1f} MB ({', '.join(sp['shards'][:3])}"
                          f"{', ...' if len(sp['shards']) > 3 else ''})")
        console.print_json(json.dumps({"features": facts["features"]}))
    if "topics" in facts:  # ROS bags: every topic and what it became
        _print_topics(console, facts)
