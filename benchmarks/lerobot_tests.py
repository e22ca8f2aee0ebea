"""LeRobot's own dataset tests against robocache.LeRobotDataset: the compatibility table.

    HF_HUB_OFFLINE=1 PYTHONPATH=src /path/to/lerobot-venv/bin/python \
        benchmarks/lerobot_tests.py --lerobot /path/to/lerobot-checkout [--out FILE.md] \
        [test_datasets.py ...]

``--lerobot``: a checkout of LeRobot's repository at the tag of the installed LeRobot (e.g.
``git clone -b v0.6.1 https://github.com/huggingface/lerobot``); its ``tests/`` are copied to a
scratch folder twice and run with pytest (which the LeRobot environment needs, with
RoboCache's ``pylance``): once as they are (LeRobot's own class), once with ``LeRobotDataset``
and ``MultiLeRobotDataset`` bound to RoboCache's in every test module of ``tests/datasets``
and in the dataset factories of ``tests/fixtures`` (so datasets are recorded through
``robocache.LeRobotDataset.create``, which delegates to LeRobot's writer, and read by
RoboCache). LeRobot's module-level helpers, metadata class and writer stay LeRobot's.

It writes a Markdown report (``--out``, default stdout): pass / fail / error / skip per test
file for both runs, and each test that LeRobot passes and RoboCache does not, with the first
line of its failure. Not part of CI: it needs LeRobot, its test suite and minutes of CPU.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

# the classes under test, rebound in the copied modules that import them from LeRobot
CLASSES = ("LeRobotDataset", "MultiLeRobotDataset")
IMPORT = re.compile(r"^from lerobot\.datasets(?:\.[a-z_]+)? import (\([^)]*\)|.+)$", re.M)


def rebind(path: Path) -> bool:
    """Bind the classes a test module imports from LeRobot to RoboCache's (a line appended
    at the end of the module: its functions read the module's globals when they run)."""
    text = path.read_text()
    names = {n.strip().split(" as ")[-1] for m in IMPORT.finditer(text)
             for n in m.group(1).strip("()").replace("\n", " ").split(",")}
    wanted = [c for c in CLASSES if c in names]
    if not wanted:
        return False
    path.write_text(text + "\n\n# the classes under test: RoboCache's\n"
                    f"from robocache import {', '.join(wanted)}  # noqa: E402, F811\n")
    return True


def run(tests: Path, report: Path, files: list[str],
        extra: list[str]) -> dict[str, tuple[str, str]]:
    """pytest over ``files`` of ``tests/datasets`` (all of them when empty) of the copy at
    ``tests``' parent: test id -> (outcome, first line of the failure)."""
    import robocache

    paths = [f"tests/datasets/{f}" for f in files] or ["tests/datasets"]
    cmd = [sys.executable, "-m", "pytest", *paths, "-q", "-p", "no:cacheprovider",
           "-o", "junit_family=xunit1", f"--junitxml={report}", *extra]
    # the copy runs from its own folder: RoboCache importable from wherever it is here
    path = [str(Path(robocache.__file__).resolve().parents[1]), *sys.path[1:]]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    subprocess.run(cmd, cwd=tests.parent, env=env, check=False)
    if not report.exists():
        raise SystemExit(f"pytest wrote no report for {tests.parent.name}: see its output")
    out = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        cls = case.get("classname", "").split(".")[-1]
        name = "::".join([case.get("file", ""), *([cls] if cls[:1].isupper() else []),
                          case.get("name", "")])
        outcome, cause = "passed", ""
        for kind in ("failure", "error", "skipped"):
            got = case.find(kind)
            if got is not None:
                outcome = {"failure": "failed", "error": "error", "skipped": "skipped"}[kind]
                cause = (got.get("message") or got.text or "").strip().splitlines()[:1]
                cause = cause[0][:200] if cause else ""
                break
        out[name] = (outcome, cause)
    return out


def table(theirs: dict, ours: dict) -> str:
    files = sorted({k.split("::")[0] for k in theirs} | {k.split("::")[0] for k in ours})
    lines = ["| file | LeRobot pass / fail / error / skip | RoboCache pass / fail / error / skip |",
             "|---|---|---|"]
    totals = [Counter(), Counter()]
    for f in files:
        cells = []
        for run_, total in zip((theirs, ours), totals, strict=True):
            c = Counter(o for k, (o, _) in run_.items() if k.split("::")[0] == f)
            total.update(c)
            cells.append(f"{c['passed']} / {c['failed']} / {c['error']} / {c['skipped']}")
        lines.append(f"| {f} | {cells[0]} | {cells[1]} |")
    cells = [f"{t['passed']} / {t['failed']} / {t['error']} / {t['skipped']}" for t in totals]
    lines.append(f"| **all** | {cells[0]} | {cells[1]} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lerobot", type=Path, required=True,
                    help="a checkout of LeRobot's repository at the installed version's tag")
    ap.add_argument("--out", type=Path, help="the Markdown report (default: stdout)")
    ap.add_argument("files", nargs="*", help="test files of tests/datasets (default: all)")
    ap.add_argument("-k", help="pytest -k expression (a subset of the tests)")
    args = ap.parse_args()
    import lerobot

    extra = ["-k", args.k] if args.k else []
    with tempfile.TemporaryDirectory() as scratch:
        results = {}
        for side in ("lerobot", "robocache"):
            root = Path(scratch) / side
            shutil.copytree(args.lerobot / "tests", root / "tests")
            if side == "robocache":
                swapped = [p for p in [*(root / "tests" / "datasets").glob("*.py"),
                                       root / "tests" / "fixtures" / "dataset_factories.py"]
                           if rebind(p)]
                print(f"classes rebound in {len(swapped)} modules", file=sys.stderr)
            results[side] = run(root / "tests", Path(scratch) / f"{side}.xml", args.files,
                                extra)
    theirs, ours = results["lerobot"], results["robocache"]
    lost = sorted(k for k, (o, _) in theirs.items()
                  if o == "passed" and ours.get(k, ("missing", ""))[0] != "passed")
    causes = defaultdict(list)
    for k in lost:
        causes[ours.get(k, ("missing", "not collected"))[1] or ours[k][0]].append(k)
    text = [f"# LeRobot {lerobot.__version__}'s `tests/datasets` against robocache.LeRobotDataset",
            "", table(theirs, ours), "",
            f"Tests LeRobot passes that RoboCache does not: {len(lost)}.", ""]
    for cause, tests in sorted(causes.items(), key=lambda kv: -len(kv[1])):
        text.append(f"- {len(tests)} × `{cause}`")
        text += [f"  - {t}" for t in tests]
    report = "\n".join(text) + "\n"
    if args.out:
        args.out.write_text(report)
    else:
        print(report)


if __name__ == "__main__":
    main()
