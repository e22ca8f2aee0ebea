"""DDP vision training fed out of core: scaling and memory per node, from RAM, from local disk
and from an object store, in one run.

    $ NCCL_NVLS_ENABLE=0 robocache bench ddp_serve --json benchmarks/results/ddp-serve.json
    $ python benchmarks/bench_ddp_serve.py --sources disk --worlds 1,2,4 --json out.json
    $ python benchmarks/bench_ddp_serve.py --quick     # CPU: gloo, 1 and 2 processes, tiny

For each source and world size (1, 2, 4, ... every visible GPU; ``--worlds``) the benchmark
launches ``torchrun --standalone --nproc-per-node W`` on this file (``bench_ddp``'s launch,
rounds and rates). Each rank trains the vision loop of ``bench_train_vision``: its ResNet-18
policy (one backbone shared by 2 cameras x history 2, 2-step state, an action chunk of 8),
``DistributedDataParallel`` (NCCL; gloo on the CPU), bf16 autocast, fused AdamW, channels-last,
batch 64 per rank, fed by a resident ``RobotLoader`` (``normalize=None``, ``set_epoch`` per
pass) over ``RobotDataset(cache, image_size=(224, 224), image_transforms=random crop + colour
jitter)``: the frames decoded per batch (nvJPEG on a GPU). Sources:

- ``ram``: ``in_memory=True``: every rank copies the steps and every encoded frame into its own
  memory at open (the baseline: the loader as it served before out-of-core serving).
- ``disk``: out of core from the local disk: the ranks map the machine's served index and read
  frames per batch. Before every launch the cache's files and the served index are evicted
  from the page cache (``posix_fadvise(DONTNEED)``, ``bench_serve.evict``), and the cache holds
  more samples than the largest run reads (``epoch_fraction`` <= 1 at the defaults), so frames
  come from the disk, not from memory; each rank's ``/proc/self/io`` ``read_bytes`` (bytes it
  made the kernel fetch from the storage) is recorded to show it. ``--memory-max-gb`` also runs
  each disk launch (torchrun, the ranks and their workers) in a cgroup v2 group with that
  ``memory.max`` where the machine allows one (page cache counts against it), and records the
  group's peak.
- ``s3``: out of core from an object store: a smaller copy of the cache published
  (``robocache.data.publish``) to moto's S3 server on 127.0.0.1 (``tests/s3server.py``), served
  from its ``s3://`` URI (fewer steps: the server is one Python process).

The caches are ``bench_serve.synthetic_cache``: the real layout (a tiny ``build`` gives schema,
manifest and stats), ``episodes`` x ``length`` rows of 6-D state and action, two cameras whose
480x640 frames cycle through a pool of textured JPEGs (q95 4:4:4, ~100 KB, as the build stores
them). The served index is made once, in its own process, before any rank opens a cache.

Reported per source and world size: samples/s over all ranks (world x batch / the slowest
rank's wall time per timed step, the median over ``rounds``; a feed's stalls count, unlike a
median step), the speedup over the source's own 1-GPU run, ``vs_in_ram`` (samples/s against
``ram`` at the same world size), per rank the GPU busy fraction (CUDA events bracketing each
training step over the span of the timed steps) and its median step; and memory: after the
timed steps, with every rank alive, each rank's PSS plus its descendants' (DataLoader workers
or any other process it started), summed over the ranks (``pss_total_bytes``), against the
same sum of the source's 1-GPU run (``pss_vs_one``: how many copies of one rank's memory the
node holds; page cache is not in it), and the growth of that PSS from before the dataset was
opened (the model and CUDA context already made). The targets (a 4-GPU node): out of core
from disk >= 3.8x on 4 GPUs, busy >= 95 % a rank, >= 90 % of ``ram``'s samples/s;
``pss_vs_one`` <= 1.25 at 4 ranks.

``--quick``: 48x64 frames served at 32x32, a one-conv model, batch 4, 3 timed steps, 1 round;
on the CPU, gloo, 1 and 2 processes. ``--backend gloo`` on a GPU machine lets more ranks than
GPUs share them (a dry run of the multi-rank path on one GPU: its speedup means nothing).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # sibling benchmarks, under the CLI
import bench_ddp as D  # noqa: E402
import bench_serve as S  # noqa: E402

from robocache.bench import harness as H  # noqa: E402

FAMILY = "ddp_serve"
SOURCES = ("ram", "disk", "s3")
STATE, ACTION, HISTORY = "observation.state", "action", 2
FULL = {"hw": (480, 640), "pool": 64, "episodes": 750, "length": 40, "s3_episodes": 40,
        "batch": 64, "horizon": 8, "size": (224, 224), "steps": 100, "warmup": 10,
        "s3_steps": 20, "s3_warmup": 3, "model": "resnet18", "rounds": 2}
QUICK = {"hw": (48, 64), "pool": 4, "episodes": 12, "length": 10, "s3_episodes": 6,
         "batch": 4, "horizon": 4, "size": (32, 32), "steps": 3, "warmup": 1,
         "s3_steps": 2, "s3_warmup": 1, "model": "tiny", "rounds": 1}
OPTIONS = {"sources": (str, f"comma-separated sources of {SOURCES} (default all)"),
           "worlds": (str, "comma-separated world sizes (default 1, 2, 4, ... every GPU; "
                           "CPU: 1,2)"),
           "rounds": (int, "rounds of every world size (default 2; --quick: 1)"),
           "episodes": (int, "episodes of the local cache, 40 steps each (default 750)"),
           "s3_episodes": (int, "episodes of the cache in the S3 server (default 40)"),
           "steps": (int, "timed steps per rank, ram and disk (default 100)"),
           "warmup": (int, "untimed steps per rank before them (default 10)"),
           "backend": (str, "torch.distributed backend (default nccl on GPUs, gloo on CPU)"),
           "memory_max_gb": (float, "disk launches in a cgroup with this memory.max (GB)"),
           "workdir": (str, "folder for the caches (default: the system's temp)")}


# ── one rank ─────────────────────────────────────────────────────────

def pss_tree(pid: int) -> tuple[int, int]:
    """PSS of ``pid`` and every process it started (and they started), in bytes, and how
    many processes that is; processes gone meanwhile are skipped."""
    total, count, todo = 0, 0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += S._pss(p)
            count += 1
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total, count


def disk_read_bytes() -> int | None:
    """Bytes this process made the kernel fetch from storage (``/proc/self/io``)."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def worker(target: str, out: str, cfg: dict) -> None:
    """One rank (started by torchrun): the vision loop on ``target`` (a cache folder or URI),
    its timings, disk reads and memory written by rank 0 for every rank."""
    import torch.distributed as dist
    from bench_train_vision import VisionPolicy, transforms
    from torch.nn.parallel import DistributedDataParallel

    from robocache.data import RobotDataset, RobotLoader

    _, _, device = D.init_rank(cfg.get("backend"))
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    model = VisionPolicy(cfg["model"], len(S.CAMS) * HISTORY, HISTORY * 6, 6,
                         cfg["horizon"]).to(device).to(memory_format=torch.channels_last)
    ddp = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4, fused=cuda)
    before, _ = pss_tree(os.getpid())
    ds = RobotDataset(target, keys=[*S.CAMS, STATE, ACTION], action_keys=[ACTION],
                      history=HISTORY, horizon=cfg["horizon"], image_size=tuple(cfg["size"]),
                      image_transforms=transforms(), in_memory=cfg["source"] == "ram",
                      storage_options=cfg.get("storage_options"))
    loader = RobotLoader(ds, cfg["batch"], device=device, normalize=None, seed=0)
    read0 = disk_read_bytes()

    def step(b):
        images = torch.cat([b[k] for k in S.CAMS], 1)  # [B, cameras x history, 3, h, w]
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, torch.bfloat16, enabled=cuda):
            pred = ddp(images, b[STATE])
        err = (pred.float() - b[ACTION]) ** 2
        (err * (~b[f"{ACTION}_is_pad"])[..., None]).mean().backward()
        opt.step()

    numbers = D.time_steps(step, D.epochs(loader), device, cfg["warmup"], cfg["steps"])
    read1 = disk_read_bytes()
    dist.barrier()  # every rank done and alive: shared pages split among all of them
    pss, processes = pss_tree(os.getpid())
    dist.barrier()
    D.finish_rank(out, {**numbers, "pss_bytes": pss, "pss_before_bytes": before,
                        "processes": processes, "samples": len(ds),
                        "disk_read_bytes": None if read0 is None else read1 - read0})


