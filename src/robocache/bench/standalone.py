"""`python benchmarks/bench_<family>.py [--quick] [--json F]`: run one family without the CLI."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def main(run: Callable[..., list[dict]], description: str | None = None) -> None:
    import torch

    from robocache.bench import harness as H

    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="small sizes; runs on CPU too")
    p.add_argument("--json", help="write the results JSON here")
    a = p.parse_args()
    meta = H.metadata()
    if torch.cuda.is_available():
        meta["d2d_copy_GBps"] = H.copy_bandwidth_gbps()
    results = {"meta": meta, "cases": run(quick=a.quick, copy_gbps=meta.get("d2d_copy_GBps"))}
    H.print_table(results)
    if a.json:
        H.write_json(a.json, results)
