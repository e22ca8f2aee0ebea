"""LeRobot's own training entry point on LeRobot's dataset and on RoboCache, side by side.

Runs in LeRobot 0.6.1's environment (Python >= 3.12, robocache installed there), from the
repository root:

    # CPU parity: ACT, 300 steps, both backends, the loss of every step compared
    HF_HUB_OFFLINE=1 python benchmarks/lerobot_train_parity.py --steps 300
    # a diffusion policy (needs lerobot[diffusion]) on a dataset LeRobot writes now
    HF_HUB_OFFLINE=1 python benchmarks/lerobot_train_parity.py --policy diffusion --steps 100 \\
        --write-dataset 4,30,32,48
    # record the expected losses (and LeRobot's batches) the CI test checks against
    HF_HUB_OFFLINE=1 python benchmarks/lerobot_train_parity.py --steps 300 \\
        --record tests/fixtures/lerobot/train_parity.json
    # GPU speed: ACT's default model on a larger LeRobot-written dataset (12 episodes of 300
    # frames, a 240x320 video camera and a 60x80 image camera), timed end to end, each backend
    # in its own process: LeRobot, RoboCache's first use (its cache built in the run) and
    # RoboCache again (cache built)
    HF_HUB_OFFLINE=1 python benchmarks/lerobot_train_parity.py --timing --device cuda \\
        --policy act-default --steps 200 --batch-size 64 --num-workers 8 --camera-codec jpeg \\
        --write-dataset 12,300,240,320,60,80 --root /tmp/lerobot-train-240x320 \\
        --json benchmarks/results/lerobot_train-cuda.json

Each backend runs ``lerobot.scripts.lerobot_train.main`` (what ``lerobot-train`` runs) in a
fresh process with the same arguments and seed: ``lerobot`` as is, ``robocache`` through
``robocache.lerobot_train.use_robocache`` (what ``python -m robocache.lerobot_train`` does),
video frames stored as PNG so the frames are LeRobot's decode exactly. The run records the
loss of every step and, for each batch the DataLoader gave the training loop, its ``index``
and a SHA-256 of every key's bytes. With ``--timing`` it records no batch digests (they cost
as much as a small step) and reports per backend the wall time of the whole process (imports,
dataset opening, a first use's cache build, training), the training loop's steps/s after its
first tenth of steps, and the fraction of the loop spent waiting for the next batch (the
``next()`` of LeRobot's loop on its DataLoader); the speed-ups are LeRobot's over RoboCache's
times. The dataset is ``tests/fixtures/lerobot/train`` (written
by LeRobot's own writer, ``tests/fixtures/lerobot/make_fixtures.py``) unless ``--root``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROOT = REPO / "tests" / "fixtures" / "lerobot" / "train"
#: policies small enough for a CPU (a few hundred steps in minutes); diffusion wants cameras of
#: one size (``--write-dataset``, not the training fixture's two sizes)
POLICIES = {
    "act": ["--policy.type=act", "--policy.pretrained_backbone_weights=null",
            "--policy.dim_model=64", "--policy.n_heads=2", "--policy.dim_feedforward=128",
            "--policy.n_encoder_layers=1", "--policy.n_decoder_layers=1",
            "--policy.n_vae_encoder_layers=1", "--policy.latent_dim=8",
            "--policy.chunk_size=10", "--policy.n_action_steps=10"],
    "diffusion": ["--policy.type=diffusion", "--policy.pretrained_backbone_weights=null",
                  "--policy.use_group_norm=true", "--policy.n_obs_steps=2",
                  "--policy.horizon=8", "--policy.n_action_steps=4",
                  "--policy.drop_n_last_frames=3", "--policy.down_dims=[32,64]",
                  "--policy.diffusion_step_embed_dim=32",
                  "--policy.spatial_softmax_num_keypoints=8", "--policy.crop_shape=[28,40]",
                  "--policy.num_train_timesteps=20"],
    # ACT as LeRobot configures it (ResNet-18, 512-wide transformer, 100-action chunks), but
    # its backbone not downloaded (a machine without a network)
    "act-default": ["--policy.type=act", "--policy.pretrained_backbone_weights=null"],
}
#: timing runs: RoboCache twice, its first use (the cache built in the run) and again
TIMED = ("lerobot", "robocache", "robocache_cached")


def lerobot_args(root: Path, out: Path, steps: int, batch_size: int, num_workers: int,
                 device: str, seed: int, policy: str = "act") -> list[str]:
    """``lerobot-train`` arguments of the run (no checkpoints, no eval, no wandb)."""
    return [f"--dataset.repo_id=robocache/{root.name}", f"--dataset.root={root}",
            "--dataset.image_transforms.enable=false", *POLICIES[policy],
            f"--policy.device={device}",
            "--policy.push_to_hub=false", f"--batch_size={batch_size}", f"--steps={steps}",
            f"--seed={seed}", f"--num_workers={num_workers}", "--log_freq=100",
            "--save_checkpoint=false", "--wandb.enable=false",
            f"--output_dir={out}"]


def digest(batch: dict) -> dict[str, str]:
    """SHA-256 (first 16 hex digits) of every tensor key's bytes, and of the task strings."""
    out = {}
    for k, v in sorted(batch.items()):
        raw = "\0".join(v).encode() if isinstance(v, list) else v.cpu().contiguous().numpy(
            ).tobytes()
        out[k] = hashlib.sha256(raw).hexdigest()[:16]
    return out


