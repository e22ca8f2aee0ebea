"""Language in mixture batches: per-step tasks, episode instructions chosen per sample with a
seed, tokens from one tokenizer call over the distinct strings.

References: the tokenizer called on each sample's string alone (``padding="max_length",
truncation=True, max_length=L``); each row's task as the cache's served index records it; an
episode's instructions as the instructions file lists them."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest
import torch
import yaml
from mixture_caches import SUBTASKS, TASKS, WordTokenizer, make_caches

from robocache.data import MixedDataset, RobotDataset, RobotLoader
from robocache.data.language import Language, Strings, read_instructions, tokenize
from robocache.errors import DataError

INSTRUCTIONS = {"0": ["put the cube in the bowl", "place cube into bowl", ""],
                "2": {"language_instruction1": "close it",
                      "language_instruction2": "shut the drawer now",
                      "language_instruction3": "push the drawer until it is closed"}}


@pytest.fixture(scope="module")
def mixture(tmp_path_factory):
    root = tmp_path_factory.mktemp("language")
    caches = make_caches(root)
    (root / "instructions.json").write_text(json.dumps(INSTRUCTIONS))
    config = {"history": 1, "horizon": 2, "pad": {"state": 7, "action": 8},
              "datasets": [
                  {"name": "arm", "path": str(caches["arm"]), "state": "observation.state",
                   "action": "action", "instructions": "instructions.json",
                   "language": {"subtask": "language.subtask"}},
                  {"name": "mobile", "path": str(caches["mobile"]),
                   "state": "observation.state", "action": "action"},
                  {"name": "panda", "path": str(caches["panda"]), "action": "action"}]}
    path = root / "mix.yaml"
    path.write_text(yaml.safe_dump(config))
    return path, caches


def batches(mixed, n: int, device: str = "cpu", **kw):
    """The first ``n`` batches of a loader, epoch after epoch."""
    out = []
    loader = RobotLoader(mixed, 32, device=device, **kw)
    while len(out) < n:
        for batch in loader:
            out.append(batch)
            if len(out) == n:
                break
    return out


def test_tokens_identical_to_the_tokenizer_per_sample(mixture):
    path, _ = mixture
    tok = WordTokenizer()
    mixed = MixedDataset.from_config(path, tokenizer=tok)
    calls = tok.calls
    # one call to measure and one to pad, per batch key; each distinct string once in each
    assert calls == 2 * len(mixed.language)
    assert tok.strings == 2 * sum(len(lang.strings) for lang in mixed.language)
    distinct = set(TASKS) | {s for v in INSTRUCTIONS.values()
                             for s in (v.values() if isinstance(v, dict) else v) if s}
    assert set(mixed.language[0].strings) <= distinct
    width = max(len(tok(s)["input_ids"]) for s in mixed.language[0].strings)
    for batch in batches(mixed, 6):
        ids, mask = batch["task.input_ids"], batch["task.attention_mask"]
        assert ids.dtype == mask.dtype == torch.int64 and ids.shape == (32, width)
        for i, text in enumerate(batch["task"]):
            want = tok(text, padding="max_length", truncation=True, max_length=width)
            assert ids[i].tolist() == want["input_ids"]
            assert mask[i].tolist() == want["attention_mask"]
        assert [mixed.language[0].strings[j] for j in batch["task_index"].tolist()] == \
            list(batch["task"])
    truncated = MixedDataset.from_config(path, tokenizer=tok, max_length=3)
    batch = batches(truncated, 1)[0]
    assert batch["task.input_ids"].shape == (32, 3)
    for i, text in enumerate(batch["task"]):
        want = tok(text, padding="max_length", truncation=True, max_length=3)
        assert batch["task.input_ids"][i].tolist() == want["input_ids"]


def test_task_per_step_and_instructions_per_episode(mixture):
    path, caches = mixture
    mixed = MixedDataset.from_config(path)
    own = {n: RobotDataset(caches[n]) for n in mixed.names}
    wanted = read_instructions(INSTRUCTIONS, "test")
    chosen = Counter()
    for batch in batches(mixed, 20):
        for i, text in enumerate(batch["task"]):
            name = mixed.names[int(batch["source"][i])]
            row = int(batch["index"][i])
            episode = int(batch["episode_index"][i])
            if name == "arm" and episode in wanted:
                assert text in wanted[episode]
                chosen[(episode, text)] += 1
            else:  # the row's own task, as the cache's served index records it
                d = own[name]
                assert text == d.task_names[int(d.task_id[row])]
    # every instruction of an episode is chosen, about as often as the others
    for episode, texts in wanted.items():
        counts = [chosen[(episode, t)] for t in texts]
        assert min(counts) > 0
        assert max(counts) < 3 * min(counts) + 10


def test_string_streams_per_step(mixture):
    """A string stream (LeRobot's string features: subtasks) at each step: the event the
    cache holds there (the latest so far), "" before the first and for robots without it."""
    import lance

    path, caches = mixture
    tok = WordTokenizer()
    mixed = MixedDataset.from_config(path, tokenizer=tok)
    assert [lang.key for lang in mixed.language] == ["task", "subtask"]
    table = lance.dataset(str(caches["arm"] / "data.lance")).to_table(
        columns=["episode_index", "step", "language/subtask"]).to_pylist()
    held = {(r["episode_index"], r["step"]): r["language/subtask"] or "" for r in table}
    own = RobotDataset(caches["arm"])
    seen = set()
    for batch in batches(mixed, 10):
        width = batch["subtask.input_ids"].shape[1]
        for i, text in enumerate(batch["subtask"]):
            if mixed.names[int(batch["source"][i])] != "arm":
                assert text == ""
                continue
            row = int(batch["index"][i])
            want = held[(int(own.episode_index[row]), int(own.step[row]))]
            assert text == want
            if want:
                assert want.rsplit(" ", 1)[0] in {t for _, t in SUBTASKS}
            seen.add(want)
            assert batch["subtask.input_ids"][i].tolist() == tok(
                text, padding="max_length", truncation=True, max_length=width)["input_ids"]
    assert "" in seen and len(seen) > 3


def test_choice_is_seeded_and_resumes(mixture):
    path, _ = mixture
    mixed = MixedDataset.from_config(path)
    run = lambda **kw: [list(b["task"]) for b in batches(mixed, 8, **kw)]  # noqa: E731
    first = run(seed=5)
    assert first == run(seed=5)
    assert first != run(seed=6)
    loader = RobotLoader(mixed, 32, device="cpu", seed=5)
    assert len(loader) == 3  # batches an epoch
    next(iter(loader))
    again = RobotLoader(mixed, 32, device="cpu", seed=5)
    again.load_state_dict(loader.state_dict())
    assert [list(b["task"]) for b in again] == first[1:3]


def test_language_tables_by_hand():
    # two sources: 3 rows then 2; episode 1 of the first has two instructions
    lang = Language.build([(["a b", "c"], np.array([0, 1, 1]), np.array([0, 1, 1]),
                            {1: ["x", "y z"]}),
                           (["c", "d"], np.array([1, 0]), np.array([4, 4]), {})],
                          WordTokenizer())
    assert lang.strings == ["a b", "c", "x", "y z", "d"]
    assert lang.count.tolist() == [1, 2, 2, 1, 1]  # a row's own task, or its instructions
    out = lang(torch.arange(5), torch.arange(5), seed=0, epoch=0)
    assert out["task"][0] == "a b" and out["task"][3:] == ["d", "c"]
    assert set(out["task"][1:3]) <= {"x", "y z"}
    assert out["task.input_ids"].shape == (5, 3)  # BOS + the longest string's two words
    picks = {lang(torch.tensor([1]), torch.tensor([p]), seed=0, epoch=0)["task"][0]
             for p in range(64)}
    assert picks == {"x", "y z"}


def test_strings_resolve_once():
    s = Strings(torch.tensor([1, 0, 1]), ["p", "q"])
    assert list(s) == ["q", "p", "q"] and len(s) == 3 and s == ["q", "p", "q"]
    assert s.clone() == s


def test_bad_tokenizer_and_instructions(tmp_path):
    with pytest.raises(DataError, match="input_ids"):
        tokenize(["a"], lambda texts, **kw: {"ids": [[1]]})
    with pytest.raises(DataError, match="max_length"):
        tokenize(["a"], WordTokenizer(), max_length=0)
    with pytest.raises(DataError, match="episode '0' must map to a list of strings"):
        read_instructions({"0": [1, 2]}, "mix.yaml: dataset 'arm'")
    with pytest.raises(DataError, match="not an episode index"):
        read_instructions({"ep-a": ["x"]}, "mix.yaml: dataset 'arm'")
    bad = tmp_path / "i.json"
    bad.write_text("[1, 2]")
    with pytest.raises(DataError, match="must hold a JSON object"):
        read_instructions(bad, "mix.yaml: dataset 'arm'")


@pytest.mark.gpu
def test_cuda_language_matches_cpu(mixture):
    path, _ = mixture
    mixed = MixedDataset.from_config(path, tokenizer=WordTokenizer())
    want = batches(mixed, 4)
    got = [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in b.items()}
           for b in batches(mixed, 4, device="cuda")]
    for g, w in zip(got, want, strict=True):
        assert list(g["task"]) == list(w["task"])
        assert torch.equal(g["task.input_ids"].cpu(), w["task.input_ids"])


def test_workers_path_serves_the_same_prompts(mixture):
    path, _ = mixture
    mixed = MixedDataset.from_config(path, tokenizer=WordTokenizer())
    want = list(RobotLoader(mixed, 32, device="cpu", seed=7))
    got = list(RobotLoader(mixed, 32, device="cpu", seed=7, num_workers=1))
    assert len(got) == len(want) > 0
    for g, w in zip(got, want, strict=True):
        assert list(g["task"]) == list(w["task"]) and list(g["subtask"]) == list(w["subtask"])
        assert torch.equal(g["task.input_ids"], w["task.input_ids"])


def test_instructions_by_episode_name(tmp_path):
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"lab-a--ep-7": 3}))
    got = read_instructions({"lab-a--ep-7": {"language_instruction1": "stack the cups",
                                             "language_instruction2": ""}},
                            "mix.yaml: dataset 'droid'", keys)
    assert got == {3: ["stack the cups"]}
