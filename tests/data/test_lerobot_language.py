"""LeRobot's language columns (``language_persistent`` / ``language_events``, as
``lerobot-annotate`` writes them) read as string streams, per step what LeRobot 0.6.1's own
recipe resolvers give (``active_at`` for persistent messages, ``emitted_at`` for events) on a
LeRobot-written fixture (tests/fixtures/lerobot/make_language.py), and served through a
mixture file as strings and tokens."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

lance = pytest.importorskip("lance")
yaml = pytest.importorskip("yaml")

from robocache.data.cache import build  # noqa: E402

FIXTURE = Path(__file__).parent.parent / "fixtures" / "lerobot"
WANT = json.loads((FIXTURE / "language.json").read_text())
PERSISTENT = ("subtask", "plan", "memory", "task_aug")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    dest = tmp_path_factory.mktemp("language") / "c"
    build(FIXTURE / "language", dest, progress=False, device="cpu")
    return dest


def test_each_step_holds_lerobots_resolved_messages(cache):
    rows = lance.dataset(str(cache / "data.lance")).to_table().sort_by(
        [("episode_index", "ascending"), ("step", "ascending")])
    manifest = json.loads((cache / "manifest.json").read_text())
    assert sorted(k for k in manifest["streams"] if k.startswith("language.")) == sorted(WANT[0])
    for key in WANT[0]:
        col = key.replace(".", "/")
        got = rows.column(col).to_pylist()
        want = [frame[key] for frame in WANT]
        if key.split(".")[1] in PERSISTENT:  # the message active at the step
            assert got == want, key
        else:  # the message emitted at the step: the latest so far, of age 0
            age = np.asarray(rows.column(f"{col}/age").to_pylist(), dtype=float)
            emitted = [g if a == 0 else None for g, a in zip(got, age, strict=True)]
            assert emitted == want, key


def test_a_mixture_serves_them_as_strings_and_tokens(cache, tmp_path):
    """Through a mixture file's language mapping: each sample's subtask string (the fixture's
    state is ``[episode, frame]``, which says which step the sample is) and its tokens."""
    import sys

    from robocache.data import MixedDataset, RobotLoader

    sys.path.insert(0, str(Path(__file__).parent))
    from mixture_caches import WordTokenizer

    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump({"history": 1, "datasets": [{
        "path": str(cache), "state": "observation.state",
        "language": {"subtask": "language.subtask.assistant"}}]}))
    tok = WordTokenizer()
    mixed = MixedDataset.from_config(path, tokenizer=tok)
    starts = {0: 0, 1: 8}
    seen = 0
    for batch in RobotLoader(mixed, 4, device="cpu", normalize=None, drop_last=False):
        width = batch["subtask.input_ids"].shape[1]
        for state, text, ids in zip(batch["observation.state"][:, -1].tolist(),
                                    batch["subtask"], batch["subtask.input_ids"].tolist(),
                                    strict=True):
            frame = starts[int(state[0])] + int(state[1])
            assert text == (WANT[frame]["language.subtask.assistant"] or "")
            assert ids == tok(text, padding="max_length", truncation=True,
                              max_length=width)["input_ids"]
            seen += 1
    assert seen >= len(WANT) // 2