# ── the run ──────────────────────────────────────────────────────────

OPEN = """
import json, sys
from robocache.data import RobotDataset
RobotDataset(sys.argv[1], storage_options=json.loads(sys.argv[2]) or None)
"""


def _open_served(target: str, options: dict | None, serve: Path) -> None:
    """Make the served index of ``target`` in its own process, before any rank opens it."""
    subprocess.run([sys.executable, "-c", OPEN, target, json.dumps(options or {})],
                   env=S._env(serve), check=True, timeout=900)


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except Exception:  # not installed
        return None


def cases(source: str, runs: dict[int, list[list[dict]]], cfg: dict, frame_bytes: float,
          ram: dict[int, float] | None = None, label: str = "GPU") -> list[dict]:
    """The records of one source from its runs (per world size, per round, every rank's
    numbers); ``ram``: the in-RAM samples/s per world size, when measured."""
    batch, sizes = cfg["batch"], sorted(runs)
    rate = D.rates(runs, batch, key="wall_step_ms")
    one = 1 if 1 in runs else sizes[0]

    def pss_total(ranks: list[dict]) -> int:
        return sum(r["pss_bytes"] for r in ranks)

    def pss_growth(ranks: list[dict]) -> int:
        return sum(r["pss_bytes"] - r["pss_before_bytes"] for r in ranks)

    base_pss, base_growth = pss_total(runs[one][-1]), pss_growth(runs[one][-1])
    frames = (cfg["warmup"] + cfg["steps"]) * batch * len(S.CAMS) * HISTORY  # a rank's
    name = (f"{source}-{cfg['model']}-{cfg['hw'][0]}x{cfg['hw'][1]}-to{cfg['size'][0]}"
            f"-b{batch}-per-rank-cams2-t2")
    out = []
    for world in sizes:
        last = runs[world][-1]
        busy = [r["busy"] for r in last]
        total = pss_total(last)
        reads = [r["disk_read_bytes"] for r in last]
        read = sum(reads) if None not in reads else None
        rec = H.case(
            FAMILY, name, f"{world} {label}",
            H.summarize([max(r["wall_step_ms"] for r in ranks) for ranks in runs[world]]),
            source=source, batch=world, world=world, rounds=len(runs[world]),
            batch_per_rank=batch, samples_per_s=rate[world], speedup=rate[world] / rate[one],
            speedup_vs_world=one,
            vs_in_ram=rate[world] / ram[world] if ram and world in ram else None,
            busy_per_rank=busy, busy_min=min(busy) if None not in busy else None,
            step_ms_per_rank=[r["step_ms"] for r in last],
            wall_s_per_round=[max(r["wall_s"] for r in ranks) for ranks in runs[world]],
            pss_bytes_per_rank=[r["pss_bytes"] for r in last], pss_total_bytes=total,
            pss_vs_one=total / base_pss,
            pss_growth_bytes=pss_growth(last),
            pss_growth_vs_one=pss_growth(last) / base_growth if base_growth > 0 else None,
            processes=sum(r["processes"] for r in last),
            disk_read_bytes=read, frame_kB=frame_bytes / 1e3,
            read_per_frame_byte=read / (world * frames * frame_bytes) if read is not None
            else None,
            epoch_fraction=world * (cfg["warmup"] + cfg["steps"]) * batch / last[0]["samples"],
            timed_steps=cfg["steps"], warmup_steps=cfg["warmup"],
            sm_clock_mhz=[r["sm_clock_mhz"] for ranks in runs[world] for r in ranks],
            devices=[r["device"] for r in last],
            **{k: last[0][k] for k in ("cgroup_peak_bytes", "memory_max_bytes") if k in last[0]})
        rec["note"] = (f"{rate[world]:,.0f} samples/s, x{rec['speedup']:.2f}"
                       + (f", {100 * rec['vs_in_ram']:.0f}% of ram" if rec["vs_in_ram"] else "")
                       + (", busy " + "/".join(f"{100 * b:.1f}%" for b in busy)
                          if rec["busy_min"] is not None else "")
                       + f", PSS {total / 1e9:.2f} GB = {rec['pss_vs_one']:.2f}x one rank's")
        out.append(rec)
    return out


