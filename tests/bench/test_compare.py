"""The regression gate on synthetic results: significance, threshold, fingerprint, schema, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from robocache.bench import compare as gate
from robocache.bench import harness
from robocache.cli import app
from robocache.errors import DataError


def _pair(make_timing, make_results, rng, slowdown, noise, n=60, **new_meta):
    """Baseline and results whose samples share one noise draw, the latter scaled by
    1 + `slowdown`: the medians differ by exactly that much."""
    seed = int(rng.integers(1 << 31))
    t = [make_timing(median, noise, np.random.default_rng(seed), n)
         for median in (1.0, 1.0 + slowdown)]
    base = make_results([harness.case("fam", "c", "robocache", t[0])])
    new = make_results([harness.case("fam", "c", "robocache", t[1])], **new_meta)
    return base, new


def _status(base, new):
    cmp = gate.compare(base, new)
    assert cmp.comparable
    return cmp.rows[0].status


def test_ten_percent_slower_low_noise_regresses(make_timing, make_results, rng):
    assert _status(*_pair(make_timing, make_results, rng, 0.10, 0.01)) == "regressed"


def test_ten_percent_slower_inside_noise_passes(make_timing, make_results, rng):
    # 30% spread, 10 samples a side: a 10% shift of the median is not significant
    assert _status(*_pair(make_timing, make_results, rng, 0.10, 0.30, n=10)) == "unchanged"


def test_below_threshold_is_unchanged_even_if_significant(make_timing, make_results, rng):
    assert _status(*_pair(make_timing, make_results, rng, 0.03, 0.002)) == "unchanged"


def test_ten_percent_faster_improves(make_timing, make_results, rng):
    assert _status(*_pair(make_timing, make_results, rng, -0.10, 0.01)) == "improved"


def test_few_samples_use_interval_overlap(make_results):
    def rec(median, q25, q75):
        t = harness.Timing(median, q25, q75, 3, [q25, median, q75])
        return make_results([harness.case("fam", "c", "robocache", t)])

    assert _status(rec(1.0, 0.98, 1.02), rec(1.2, 1.1, 1.3)) == "regressed"
    assert _status(rec(1.0, 0.9, 1.15), rec(1.2, 1.1, 1.3)) == "unchanged"


def test_changed_fingerprint_is_reported_not_compared(make_timing, make_results, rng):
    base, new = _pair(make_timing, make_results, rng, 0.50, 0.01, driver="590.0")
    cmp = gate.compare(base, new)
    assert not cmp.comparable and cmp.rows == [] and not cmp.regressed
    assert cmp.fingerprint_diff == {"driver": ("580.1", "590.0")}


def test_missing_and_new_cases(make_timing, make_results, rng):
    base = make_results([harness.case("f", "a", "robocache", make_timing(1.0, 0.01, rng))])
    new = make_results([harness.case("f", "b", "robocache", make_timing(1.0, 0.01, rng))])
    assert {r.name: r.status for r in gate.compare(base, new).rows} == {"a": "missing",
                                                                          "b": "new"}


def _write(tmp_path, name, doc):
    path = tmp_path / name
    harness.write_json(path, doc)
    return str(path)


def test_cli_exit_code_and_table(tmp_path, make_timing, make_results, rng):
    base, new = _pair(make_timing, make_results, rng, 0.10, 0.01)
    b, n = _write(tmp_path, "base.json", base), _write(tmp_path, "new.json", new)
    runner = CliRunner()
    bad = runner.invoke(app, ["bench", "--compare", b, "--results", n])
    assert bad.exit_code == 1, bad.output
    assert "regressed" in bad.output and "+10" in bad.output
    same = runner.invoke(app, ["bench", "--compare", b, "--results", b])
    assert same.exit_code == 0 and "1 unchanged" in same.output


def test_cli_fingerprint_mismatch_exits_zero_and_says_so(tmp_path, make_timing, make_results,
                                                           rng):
    base, new = _pair(make_timing, make_results, rng, 0.5, 0.01, device="NVIDIA H200")
    out = CliRunner().invoke(app, ["bench", "--compare", _write(tmp_path, "b.json", base),
                                   "--results", _write(tmp_path, "n.json", new)])
    assert out.exit_code == 0 and "fingerprints differ" in out.output and "H200" in out.output


def test_results_without_compare_is_rejected(tmp_path, make_results):
    out = CliRunner().invoke(app, ["bench", "--results",
                                   _write(tmp_path, "r.json", make_results([]))])
    assert out.exit_code != 0 and "--compare" in out.output


def test_schema_accepts_written_results(tmp_path, report_results):
    path = _write(tmp_path, "r.json", report_results)
    assert gate.load_results(path)["cases"] == json.loads(Path(path).read_text())["cases"]


@pytest.mark.parametrize("breakage", ["no_cases", "meta_device", "case_median", "case_samples",
                                      "duplicate"])
def test_schema_rejects_malformed(tmp_path, report_results, breakage):
    doc = json.loads(json.dumps(report_results))
    if breakage == "no_cases":
        del doc["cases"]
    elif breakage == "meta_device":
        del doc["meta"]["device"]
    elif breakage == "case_median":
        doc["cases"][1]["median_ms"] = "fast"
    elif breakage == "duplicate":
        doc["cases"].append(doc["cases"][0])
    else:
        doc["cases"][1]["samples_ms"] = None
    with pytest.raises(DataError, match="cases|device|median_ms|samples_ms|distinct names"):
        gate.load_results(_write(tmp_path, "bad.json", doc))


def test_cli_reports_malformed_file(tmp_path, make_results):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    good = _write(tmp_path, "good.json", make_results([]))
    out = CliRunner().invoke(app, ["bench", "--compare", str(bad), "--results", good])
    text = " ".join(out.output.replace("│", " ").split())  # unwrap rich's error box
    assert out.exit_code == 2 and "is not valid JSON" in text


BASELINES = sorted((Path(__file__).resolve().parents[2] / "benchmarks").glob("*baseline*.json"))


@pytest.mark.parametrize("baseline", BASELINES, ids=lambda p: p.name)
def test_committed_baseline_gates_against_itself(baseline):
    doc = gate.load_results(baseline)
    cmp = gate.compare(doc, doc)
    assert cmp.comparable and cmp.counts() == {"unchanged": len(doc["cases"])}


def test_merge_runs_of_one_environment(make_timing, make_results, rng):
    a = make_results([harness.case("f", "a", "robocache", make_timing(1.0, 0.01, rng))])
    b = make_results([harness.case("g", "b", "robocache", make_timing(1.0, 0.01, rng))])
    merged = gate.merge([a, b], ["run-a", "run-b"])
    assert [c["family"] for c in merged["cases"]] == ["f", "g"]
    assert [s["source"] for s in merged["meta"]["sources"]] == ["run-a", "run-b"]
    with pytest.raises(DataError, match="fingerprint"):
        gate.merge([a, make_results([], driver="999")], ["run-a", "other"])
    with pytest.raises(DataError, match="distinct names"):
        gate.merge([a, a], ["run-a", "again"])


def test_cli_summarizes_families_not_run(tmp_path, make_timing, make_results, rng):
    t = make_timing(1.0, 0.01, rng)
    base = make_results([harness.case("f", "a", "robocache", t),
                         harness.case("g", "b", "robocache", t),
                         harness.case("g", "c", "robocache", t, unit="us")])
    new = make_results([harness.case("f", "a", "robocache", t)])
    out = CliRunner().invoke(app, ["bench", "--compare", _write(tmp_path, "b.json", base),
                                   "--results", _write(tmp_path, "n.json", new)])
    assert out.exit_code == 0, out.output
    assert "not in the results (not run): g (2 cases)" in out.output
    assert "2 missing, 1 unchanged" in " ".join(out.output.split())
