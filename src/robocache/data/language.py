"""Language for vision-language-action training: tasks and instructions as strings and tokens.

    >>> mixed = MixedDataset.from_config("mixture.yaml", tokenizer=tokenizer)
    >>> batch = next(iter(RobotLoader(mixed, 256)))
    >>> batch["task"][0], batch["task.input_ids"].shape      # a str; int64 [256, L]

Each served row has a prompt: the episode's instruction when the episode has several
(DROID's three per episode: one chosen per sample, from the loader's seed, the epoch and the
sample's position in it, so a resumed loader chooses as before), else the row's own task (the
cache's per-step task, LeRobot's ``task_index``). Every distinct string of a mixture is
tokenized once, in one call of the tokenizer, when the mixture is opened: a batch's tokens
are a gather of that table on the batch's device (no tokenizer call, no host work per
sample), bit for bit what the tokenizer returns for each string on its own with
``padding="max_length", truncation=True, max_length=L``.

A string stream of the cache (LeRobot's ``dtype: "string"`` features, e.g. subtask
annotations) is served the same way under its own key, each step its held event
(:func:`event_strings`).

Batch keys (``key``: ``"task"`` for the prompt): ``task`` (a :class:`Strings`, the batch's
``B`` strings, copied to the host when first read), ``task_index`` (int64 ``[B]``, into
:attr:`Language.strings`) and, with a tokenizer, ``task.input_ids`` and
``task.attention_mask`` (int64 ``[B, L]``, as the tokenizer returns them).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robocache.errors import DataError


class Strings(Sequence):
    """A batch's strings: their ids on the batch's device and the table they index; the ids
    are copied to the host the first time a string is read (so a batch nobody reads the
    strings of costs no device sync)."""

    def __init__(self, ids: torch.Tensor, table: Sequence[str]):
        self.ids, self.table = ids, table
        self._items: list[str] | None = None

    def _resolve(self) -> list[str]:
        if self._items is None:
            self._items = [self.table[i] for i in self.ids.tolist()]
        return self._items

    def __getitem__(self, i):
        return self._resolve()[i]

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def __eq__(self, other) -> bool:
        return list(self) == list(other)

    def __repr__(self) -> str:
        return f"Strings({self._resolve()!r})"

    def record_stream(self, stream: torch.cuda.Stream) -> None:
        """Mark the ids as used on ``stream`` (as a batch's tensors are)."""
        self.ids.record_stream(stream)

    def clone(self) -> Strings:
        return Strings(self.ids.clone(), self.table)


def tokenize(strings: Sequence[str], tokenizer: Any, max_length: int | None = None
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention masks of ``strings``, each as the tokenizer gives it alone.

    Args:
        strings: the distinct strings.
        tokenizer: a Hugging Face tokenizer (any object called as
            ``tokenizer(list_of_str, padding="max_length", truncation=True, max_length=L)``
            returning ``input_ids`` and ``attention_mask`` lists).
        max_length: tokens per string; default the longest string's count (none truncated).

    Returns:
        ``input_ids`` and ``attention_mask``, int64 ``[len(strings), L]``.

    Raises:
        DataError: ``max_length`` < 1, or a tokenizer that does not return both lists of
            ``L`` tokens per string.
    """
    strings = list(strings)
    if max_length is not None and not (isinstance(max_length, int) and max_length >= 1):
        raise DataError(f"`max_length` must be an integer >= 1 tokens; got {max_length!r}.")
    try:
        if max_length is None:
            lengths = [len(x) for x in _call(tokenizer, strings)["input_ids"]]
            max_length = max(lengths, default=1)
        out = _call(tokenizer, strings, padding="max_length", truncation=True,
                    max_length=max_length)
        ids = torch.tensor(out["input_ids"], dtype=torch.int64).reshape(len(strings), -1)
        mask = torch.tensor(out["attention_mask"], dtype=torch.int64).reshape(len(strings), -1)
    except (KeyError, ValueError, TypeError, RuntimeError) as e:
        raise DataError(f"the tokenizer did not return `input_ids` and `attention_mask` of "
                        f"{max_length} tokens per string ({type(e).__name__}: {e}); pass a "
                        "Hugging Face tokenizer that pads (one with a pad token).") from e
    if ids.shape[1] != max_length or mask.shape != ids.shape:
        raise DataError(f"the tokenizer returned {ids.shape[1]} tokens per string where "
                        f"{max_length} were asked (padding='max_length'); pass a Hugging Face "
                        "tokenizer that pads (one with a pad token).")
    return ids, mask


def _call(tokenizer: Any, strings: list[str], **kw) -> Mapping[str, Any]:
    if not strings:
        return {"input_ids": [], "attention_mask": []}
    return tokenizer(strings, **kw)


def read_instructions(source: str | Path | Mapping[str, Any], where: str,
                      episode_keys: str | Path | Mapping[str, int] | None = None
                      ) -> dict[int, list[str]]:
    """Episode instructions: a JSON object (a file, or the parsed mapping) of episode -> its
    instructions, a list of strings or an object of them (DROID's
    ``{"language_instruction1": ..., ...}``); empty strings are dropped.

    Keys are cache episode indices, or names ``episode_keys`` maps to them (as a keep-ranges
    file's, :mod:`robocache.data.filters`).

    Raises:
        DataError: not such an object, or a key that is neither an index nor a known name.
    """
    from robocache.data.filters import _index, _names

    if isinstance(source, Mapping):
        data, name = source, where
    else:
        name = str(source)
        try:
            data = json.loads(Path(source).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise DataError(f"{where}: the instructions file {name} cannot be read ({e}); "
                            "pass a JSON object of episode -> instructions.") from e
    if not isinstance(data, Mapping):
        raise DataError(f"{where}: {name} must hold a JSON object of episode -> instructions.")
    names = _names(episode_keys) if episode_keys is not None else {}
    out: dict[int, list[str]] = {}
    for key, value in data.items():
        items = value.values() if isinstance(value, Mapping) else \
            [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple, type({}.values()))) or \
                not all(isinstance(s, str) for s in items):
            raise DataError(f"{where}: {name}: episode {key!r} must map to a list of strings; "
                            f"got {value!r}.")
        out[_index(str(key), names, f"{where}: {name}")] = [s for s in items if s]
    return out


def event_strings(ds, stream: str) -> tuple[list[str], np.ndarray]:
    """A string (event) stream of ``ds``'s cache at each served step: the latest event so far,
    ``""`` before the first (as the cache holds it), as ``(names, ids [rows])``; one scan of
    the cache's step keys and that column.

    Raises:
        DataError: ``stream`` is not a string stream of the cache.
    """
    import pyarrow.compute as pc

    spec = ds.manifest["streams"].get(stream)
    if spec is None or spec["kind"] != "event":
        raise DataError(f"{ds.location}: {stream!r} is not a string (event) stream of the "
                        "cache.")
    table = ds.location.lance("data.lance", version=ds.served.meta.get("data_version"))
    scale = 1 << 32  # (episode, step) as one int64 key
    want = ds.episode_index.numpy() * scale + ds.step.numpy()
    order = np.argsort(want, kind="stable")
    names: dict[str, int] = {"": 0}
    ids = np.zeros(len(want), np.int64)
    with ds.location.reading("data.lance"):
        for batch in table.to_batches(columns=["episode_index", "step", spec["column"]],
                                      batch_size=1 << 16):
            key = batch.column(0).to_numpy() * scale + batch.column(1).to_numpy()
            at = np.searchsorted(want, key, sorter=order)
            at = np.minimum(at, len(want) - 1)
            hit = (len(want) > 0) & (want[order[at]] == key)
            if not hit.any():
                continue
            text = pc.fill_null(batch.column(2), "").filter(hit).dictionary_encode()
            lut = np.array([names.setdefault(t, len(names)) for t in
                            text.dictionary.to_pylist()] or [0], np.int64)
            ids[order[at[hit]]] = lut[text.indices.to_numpy(zero_copy_only=False)]
    return list(names), ids


class Language:
    """The prompts of stacked rows (a mixture's sources one after the other, as
    :class:`robocache.MixedDataset` stacks them) as ids into :attr:`strings`, with the token
    table when a tokenizer was given.

    Each row's candidates are ``count[row]`` string ids from ``flat[first[row]]`` on: its
    episode's instructions, or (``count`` 1) its own task, kept after the instructions in
    ``flat``; a sample serves candidate ``hash % count``. So a batch is a few gathers and
    integer ops on its device, whatever it holds.

    Args:
        strings: the distinct strings.
        first, count: int64 ``[rows]``, where each row's candidates start in ``flat`` and how
            many there are (>= 1).
        flat: int64 ``[n]``, the candidates' string indices.
        tokens: ``(input_ids, attention_mask)`` of ``strings`` (:func:`tokenize`), or None.
        key: the batch key (``task``).
    """

    def __init__(self, strings: list[str], first: torch.Tensor, count: torch.Tensor,
                 flat: torch.Tensor, tokens: tuple[torch.Tensor, torch.Tensor] | None = None,
                 key: str = "task"):
        self.strings, self.key = strings, key
        self.first, self.count, self.flat, self.tokens = first, count, flat, tokens
        self.choices = bool(count.numel()) and bool(count.max() > 1)
        self._on: dict[torch.device, Language] = {}

    @classmethod
    def build(cls, rows: Sequence[tuple[Sequence[str], np.ndarray, np.ndarray,
                                        Mapping[int, Sequence[str]]]],
              tokenizer: Any = None, max_length: int | None = None, key: str = "task"
              ) -> Language:
        """The language of sources stacked in order, each given as ``(task_names, task_id
        [rows], episode_index [rows], instructions {episode: [str]})``."""
        strings: dict[str, int] = {}
        tasks, episodes, flat = [], [], []
        for names, task_id, episode_index, instructions in rows:
            lut = np.array([strings.setdefault(t, len(strings)) for t in names] or [0],
                           np.int64)
            tasks.append(lut[np.asarray(task_id, np.int64)])
            top = max(max(instructions, default=-1), int(np.max(episode_index, initial=-1)))
            first = np.zeros(top + 1, np.int64)
            count = np.zeros(top + 1, np.int64)
            for ep, texts in instructions.items():
                first[ep], count[ep] = len(flat), len(texts)
                flat.extend(strings.setdefault(t, len(strings)) for t in texts)
            episode_index = np.asarray(episode_index, np.int64)
            episodes.append((first[episode_index], count[episode_index]))
        # a row without instructions: one candidate, its task, kept after the instructions
        base = len(flat)
        tail = np.concatenate(tasks or [np.zeros(0, np.int64)])
        own = base + np.arange(len(tail), dtype=np.int64)
        first = np.concatenate([f for f, _ in episodes] or [np.zeros(0, np.int64)])
        count = np.concatenate([c for _, c in episodes] or [np.zeros(0, np.int64)])
        listed = count > 0
        table = list(strings)
        tokens = tokenize(table, tokenizer, max_length) if tokenizer is not None else None
        return cls(table, torch.from_numpy(np.where(listed, first, own)),
                   torch.from_numpy(np.where(listed, count, 1)),
                   torch.from_numpy(np.concatenate([np.array(flat, np.int64), tail])),
                   tokens, key)

    def to(self, device: torch.device | str) -> Language:
        """This language's tables on ``device`` (made once per device)."""
        device = torch.device(device)
        if self.first.device == device:
            return self
        if device not in self._on:
            move = lambda t: t.to(device)
            self._on[device] = Language(
                self.strings, move(self.first), move(self.count), move(self.flat),
                None if self.tokens is None else tuple(map(move, self.tokens)), self.key)
        return self._on[device]

    def __call__(self, rows: torch.Tensor, positions: torch.Tensor, seed: int,
                 epoch: int) -> dict[str, Any]:
        """The batch keys of stacked rows ``rows`` drawn at epoch ``positions`` (see
        :meth:`ids` and :meth:`serve`)."""
        return self.serve(self.ids(rows, positions, seed, epoch))

    def ids(self, rows: torch.Tensor, positions: torch.Tensor, seed: int,
            epoch: int) -> torch.Tensor:
        """The string ids of stacked rows ``rows`` (int64 ``[N]``) drawn at epoch
        ``positions`` (int64 ``[N]``, where each sample is in the epoch: the instruction chosen
        is a hash of ``seed``, ``epoch`` and the position), on ``rows``' device."""
        lang = self.to(rows.device)
        at = lang.first[rows]
        if self.choices:
            at = at + _mix(positions, seed, epoch) % lang.count[rows]
        return lang.flat[at]

    def serve(self, ids: torch.Tensor) -> dict[str, Any]:
        """A batch's keys from its string ids (int64 ``[B]``): the strings, the ids and, with
        tokens, their ``input_ids`` and ``attention_mask`` (two gathers on ``ids``' device)."""
        out: dict[str, Any] = {self.key: Strings(ids, self.strings), f"{self.key}_index": ids}
        if self.tokens is not None:
            tokens = self.to(ids.device).tokens
            out[f"{self.key}.input_ids"] = tokens[0][ids]
            out[f"{self.key}.attention_mask"] = tokens[1][ids]
        return out


def _mix(positions: torch.Tensor, seed: int, epoch: int) -> torch.Tensor:
    """A 31-bit hash of (``seed``, ``epoch``, each position) in int64 arithmetic that never
    overflows (32-bit words times constants below 2^28), the same on every device; eleven
    element-wise ops (a batch's choice is launch-bound on a GPU)."""
    mask = 0xFFFFFFFF
    key = (seed * 0x9E3779B1 + epoch * 0x85EBCA77) & mask
    x = (((positions & mask) * 0x2C1B3C6) ^ key) & mask
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & mask
    return (x ^ (x >> 15)) & 0x7FFFFFFF
