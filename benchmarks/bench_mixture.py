"""Benchmark a weighted mixture of caches against one cache of the same total size.

    $ robocache bench mixture --json benchmarks/results/mixture.json
    $ python benchmarks/bench_mixture.py --quick        # CPU smoke run

Three caches of different robots, as an Open X-Embodiment mixture: ``arm`` (24-D state, 16-D
action, 50 Hz), ``mobile`` (14-D state, 7-D action, 10 Hz), ``hand`` (8-D state, 7-D action,
20 Hz), sampled with weights 0.5 / 0.3 / 0.2 by :class:`robocache.MixedDataset`; each
normalized with its own stats on the GPU, padded to 24 / 16 dims with ``_dim_mask``,
``source`` per sample. Against it, one cache with the same total number of steps and the
widest shapes (24-D state, 16-D action) served by the same :class:`robocache.RobotLoader`.
Batch 256, observation history 2, action horizon 16, resident on the device (a mixture is
stacked into one packed cache: a batch is one gather). Three comparisons, each against its own
single cache (``ratio_vs_single``: mixture samples/s over single-cache samples/s):

- ``numeric``: state and action only (both replayed from CUDA graphs);
- ``cameras``: plus a 32x32 RGB camera (JPEG, decoded per batch with nvJPEG) on every step of
  the single cache and of every source (``mixture-3``): the same frames per batch, like for
  like;
- ``arm-camera``: the camera on the ``arm`` only (``mixture-3``, as such mixtures are): the
  other sources' rows serve a blank frame, decoded once per batch, so the mixture decodes about
  half the single cache's frames.

A mixture file (``part`` ``file``): ten caches of different robots (state 6-24 D, action
6-16 D, 5-50 Hz, sizes 2-18 % of the rows) named in one YAML file with weights 1..10, padded to
32 / 32 with ``_dim_mask``, opened by :meth:`robocache.MixedDataset.from_config`, and:

- ``composition``: each source's share of the draws the loader serves over 10,000 batches of
  256 against its weight (``max_dev_pp``: the largest gap, percentage points; the per-batch
  spread is reported beside it);
- ``file-numeric``: samples/s of the ten-source mixture (state and action) against one cache of
  the same rows at the padded widths (``ratio_vs_single``);
- ``file-language``: the same mixture with its prompts (per-step tasks; three instructions per
  episode on five of the sources, one chosen per sample) as strings and token ids ``[B, 24]``
  from a tokenizer (a word-level one speaking Hugging Face's call protocol: every distinct
  prompt is tokenized once at open, so its speed does not enter the timing).

Timing: wall clock over ``batches`` batches after warm-up, one device sync at the end, repeated
(as the ``loader`` family).
"""

from __future__ import annotations

import importlib.util
import json
import tempfile
from pathlib import Path

import numpy as np
import torch

from robocache.bench import harness as H
from robocache.bench.standalone import main

FAMILY = "mixture"
HISTORY, HORIZON, BATCH = 2, 16, 256
CAM = (32, 32, 3)
# name: (state dim, action dim, rate Hz, share of the steps, sampling weight)
ROBOTS = {"arm": (24, 16, 50.0, 0.4, 0.5), "mobile": (14, 7, 10.0, 0.35, 0.3),
          "hand": (8, 7, 20.0, 0.25, 0.2)}
NUMERIC = ["observation.state", "action"]
# comparison: (single cache's keys, each source's keys; None: all, with the camera)
CASES = {"numeric": (NUMERIC, [NUMERIC] * 3), "cameras": (None, [None] * 3),
         "arm-camera": (None, [None, NUMERIC, NUMERIC])}
FULL = {"steps": 100_000, "length": 500, "batches": 60, "repeats": 5}
QUICK = {"steps": 3_000, "length": 100, "batches": 4, "repeats": 2}


