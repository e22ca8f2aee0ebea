"""What each camera storage does to a policy: LeRobot's ACT trained on the same frames stored as
PNG, JPEG and video, then evaluated on held-out episodes seen losslessly.

    $ robocache bench policy_storage --json benchmarks/results/policy_storage.json
    $ python benchmarks/bench_policy_storage.py --budget-seconds 420 --json out.json
    $ python benchmarks/bench_policy_storage.py --quick        # CPU, tiny sizes, 3 steps

Runs in LeRobot 0.6.1's environment (``pip install lerobot==0.6.1``: Python >= 3.12), robocache
installed there.

The task is made so that the action can only be predicted by reading the image precisely: a
96x128 RGB camera looks down on a textured table (a colour field per episode, mid- and
pixel-scale texture, and per-frame sensor noise of 2 levels: what a lossy codec must spend bits
on or blur away) holding a small red disc (radius 2.5 px, anti-aliased, so its position is
continuous, sub-pixel) at a target drawn uniformly in the workspace (0.40 x 0.30 m, 3.1 mm a
pixel) and seen only in the image, and the end effector (a blue square, drawn over the disc
when it gets there). ``obs.state`` = the end effector's x, y, z (m) and gripper opening;
``actions`` = the next state: a minimum-jerk reach from a random start to the target in 60-90
steps, descending from z 0.15 to 0.02 m, the gripper closing once there. Episodes of 120 steps
at 30 fps; 240 training episodes and 40 held-out ones, from different seeds (other textures,
targets and starts). The dataset is written as a robomimic HDF5 file of raw frames
(``data/demo_<i>/obs/img``, ``obs/state``, ``actions``) and ingested three times
(``camera_codec``): ``png`` (lossless), ``jpeg`` (q95, 4:4:4) and ``video`` (encoded once per
episode, :data:`robocache.data.video_store.RAW_ENCODER`); the held-out episodes once, as PNG.

The policy is LeRobot's own ``ACTPolicy`` with ``ACTConfig``'s defaults (ResNet-18, a chunk of
100 actions, the VAE, dim 512, lr 1e-5 for backbone and transformer, weight decay 1e-4, AdamW
from the config's preset, gradients clipped at the preset's norm 10), changed only where the
data requires it: the input/output features, and ``pretrained_backbone_weights=None`` (the
benchmark runs without network access, so the backbone is trained from scratch; LeRobot's
default loads ImageNet weights). Normalization is LeRobot's: ``make_pre_post_processors`` with
the cache's mean/std of state and action and ImageNet's statistics for the camera (LeRobot's
``use_imagenet_stats`` default). TF32 matmuls and cuDNN autotuning as ``lerobot-train`` sets
them; fp32 (ACT's ``use_amp`` is off). Batch size and steps differ from ``lerobot-train``'s (8
and 100k) to learn within the run's time: batch 32, and as many steps as ``--budget-seconds``
(the whole run's wall time) leaves for all the runs at the times of a timed warm-up (12 steps
and one evaluation), unless ``--steps``; the same steps, batch and seeds (0 and 1) for every
store, recorded in each case.

Batches come from RoboCache's serving path of each store: ``RobotLoader`` (its sampling seeded
per run) over ``RobotDataset(cache, keys=[state, actions], delta_steps={"actions":
range(100)})``: the action chunk with its ``actions_is_pad`` mask (LeRobot's
``action_is_pad``) and the state at the current step, as LeRobot serves ACT. The store's camera
frames are decoded once through ``RobotLoader`` (``image_dtype=uint8``, on the training device)
into a device tensor, and each batch takes its samples' frames from it by ``index``: the frames
the loader serves, decoded once rather than at every step.

Reported:

- ``ingest-<store>``: the build's time; ``bytes_per_frame`` of the store's camera frames;
  ``psnr_db`` of the store's served frames against the raw ones (``inf``: identical).
- ``<store>-seed<k>``: the training step's time (median; the step as ``lerobot-train``'s
  ``update_policy`` takes it: batch, forward, backward, clipping, AdamW, ``loss.item()``), and
  on the held-out episodes, their lossless frames being what the robot's camera gives at
  deployment: ``heldout_l1`` and ``heldout_rmse`` of the predicted chunk
  (``predict_action_chunk``, unnormalized by the post-processor) against the recorded actions
  over every unpadded step (in action units: metres, and the gripper's 0-1), and
  ``heldout_loss`` (LeRobot's eval loss: the policy in eval mode, ``forward`` on the
  normalized batch); ``train_loss``: the mean over the last tenth of the steps.
- ``<store>``: mean, spread (max - min) and per-seed values of those over the seeds, with the
  bytes and PSNR; its time is the median of the seeds' step times.
- ``verdict``: the cheapest store (bytes per frame) whose mean held-out L1 is within the
  lossless store's seed spread (mean L1 - lossless mean L1 <= lossless max - min). For scale,
  ``hold_l1`` is the error of repeating the current state over the chunk (no policy);
  ``learnt`` says whether the lossless policy beats it (if not, the verdict says nothing).
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from robocache.bench import harness as H
from robocache.bench.standalone import main

FAMILY = "policy_storage"
FPS = 30.0
CAMERA, STATE, ACTION = "obs.img", "obs.state", "actions"  # the cache's keys
POLICY_KEYS = {CAMERA: "observation.images.top", STATE: "observation.state", ACTION: "action"}
STORES = ("png", "jpeg", "video")  # png first: the lossless reference
WORKSPACE_M = (0.40, 0.30)  # x (image width), y (image height)
FULL = {"hw": (96, 128), "train": 240, "heldout": 40, "length": 120, "batch": 32,
        "seeds": "0,1", "budget_seconds": 420.0, "steps": None, "eval_batch": 256,
        "min_steps": 50}
QUICK = {"hw": (32, 48), "train": 6, "heldout": 2, "length": 24, "batch": 4, "seeds": "0,1",
         "budget_seconds": None, "steps": 3, "eval_batch": 16, "min_steps": 1}
WHY = "The policy benchmark trains LeRobot's own ACT"


# ── the dataset ──────────────────────────────────────────────────────

def _upsample(a: np.ndarray, hw: tuple[int, int]) -> np.ndarray:
    """``a`` ``[h, w, C]`` resized to ``hw`` (bilinear)."""
    t = torch.from_numpy(np.ascontiguousarray(a, np.float32)).permute(2, 0, 1)[None]
    return torch.nn.functional.interpolate(t, size=hw, mode="bilinear",
                                           align_corners=False)[0].permute(1, 2, 0).numpy()


def trajectory(rng: np.random.Generator, length: int) -> tuple[np.ndarray, np.ndarray]:
    """A reach to a random target: ``(target [2], state [length + 1, 4])`` (x, y, z in metres,
    gripper opening 1 -> 0); the action at step t is the state at t + 1."""
    (w, h) = WORKSPACE_M
    target = rng.uniform((0.1 * w, 0.1 * h), (0.9 * w, 0.9 * h))
    start = rng.uniform((0.05 * w, 0.05 * h), (0.95 * w, 0.95 * h))
    reach = rng.integers(60, 91) * length / 120  # steps (scaled for short quick episodes)
    tau = np.clip(np.arange(length + 1) / reach, 0.0, 1.0)
    s = 10 * tau ** 3 - 15 * tau ** 4 + 6 * tau ** 5  # minimum jerk
    xy = start + (target - start) * s[:, None]
    z = 0.15 + (0.02 - 0.15) * s
    grip = np.clip(1.0 - (np.arange(length + 1) - reach) / 10.0, 0.0, 1.0)
    return target, np.column_stack([xy, z, grip]).astype(np.float32)


def render(rng: np.random.Generator, target: np.ndarray, xy: np.ndarray,
           hw: tuple[int, int], noise: torch.Tensor) -> np.ndarray:
    """An episode's frames ``[T, H, W, 3]`` uint8: the table's texture (drawn from ``rng``),
    the target disc at ``target`` and the end effector at each ``xy`` ``[T, 2]`` (metres), plus
    sensor noise (rows of ``noise``, a bank ``[K, H, W, 3]`` indexed from a random start)."""
    h, w = hw
    scale = np.array([w / WORKSPACE_M[0], h / WORKSPACE_M[1]])  # px per metre
    colour = rng.uniform(70, 190, (3, 4, 3))
    colour = 0.5 * colour + 0.5 * colour.mean(-1, keepdims=True)  # a desaturated table
    table = torch.from_numpy(_upsample(colour, hw) + _upsample(
        rng.normal(0, 18, (h // 4, w // 4, 3)), hw) + rng.normal(0, 12, (h, w, 1)).astype(
            np.float32))
    cols = torch.arange(w, dtype=torch.float32) + 0.5
    rows = torch.arange(h, dtype=torch.float32) + 0.5
    # the target: a disc with an anti-aliased edge (coverage = clip(r - d + 0.5))
    r = 2.5 * w / 128
    u, v = (float(c) for c in target * scale)
    d = torch.hypot(cols[None, :] - u, rows[:, None] - v)
    a = (r - d + 0.5).clamp_(0.0, 1.0)[..., None]
    table = table * (1 - a) + a * torch.tensor([225.0, 35.0, 30.0])
    # the end effector: a square of side 5 px, its edges anti-aliased the same way
    p = torch.from_numpy((xy * scale).astype(np.float32))  # [T, 2]
    half = 2.5 * w / 128
    ax = (half - (cols[None, :] - p[:, :1]).abs() + 0.5).clamp_(0.0, 1.0)  # [T, W]
    ay = (half - (rows[None, :] - p[:, 1:]).abs() + 0.5).clamp_(0.0, 1.0)  # [T, H]
    b = (ay[:, :, None] * ax[:, None, :])[..., None]  # [T, H, W, 1]
    ee = torch.tensor([40.0, 70.0, 210.0])
    k = int(rng.integers(len(noise)))
    frames = torch.lerp(table[None], ee, b) + noise[(torch.arange(len(xy)) + k) % len(noise)]
    return frames.round_().clamp_(0, 255).to(torch.uint8).numpy()


def write_source(path: Path, episodes: int, length: int, hw: tuple[int, int],
                 seed: int) -> tuple[Path, np.ndarray]:
    """The robomimic HDF5 file of ``episodes`` reaches of ``length`` steps drawn from ``seed``;
    returns it and its raw frames ``[episodes * length, H, W, 3]``."""
    import h5py

    rng = np.random.default_rng(seed)
    noise = torch.from_numpy(rng.normal(0, 2.0, (97, *hw, 3)).astype(np.float32))
    img = np.empty((episodes * length, *hw, 3), np.uint8)
    with h5py.File(path, "w") as f:
        for e in range(episodes):
            target, s = trajectory(rng, length)
            rows = slice(e * length, (e + 1) * length)
            img[rows] = render(rng, target, s[:-1, :2], hw, noise)
            g = f.create_group(f"data/demo_{e}")
            g.create_dataset("obs/img", data=img[rows], chunks=(length, *hw, 3))
            g.create_dataset("obs/state", data=s[:-1])
            g.create_dataset("actions", data=s[1:])
            g.attrs["num_samples"] = length
    return path, img


def _build(src: Path, dest: Path, codec: str) -> float:
    from robocache.data.cache import build

    t0 = time.perf_counter()
    build(src, dest, rate_hz="native", progress=False, device="cpu", camera_codec=codec,
          source_options={"fps": FPS})
    return time.perf_counter() - t0


def _frame_bytes(cache: Path) -> int:
    return sum(p.stat().st_size for p in (cache / "frames").rglob("*") if p.is_file())


# ── serving ──────────────────────────────────────────────────────────

def served_frames(cache: Path, device: torch.device) -> torch.Tensor:
    """Every camera frame of ``cache`` as its serving path gives them (``RobotLoader``, uint8),
    ``[rows, 3, H, W]`` on ``device``, placed by the samples' ``index``."""
    from robocache.data import RobotDataset, RobotLoader

    ds = RobotDataset(cache, keys=[CAMERA], image_dtype=torch.uint8)
    out = None
    for batch in RobotLoader(ds, batch_size=512, shuffle=False, drop_last=False,
                             normalize=None, device=device):
        f = batch[CAMERA]
        f = f.reshape(f.shape[0], *f.shape[-3:])  # [B, 1, 3, H, W] -> [B, 3, H, W]
        if out is None:
            out = torch.empty((len(ds), *f.shape[1:]), dtype=torch.uint8, device=device)
        out[batch["index"].to(device)] = f
    return out