def run_backend(backend: str, args: list[str], out: Path, cache: Path | None,
                camera_codec: str = "png", timing: bool = False) -> None:
    """In this process: LeRobot's training with ``backend`` serving the data; writes
    ``{"loss": [...], "index": [[...]...], "digest": [{key: sha}...], "seconds": s,
    "wait": [s...], "step_end": [s...]}`` to ``out`` (``wait``: each step's wait for its batch;
    ``step_end``: when each step ended, since the run started; no digests when ``timing``)."""
    import lerobot.scripts.lerobot_train as lt
    from lerobot.utils.import_utils import get_safe_default_video_backend

    record: dict = {"loss": [], "index": [], "digest": [], "wait": [], "step_end": [],
                    "video_backend": get_safe_default_video_backend()}  # LeRobot's decoder
    if backend.startswith("robocache"):
        from robocache.lerobot_train import use_robocache

        use_robocache(camera_codec=camera_codec, **({"cache": str(cache)} if cache else {}))
    cycle, update = lt.cycle, lt.update_policy
    t0 = time.perf_counter()

    def recorded_cycle(loader):
        batches = cycle(loader)
        while True:
            t = time.perf_counter()
            batch = next(batches)
            record["wait"].append(time.perf_counter() - t)
            record["index"].append(batch["index"].tolist())
            if not timing:
                record["digest"].append(digest(batch))
            yield batch

    def recorded_update(metrics, *a, **k):
        result = update(metrics, *a, **k)  # LeRobot reads the loss back: the step has ended
        record["loss"].append(float(result[0].metrics["loss"].val))
        record["step_end"].append(time.perf_counter() - t0)
        return result

    lt.cycle, lt.update_policy = recorded_cycle, recorded_update
    sys.argv = ["lerobot-train", *args]
    lt.main()
    record["seconds"] = time.perf_counter() - t0
    out.write_text(json.dumps(record))


