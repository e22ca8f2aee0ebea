"""``robocache info``: versions, CUDA device and Triton availability.

    $ robocache info
    $ robocache info --json
"""

from __future__ import annotations

import json

import typer

from robocache import _env


def collect() -> dict:
    """What is installed and which device RoboCache would run on."""
    import torch  # the one heavy import: needed to see the CUDA device

    v = _env.versions()
    cuda = torch.cuda.is_available()
    return {
        "robocache": v["robocache"],
        "python": v["python"],
        "platform": _env.host()["platform"],
        "torch": v["torch"],
        "torch_cuda": v["cuda_runtime"],
        "triton": v["triton"],
        "cuda_available": cuda,
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if cuda else [],
        "kernels": "triton (CUDA)" if cuda and v["triton"] else "pytorch reference (CPU)",
        "extras": {name: _env.dist_version(name) for name in _env.OPTIONAL},
    }


def info(json_out: bool = typer.Option(False, "--json", help="Print JSON instead of a table.")):
    """Show versions, the CUDA device and whether Triton kernels will run."""
    data = collect()
    if json_out:
        typer.echo(json.dumps(data, indent=1))
        return
    from rich.table import Table

    from robocache._console import print_table

    table = Table(title="RoboCache", show_header=False)
    for key, value in data.items():
        if key == "extras":
            value = ", ".join(f"{k} {v}" for k, v in value.items() if v) or "none"
        elif key == "devices":
            value = ", ".join(value) or "none"
        table.add_row(key, str(value))
    print_table(table)