def _loader_bench():
    """The ``loader`` family's timing helper (benchmarks are files, not a package)."""
    spec = importlib.util.spec_from_file_location(
        "robocache_bench_loader", Path(__file__).with_name("bench_loader.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Synthetic:
    """An in-memory source of random-walk episodes (a reader without files)."""

    format = "synthetic"

    def __init__(self, path: Path, state: int, action: int, fps: float, camera: bool,
                 episodes: int, length: int, seed: int):
        from robocache.data.episode import StreamSpec

        self.path, self.fps, self.length, self.seed = path, fps, length, seed
        self.count, self.task = episodes, "benchmark"
        self.specs = {"observation.state": StreamSpec("observation.state", "numeric", "float32",
                                                      (state,), fps),
                      "action": StreamSpec("action", "numeric", "float32", (action,), fps)}
        if camera:
            self.specs["observation.image"] = StreamSpec("observation.image", "image", "uint8",
                                                         CAM, fps)

    def episode_indices(self) -> list[int]:
        return list(range(self.count))

    def read(self, index: int):
        from robocache.data.episode import Episode, Stream

        rng = np.random.default_rng([self.seed, index])
        t = np.arange(self.length) / self.fps
        streams = {}
        for k, s in self.specs.items():
            data = rng.integers(0, 255, (self.length, *s.shape), np.uint8) if s.kind == "image" \
                else rng.normal(size=(self.length, *s.shape)).cumsum(0).astype(np.float32)
            streams[k] = Stream(s, t, data)
        return Episode(index, streams, {"tasks": [self.task]})


def run(quick: bool = False, copy_gbps: float | None = None, report=None,
        part: str = "all") -> list[dict]:
    records: list[dict] = []

    def keep(rec: dict) -> None:
        records.append(rec)
        if report is not None:
            report(rec)

    with tempfile.TemporaryDirectory() as tmp:
        if part in ("all", "three"):
            _three(Path(tmp), QUICK if quick else FULL, keep)
        if part in ("all", "file"):
            _file(Path(tmp), FILE_QUICK if quick else FILE_FULL, keep)
    return records


def _three(tmp: Path, cfg: dict, keep) -> None:
    """Three robots mixed against one cache (numeric, cameras, a camera on one robot)."""
    from robocache.data import MixedDataset, RobotDataset, RobotLoader
    from robocache.data.cache import build

    bench = _loader_bench()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    def cache(name, state, action, fps, steps, seed):
        (tmp / f"{name}-src").mkdir()
        src = _Synthetic(tmp / f"{name}-src", state, action, fps, True,
                         max(1, steps // cfg["length"]), cfg["length"], seed)
        build(src, tmp / name, rate_hz=fps, progress=False)
        return lambda keys: RobotDataset(tmp / name, history=HISTORY, horizon=HORIZON,
                                         keys=keys)

    parts = [cache(n, s, a, f, int(cfg["steps"] * share), i)
             for i, (n, (s, a, f, share, _)) in enumerate(ROBOTS.items())]
    single = cache("single", 24, 16, 50.0, cfg["steps"], 9)
    weights = [w for *_, w in ROBOTS.values()]
    for case, (single_keys, part_keys) in CASES.items():
        mixed = MixedDataset([p(k) for p, k in zip(parts, part_keys, strict=True)],
                             weights=weights)
        one = single(single_keys)
        name = f"b{BATCH}-h{HISTORY}-H{HORIZON}-{len(one)}steps-{case}"
        single_rate = None
        for impl, data in (("single-cache", one), ("mixture-3", mixed)):
            loader = RobotLoader(data, BATCH, device=device)
            timing, nbytes = bench._measure(bench._robocache_batches(loader),
                                            cfg["batches"], cfg["repeats"], device)
            rate = BATCH / (timing.median_ms * 1e-3)
            single_rate = single_rate or rate
            keep(H.case(
                FAMILY, name, impl, timing, nbytes=nbytes, samples_per_s=rate,
                ratio_vs_single=rate / single_rate, steps=len(data),
                sources=len(getattr(data, "datasets", [0])),
                cuda_graph=loader.graphed is not None,
                note=f"{rate:,.0f} samples/s, {rate / single_rate:.2f}x single"))
            del loader


# a mixture file: ten robots (state dim, action dim, rate Hz, share of the steps, weight,
# instructions per episode)
FILE_ROBOTS = [(6 + 2 * i, 6 + i, (5.0, 10.0, 15.0, 30.0, 50.0)[i % 5], (2 + 2 * i) / 110,
                float(1 + i), 3 * (i % 2)) for i in range(10)]
FILE_PAD = {"state": 32, "action": 32}
FILE_FULL = {"steps": 100_000, "length": 200, "batches": 200, "repeats": 5,
             "composition_batches": 10_000}
FILE_QUICK = {"steps": 6_000, "length": 60, "batches": 20, "repeats": 2,
              "composition_batches": 10_000}
WORDS = ["pick", "place", "open", "close", "push", "pull", "the", "a", "red", "blue", "green",
         "cube", "drawer", "door", "bowl", "cup", "into", "onto", "from", "left", "right", "top",
         "bottom", "slowly", "carefully", "then", "and"]


class WordTokenizer:
    """Word-level ids with a BOS first and pad 0 on the right, called as a Hugging Face
    tokenizer (no download; tokenizing runs once per distinct prompt, outside the timing)."""

    def __init__(self):
        self.vocab: dict[str, int] = {}

    def __call__(self, texts, padding=False, truncation=False, max_length=None):
        ids = [[1] + [self.vocab.setdefault(w, len(self.vocab) + 2) for w in t.split()]
               for t in texts]
        if truncation and max_length is not None:
            ids = [x[:max_length] for x in ids]
        masks = [[1] * len(x) for x in ids]
        if padding == "max_length":
            masks = [m + [0] * (max_length - len(m)) for m in masks]
            ids = [x + [0] * (max_length - len(x)) for x in ids]
        return {"input_ids": ids, "attention_mask": masks}


def _prompt(rng: np.random.Generator) -> str:
    return " ".join(rng.choice(WORDS, int(rng.integers(4, 16))))


def _file(tmp: Path, cfg: dict, keep) -> None:
    """Ten caches from one mixture file: composition, samples/s against one cache, tokens."""
    import yaml

    from robocache.data import MixedDataset, RobotDataset, RobotLoader
    from robocache.data.cache import build
    from robocache.data.loader import _Sampler

    bench = _loader_bench()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rng = np.random.default_rng(0)
    entries = []
    for i, (state, action, fps, share, weight, texts) in enumerate(FILE_ROBOTS):
        name = f"robot{i}"
        steps = int(cfg["steps"] * share)
        src = _Synthetic(tmp / f"{name}-src", state, action, fps, False,
                         max(1, steps // cfg["length"]), cfg["length"], 100 + i)
        src.task = _prompt(rng)
        (tmp / f"{name}-src").mkdir()
        build(src, tmp / name, rate_hz=fps, progress=False)
        entry = {"name": name, "path": str(tmp / name), "weight": weight,
                 "state": "observation.state", "action": "action"}
        if texts:
            (tmp / f"{name}.json").write_text(json.dumps(
                {str(e): [_prompt(rng) for _ in range(texts)] for e in range(src.count)}))
            entry["instructions"] = str(tmp / f"{name}.json")
        entries.append(entry)
    path = tmp / "mixture.yaml"
    path.write_text(yaml.safe_dump({"history": HISTORY, "horizon": HORIZON, "pad": FILE_PAD,
                                    "language": {"max_length": 24}, "datasets": entries},
                                   sort_keys=False))
    mixed = MixedDataset.from_config(path, tokenizer=WordTokenizer())
    weights = mixed.weights.numpy()
    # composition: the draws the loader serves over composition_batches batches
    n = cfg["composition_batches"]
    sampler = _Sampler(mixed, BATCH, True, True, seed=0)
    src = sampler._draws(sampler._positions(torch.arange(n)))[0]
    counts = torch.nn.functional.one_hot(src, len(weights)).sum(1).double()  # [n, sources]
    share = counts.sum(0).numpy() / counts.sum().item()
    per_batch = (counts / BATCH - torch.from_numpy(weights)).abs().max(1).values
    dev_pp = 100 * np.abs(share - weights).max()
    keep(H.case(FAMILY, f"b{BATCH}-{n}batches-10sources", "composition",
                H.summarize([0.0]), unit="pp", max_dev_pp=dev_pp,
                per_batch_max_dev_pp_median=100 * per_batch.median().item(),
                weights=weights.tolist(), shares=share.tolist(), target_pp=1.0,
                note=f"largest gap {dev_pp:.3f} pp over {n:,} batches (target 1 pp)"))
    # samples/s: the mixture, without and with language, against one cache of the same rows
    (tmp / "file-single-src").mkdir()  # named apart from the three robots' part's
    rows = len(mixed)
    build(_Synthetic(tmp / "file-single-src", FILE_PAD["state"], FILE_PAD["action"], 50.0, False,
                     max(1, rows // cfg["length"]), cfg["length"], 99), tmp / "file-single",
          rate_hz=50.0, progress=False)
    one = RobotDataset(tmp / "file-single", history=HISTORY, horizon=HORIZON)
    language = mixed.language
    name = f"b{BATCH}-h{HISTORY}-H{HORIZON}-{rows}steps-file10"
    single_rate = None
    for impl, data, lang in (("single-cache", one, []), ("mixture-10", mixed, []),
                             ("mixture-10+tokens", mixed, language)):
        if data is mixed:
            mixed.language = lang
        loader = RobotLoader(data, BATCH, device=device)
        timing, nbytes = bench._measure(bench._robocache_batches(loader), cfg["batches"],
                                        cfg["repeats"], device)
        rate = BATCH / (timing.median_ms * 1e-3)
        single_rate = single_rate or rate
        keep(H.case(FAMILY, name, impl, timing, nbytes=nbytes, samples_per_s=rate,
                    ratio_vs_single=rate / single_rate, steps=len(data), sources=10
                    if data is mixed else 1, cuda_graph=loader.graphed is not None,
                    prompts=sum(len(x.strings) for x in lang),
                    note=f"{rate:,.0f} samples/s, {rate / single_rate:.2f}x single"))
        del loader
    mixed.language = language


if __name__ == "__main__":
    main(run, __doc__, {"part": (str, "all (default), three (three robots, cameras) or file "
                                      "(ten robots from one mixture file, language)")})
