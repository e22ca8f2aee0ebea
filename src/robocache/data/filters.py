"""Filters applied when a cache is opened: keep ranges and audit reports.

    >>> ds = RobotDataset(cache, keep_ranges="droid_keep_ranges.json", episode_keys=keys)
    >>> ds = RobotDataset(cache, audit="audit.json", drop_flags=["idle", "jump"])

Nothing in the cache changes: a filter decides which episodes and steps the served index
holds (:func:`robocache.data.served.open_served`). A kept range is a segment of its own, so
a window never crosses a removed range: it stops at the cut and is padded there, as at an
episode's ends.

Keep-ranges files come in two formats (docs/curation.md):

- openpi's DROID ``keep_ranges`` JSON: ``{KEY: [[start, end], ...], ...}``, or
  ``{"metadata": {"filter_last_n_in_ranges": N}, "keep_ranges": {KEY: ...}}`` (each range's
  end is then moved back by N); ranges in the source's frames, half-open; an episode not
  listed is dropped. KEY is an episode index, or a name that ``episode_keys`` maps to one
  (DROID's ``"<recording_folderpath>--<file_path>"``).
- RoboCache's: ``{"format": "robocache-keep-ranges/1", "unit": "steps" | "seconds",
  "unlisted": "drop" | "keep", "episodes": {"12": [[0, 40], [55, 120]], ...}}``; ranges
  half-open, in steps or in seconds from the episode's first step (a step is kept when its
  time ``k / rate`` lies in ``[start, end)``); ``unlisted`` says what happens to an episode
  not listed (default ``"drop"``, as openpi).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from robocache.errors import DataError

#: RoboCache's keep-ranges format (its ``"format"`` field).
KEEP_RANGES_FORMAT = "robocache-keep-ranges/1"

Ranges = dict[int, list[tuple[int, int]]]


def _load(what: str | Path | Mapping[str, Any], name: str) -> tuple[dict[str, Any], str]:
    if isinstance(what, Mapping):
        return dict(what), f"the `{name}` mapping"
    try:
        return json.loads(Path(what).read_text()), str(what)
    except (OSError, ValueError) as e:
        raise DataError(f"{what}: not a readable JSON file for `{name}` ({e}); pass a keep-"
                        "ranges file (openpi's DROID format or robocache-keep-ranges/1).") from e


def merge_ranges(ranges: Iterable[Sequence[int]]) -> list[tuple[int, int]]:
    """Half-open ranges sorted, overlapping or touching ones merged, empty ones dropped."""
    out: list[list[int]] = []
    for a, b in sorted((int(a), int(b)) for a, b in ranges):
        if b <= a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _pairs(value: Any, where: str, key: str) -> list[tuple[float, float]]:
    if not isinstance(value, (list, tuple)) or not all(
            isinstance(r, (list, tuple)) and len(r) == 2 and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                for x in r) for r in value):
        raise DataError(f"{where}: the ranges of {key!r} must be a list of [start, end] pairs "
                        f"of numbers; got {json.dumps(value)[:80]}.")
    return [(r[0], r[1]) for r in value]


def keep_ranges(source: str | Path | Mapping[str, Any], manifest: Mapping[str, Any],
                episode_keys: str | Path | Mapping[str, int] | None = None
                ) -> tuple[list[int], Ranges]:
    """The episodes a keep-ranges file serves and their kept step ranges.

    Args:
        source: the file (or its parsed JSON), in openpi's format or RoboCache's (module
            docstring).
        manifest: the cache's manifest (its episodes, rate and whether it is at the source's
            rate).
        episode_keys: names of episodes to their indices (a mapping, or a JSON file of one),
            for files keyed by names.

    Returns:
        (the cached episodes to serve, sorted; episode -> half-open step ranges, merged, for
        the episodes served in part; an episode served whole is not in it).

    Raises:
        DataError: not a keep-ranges file, malformed ranges, a key that is neither an episode
            index nor in ``episode_keys``, openpi's frame ranges on a cache aligned to another
            rate than the source's, or nothing left to serve.
    """
    data, where = _load(source, "keep_ranges")
    rate = float(manifest["rate_hz"])
    rows = {int(e["index"]): int(e["rows"]) for e in manifest["episodes"]}
    if data.get("format") == KEEP_RANGES_FORMAT:
        unit, unlisted = data.get("unit", "steps"), data.get("unlisted", "drop")
        if unit not in ("steps", "seconds") or unlisted not in ("drop", "keep"):
            raise DataError(f"{where}: `unit` must be 'steps' or 'seconds' and `unlisted` "
                            f"'drop' or 'keep'; got {unit!r}, {unlisted!r}.")
        table, trim = data.get("episodes"), 0
    elif "format" in data:
        raise DataError(f"{where}: unknown keep-ranges format {data['format']!r}; RoboCache "
                        f"reads {KEEP_RANGES_FORMAT!r} and openpi's DROID keep_ranges JSON.")
    else:  # openpi's: the frames of the source
        unit, unlisted = "steps", "drop"
        table = data.get("keep_ranges", data) if isinstance(data.get("keep_ranges"), dict) \
            else data
        trim = int((data.get("metadata") or {}).get("filter_last_n_in_ranges", 0)) \
            if table is not data else 0
        if not manifest.get("native", False):
            raise DataError(f"{where}: openpi's keep ranges count the source's frames, but this "
                            f"cache was aligned to {rate:g} Hz, not the source's rate; ingest at "
                            "the source's rate (the default) or write the ranges in seconds "
                            f"({KEEP_RANGES_FORMAT}, unit 'seconds').")
    if not isinstance(table, dict):
        raise DataError(f"{where}: expected a mapping of episodes to [start, end] ranges.")
    names = _names(episode_keys) if episode_keys is not None else {}
    ranges: Ranges = {}
    listed: set[int] = set()
    for key, value in table.items():
        index = _index(key, names, where)
        pairs = _pairs(value, where, key)
        if index not in rows:
            continue  # an episode this cache does not hold (quarantined, or another split)
        listed.add(index)
        if unit == "seconds":
            steps = [(math.ceil(a * rate - 1e-9), math.ceil(b * rate - 1e-9)) for a, b in pairs]
        else:
            if any(a != int(a) or b != int(b) for a, b in pairs):
                raise DataError(f"{where}: step ranges of {key!r} must be integers.")
            steps = [(int(a), int(b) - trim) for a, b in pairs]
        kept = merge_ranges((max(0, a), min(rows[index], b)) for a, b in steps)
        if kept != [(0, rows[index])]:
            ranges[index] = kept
    served = sorted(e for e in rows if (e in listed and ranges.get(e, True))
                    or (e not in listed and unlisted == "keep"))
    if not served:
        raise DataError(f"{where} keeps no step of the cache's {len(rows)} episodes (keys "
                        f"matched: {len(listed)}); check that its keys are this cache's "
                        "episode indices or pass `episode_keys` (--episode-keys) to map them.")
    return served, {e: r for e, r in ranges.items() if e in served}


def _names(episode_keys: str | Path | Mapping[str, int]) -> dict[str, int]:
    data, where = _load(episode_keys, "episode_keys")
    try:
        return {str(k): int(v) for k, v in data.items()}
    except (TypeError, ValueError) as e:
        raise DataError(f"{where}: `episode_keys` must map names to episode indices.") from e


def _index(key: str, names: Mapping[str, int], where: str) -> int:
    if key in names:
        return names[key]
    try:
        return int(key)
    except ValueError:
        raise DataError(f"{where}: key {key!r} is not an episode index, and `episode_keys` "
                        f"({len(names)} names) does not name it; pass a JSON mapping of the "
                        "file's keys to the cache's episode indices as `episode_keys` "
                        "(--episode-keys).") from None


def without_flagged(episodes: Sequence[int], report: str | Path | Mapping[str, Any],
                    flags: Iterable[str] | None = None) -> list[int]:
    """``episodes`` without those an audit report flags with any of ``flags`` (default: any
    flag; see :func:`robocache.data.audit.flagged`)."""
    from robocache.data.audit import flagged

    drop = flagged(report, flags)
    return [e for e in episodes if int(e) not in drop]