def timed(run: dict) -> dict:
    """A run's speed: its process's wall time, the time to its first step's end, and over the
    steps after the first tenth the loop's steps/s and the fraction of it spent waiting for
    batches."""
    ends, waits = run["step_end"], run["wait"]
    first = max(len(ends) // 10, 1)
    loop = ends[-1] - ends[first - 1]
    return {"wall_s": run["wall_s"], "first_step_s": ends[0],
            "steps_per_s": (len(ends) - first) / loop,
            "data_wait_fraction": sum(waits[first:len(ends)]) / loop,
            "first_loss": run["loss"][0], "last_loss": run["loss"][-1]}


def compare_timing(runs: dict[str, dict]) -> dict:
    """Each backend's :func:`timed` figures and RoboCache's speed-ups over LeRobot (end to end
    on its first use and with its cache built; steps/s of the loop)."""
    out = {k: timed(r) for k, r in runs.items()}
    lr = out["lerobot"]
    return {"runs": out, "video_backend": runs["lerobot"].get("video_backend"),
            "speedup": {"wall_first_use": lr["wall_s"] / out["robocache"]["wall_s"],
                        "wall_cached": lr["wall_s"] / out["robocache_cached"]["wall_s"],
                        "steps_per_s": out["robocache_cached"]["steps_per_s"] / lr["steps_per_s"]}}


def compare(runs: dict[str, dict]) -> dict:
    """Step-by-step comparison of the two runs: max |loss difference|, first differing batch."""
    a, b = runs["lerobot"], runs["robocache"]
    diffs = [abs(x - y) for x, y in zip(a["loss"], b["loss"], strict=True)]
    batches = next((i for i, (x, y) in enumerate(zip(a["digest"], b["digest"], strict=True))
                    if x != y), None)
    return {"steps": len(diffs), "max_abs_loss_diff": max(diffs),
            "first_loss": a["loss"][0], "last_loss": a["loss"][-1],
            "first_differing_batch": batches,
            "seconds": {k: r["seconds"] for k, r in runs.items()},
            "speedup": a["seconds"] / b["seconds"]}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, help="a LeRobot dataset with cameras (default: the "
                   "training fixture); with --write-dataset, where to write it (kept; an "
                   "existing one is used as it is)")
    p.add_argument("--policy", choices=sorted(POLICIES), default="act")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--num-workers", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=1000)
    p.add_argument("--camera-codec", choices=("png", "jpeg"), default="png",
                   help="how RoboCache stores video frames (png: LeRobot's decode exactly)")
    p.add_argument("--write-dataset", metavar="EPISODES,LENGTH,HEIGHT,WIDTH[,IH,IW]",
                   help="write a dataset of that many episodes and frames per episode with a "
                   "HEIGHTxWIDTH video camera and an image camera (IHxIW, default the video's "
                   "size) with LeRobot's writer, in a temporary directory or --root")
    p.add_argument("--record", type=Path, help="write the expected losses, the batches' "
                   "indices and LeRobot's batch digests (per key, one per step) here (the CI "
                   "test's reference)")
    p.add_argument("--json", type=Path, help="write the comparison here")
    p.add_argument("--timing", action="store_true", help="time the runs instead of comparing "
                   "batches: LeRobot, RoboCache's first use and RoboCache with its cache built")
    p.add_argument("--backend", choices=TIMED, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--cache", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.backend:  # a child process: one backend (--root given)
        args = lerobot_args(a.root.resolve(), a.out.with_suffix(".train"), a.steps,
                            a.batch_size, a.num_workers, a.device, a.seed, a.policy)
        run_backend(a.backend, args, a.out, a.cache, a.camera_codec, a.timing)
        return {}
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        if a.write_dataset:
            sys.path.insert(0, str(ROOT.parent))
            from make_fixtures import write_train_dataset

            n, length, h, w, *image = (int(x) for x in a.write_dataset.split(","))
            a.root = (a.root or Path(tmp) / "train").resolve()
            if not (a.root / "meta" / "info.json").exists():
                write_train_dataset(a.root, (length,) * n, (h, w), tuple(image) or (h, w))
        a.root = a.root or ROOT
        for backend in TIMED if a.timing else TIMED[:2]:
            out = Path(tmp) / f"{backend}.json"
            cmd = [sys.executable, __file__, "--backend", backend, "--out", str(out),
                   "--cache", str(Path(tmp) / "cache"), "--root", str(a.root),
                   "--steps", str(a.steps), "--batch-size", str(a.batch_size),
                   "--num-workers", str(a.num_workers), "--device", a.device,
                   "--seed", str(a.seed), "--camera-codec", a.camera_codec,
                   "--policy", a.policy, *(["--timing"] if a.timing else [])]
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
            runs[backend] = {**json.loads(out.read_text()), "wall_s": time.perf_counter() - t0}
    result = compare_timing(runs) if a.timing else compare(runs)
    result["settings"] = {"steps": a.steps, "batch_size": a.batch_size,
                          "num_workers": a.num_workers, "device": a.device, "seed": a.seed,
                          "camera_codec": a.camera_codec,
                          "dataset": str(a.root.relative_to(REPO) if a.root.is_relative_to(
                              REPO) else a.root), "policy": POLICIES[a.policy],
                          "write_dataset": a.write_dataset}
    if a.timing:
        import torch

        result["machine"] = {"device": torch.cuda.get_device_name() if a.device == "cuda"
                             else "cpu", "cpus": os.cpu_count(), "torch": torch.__version__,
                             "date": time.strftime("%Y-%m-%d")}
    print(json.dumps(result, indent=1))
    if a.record:
        import lerobot
        import torch

        a.record.write_text(json.dumps({
            **result, "lerobot_version": lerobot.__version__, "torch": torch.__version__,
            "loss": {k: r["loss"] for k, r in runs.items()}, "index": runs["lerobot"]["index"],
            "digest": {k: [d[k] for d in runs["lerobot"]["digest"]]  # key -> one per step
                       for k in runs["lerobot"]["digest"][0]}}, separators=(",", ":")) + "\n")
    if a.json:
        a.json.write_text(json.dumps(result, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
