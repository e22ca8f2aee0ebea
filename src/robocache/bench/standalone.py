"""`python benchmarks/bench_<family>.py [--quick] [--json F]`: run one family without the CLI."""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable
from typing import Any


def main(run: Callable[..., list[dict]], description: str | None = None,
         options: dict[str, tuple[type, str]] | None = None) -> None:
    """Parse ``--quick``, ``--json`` and the family's own ``options`` (name -> (type, help);
    ``--name-with-dashes`` on the command line, passed to ``run`` as ``name=value`` when
    given), run the family, print its table and write the results JSON. A ``run`` that takes
    ``report`` gets a callback for each case as it finishes: the case is printed on one line
    and the JSON rewritten with the cases so far."""
    import torch

    from robocache.bench import harness as H

    p = argparse.ArgumentParser(description=description,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small sizes; runs on CPU too")
    p.add_argument("--json", help="write the results JSON here")
    for name, (kind, text) in (options or {}).items():
        p.add_argument(f"--{name.replace('_', '-')}", type=kind, default=None, help=text)
    a = p.parse_args()
    given: dict[str, Any] = {k: getattr(a, k) for k in options or {}
                             if getattr(a, k) is not None}
    meta = H.metadata()
    if torch.cuda.is_available():
        meta["d2d_copy_GBps"] = H.copy_bandwidth_gbps()
    if given:
        meta["options"] = given
    results = {"meta": meta, "cases": []}
    if "report" in inspect.signature(run).parameters:
        # a family that reports its cases as they finish: each printed and saved at once, so
        # a run killed at its time limit keeps them (``meta.partial`` until the end)
        meta["partial"] = True

        def report(rec: dict) -> None:
            results["cases"].append(rec)
            print(H.one_line(rec), flush=True)
            if a.json:
                H.write_json(a.json, results)

        run(quick=a.quick, copy_gbps=meta.get("d2d_copy_GBps"), report=report, **given)
        del meta["partial"]
    else:
        results["cases"] = run(quick=a.quick, copy_gbps=meta.get("d2d_copy_GBps"), **given)
    H.print_table(results)
    if a.json:
        H.write_json(a.json, results)