def psnr(frames: torch.Tensor, reference: torch.Tensor) -> float:
    """PSNR (dB) of uint8 ``frames`` against ``reference`` over every pixel; ``inf`` when equal."""
    se = 0.0
    for i in range(0, len(frames), 4096):
        d = frames[i:i + 4096].float() - reference[i:i + 4096].float()
        se += float(d.square().sum())
    mse = se / frames.numel()
    return math.inf if mse == 0 else 10 * math.log10(255.0 ** 2 / mse)


def _numeric(cache: Path, chunk: int):
    from robocache.data import RobotDataset

    return RobotDataset(cache, keys=[STATE, ACTION], delta_steps={ACTION: list(range(chunk))})


# ── the policy ───────────────────────────────────────────────────────

def lerobot_stats(ds) -> dict[str, dict[str, torch.Tensor]]:
    """The dataset statistics LeRobot's processors take: the cache's state and action
    statistics, ImageNet's for the camera (LeRobot's ``use_imagenet_stats`` default)."""
    from robocache.data.lerobot_meta import lerobot_part

    imagenet = lerobot_part("lerobot.utils.constants", "IMAGENET_STATS", WHY)
    out = {POLICY_KEYS[k]: {s: getattr(ds.stats[k], s).to(torch.float32)
                            for s in ("mean", "std", "min", "max")} for k in (STATE, ACTION)}
    out[POLICY_KEYS[CAMERA]] = {s: torch.tensor(v, dtype=torch.float32)
                                for s, v in imagenet.items()}
    return out


