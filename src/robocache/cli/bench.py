"""``robocache bench``: run op-family benchmarks from ``benchmarks/bench_<family>.py``, and gate
regressions against a baseline.

    $ robocache bench resample --json results.json
    $ robocache bench resample --quick                  # small sizes; runs on CPU too
    $ robocache bench --compare benchmarks/h100-baseline.json            # run, then gate
    $ robocache bench --compare BASELINE.json --results results.json    # gate two files, no GPU
    $ robocache bench resample --profile traces/        # + a torch.profiler trace per family

Each benchmark module defines ``run(quick: bool, copy_gbps: float | None) -> list[dict]``
returning case records made by ``robocache.bench.harness.case``; a ``run`` that also takes
``report`` is called with a callback it gives each case as soon as it is done (printed, and
written to ``--json`` at once: a run killed at its time limit keeps the cases it finished).
Benchmarks live in the source checkout (``benchmarks/``). Before them, on a GPU, the run
measures its ceilings (copy bandwidth, bf16/fp32 GEMM) so every case is placed on this run's
roofline. A family that raises is recorded in ``meta.errors`` and the others still run. With
``--profile`` timing loops are shortened 20x (``meta.profiled``): such a run reads as a trace,
not as a baseline.

Exit code: 0 ok, 1 a regression against ``--compare``, 3 a benchmark family failed.
"""

from __future__ import annotations

import contextlib
import importlib.util
import inspect
from collections.abc import Callable
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


def _profiler(trace_dir: Path | None, family: str):
    """A torch.profiler context writing ``<trace_dir>/<family>.trace.json.gz``, or a no-op."""
    if trace_dir is None:
        return contextlib.nullcontext()
    import torch
    from torch.profiler import ProfilerActivity, profile

    trace_dir.mkdir(parents=True, exist_ok=True)
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)

    def export(prof):
        path = trace_dir / f"{family}.trace.json.gz"
        prof.export_chrome_trace(str(path))
        typer.echo(f"wrote {path} (open in https://ui.perfetto.dev or chrome://tracing)")

    return profile(activities=activities, on_trace_ready=export)


def run_families(names: list[str], *, quick: bool, profile: Path | None = None,
                 checkpoint: Callable[[dict], None] = lambda _results: None) -> dict:
    """Run the named benchmark families (all when empty, in the order given) and return the
    results document; `checkpoint` sees it after each family (``meta.families_done``), and
    after each case of a family whose ``run`` takes ``report`` (called as each case is
    done)."""
    from robocache.bench import doctor, harness
    from robocache.bench.report import ceiling_values
    from robocache.observability import nvtx

    modules = {name: load(name) for name in names or families()}
    results = {"meta": harness.metadata(), "cases": []}
    if harness.cuda_ready():
        ceilings = doctor.measure_ceilings(quick=quick, host=False, multi_gpu=False)
        results["meta"]["ceilings"] = ceilings
        results["meta"]["d2d_copy_GBps"] = ceiling_values(results["meta"]).get("d2d_copy_GBps")
    if profile is not None:
        nvtx.enable()
        harness.profiling()
        results["meta"]["profiled"] = True
    copy_gbps = results["meta"].get("d2d_copy_GBps")
    values = ceiling_values(results["meta"])
    results["meta"]["families_done"] = []
    try:
        for name, module in modules.items():
            reported: list[dict] = []

            def report(rec: dict, reported=reported) -> None:  # a case as soon as it is done
                reported.append(rec)
                results["cases"].append(harness.roofline(rec, values))
                typer.echo(harness.one_line(rec))
                checkpoint(results)

            kwargs = {"report": report} if "report" in inspect.signature(
                module.run).parameters else {}
            try:
                with _profiler(profile, name), nvtx.range(f"robocache.bench.{name}"):
                    cases = module.run(quick=quick, copy_gbps=copy_gbps, **kwargs)
                results["cases"].extend(harness.roofline(rec, values) for rec in cases
                                        if not any(rec is r for r in reported))
            except Exception as exc:  # one broken family must not lose the others' numbers
                results["meta"].setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"
                typer.echo(f"benchmark {name!r} failed: {type(exc).__name__}: {exc}", err=True)
            results["meta"]["families_done"].append(name)
            if harness.cuda_ready():  # clocks under load; did the GPU throttle during the run?
                results["meta"]["gpu_state_end"] = harness.gpu_state()
            checkpoint(results)
    finally:
        harness.profiling(False)
    return results


def bench(
    names: list[str] = typer.Argument(None, help="Op families to run (default: all)."),
    json_path: Path = typer.Option(None, "--json", help="Write the results JSON here."),
    quick: bool = typer.Option(False, "--quick", help="Small sizes, few repeats (CPU-friendly)."),
    compare: Path = typer.Option(None, "--compare", help="Baseline results JSON to gate against "
                                 "(exit 1 on a regression)."),
    results_path: Path = typer.Option(None, "--results", help="With --compare: compare this "
                                      "stored results file instead of running benchmarks."),
    profile: Path = typer.Option(None, "--profile", help="Write a torch.profiler trace per "
                                 "family into this folder (NVTX ranges on)."),
    threshold: float = typer.Option(0.05, help="Slowdown that counts as a regression (0.05 = 5%)."),
    alpha: float = typer.Option(0.01, help="Significance level of the Mann-Whitney U test."),
):
    """Benchmark RoboCache against the alternatives a user has, in one run; gate regressions."""
    from robocache.bench import compare as gate
    from robocache.bench import harness
    from robocache.errors import DataError

    if results_path is not None:
        if compare is None:
            raise typer.BadParameter("--results only makes sense with --compare BASELINE.json.")
        try:
            results = gate.load_results(results_path)
        except DataError as exc:
            raise typer.BadParameter(str(exc), param_hint="--results") from exc
    else:
        def checkpoint(doc: dict) -> None:  # a run cut short keeps the families that finished
            if json_path:
                harness.write_json(json_path, doc)

        results = run_families(names or [], quick=quick, profile=profile, checkpoint=checkpoint)
        harness.print_table(results)
        if json_path:
            typer.echo(f"wrote {json_path}")
    if compare is not None:
        try:
            baseline = gate.load_results(compare)
        except DataError as exc:
            raise typer.BadParameter(str(exc), param_hint="--compare") from exc
        cmp = gate.compare(baseline, results, threshold=threshold, alpha=alpha)
        gate.print_comparison(cmp, threshold=threshold, alpha=alpha)
        if cmp.regressed:
            raise typer.Exit(1)
    if results["meta"].get("errors"):
        raise typer.Exit(3)