def _source_runs(source: str, tmp: Path, cfg: dict, sizes: list[int], template: Path,
                 pool: list[bytes], warm: bool, backend: str | None,
                 memory_max_gb: float | None, server=None
                 ) -> tuple[dict[int, list[list[dict]]], dict, dict]:
    """Every world size's runs from ``source`` (the cache made or published first), the
    ranks' configuration, and what the source's records add."""
    from robocache.data.location import Location
    from robocache.data.publish import publish

    serve, options, extra = tmp / f"serve-{source}", None, {}
    if source == "s3":
        local = S.synthetic_cache(tmp / "cache-s3", template, cfg["s3_episodes"],
                                  cfg["length"], pool)
        target, options = f"s3://{server.bucket()}/cache", server.options()
        t0 = time.perf_counter()
        publish(local, Location(target, options))
        extra["publish_s"] = time.perf_counter() - t0
        shutil.rmtree(local)
    else:
        cache = tmp / "cache"
        if not cache.exists():
            S.synthetic_cache(cache, template, cfg["episodes"], cfg["length"], pool)
        target = str(cache)
    if source == "disk":
        extra["page_cache"] = ("cache and served index evicted before each launch "
                               "(posix_fadvise DONTNEED)")
    _open_served(target, options, serve)
    rank_cfg = {**cfg, "source": source, "backend": backend, "storage_options": options}
    if source == "s3":
        rank_cfg.update(steps=cfg["s3_steps"], warmup=cfg["s3_warmup"])
    result = tmp / "ranks.json"

    def launch_one(world: int) -> list[dict]:
        group = None
        if source == "disk":
            S.evict(Path(target), serve)
            if memory_max_gb:
                group = S._cgroup(int(memory_max_gb * 1e9))
                if group is None:
                    extra["memory_max"] = "no cgroup v2 group here: page cache evicted only"
        ranks = D.launch(__file__, world, result, [target, str(result), json.dumps(rank_cfg)],
                         env={"ROBOCACHE_SERVE_DIR": str(serve)},
                         preexec_fn=(lambda: (group / "cgroup.procs").write_text("0"))
                         if group else None)
        if group:
            peak = group / "memory.peak"
            ranks[0]["cgroup_peak_bytes"] = int(peak.read_text()) if peak.exists() else None
            ranks[0]["memory_max_bytes"] = int(memory_max_gb * 1e9)
            group.rmdir()
        return ranks

    return D.sweep(launch_one, sizes, cfg["rounds"], warm=warm), rank_cfg, extra