def make_policy(hw: tuple[int, int], stats: dict, device: torch.device, seed: int):
    """LeRobot's ACT with its defaults, the data's features and no pretrained weights; its
    pre/post-processors, optimizer (the config's preset) and gradient clipping norm."""
    from robocache.data.lerobot_meta import lerobot_part

    ACTConfig = lerobot_part("lerobot.policies.act.configuration_act", "ACTConfig", WHY)
    ACTPolicy = lerobot_part("lerobot.policies.act.modeling_act", "ACTPolicy", WHY)
    make_processors = lerobot_part("lerobot.policies.factory", "make_pre_post_processors", WHY)
    set_seed = lerobot_part("lerobot.utils.random_utils", "set_seed", WHY)
    types = __import__("lerobot.configs.types", fromlist=["FeatureType", "PolicyFeature"])
    F, feature = types.FeatureType, types.PolicyFeature

    set_seed(seed)
    config = ACTConfig(
        input_features={POLICY_KEYS[CAMERA]: feature(type=F.VISUAL, shape=(3, *hw)),
                        POLICY_KEYS[STATE]: feature(type=F.STATE, shape=(4,))},
        output_features={POLICY_KEYS[ACTION]: feature(type=F.ACTION, shape=(4,))},
        pretrained_backbone_weights=None, device=device.type)
    policy = ACTPolicy(config).to(device)
    pre, post = make_processors(config, dataset_stats=stats)
    preset = config.get_optimizer_preset()
    optimizer = preset.build(policy.get_optim_params())
    return config, policy, pre, post, optimizer, preset.grad_clip_norm


