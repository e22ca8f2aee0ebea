"""``robocache bench``: run op-family benchmarks from ``benchmarks/bench_<family>.py``.

    $ robocache bench resample --json results.json
    $ robocache bench resample --quick          # small sizes; runs on CPU too

Each benchmark module defines ``run(quick: bool) -> list[dict]`` returning case records made by
``robocache.bench.harness.case``. Benchmarks live in the source checkout (``benchmarks/``).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import typer

BENCH_DIR = Path(__file__).resolve().parents[3] / "benchmarks"


def families() -> list[str]:
    return sorted(p.stem.removeprefix("bench_") for p in BENCH_DIR.glob("bench_*.py"))


def load(family: str):
    path = BENCH_DIR / f"bench_{family}.py"
    if not path.exists():
        raise typer.BadParameter(
            f"no benchmark named {family!r}; available: {', '.join(families()) or 'none'} "
            f"(benchmarks are read from {BENCH_DIR}, i.e. a source checkout)."
        )
    spec = importlib.util.spec_from_file_location(f"robocache_bench_{family}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bench(
    names: list[str] = typer.Argument(None, help="Op families to run (default: all)."),
    json_path: Path = typer.Option(None, "--json", help="Write the results JSON here."),
    quick: bool = typer.Option(False, "--quick", help="Small sizes, few repeats (CPU-friendly)."),
):
    """Benchmark RoboCache against the alternatives a user has, in one run."""
    from robocache.bench import harness

    selected = names or families()
    modules = {name: load(name) for name in selected}
    results = {"meta": harness.metadata(), "cases": []}
    if harness.cuda_ready():
        results["meta"]["d2d_copy_GBps"] = harness.copy_bandwidth_gbps()
    for module in modules.values():
        results["cases"].extend(module.run(quick=quick, copy_gbps=results["meta"].get(
            "d2d_copy_GBps")))
    harness.print_table(results)
    if json_path:
        harness.write_json(json_path, results)
        typer.echo(f"wrote {json_path}")
