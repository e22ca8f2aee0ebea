"""``robocache mixture``: check a mixture file and show what it resolves to.

    $ robocache mixture mixture.yaml --check          # the caches' manifests only
    $ robocache mixture mixture.yaml                  # also opens the caches, serves a batch
    $ robocache mixture mixture.yaml --stats          # relative actions' statistics, stored

The table has one row per dataset: its episodes and frames (from the cache's manifest), its
weight after balancing (normalized), its state and action widths (own -> served, padded to the
file's ``pad``), the action encoding, and the key mapping onto the common schema. With
``--check`` nothing but the manifests is read; without it, the mixture is opened as training
opens it (:meth:`robocache.MixedDataset.from_config`) and one batch of 8 is served on the CPU,
its keys and shapes printed. ``--stats`` computes the statistics of the relative action chunks
of every dataset whose action is relative (the file's horizon, the whole cache; on the GPU when
there is one) and stores them in its cache, where training finds them. Exit codes: 0 the file
is good, 2 a bad file (one line naming the file, the dataset and the fix), 1 an internal error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from robocache.cli._errors import VERBOSE_OPTION_HELP, cli_errors


def mixture(
    file: Annotated[Path, typer.Argument(help="The mixture file (YAML).")],
    check: Annotated[bool, typer.Option(
        "--check", help="Check the file against the caches' manifests and print the resolved "
                        "table; read no episode.")] = False,
    stats: Annotated[bool, typer.Option(
        "--stats", help="Compute and store the statistics of the relative action chunks of "
                        "the datasets whose action is relative.")] = False,
    device: Annotated[str, typer.Option(help="--stats: cuda or cpu (default: cuda when there "
                                             "is one).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the table as JSON.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", help=VERBOSE_OPTION_HELP)] = False,
):
    """Check a mixture file (datasets, key mapping, weights, widths) and print its table."""
    from robocache.data.mixture import open_mixture, relative_stats, resolve

    with cli_errors(verbose):
        resolved = resolve(file)
        rows = resolved.table()
        shapes = computed = None
        if stats:
            computed = {name: {k: {"count": v.count, "relative": v.relative} for k, v in
                               keys.items()}
                        for name, keys in relative_stats(file, device=device).items()}
        if not check:
            import torch

            from robocache.data.loader import RobotLoader

            mixed = open_mixture(file)
            batch = next(iter(RobotLoader(mixed, 8, device="cpu", drop_last=False)))
            shapes = {k: list(v.shape) if isinstance(v, torch.Tensor) else [len(v)]
                      for k, v in batch.items()}
    if as_json:
        typer.echo(json.dumps({"file": str(file), "balance": resolved.balance,
                               "pad": resolved.pad, "history": resolved.history,
                               "horizon": resolved.horizon, "datasets": rows,
                               **({"batch": shapes} if shapes is not None else {}),
                               **({"stats": computed} if computed is not None else {})},
                              indent=2, default=str))
        return
    _print(resolved, rows, shapes)
    for name, keys in (computed or {}).items():
        for key, facts in keys.items():
            typer.echo(f"{name}: statistics of {key}'s relative chunks ({facts['count']:,} rows) "
                       "stored in its cache")
    if computed == {}:
        typer.echo("no dataset's action is relative: no statistics to compute")


def _print(resolved, rows: list[dict], shapes: dict | None) -> None:
    from rich.table import Table

    from robocache._console import console, print_table

    out = console()
    table = Table(title=f"{resolved.path}: {len(rows)} datasets, balance {resolved.balance}, "
                        f"history {resolved.history}, horizon {resolved.horizon}")
    for col in ("dataset", "episodes", "frames", "weight", "state", "action",
                "action encoding", "mapping"):
        table.add_column(col, justify="right" if col in ("episodes", "frames", "weight")
                         else "left")
    def width(r: dict, k: str) -> str:
        if k not in r["own_widths"]:
            return "-"
        own, served = r["own_widths"][k], r["widths"][k]
        return f"{own}" if own == served else f"{own} -> {served}"

    for r in rows:
        mapping = ", ".join(f"{k} <- {v}" for k, v in r["mapping"].items())
        if r["instructions"]:
            mapping += f", task <- {r['instructions']}"
        table.add_row(r["name"], f"{r['episodes']:,}", f"{r['frames']:,}",
                      f"{r['weight']:.4f}", width(r, "observation.state"), width(r, "action"),
                      r["action_encoding"], mapping)
    print_table(table, out)
    if shapes is not None:
        out.print("one batch of 8: " + ", ".join(f"{k} {v}" for k, v in shapes.items()))