def _policy_batch(batch: dict, frames: torch.Tensor) -> dict[str, torch.Tensor]:
    """A served batch in LeRobot's keys, its camera frames taken from ``frames`` by index."""
    device = frames.device
    return {POLICY_KEYS[CAMERA]: frames[batch["index"].to(device)].float().div_(255.0),
            POLICY_KEYS[STATE]: batch[STATE].to(device),
            POLICY_KEYS[ACTION]: batch[ACTION].to(device),
            "action_is_pad": batch[f"{ACTION}_is_pad"].to(device)}


def train(ds, frames: torch.Tensor, stats: dict, hw: tuple[int, int], seed: int, steps: int,
          batch_size: int) -> tuple:
    """Train ACT ``steps`` steps on batches of ``ds`` (sampled with ``seed``) and ``frames``,
    as ``lerobot-train``'s ``update_policy`` does a step; returns the policy, its processors,
    the step times (s) and the losses."""
    from robocache.data import RobotLoader

    device = frames.device
    _, policy, pre, post, optimizer, clip = make_policy(hw, stats, device, seed)
    policy.train()
    loader = RobotLoader(ds, batch_size=batch_size, shuffle=True, drop_last=True,
                         normalize=None, device=device, seed=seed)
    times, losses, it = [], [], iter(loader)
    for _ in range(steps):
        t0 = time.perf_counter()
        try:
            batch = next(it)
        except StopIteration:
            it = iter(loader)
            batch = next(it)
        loss, _ = policy.forward(pre(_policy_batch(batch, frames)))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
        times.append(time.perf_counter() - t0)
    return policy, pre, post, times, losses


