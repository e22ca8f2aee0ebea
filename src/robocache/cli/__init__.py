"""The ``robocache`` command: one typer app, one module per verb in this package.

Verb modules import heavy packages (torch, Triton) inside their commands, so ``robocache info``
and ``robocache --help`` stay fast.
"""

from __future__ import annotations

import typer

from robocache.cli import (
    bench,
    demo,
    doctor,
    info,
    ingest,
    inspect,
    merge,
    preprocess,
    report,
    view,
)

app = typer.Typer(
    name="robocache",
    help="RoboCache: a GPU data engine for robot-learning training.",
    no_args_is_help=True,
    add_completion=False,
)
app.command("info")(info.info)
app.command("bench")(bench.bench)
app.command("doctor")(doctor.doctor)
app.command("report")(report.report)
app.command("inspect")(inspect.inspect)
app.command("ingest")(ingest.ingest)
app.command("preprocess")(preprocess.preprocess)
app.command("merge")(merge.merge)
app.command("demo")(demo.demo)
app.command("view")(view.view)


def main() -> None:
    app()
