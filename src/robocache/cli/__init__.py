"""The ``robocache`` command: one typer app, one module per verb in this package.

Verb modules import heavy packages (torch, Triton) inside their commands, so ``robocache info``
and ``robocache --help`` stay fast.
"""

from __future__ import annotations

import typer

from robocache.cli import (
    audit,
    bench,
    demo,
    doctor,
    edit,
    export,
    info,
    ingest,
    inspect,
    merge,
    mixture,
    preprocess,
    report,
    stats,
    view,
)

app = typer.Typer(
    name="robocache",
    help="RoboCache: a GPU data engine for robot-learning training.",
    no_args_is_help=True,
    add_completion=False,
    # click's plain help: flags show as flags (`--json`), where the rich panels of typer 0.29
    # print `--json <bool>`, which reads as an option taking a value
    rich_markup_mode=None,
)
app.command("info")(info.info)
app.command("bench")(bench.bench)
app.command("doctor")(doctor.doctor)
app.command("report")(report.report)
app.command("inspect")(inspect.inspect)
app.command("ingest")(ingest.ingest)
app.command("preprocess")(preprocess.preprocess)
app.command("merge")(merge.merge)
app.command("mixture")(mixture.mixture)
app.command("export")(export.export)
app.command("demo")(demo.demo)
app.command("view")(view.view)
app.command("audit")(audit.audit)
app.command("edit")(edit.edit)
app.command("stats")(stats.stats)


def main() -> None:
    app()