@torch.no_grad()
def evaluate(policy, pre, post, ds, frames: torch.Tensor, batch_size: int) -> dict[str, float]:
    """Held-out errors of the predicted chunk in action units (over unpadded steps) and
    LeRobot's eval loss, over every step of ``ds``."""
    from robocache.data import RobotLoader

    policy.eval()
    abs_sum = sq_sum = hold_sum = 0.0
    count = loss_sum = 0
    batches = 0
    for batch in RobotLoader(ds, batch_size=batch_size, shuffle=False, drop_last=False,
                             normalize=None, device=frames.device):
        b = _policy_batch(batch, frames)
        loss, _ = policy.forward(pre(dict(b)))
        loss_sum += float(loss)
        batches += 1
        pred = post(policy.predict_action_chunk(pre(dict(b)))).to(frames.device)
        want = b[POLICY_KEYS[ACTION]]
        valid = ~b["action_is_pad"][..., None]
        n = int(valid.sum()) * want.shape[-1]
        abs_sum += float(((pred - want).abs() * valid).sum())
        sq_sum += float(((pred - want).square() * valid).sum())
        hold_sum += float(((b[POLICY_KEYS[STATE]][:, None] - want).abs() * valid).sum())
        count += n
    policy.train()
    return {"heldout_l1": abs_sum / count, "heldout_rmse": math.sqrt(sq_sum / count),
            "heldout_loss": loss_sum / batches, "hold_l1": hold_sum / count}


def size_runs(cfg: dict, ds, frames, held, held_frames, stats, runs: int,
              left_s: float) -> tuple[int, dict]:
    """The steps of every run: ``cfg["steps"]`` if set, else what ``left_s`` seconds allow for
    ``runs`` runs (each: a policy made, trained, evaluated) at the times of a timed warm-up
    (12 steps and one evaluation), with a tenth to spare; at least ``cfg["min_steps"]``."""
    if cfg["steps"]:
        return int(cfg["steps"]), {}
    began = t0 = time.perf_counter()
    policy, pre, post, times, _ = train(ds, frames, stats, cfg["hw"], 0, 12, cfg["batch"])
    step_s = float(np.median(times[4:]))
    # making the policy and its first step's extra (the loader's start, cuDNN's autotuning)
    setup_s = max(0.0, time.perf_counter() - t0 - sum(times) + times[0] - step_s)
    t0 = time.perf_counter()
    evaluate(policy, pre, post, held, held_frames, cfg["eval_batch"])
    eval_s = time.perf_counter() - t0
    del policy, pre, post
    if frames.is_cuda:
        torch.cuda.empty_cache()
    left_s -= time.perf_counter() - began  # the warm-up itself
    steps = int((left_s / runs - setup_s - eval_s) / (step_s * 1.1))
    return max(cfg["min_steps"], steps), {"warmup_step_ms": step_s * 1e3,
                                          "warmup_eval_s": eval_s, "warmup_setup_s": setup_s}


