"""``robocache doctor``: certify the GPU stack before trusting any benchmark.

    $ robocache doctor --json doctor.json            # snapshot + ceilings measured now
    $ robocache doctor --compare doctor.json         # what drifted since that snapshot

Exit code: 0 healthy, 1 drift against ``--compare``, 2 no usable GPU (the report says why).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer


def _print(snap: dict) -> None:
    from rich.table import Table

    from robocache._console import console as make_console
    from robocache._console import print_table

    console = make_console()
    sw = snap["software"]
    console.print(f"[bold]robocache doctor[/] · {snap['date']} · python {sw['python']} · "
                  f"torch {sw['torch']} (CUDA {sw['cuda_runtime']}) · triton {sw['triton']}")
    host = snap["host"]
    console.print(f"host {host['hostname']}: {host['cpu_model']}, {host['logical_cores']} "
                  f"logical cores ({host['usable_cores']} usable)")
    if not snap["gpu_available"]:
        console.print("[bold red]No usable CUDA GPU.[/]")
        for reason in snap["missing"]:
            console.print(f"  - {reason}")
        console.print("With a GPU, doctor would measure:")
        for item in snap["would_measure"]:
            console.print(f"  - {item}")
        return
    state = snap["nvml"]
    if state.get("available"):
        console.print(f"driver {state['driver']} (CUDA {state['cuda_driver']}), "
                      f"NCCL {sw.get('nccl')}")
        gpus = Table(title="GPUs (NVML)")
        for col in ("#", "name", "memory GiB", "SMs", "SM MHz (max)", "mem MHz (max)", "ECC",
                    "throttle", "PCIe", "NVLink"):
            gpus.add_column(col)
        for g, d in zip(state["gpus"], snap["cuda_devices"], strict=False):
            c, pcie = g["clocks_mhz"], g["pcie"]
            gib = (g["memory_total_bytes"] or 0) / 2**30
            gpus.add_row(str(g["index"]), g["name"], f"{gib:.0f}", str(d["sm_count"]),
                         f"{c['sm']} ({c['sm_max']})",
                         f"{c['mem']} ({c['mem_max']})", str(g["ecc_enabled"]),
                         ", ".join(g["throttle_reasons"] or []) or "none",
                         f"gen{pcie['current_generation']} x{pcie['current_width']}",
                         f"{g['nvlink']['links_active']} links")
        print_table(gpus, console)
    else:
        console.print(f"[yellow]NVML unavailable: {state.get('error')}[/]")
    if snap.get("topology"):
        console.print(snap["topology"], markup=False, highlight=False)
    if snap.get("ceilings"):
        table = Table(title="Ceilings measured now")
        for col in ("ceiling", "value", "peak", "% of peak", "what"):
            table.add_column(col, justify="right" if col in ("value", "peak", "% of peak")
                             else "left")
        sources: dict[str, list[str]] = {}
        for key, rec in snap["ceilings"].items():
            if "error" in rec:
                table.add_row(key, "[red]failed[/]", "", "", rec["error"])
                continue
            if rec.get("peak"):
                sources.setdefault(rec["peak_source"], []).append(key)
            table.add_row(key, f"{rec['value']:.1f} {rec['unit']}",
                          f"{rec['peak']:.4g}" if rec.get("peak") else "",
                          f"{rec['pct_peak']:.0f}%" if rec.get("pct_peak") else "", rec["what"])
        print_table(table, console)
        for source, keys in sources.items():
            console.print(f"peak of {', '.join(keys)}: {source}")
        sweep = snap["ceilings"].get("nccl_allreduce_busbw_GBps", {}).get("sweep")
        if sweep:
            t = Table(title=f"NCCL all-reduce, {sweep['world']} GPUs "
                            f"(result correct: {sweep['correct']})")
            for col in ("bytes", "time us", "algbw GB/s", "busbw GB/s"):
                t.add_column(col, justify="right")
            for r in sweep["rows"]:
                t.add_row(f"{r['bytes']:,}", f"{r['time_us']:.1f}", f"{r['algbw_GBps']:.1f}",
                          f"{r['busbw_GBps']:.1f}")
            print_table(t, console)
    for w in snap.get("warnings", []):
        console.print(f"[yellow]warning:[/] {w}")


def doctor(
    json_path: Path = typer.Option(None, "--json", help="Write the snapshot JSON here."),
    compare: Path = typer.Option(None, "--compare",
                                 help="A saved snapshot: list what drifted since (exit 1)."),
    quick: bool = typer.Option(False, "--quick", help="Smaller ceilings (GEMM 4096^3)."),
    no_measure: bool = typer.Option(False, "--no-measure",
                                    help="Only the snapshot: skip measuring ceilings."),
):
    """Snapshot the GPU stack and measure its ceilings (copy, GEMM, host link, P2P, NCCL)."""
    from robocache.bench import doctor as dr

    snap = dr.snapshot(measure=not no_measure, quick=quick,
                       log=lambda msg: typer.echo(msg, err=True))
    _print(snap)
    if json_path:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(snap, indent=1, default=str) + "\n")
        typer.echo(f"wrote {json_path}")
    if not snap["gpu_available"]:
        raise typer.Exit(dr.EXIT_NO_GPU)
    if compare:
        changes = dr.drift(json.loads(compare.read_text()), snap)
        typer.echo(f"drift against {compare}: " + ("none" if not changes else ""))
        for change in changes:
            typer.echo(f"  - {change}")
        if changes:
            raise typer.Exit(dr.EXIT_DRIFT)
