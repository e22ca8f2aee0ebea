"""The report card renders from a results file on a machine without a GPU."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from typer.testing import CliRunner

from robocache.bench import harness, report
from robocache.cli import app

BASELINES = sorted((Path(__file__).resolve().parents[2] / "benchmarks").glob("*baseline*.json"))


def _is_png(path: Path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_render_writes_markdown_plots_and_csv(tmp_path, report_results):
    written = report.render(report_results, tmp_path)
    assert set(written) == {"report.md", "cases.csv", "speedup.csv", "roofline.png",
                            "scaling.png", "speedup.png"}
    assert all(_is_png(written[k]) for k in ("roofline.png", "scaling.png", "speedup.png"))
    rows = list(csv.DictReader(written["cases.csv"].open()))
    assert len(rows) == len(report_results["cases"])
    assert "samples_ms" not in rows[0] and float(rows[0]["median_ms"]) > 0
    md = written["report.md"].read_text()
    for section in ("Ceilings measured in the same run", "Roofline", "Speedup", "Scaling",
                    "All cases", "![roofline](roofline.png)"):
        assert section in md


def test_speedups_pair_each_alternative_with_ours(report_results):
    rows = report.speedups(report_results["cases"])
    assert {r["alternative"] for r in rows} == {"torch_eager", "torch_compile",
                                                "pytorch_kinematics"}
    eager = next(r for r in rows if r["alternative"] == "torch_eager")
    assert eager["speedup"] == pytest.approx(eager["alternative_ms"] / eager["ours_ms"])
    assert all(r["ours"] == "robocache" for r in rows)  # host-time (us) cases are not paired


def test_scaling_falls_back_to_problem_size(make_timing, make_results, rng, tmp_path):
    """Shapes run at one batch size each still give a curve, over the minimum bytes."""
    cases = [harness.case("f", f"n{n}", "robocache", make_timing(n / 1e3, 0.01, rng),
                          nbytes=n * 1000, B=n, S=n) for n in (10, 20, 40)]
    axis, lines = report._scaling_series(cases)
    assert axis == "minimum bytes moved" and len(lines) == 1
    assert report.plot_scaling(cases, tmp_path / "s.png")


def test_render_without_gpu_ceilings(make_timing, make_results, rng, tmp_path):
    """A CPU-only run (no ceilings, no GB/s ceiling) still gives a report and a CSV."""
    doc = make_results([harness.case("f", "a", "robocache_cpu", make_timing(1.0, 0.01, rng))])
    doc["meta"].pop("ceilings")
    doc["meta"].pop("d2d_copy_GBps")
    written = report.render(doc, tmp_path)
    assert set(written) == {"report.md", "cases.csv"}
    assert "None (the run had no GPU)." in written["report.md"].read_text()


def test_cli_report(tmp_path, report_results):
    path = tmp_path / "results.json"
    harness.write_json(path, report_results)
    out = CliRunner().invoke(app, ["report", str(path)])
    assert out.exit_code == 0, out.output
    assert (tmp_path / "results-report" / "report.md").exists()


@pytest.mark.slow
@pytest.mark.parametrize("baseline", BASELINES, ids=lambda p: p.name)
def test_committed_baseline_renders(baseline, tmp_path):
    from robocache.bench.compare import load_results

    written = report.render(load_results(baseline), tmp_path)
    assert _is_png(written["roofline.png"])