def run(quick: bool = False, copy_gbps: float | None = None, report=None,
        seeds: str | None = None, steps: int | None = None,
        budget_seconds: float | None = None, batch: int | None = None,
        train_episodes: int | None = None, workdir: str | None = None) -> list[dict]:
    start = time.perf_counter()
    cfg = dict(QUICK if quick else FULL)
    for key, value in (("seeds", seeds), ("steps", steps), ("budget_seconds", budget_seconds),
                       ("batch", batch), ("train", train_episodes)):
        if value is not None:
            cfg[key] = value
    if budget_seconds is not None and steps is None:
        cfg["steps"] = None
    if not cfg["steps"] and not cfg["budget_seconds"]:
        raise ValueError("give `steps` or `budget_seconds`.")
    seed_list = [int(s) for s in str(cfg["seeds"]).split(",")]
    out: list[dict] = []
    report = report or out.append
    try:
        import lerobot.policies.act.modeling_act  # noqa: F401
    except ImportError as e:  # `robocache bench` (every family) outside LeRobot's environment
        report(H.case(FAMILY, "act", "skipped", H.summarize([0.0]), skipped=True,
                      note=f"skipped: LeRobot's ACT does not import ({e}); run in LeRobot "
                      "0.6.1's environment (pip install lerobot==0.6.1: Python >= 3.12)"))
        return out
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":  # as lerobot-train sets them
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
    hw, length, chunk = cfg["hw"], cfg["length"], 100  # ACTConfig's chunk_size
    name = f"act-{hw[0]}x{hw[1]}-{cfg['train']}x{length}-b{cfg['batch']}"
    common = dict(hw=f"{hw[0]}x{hw[1]}", train_episodes=cfg["train"],
                  heldout_episodes=cfg["heldout"], length=length, chunk=chunk,
                  batch=cfg["batch"], pretrained_backbone_weights=None)
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        tmp = Path(tmp)
        # the datasets, the caches, and every store's frames as served
        t0 = time.perf_counter()
        src, raw = write_source(tmp / "train.hdf5", cfg["train"], length, hw, seed=1000)
        held_src, _ = write_source(tmp / "heldout.hdf5", cfg["heldout"], length, hw, seed=2000)
        made_s = time.perf_counter() - t0
        _build(held_src, tmp / "heldout-png", "png")
        held = _numeric(tmp / "heldout-png", chunk)
        held_frames = served_frames(tmp / "heldout-png", device)
        raw = torch.from_numpy(raw).permute(0, 3, 1, 2).to(device)  # [rows, 3, H, W], as served
        served, quality = {}, {}
        for store in STORES:
            cache = tmp / f"train-{store}"
            build_s = _build(src, cache, store)
            t0 = time.perf_counter()
            frames = served_frames(cache, device)
            decode_s = time.perf_counter() - t0
            nbytes = _frame_bytes(cache) / len(frames)
            db = psnr(frames, raw)
            served[store], quality[store] = (frames, _numeric(cache, chunk)), (nbytes, db)
            report(H.case(FAMILY, name, f"ingest-{store}", H.summarize([build_s * 1e3]),
                          store=store, bytes_per_frame=nbytes, psnr_db=db, decode_s=decode_s,
                          source_seconds=made_s, **common,
                          note=f"{nbytes / 1e3:.1f} KB/frame, PSNR {db:.1f} dB"))
        del raw
        # the training runs: the same steps, batch and seeds for every store
        runs_n = len(STORES) * len(seed_list)
        frames, ds = served["png"]
        left_s = (cfg["budget_seconds"] or 0.0) - (time.perf_counter() - start)
        steps_n, sizing = size_runs(cfg, ds, frames, held, held_frames, lerobot_stats(ds),
                                    runs_n, left_s)
        per_store: dict[str, dict] = {}
        for store in STORES:
            frames, ds = served.pop(store)
            stats = lerobot_stats(ds)
            runs, step_ms = [], []  # step_ms: each seed's median step (ms)
            for seed in seed_list:
                policy, pre, post, times, losses = train(ds, frames, stats, hw, seed, steps_n,
                                                         cfg["batch"])
                got = evaluate(policy, pre, post, held, held_frames, cfg["eval_batch"])
                got["train_loss"] = float(np.mean(losses[-max(1, steps_n // 10):]))
                runs.append(got)
                timed = H.summarize([t * 1e3 for t in times[min(5, len(times) - 1):]])
                step_ms.append(timed.median_ms)
                report(H.case(FAMILY, name, f"{store}-seed{seed}", timed, store=store, seed=seed,
                              steps=steps_n, train_seconds=float(sum(times)), **got, **sizing,
                              **common, note=f"held-out L1 {got['heldout_l1'] * 1e3:.2f} mm, "
                              f"RMSE {got['heldout_rmse'] * 1e3:.2f} mm, "
                              f"loss {got['heldout_loss']:.4f}"))
                del policy, pre, post
            nbytes, db = quality[store]
            summary = {"bytes_per_frame": nbytes, "psnr_db": db}
            for key in ("heldout_l1", "heldout_rmse", "heldout_loss", "train_loss"):
                values = [r[key] for r in runs]
                summary[key] = float(np.mean(values))
                summary[f"{key}_spread"] = float(np.max(values) - np.min(values))
                summary[f"{key}_seeds"] = values
            summary["hold_l1"] = runs[0]["hold_l1"]
            per_store[store] = summary
            report(H.case(FAMILY, name, store, H.summarize(step_ms), store=store,
                steps=steps_n, seeds=seed_list, **summary, **common,
                note=f"L1 {summary['heldout_l1'] * 1e3:.2f} (spread "
                f"{summary['heldout_l1_spread'] * 1e3:.2f}) mm, RMSE "
                f"{summary['heldout_rmse'] * 1e3:.2f} mm, {nbytes / 1e3:.1f} KB/frame, "
                f"{db:.1f} dB"))
            del frames, ds
            if device.type == "cuda":
                torch.cuda.empty_cache()
        lossless = per_store["png"]
        within = [s for s in STORES if per_store[s]["heldout_l1"] - lossless["heldout_l1"]
                  <= lossless["heldout_l1_spread"]]
        pick = min(within, key=lambda s: per_store[s]["bytes_per_frame"])
        # a lossless policy no better than holding still has not learnt to read the image
        learnt = lossless["heldout_l1"] < lossless["hold_l1"]
        report(H.case(FAMILY, name, "verdict", H.summarize([0.0]), store=pick,
                      within_spread=within, learnt=learnt, steps=steps_n, seeds=seed_list,
                      per_store=per_store, seconds=time.perf_counter() - start, **common,
                      note=f"cheapest within the lossless seed spread: {pick} "
                      f"({per_store[pick]['bytes_per_frame'] / 1e3:.1f} KB/frame vs png "
                      f"{lossless['bytes_per_frame'] / 1e3:.1f}); within: {', '.join(within)}; "
                      f"{steps_n} steps x {len(seed_list)} seeds; hold-still L1 "
                      f"{lossless['hold_l1'] * 1e3:.1f} mm"
                      + ("" if learnt else " (the lossless policy is no better than holding "
                         "still: it has not learnt the task, the verdict says nothing)")))
    return out


if __name__ == "__main__":
    main(run, __doc__, {"seeds": (str, "training seeds, comma-separated (default 0,1)"),
                        "steps": (int, "training steps of every run (default: what "
                                  "--budget-seconds allows)"),
                        "budget_seconds": (float, "wall seconds of the whole run; the steps "
                                           "are sized from a timed warm-up to end within it "
                                           "(default 420)"),
                        "batch": (int, "batch size (default 32)"),
                        "train_episodes": (int, "training episodes (default 240)"),
                        "workdir": (str, "where the datasets and caches are written "
                                    "(default: the system's temporary folder)")})
