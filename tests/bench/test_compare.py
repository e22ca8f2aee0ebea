"""The regression gate on synthetic results: significance, threshold, fingerprint, schema, CLI."""

from __future__ import annotations

import json
import re
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
    base = make_results([harness.case("fam", "c", "robocache", t[0], gate="device")])
    new = make_results([harness.case("fam", "c", "robocache", t[1], gate="device")], **new_meta)
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
        return make_results([harness.case("fam", "c", "robocache", t, gate="device")])

    assert _status(rec(1.0, 0.98, 1.02), rec(1.2, 1.1, 1.3)) == "regressed"
    assert _status(rec(1.0, 0.97, 1.15), rec(1.2, 1.1, 1.3)) == "unchanged"


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
    counts = cmp.counts()
    assert cmp.comparable and set(counts) == {"unchanged", "info"}
    assert counts["unchanged"] == sum(r.gate != "info" for r in cmp.rows)


def _rerun(doc, seed, *, drift=0.04, host=3.0, jitter=0.05, info=(0.3, 5.0), slow=None):
    """`doc` measured again on the same commit: every device case off by one run-to-run drift
    (up to `drift`) with its samples redrawn, every host-time case on a host `host` times slower
    (up to `jitter` each), every informative case anywhere in the `info` range; the case
    `slow` ((family, name, impl), factor) additionally slowed by that factor."""
    rng = np.random.default_rng(seed)
    cases = []
    for c in json.loads(json.dumps(doc["cases"])):
        kind = gate.gate_of(c)
        if c["unit"] == "us" and "gpu" not in c["impl"].lower():  # host time, reference too
            kind = "host"
        if kind == "device":
            f = 1 + rng.uniform(-drift, drift)
            samples = rng.choice(c["samples_ms"], size=len(c["samples_ms"]))
        else:
            f = (host * (1 + rng.uniform(-jitter, jitter)) if kind == "host"
                 else rng.uniform(*info))
            samples = np.asarray(c["samples_ms"])
        if slow and (c["family"], c["name"], c["impl"]) == slow[0]:
            f *= slow[1]
        t = harness.summarize(samples * f)
        c.update(t.to_dict(), n=c["n"])
        cases.append(c)
    return {"meta": doc["meta"], "cases": cases}


BASELINE = Path(__file__).resolve().parents[2] / "benchmarks" / "h100-baseline.json"
BANDWIDTH_CASE = ("resample", "B1024-S1000-T2000-D32-bfloat16-t32", "robocache")


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rerun_of_committed_results_is_quiet(seed):
    """Host-bound cases move with the host (3x here), informative ones anywhere, device cases
    within the 1-4% seen between two H100 runs of one commit: nothing regresses."""
    doc = gate.load_results(BASELINE)
    cmp = gate.compare(doc, _rerun(doc, seed))
    assert cmp.comparable and not cmp.regressed
    counts = cmp.counts()
    assert counts["unchanged"] >= 30 and "new" not in counts and "missing" not in counts


@pytest.mark.parametrize("seed", [0, 1])
def test_planted_ten_percent_in_a_bandwidth_bound_case_is_caught(seed):
    doc = gate.load_results(BASELINE)
    assert gate.gate_of(next(c for c in doc["cases"]
                             if (c["family"], c["name"], c["impl"]) == BANDWIDTH_CASE)) == "device"
    cmp = gate.compare(doc, _rerun(doc, seed, drift=0.01, slow=(BANDWIDTH_CASE, 1.10)))
    assert [(r.family, r.name, r.impl) for r in cmp.regressed] == [BANDWIDTH_CASE]


def test_gate_classification_of_committed_rows():
    doc = gate.load_results(BASELINE)
    kinds = {(c["family"], c["name"], c["impl"]): gate.gate_of(c) for c in doc["cases"]}
    assert kinds[("align", "batch-B256-1s-4streams", "robocache")] == "info"  # 19 us, host-bound
    assert kinds[("align", "batch-B256-1s-4streams", "robocache_graph_replay")] == "device"
    assert kinds[("align", "batch-B256-1s-4streams", "host_robocache_eager")] == "host"
    assert kinds[("pointcloud", "rgbd 640x480 -> 64^3 mean, B=1", "robocache fused")] == "info"
    # eager, 0.104 ms, but its host needed 0.119 ms a call: the host's time, not the GPU's
    assert kinds[("pointcloud", "rgbd 640x480 -> 64^3 mean, B=8", "robocache fused")] == "info"
    assert kinds[("pointcloud", "rgbd 640x480 -> 64^3 mean, B=8",
                  "robocache fused block=256")] == "device"
    assert kinds[("kinematics", "ik-256targets", "robocache 32x50")] == "info"
    assert kinds[("resample", "B256-S100-T50-D32-bfloat16-t32", "torch_compile")] == "info"
    assert {k for (f, *_), k in kinds.items() if f in ("loader", "train")} == {"info"}


@pytest.mark.parametrize(("host_us", "gate_kind"), [(None, "device"), (40.0, "device"),
                                                     (60.0, "info"), (150.0, "info")])
def test_eager_case_gates_on_the_device_only_while_its_host_time_is_short(host_us, gate_kind):
    """A bandwidth-bound eager case of 0.1 ms gates as device time while its host needs under
    half of that a call (or was not measured), else it informs."""
    case = {"family": "f", "name": "n", "impl": "robocache", "unit": "ms", "median_ms": 0.1,
            "pct_copy": 60.0, "graph_ms": 0.095, "host_us": host_us}
    assert gate.gate_of(case) == gate_kind


