"""Small caches of different robots for the mixture-file and language tests, and a tokenizer
that speaks Hugging Face's call protocol (no download)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from robocache.data.cache import build
from robocache.data.episode import Episode, Stream, StreamSpec
from robocache.data.formats.lerobot import write_lerobot

# name: (state dim, action dim, rate Hz, camera stream or None)
ROBOTS = {"arm": (3, 2, 10.0, "observation.images.top"),
          "mobile": (6, 4, 5.0, None),
          "hand": (2, 7, 20.0, "observation.images.wrist"),
          "panda": (7, 8, 10.0, None)}
CAM = (4, 5, 3)
TASKS = ["pick the red cube", "open the drawer", "wipe the table clean"]
# the arm's string stream: (step, subtask) events per episode, from its third step
SUBTASKS = [(2, "reach"), (5, "grasp the cube"), (7, "lift")]


def episodes(state: int, action: int, fps: float, camera: str | None, seed: int):
    rng = np.random.default_rng(seed)
    specs = {"observation.state": StreamSpec("observation.state", "numeric", "float32",
                                             (state,), fps),
             "action": StreamSpec("action", "numeric", "float32", (action,), fps)}
    if camera:
        specs[camera] = StreamSpec(camera, "image", "uint8", CAM, fps)
    if seed == 0:
        specs["language.subtask"] = StreamSpec("language.subtask", "event", "str", (), None)
    if seed == 2:  # the hand's gripper opening: a stream of its own
        specs["observation.gripper"] = StreamSpec("observation.gripper", "numeric", "float32",
                                                  (1,), fps)
    out = []
    for i in range(3):
        n = int(rng.integers(8, 14))
        t = np.arange(n) / fps
        data = {"observation.state": rng.uniform(-1.5, 1.5, (n, state)),
                "action": rng.normal(-seed, 0.5, (n, action)),
                camera: rng.integers(0, 255, (n, *CAM))}
        data["language.subtask"] = np.array([f"{text} {i}" for _, text in SUBTASKS], object)
        data["observation.gripper"] = rng.uniform(0.0, 0.08, (n, 1))
        times = {"language.subtask": np.array([k for k, _ in SUBTASKS]) / fps}
        out.append(Episode(i, {k: Stream(s, times.get(k, t), data[k].astype(s.dtype))
                               for k, s in specs.items()},
                           {"tasks": [TASKS[(i + seed) % len(TASKS)]]}))
    return out, specs


def make_caches(root: Path) -> dict[str, Path]:
    """One cache per robot of :data:`ROBOTS` under ``root``."""
    out = {}
    for seed, (name, (state, action, fps, camera)) in enumerate(ROBOTS.items()):
        eps, specs = episodes(state, action, fps, camera, seed)
        write_lerobot(root / f"{name}-src", eps, specs, fps=fps)
        build(root / f"{name}-src", root / name, rate_hz=fps, progress=False, device="cpu",
              camera_codec="png")
        out[name] = root / name
    return out


class WordTokenizer:
    """A word-level tokenizer called as a Hugging Face one: ``tok(text or list,
    padding="max_length" | False, truncation=..., max_length=...)`` -> ``input_ids`` and
    ``attention_mask`` (lists), a BOS id first, pad id 0 on the right; counts its calls and
    the strings it tokenized."""

    pad_token_id, bos_token_id = 0, 1

    def __init__(self):
        self.vocab: dict[str, int] = {}
        self.calls, self.strings = 0, 0

    def _ids(self, text: str) -> list[int]:
        return [self.bos_token_id] + [self.vocab.setdefault(w, len(self.vocab) + 2)
                                      for w in text.split()]

    def __call__(self, text, padding=False, truncation=False, max_length=None):
        self.calls += 1
        many = isinstance(text, list)
        texts = text if many else [text]
        self.strings += len(texts)
        ids = [self._ids(t) for t in texts]
        if truncation and max_length is not None:
            ids = [x[:max_length] for x in ids]
        masks = [[1] * len(x) for x in ids]
        if padding == "max_length":
            masks = [m + [0] * (max_length - len(m)) for m in masks]
            ids = [x + [self.pad_token_id] * (max_length - len(x)) for x in ids]
        out = {"input_ids": ids, "attention_mask": masks}
        return out if many else {k: v[0] for k, v in out.items()}