def run(quick: bool = False, copy_gbps: float | None = None, report=None,
        sources: str | None = None, worlds: str | None = None, rounds: int | None = None,
        episodes: int | None = None, s3_episodes: int | None = None, steps: int | None = None,
        warmup: int | None = None, backend: str | None = None,
        memory_max_gb: float | None = None, workdir: str | None = None) -> list[dict]:
    from bench_train_vision import versions

    cfg = dict(QUICK if quick else FULL)
    cfg.update({k: v for k, v in dict(rounds=rounds, episodes=episodes, steps=steps,
                                      s3_episodes=s3_episodes, warmup=warmup).items()
                if v is not None})
    chosen = [s for s in (sources or ",".join(SOURCES)).split(",") if s]
    if unknown := set(chosen) - set(SOURCES):
        raise ValueError(f"unknown sources {sorted(unknown)}; choose from {SOURCES}")
    gpus = torch.cuda.device_count()
    sizes = [int(w) for w in worlds.split(",")] if worlds else D.world_sizes(gpus)
    label = "GPU" if gpus else "CPU process"
    out: list[dict] = []
    report = report or out.append
    ram: dict[int, float] | None = None
    warm = gpus > 0  # one unmeasured launch at the largest size first, as bench_ddp
    vers = {**versions(), **{name: _version(name) for name in ("lance", "moto")}}
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        tmp = Path(tmp)
        pool = S.jpeg_pool(cfg["pool"], cfg["hw"])
        frame_bytes = float(np.mean([len(p) for p in pool]))
        template = S._template(tmp, cfg["hw"], cameras=True)
        for source in chosen:
            if source == "s3" and (server := S._s3()) is None:
                report(H.case(FAMILY, "s3", "skipped", H.summarize([0.0]),
                              note="no S3 server: moto is not installed"))
                continue
            try:
                runs, rank_cfg, extra = _source_runs(source, tmp, cfg, sizes, template, pool,
                                                     warm, backend, memory_max_gb,
                                                     server if source == "s3" else None)
            except subprocess.CalledProcessError as e:  # the other sources still run
                report(H.case(FAMILY, source, "failed", H.summarize([0.0]), source=source,
                              error=str(e), note=f"a launch failed: {e}"))
                continue
            finally:
                if source == "s3":
                    server.stop()
            warm = False
            for rec in cases(source, runs, rank_cfg, frame_bytes, ram, label):
                report({**rec, **extra, "versions": vers})
            if source == "ram":
                ram = D.rates(runs, cfg["batch"], key="wall_step_ms")
    return out


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))
    else:
        from robocache.bench.standalone import main

        main(run, __doc__, OPTIONS)
