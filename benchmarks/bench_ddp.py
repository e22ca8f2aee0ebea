"""DDP training benchmark: the training benchmark's policy under torchrun on 1..N GPUs, each
rank fed by its own RobotLoader shard (the packed cache resident on its GPU).

    $ robocache bench ddp --json benchmarks/results/ddp.json
    $ python benchmarks/bench_ddp.py --quick        # CPU: gloo, 1 and 2 processes, tiny model

For each world size (1, 2, 4, ... every visible GPU) the benchmark launches ``torchrun
--standalone --nproc-per-node W`` on this file; each rank trains the ACT-like policy of
``bench_train`` (DistributedDataParallel, NCCL, bf16 autocast, AdamW; eager: gradients are
all-reduced during backward) on batches of 256 windows from ``RobotLoader`` with
``set_epoch`` per pass. Reported: samples/s over all ranks, the speedup over one GPU (target
>= 1.9x on two), and per rank the GPU busy fraction (CUDA events bracketing each step on the
training stream, over the span of all steps; target >= 95 %). Keep NCCL's NVLink multicast off
where the machine asks for it (``NCCL_NVLS_ENABLE=0``; the environment is passed through).

A fair baseline: every world size, one GPU included, runs the same path (torchrun, DDP over
NCCL, world size 1 for one GPU) with the same warm-up steps and ``OMP_NUM_THREADS`` (1 unless
the environment sets it; torchrun sets it only for several processes). Before anything is timed
one unmeasured run at the largest world size fills Triton's on-disk kernel cache and wakes
every GPU, so no measured run pays for a JIT compile the next one finds cached. The world sizes
then run in ``rounds`` rounds of alternating order (1, 2, 4, then 4, 2, 1, ...), so drift of
the machine (clocks, temperature) reaches each size alike. The cache is built on the CPU: the
parent process holds no GPU memory while the ranks train. Per rank the step time is the median
interval between consecutive steps' start events (a one-off stall moves it little); a run's
rate is world x batch / its slowest rank's median step, a size's rate the median over rounds,
and the speedup is against the median one-GPU rate. Each rank also reports its SM clock (MHz,
``torch.cuda.clock_rate``, needs nvidia-ml-py) after its timed steps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

FAMILY = "ddp"
FULL = {"episodes": 400, "length": 500, "steps": 200, "warmup": 20, "d_model": 512,
        "layers": 8}
QUICK = {"episodes": 8, "length": 120, "steps": 4, "warmup": 1, "d_model": 32, "layers": 1}


def init_rank(backend: str | None = None) -> tuple[int, int, torch.device]:
    """This rank's process group and device (started by torchrun): (rank, world, device).

    NCCL on GPUs and gloo on the CPU by default; ``backend="gloo"`` on GPUs lets more ranks
    than GPUs share them (rank ``LOCAL_RANK`` on GPU ``LOCAL_RANK % GPUs``: a dry run of the
    multi-rank path on one GPU, not a measurement of scaling)."""
    import torch.distributed as dist

    cuda = torch.cuda.is_available()
    local = int(os.environ["LOCAL_RANK"])
    if cuda:
        torch.cuda.set_device(local % torch.cuda.device_count())
    dist.init_process_group(backend or ("nccl" if cuda else "gloo"))
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    return dist.get_rank(), dist.get_world_size(), device


def time_steps(step, source, device: torch.device, warmup: int, steps: int) -> dict:
    """``warmup`` untimed then ``steps`` timed calls of ``step(next(source))`` after a barrier
    of every rank: wall time, GPU busy fraction (CUDA events bracketing each step, over the
    span of all steps), the median step period (start to next start) and the mean step (wall
    / steps), the SM clock after the steps."""
    import torch.distributed as dist

    cuda = device.type == "cuda"
    for _ in range(warmup):
        step(next(source))
    marks = []
    if cuda:
        torch.cuda.synchronize(device)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        batch = next(source)  # the host waits here for the feed
        if cuda:
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            step(batch)
            end.record()
            marks.append((start, end))
        else:
            step(batch)
    if cuda:
        torch.cuda.synchronize(device)
    wall = time.perf_counter() - t0
    busy = (sum(s.elapsed_time(e) for s, e in marks) / marks[0][0].elapsed_time(marks[-1][1])
            if marks else None)
    # the step period: from one step's start to the next's, median over the timed steps
    starts = [a for a, _ in marks]
    periods = sorted(a.elapsed_time(b) for a, b in zip(starts[:-1], starts[1:], strict=True))
    step_ms = periods[len(periods) // 2] if periods else wall * 1e3 / steps
    try:
        clock = torch.cuda.clock_rate(device) if cuda else None
    except Exception:  # NVML (nvidia-ml-py) missing: the clock is not reported
        clock = None
    return {"wall_s": wall, "busy": busy, "step_ms": step_ms,
            "wall_step_ms": wall * 1e3 / steps, "sm_clock_mhz": clock, "device": str(device)}


def finish_rank(out: str, numbers: dict) -> None:
    """Gather every rank's ``numbers`` (with its rank) on rank 0, which writes them to ``out``
    as a JSON list in rank order; end the process group."""
    import torch.distributed as dist

    rank = dist.get_rank()
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, {"rank": rank, **numbers})
    if rank == 0:
        Path(out).write_text(json.dumps(gathered))
    dist.destroy_process_group()


def worker(cache: str, out: str, cfg: dict) -> None:
    """One rank (started by torchrun): train ``cfg['steps']`` steps, write its numbers."""
    from torch.nn.parallel import DistributedDataParallel

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_loader as L
    from bench_train import Policy

    from robocache.data import RobotDataset, RobotLoader

    _, _, device = init_rank()
    cuda = device.type == "cuda"
    loader = RobotLoader(RobotDataset(cache, history=L.HISTORY, horizon=L.HORIZON), L.BATCH)
    assert loader.device == device, (loader.device, device)
    torch.manual_seed(0)
    model = Policy(L.OBS_DIM, L.ACT_DIM, L.HISTORY, L.HORIZON, cfg["d_model"],
                   cfg["layers"]).to(device)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)

    def step(batch):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, torch.bfloat16, enabled=cuda):
            pred = ddp(batch["observation.state"])
        err = (pred.float() - batch["action"]) ** 2
        ((err * (~batch["action_is_pad"])[..., None]).mean()).backward()
        opt.step()

    finish_rank(out, time_steps(step, epochs(loader), device, cfg["warmup"], cfg["steps"]))


def epochs(loader):
    """The loader's batches, epoch after epoch (``set_epoch`` before each)."""
    epoch = 0
    while True:
        loader.set_epoch(epoch)
        yield from loader
        epoch += 1


