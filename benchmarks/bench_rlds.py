"""Benchmark reading RLDS (TFDS TFRecord shards) without TensorFlow, and ingesting it.

    $ robocache bench rlds --json benchmarks/results/rlds.json
    $ ROBOCACHE_RLDS_DIR=/data/toy_rlds/jpeg/1.0.0 taskset -c 0 python benchmarks/bench_rlds.py

The dataset has the layout of ``tests/fixtures/rlds`` (``jpeg`` config) scaled up: episodes of
100 steps with two 64x64 JPEG cameras, 9-D state, 4-D action, an 8-D language embedding,
8 train shards. It is written here through RoboCache's own TFRecord framing and Example
messages unless ``ROBOCACHE_RLDS_DIR`` names a version folder (e.g. the one
``tests/fixtures/rlds/make_fixtures.py --scale N`` wrote with TFDS, whose script times
TFDS/tf.data reading the same files on one core).

Cases (all on the CPU, one process; pin it to one core with ``taskset`` to compare per core):

- ``parse``: every record read, both CRCs checked, parsed into ``{key: values}``.
- ``episodes``: the same plus the :class:`~robocache.data.episode.Episode` (streams shaped,
  images kept as JPEG bytes) — what ingest consumes.
- ``ingest``: ``robocache.cache.build`` of the whole split at the control rate (alignment on
  the GPU when there is one), beside ``episodes`` to show whether reading bounds it.

Records give ``steps_per_s`` and ``MB_per_s`` (shard bytes over wall time).
"""

from __future__ import annotations

import io
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

from robocache.bench import harness as H
from robocache.bench.standalone import main

FAMILY = "rlds"
FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "rlds" / "toy_rlds" / \
    "jpeg" / "1.0.0"
FULL = {"episodes": 200, "steps": 100, "camera": 64, "shards": 8, "repeats": 3}
QUICK = {"episodes": 8, "steps": 20, "camera": 16, "shards": 2, "repeats": 1}
FPS = 10.0


def write_dataset(root: Path, episodes: int, steps: int, camera: int, shards: int,
                  distinct: int = 0) -> Path:
    """An RLDS version folder like the fixture's ``jpeg`` config, cameras ``camera`` square.
    ``distinct``: when not 0, each camera's JPEGs are that many frames encoded once and
    cycled through the steps (a dataset of gigabytes is written in seconds)."""
    from PIL import Image

    from robocache.data.formats import tfrecord

    root.mkdir(parents=True)
    features = json.loads((FIXTURE / "features.json").read_text())
    obs = features["featuresDict"]["features"]["steps"]["sequence"]["feature"][
        "featuresDict"]["features"]["observation"]["featuresDict"]["features"]
    for cam in ("image", "wrist_image"):
        obs[cam]["image"]["shape"]["dimensions"] = [str(camera), str(camera), "3"]
    (root / "features.json").write_text(json.dumps(features))
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:camera, 0:camera]
    Example = tfrecord.classes()["Example"]
    lengths = [0] * shards
    files = [open(root / f"toy_rlds-train.tfrecord-{i:05d}-of-{shards:05d}", "wb")  # noqa: SIM115
             for i in range(shards)]

    def jpeg(t: int) -> bytes:
        pixels = np.stack([(x * 4 + 17 * t) % 256, (y * 4 + 5 * t) % 256,
                           (x + y + 31 * t) % 256], -1) + rng.integers(-6, 7, (1, 1, 3))
        buf = io.BytesIO()
        Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(buf, "JPEG")
        return buf.getvalue()

    bank = {(cam, t): jpeg(t) for t in range(distinct) for cam in ("image", "wrist_image")}
    for e in range(episodes):
        ex = Example()
        f = ex.features.feature
        for t in range(steps):
            for cam in ("image", "wrist_image"):
                f[f"steps/observation/{cam}"].bytes_list.value.append(
                    bank[cam, t % distinct] if distinct else jpeg(t))
            f["steps/language_instruction"].bytes_list.value.append(b"pick up the red block")
        for key, size in (("steps/observation/state", 9), ("steps/action", 4),
                          ("steps/language_embedding", 8)):
            f[key].float_list.value.extend(rng.normal(size=steps * size).astype(np.float32))
        for key in ("steps/reward", "steps/discount"):
            f[key].float_list.value.extend(np.ones(steps, np.float32))
        for key, at in (("steps/is_first", 0), ("steps/is_last", steps - 1),
                        ("steps/is_terminal", steps - 1)):
            f[key].int64_list.value.extend((np.arange(steps) == at).astype(int))
        f["episode_metadata/file_path"].bytes_list.value.append(f"episode_{e}".encode())
        f["episode_metadata/episode_id"].int64_list.value.append(e)
        files[e % shards].write(tfrecord.frame(ex.SerializeToString()))
        lengths[e % shards] += 1
    for fh in files:
        fh.close()
    (root / "dataset_info.json").write_text(json.dumps({
        "name": "toy_rlds", "version": "1.0.0", "fileFormat": "tfrecord",
        "splits": [{"name": "train", "shardLengths": [str(n) for n in lengths]}]}))
    return root


def run(quick: bool = False, copy_gbps: float | None = None) -> list[dict]:
    import torch

    from robocache.data.cache import build
    from robocache.data.formats import tfrecord
    from robocache.data.formats.rlds import RldsSource

    cfg = QUICK if quick else FULL
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        given = os.environ.get("ROBOCACHE_RLDS_DIR")
        root = Path(given) if given else write_dataset(
            Path(tmp) / "rlds", cfg["episodes"], cfg["steps"], cfg["camera"], cfg["shards"])
        nbytes = sum(p.stat().st_size for p in root.glob("*-train.tfrecord-*"))
        src = RldsSource(root, split="train", fps=FPS)
        indices = src.episode_indices()
        # a warm-up pass (shards in the page cache, as on a second epoch) counts the steps
        steps = sum(src.read(i).meta["length"] for i in indices)

        def parse():
            for i in indices:
                tfrecord.parse_example(src.record(i))

        def episodes():
            for i in indices:
                src.read(i)

        name = f"{len(indices)}ep-{nbytes / 1e6:.0f}MB"
        for impl, fn in (("parse", parse), ("episodes", episodes)):
            samples = []
            for _ in range(cfg["repeats"]):
                t0 = time.perf_counter()
                fn()
                samples.append((time.perf_counter() - t0) * 1e3)
            timing = H.summarize(samples)
            records.append(H.case(FAMILY, name, impl, timing, nbytes=nbytes,
                                  episodes=len(indices),
                                  dataset="given" if given else "synthetic"))
        device = "cuda" if torch.cuda.is_available() else "cpu"
        t0 = time.perf_counter()
        manifest = build(RldsSource(root, split="train", fps=FPS), Path(tmp) / "cache",
                         rate_hz=FPS, device=device, progress=False)
        timing = H.summarize([(time.perf_counter() - t0) * 1e3])
        records.append(H.case(FAMILY, name, "ingest", timing, nbytes=nbytes,
                              episodes=manifest["counts"]["cached"], device=device))
    H.add_rates(records, steps, "steps", nbytes)
    return records


if __name__ == "__main__":
    main(run, __doc__)