def test_host_case_gates_on_its_ratio_to_the_bare_launch(make_results):
    def doc(ours, bare):
        t = lambda us: harness.Timing(us, us * 0.99, us * 1.01, 7, [us] * 7)  # noqa: E731
        return make_results([harness.case("f", "c", "host_robocache_eager", t(ours), unit="us"),
                             harness.case("f", "c", "host_bare_triton_launch", t(bare),
                                          unit="us")])

    assert gate.compare(doc(10, 20), doc(30, 60)).regressed == []  # slower host, same ratio
    # +50% against the bare launch is within what two runs of one commit showed: unchanged
    assert gate.compare(doc(10, 20), doc(15, 20)).regressed == []
    rows = {r.impl: r for r in gate.compare(doc(10, 20), doc(40, 20)).rows}  # 4x: a real change
    assert rows["host_robocache_eager"].status == "regressed"
    assert rows["host_bare_triton_launch"].status == "info"


def _gpu_case(unit, us, noise, rng):
    """A CUDA-graph replay of `us` microseconds, stored in `unit`."""
    scale = 1.0 if unit == "us" else 1e-3
    t = harness.summarize(us * scale * np.exp(rng.normal(0.0, noise, 256)))
    return harness.case("resample", "B256", "robocache_graph_replay_gpu", t, unit=unit)


@pytest.mark.parametrize(("base_unit", "new_unit"), [("us", "us"), ("ms", "ms"), ("us", "ms"),
                                                     ("ms", "us")])
def test_device_floor_is_half_a_microsecond_in_either_unit(make_results, base_unit, new_unit):
    """2.49 -> 2.84 us (+14 %, IQR 0.5 %) is launch latency between two hosts: under the 0.5 us
    floor whatever unit each record is stored in; 2.49 -> 3.2 us is over it."""
    def status(new_us):
        rng = np.random.default_rng(0)
        base = make_results([_gpu_case(base_unit, 2.489, 0.003, rng)])
        new = make_results([_gpu_case(new_unit, new_us, 0.003, rng)])
        return _status(base, new)

    assert status(2.841) == "unchanged"
    assert status(3.2) == "regressed"


def test_rows_show_each_record_in_its_own_unit(tmp_path, make_results, rng):
    base = make_results([_gpu_case("us", 2.489, 0.003, rng)])
    new = make_results([_gpu_case("ms", 3.2, 0.003, rng)])
    row = gate.compare(base, new).rows[0]
    assert row.unit == "ms" and row.base_ms == pytest.approx(0.002489, rel=0.01)
    out = CliRunner().invoke(app, ["bench", "--compare", _write(tmp_path, "b.json", base),
                                   "--results", _write(tmp_path, "n.json", new)])
    # both sides in the results' unit: 2.489 us shown as 0.0025 ms, not 2.489 ms
    assert out.exit_code == 1 and re.search(r"0\.002[45]\d* ms[ |│]+0\.003[12]\d* ms", out.output)


def test_host_ratio_is_unit_aware(make_results):
    """The host gate's ratio to the bare launch holds when one of them is stored in ms."""
    def doc(ours_us, bare_us, bare_unit):
        def t(v):
            return harness.Timing(v, v * 0.99, v * 1.01, 7, [v] * 7)
        scale = 1.0 if bare_unit == "us" else 1e-3
        return make_results([harness.case("f", "c", "host_robocache_eager", t(ours_us),
                                          unit="us"),
                             harness.case("f", "c", "host_bare_triton_launch",
                                          t(bare_us * scale), unit=bare_unit)])

    assert gate.compare(doc(10, 20, "us"), doc(12, 20, "ms")).regressed == []
    assert [r.impl for r in gate.compare(doc(10, 20, "ms"), doc(40, 20, "us")).regressed] == [
        "host_robocache_eager"]


def test_unknown_unit_is_rejected(tmp_path, make_results):
    case = harness.case("f", "c", "robocache", harness.summarize([1.0, 1.1]), unit="s")
    with pytest.raises(DataError, match="unit is 's'"):
        gate.load_results(_write(tmp_path, "r.json", make_results([case])))


# Full runs whose kernels are the baseline's: the baseline's own commit, and the commit before it
# (it changed only the gate's classification). Results of other commits measure other code.
SAME_CODE = {"0c0d2f9", "ab76e93"}
RESULTS = sorted((Path(__file__).resolve().parents[2] / "benchmarks" / "results").glob("*.json"))


@pytest.mark.parametrize("path", [p for p in RESULTS
                                  if json.loads(p.read_text()).get("meta", {}).get("commit")
                                  in SAME_CODE and "cases" in json.loads(p.read_text())],
                         ids=lambda p: p.name)
def test_committed_baseline_is_quiet_against_runs_of_its_code(path):
    """Every stored run of the baseline's code, compared either way with the baseline: same
    fingerprint, nothing regressed, every shared case compared."""
    base, run = gate.load_results(BASELINE), gate.load_results(path)
    for old, new in ((base, run), (run, base)):
        cmp = gate.compare(old, new)
        assert cmp.comparable, cmp.fingerprint_diff
        assert [(r.family, r.name, r.impl) for r in cmp.regressed] == []
        assert {r.status for r in cmp.rows} - {"missing", "new"} <= {"unchanged", "info",
                                                                      "improved"}


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
    base = make_results([harness.case("f", "a", "robocache", t, gate="device"),
                         harness.case("g", "b", "robocache", t),
                         harness.case("g", "c", "robocache", t, unit="us")])
    new = make_results([harness.case("f", "a", "robocache", t, gate="device")])
    out = CliRunner().invoke(app, ["bench", "--compare", _write(tmp_path, "b.json", base),
                                   "--results", _write(tmp_path, "n.json", new)])
    assert out.exit_code == 0, out.output
    assert "not in the results (not run): g (2 cases)" in out.output
    assert "2 missing, 1 unchanged" in " ".join(out.output.split())