def launch(script: str, world: int, out: Path, args: list[str], env: dict | None = None,
           preexec_fn=None) -> list[dict]:
    """``torchrun --standalone --nproc-per-node world script --worker *args``, whose rank 0
    writes every rank's numbers to ``out`` (see :func:`finish_rank`): those numbers. The
    ranks get this process's environment (``NCCL_*`` included), our ``sys.path`` and
    ``env``; ``preexec_fn`` runs in torchrun's process before it starts (a cgroup, say).
    ``OMP_NUM_THREADS`` is 1 at every world size unless the environment sets it: torchrun sets
    it for several processes only, and one rank with a thread per core would not run the
    path the others run (on 2 cores, a rank fed camera batches stepped 6-10x slower with
    them)."""
    env = {"OMP_NUM_THREADS": "1", **os.environ,
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), **(env or {})}
    Path(out).unlink(missing_ok=True)
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    f"--nproc-per-node={world}", script, "--worker", *args],
                   check=True, env=env, preexec_fn=preexec_fn)
    return json.loads(Path(out).read_text())


def sweep(launch_one, sizes: list[int], rounds: int, warm: bool = True
          ) -> dict[int, list[list[dict]]]:
    """Every world size's runs (per round, every rank's numbers from ``launch_one(world)``):
    first, when ``warm``, one unmeasured run at the largest size (kernels compiled and cached,
    every GPU awake), then ``rounds`` rounds of alternating order."""
    runs: dict[int, list[list[dict]]] = {w: [] for w in sizes}
    if warm:
        launch_one(max(sizes))
    for order in round_orders(sizes, rounds):
        for world in order:
            runs[world].append(launch_one(world))
    return runs


