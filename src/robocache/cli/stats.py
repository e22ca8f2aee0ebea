"""``robocache stats``: a cache's statistics, and those of relative action chunks.

    $ robocache stats /data/droid.cache                      # what is stored
    $ robocache stats /data/droid.cache --relative action=joint:observation.state \\
          --absolute-dims action=7 --horizon 50
    $ robocache stats /data/umi.cache --relative action=ee:observation.ee_pose \\
          --rotation action=rotvec --absolute-dims action=6 --horizon 16 --json

``--relative KEY=MODE:STATE`` (repeat per key; modes ``joint``, ``ee``, ``base``) computes the
mean, std and exact q01/q99 of KEY's chunks relative to the current STATE over every window
of the cache (:func:`robocache.data.stats.relative_action_stats`, on the GPU when there is
one) and stores them in the cache (``relative_stats/``), where
``RobotDataset(..., relative_actions=...)`` finds them. The other options complete a key's
entry (see :mod:`robocache.data.relative`): ``--absolute-dims KEY=6,7``, ``--state-dims
KEY=0,1,2``, ``--rotation KEY=ROT``, ``--state-rotation KEY=ROT``.

Exit codes: 0 done; 2 bad usage or input (one line on stderr: the problem and the fix); 1
internal error (``--verbose`` shows the traceback); 130 interrupted, 143 terminated
(nothing is stored before the statistics are complete).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from robocache.cli._errors import (
    VERBOSE_OPTION_HELP,
    CommandError,
    cache_argument,
    cli_errors,
    storage_option_flag,
    storage_options,
)


def _pairs(option: str, items: list[str] | None, keys: set[str]) -> dict[str, str]:
    """``KEY=VALUE`` items of ``option`` (each KEY one of ``keys``, the ``--relative`` keys)."""
    out = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not (sep and key and value):
            raise CommandError(f"{option} {item!r} is not KEY=VALUE",
                               f"pass e.g. {option} action=...")
        if key not in keys:
            raise CommandError(f"{option} names {key!r}, which no --relative names",
                               "add --relative KEY=MODE:STATE for it")
        out[key] = value
    return out


def _ints(option: str, text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CommandError(f"{option} {text!r} is not a list of integers",
                           "pass e.g. 0,1,2") from None


def parse_relative(relative: list[str], absolute_dims: list[str] | None,
                   state_dims: list[str] | None, rotation: list[str] | None,
                   state_rotation: list[str] | None) -> dict[str, dict[str, Any]]:
    """The ``relative_actions`` mapping the options describe."""
    spec: dict[str, dict[str, Any]] = {}
    for item in relative:
        key, sep, rest = item.partition("=")
        mode, colon, state = rest.partition(":")
        if not (sep and key and (colon and state or mode == "absolute")):
            raise CommandError(f"--relative {item!r} is not KEY=MODE:STATE",
                               "pass e.g. --relative action=joint:observation.state")
        spec[key] = {"mode": mode, **({"state": state} if state else {})}
    keys = set(spec)
    for k, v in _pairs("--absolute-dims", absolute_dims, keys).items():
        spec[k]["absolute_dims"] = _ints("--absolute-dims", v)
    for k, v in _pairs("--state-dims", state_dims, keys).items():
        spec[k]["state_dims"] = _ints("--state-dims", v)
    for k, v in _pairs("--rotation", rotation, keys).items():
        spec[k]["rotation"] = v
    for k, v in _pairs("--state-rotation", state_rotation, keys).items():
        spec[k]["state_rotation"] = v
    return spec


def _table(key: str, stats: dict[str, Any]) -> str:
    lines = [f"{key}  ({stats['count']:,} values per dimension)",
             f"  {'dim':>4} {'mean':>12} {'std':>12} {'q01':>12} {'q99':>12}"]
    for d, row in enumerate(zip(*(stats[k] for k in ("mean", "std", "q01", "q99")),
                                strict=True)):
        lines.append(f"  {d:>4} " + " ".join(f"{v:>12.6g}" for v in row))
    return "\n".join(lines)


def stats(
    cache: Annotated[str, typer.Argument(help="The RoboCache cache (a directory or "
                                              "s3://BUCKET/PREFIX, gs://, az://).")],
    relative: Annotated[list[str], typer.Option(
        "--relative", metavar="KEY=MODE:STATE",
        help="Compute the statistics of KEY's chunks relative to STATE (MODE joint, ee or "
             "base); repeat per key.")] = None,
    absolute_dims: Annotated[list[str], typer.Option(
        "--absolute-dims", metavar="KEY=I,J", help="KEY's dimensions kept absolute "
                                                   "(grippers).")] = None,
    state_dims: Annotated[list[str], typer.Option(
        "--state-dims", metavar="KEY=I,J", help="The state dimension of each relative "
                                                "dimension of KEY.")] = None,
    rotation: Annotated[list[str], typer.Option(
        "--rotation", metavar="KEY=ROT", help="ee/base: KEY's rotation (rotvec, quat, "
                                              "quat_xyzw, rot6d, matrix, euler_xyz...).")] = None,
    state_rotation: Annotated[list[str], typer.Option(
        "--state-rotation", metavar="KEY=ROT", help="ee/base: the state pose's rotation.")]
    = None,
    horizon: Annotated[int, typer.Option(help="Chunk length: offsets 0..H-1.")] = None,
    offsets: Annotated[str, typer.Option(help="Instead of --horizon, the chunk's row "
                                              "offsets: 0,2,4.")] = None,
    device: Annotated[str, typer.Option(help="cuda or cpu (default: cuda when there is "
                                             "one).")] = None,
    no_store: Annotated[bool, typer.Option("--no-store", help="Print them only; store "
                                                              "nothing.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar (on a terminal).")]
    = True,
    storage_option: list[str] = storage_option_flag(),
    verbose: Annotated[bool, typer.Option("--verbose", help=VERBOSE_OPTION_HELP)] = False,
):
    """Show a cache's statistics; compute and store those of relative action chunks."""
    from robocache.data.location import Location

    with cli_errors(verbose):
        options = storage_options(storage_option)
        where = cache_argument(cache)
        if not relative:
            if any([absolute_dims, state_dims, rotation, state_rotation, horizon, offsets]):
                raise CommandError("the entry options complete a --relative entry",
                                   "pass --relative KEY=MODE:STATE too")
            from robocache.data.stats import stored

            location = Location(where, options)
            manifest = location.manifest()
            absolute = json.loads(location.read_text(manifest.get("stats_path",
                                                                   "stats.json")))
            doc = {"cache": location.uri, "absolute": absolute,
                   "relative": stored(where, options)}
            if as_json:
                typer.echo(json.dumps(doc, indent=2))
                return
            typer.echo(f"{location.uri}: absolute statistics of {', '.join(absolute) or 'no'} "
                       "key(s) (stats.json)")
            for entry in doc["relative"]:
                state = "current" if entry["current"] else "stale: computed for other rows"
                typer.echo(f"{entry['file']} ({state}): {entry['key']} "
                           f"{json.dumps(entry['transform'])}, {len(entry['offsets'])} steps")
                typer.echo(_table(entry["key"], entry["stats"]))
            return
        spec = parse_relative(relative, absolute_dims, state_dims, rotation, state_rotation)
        if (horizon is None) == (offsets is None):
            raise CommandError("the chunk is not given", "pass --horizon H or --offsets "
                                                         "0,1,...")
        if horizon is not None and horizon < 1:
            raise CommandError(f"--horizon {horizon} is not >= 1", "pass --horizon 50, say")
        chunk = horizon if horizon is not None else _ints("--offsets", offsets)
        if device not in (None, "cpu", "cuda") and not str(device).startswith("cuda:"):
            raise CommandError(f"--device {device!r} is not cpu or cuda", "pass --device cpu")
        import torch

        from robocache.data.stats import relative_action_stats

        if device and device.startswith("cuda") and not torch.cuda.is_available():
            raise CommandError("--device cuda but torch sees no CUDA device",
                               "pass --device cpu")
        from robocache._console import progress_bar

        with progress_bar(progress and not as_json, "relative statistics", "chunks") as tick:
            result = relative_action_stats(where, spec, chunk, device=device,
                                           store=False if no_store else None,
                                           storage_options=options, progress=tick)
        out = {k: s.to_dict() for k, s in result.items()}
        if as_json:
            typer.echo(json.dumps({k: {f: v[f] for f in ("count", "mean", "std", "min", "max",
                                                         "q01", "q99", "relative")}
                                   for k, v in out.items()}, indent=2))
            return
        for k, s in out.items():
            typer.echo(_table(k, s))
        if not no_store:
            typer.echo(f"stored in {cache} (relative_stats/); RobotDataset(..., "
                       "relative_actions=...) normalizes with them")