def world_sizes(gpus: int) -> list[int]:
    sizes, w = [], 1
    while w < gpus:
        sizes.append(w)
        w *= 2
    return [*sizes, gpus] if gpus else [1, 2]


def round_orders(sizes: list[int], rounds: int) -> list[list[int]]:
    """The world sizes of each round, every other round reversed (1, 2, 4 / 4, 2, 1 / ...)."""
    return [sizes if r % 2 == 0 else sizes[::-1] for r in range(rounds)]


def rates(runs: dict[int, list[list[dict]]], batch: int, key: str = "step_ms"
          ) -> dict[int, float]:
    """samples/s of each world size from its runs (per round, every rank's numbers): world x
    batch / the slowest rank's step (``key``: its median step period, or ``wall_step_ms``, its
    wall time over its steps), the median over the rounds."""
    import statistics

    return {w: statistics.median(w * batch / (max(r[key] for r in ranks) / 1e3)
                                 for ranks in rounds) for w, rounds in runs.items()}


def run(quick: bool = False, copy_gbps: float | None = None,
        rounds: int | None = None) -> list[dict]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_loader as L

    from robocache.bench import harness as H
    from robocache.data.cache import build

    cfg = QUICK if quick else FULL
    rounds = rounds or (1 if quick else 3)
    gpus = torch.cuda.device_count()
    sizes = world_sizes(gpus)
    name = f"policy-d{cfg['d_model']}x{cfg['layers']}-b{L.BATCH}-per-rank"
    with tempfile.TemporaryDirectory() as tmp:
        root = L.make_dataset(Path(tmp) / "lerobot", cfg["episodes"], cfg["length"])
        build(root, Path(tmp) / "cache", rate_hz=L.FPS, progress=False, device="cpu")
        out = Path(tmp) / "ranks.json"
        runs = sweep(lambda world: launch(__file__, world, out, [
            str(Path(tmp) / "cache"), str(out), json.dumps(cfg)]), sizes, rounds)
    records, rate = [], rates(runs, L.BATCH)
    for world in sizes:
        last = runs[world][-1]
        busy = [r["busy"] for r in last]
        clocks = [r["sm_clock_mhz"] for ranks in runs[world] for r in ranks]
        records.append(H.case(
            FAMILY, name, f"{world} GPU" if gpus else f"{world} CPU process",
            H.summarize([max(r["step_ms"] for r in ranks) for ranks in runs[world]]),
            batch=world, world=world, rounds=rounds, samples_per_s=rate[world],
            speedup=rate[world] / rate[sizes[0]], busy_per_rank=busy,
            wall_s_per_round=[max(r["wall_s"] for r in ranks) for ranks in runs[world]],
            sm_clock_mhz=clocks, devices=[r["device"] for r in last],
            note=f"{rate[world]:.0f} samples/s, x{rate[world] / rate[sizes[0]]:.2f} (median of "
                 f"{rounds} rounds)"
                 + (", busy " + "/".join(f"{100 * b:.1f}%" for b in busy) if gpus else "")))
    return records


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))
    else:
        from robocache.bench.standalone import main

        main(run, __doc__, {"rounds": (int, "rounds of every world size (default 3; "
                                            "--quick: 1)")})
