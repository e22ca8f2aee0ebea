"""Stage 4, write: an aligned episode's Arrow tables and their Lance data files, uncommitted
(invisible until :mod:`robocache.data.build.commit` adds them).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from robocache._optional import require
from robocache.data.build.commit import _committed
from robocache.data.build.config import CacheConfig, column_name
from robocache.data.build.encode import frame_format, stored_size
from robocache.data.cameras import camera_tables
from robocache.data.episode import Episode, StreamSpec


@functools.lru_cache(maxsize=64)
def _schema(specs: tuple[tuple[str, StreamSpec], ...]):
    """The ``data.lance`` schema of streams ``specs`` (``dict.items()`` as a tuple: made once
    per build, not per episode)."""
    pa = require("pyarrow", "data", "Arrow tables")

    fields = [pa.field("episode_index", pa.int64()), pa.field("step", pa.int64()),
              pa.field("timestamp", pa.float64()), pa.field("task", pa.string())]
    for name, spec in specs:
        col = column_name(name)
        if spec.kind == "numeric":
            fields.append(pa.field(col, pa.list_(pa.from_numpy_dtype(np.dtype(spec.dtype)),
                                                 spec.dim)))
        elif spec.kind == "event":
            fields += [pa.field(col, pa.string()), pa.field(f"{col}/age", pa.float32())]
        else:
            fields += [pa.field(f"{col}/frame", pa.int64()),
                       pa.field(f"{col}/offset", pa.float32())]
        fields.append(pa.field(f"{col}_is_pad", pa.bool_()))
    return pa.schema(fields)


def _table(cols: dict[str, Any], schema):
    pa = require("pyarrow", "data", "Arrow tables")

    arrays = []
    for f in schema:
        v = cols[f.name]
        if pa.types.is_fixed_size_list(f.type):
            arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(v.reshape(-1)),
                                                            f.type.list_size))
        else:
            arrays.append(pa.array(v, f.type))  # object arrays (strings, None) converted in C
    return pa.Table.from_arrays(arrays, schema=schema)


class Rows:
    """An aligned episode's rows (``data.lance``) as NumPy columns, made into Arrow with the
    other episodes of its batch (:meth:`concat`): one conversion per column for the batch
    instead of one per episode (0.12-0.15 ms an episode of ``bench preprocess``'s kind,
    docs/build-profile.md).

    Attributes:
        cols: column name -> array ``[n]`` or ``[n, D]``, one entry per field of ``schema``.
        schema: the table's Arrow schema.
        num_rows, nbytes: its steps, and the bytes of its arrays.
    """

    def __init__(self, cols: dict[str, Any], schema):
        self.cols = {f.name: cols[f.name] for f in schema}
        self.schema = schema
        self.num_rows = len(self.cols["episode_index"])
        self.nbytes = sum(v.nbytes for v in self.cols.values())

    @staticmethod
    def concat(parts: list[Rows]):
        """The Arrow table of ``parts``' rows, in order."""
        if len(parts) == 1:
            return _table(parts[0].cols, parts[0].schema)
        return _table({name: np.concatenate([p.cols[name] for p in parts])
                       for name in parts[0].cols}, parts[0].schema)


def episode_tables(episode: Episode, cols: dict[str, Any], specs: dict[str, StreamSpec],
                   config: CacheConfig | None = None,
                   frames: dict[str, Any] | None = None) -> list[tuple[str, Any]]:
    """One aligned episode's tables: ``(table path relative to the cache, table)``, camera
    frames first as Arrow tables (encoded as ``config`` says, unless ``frames`` holds their
    tables already), the aligned rows (``data.lance``) last, as :class:`Rows`."""
    config = config or CacheConfig()
    cameras = [name for name, spec in specs.items() if spec.kind in ("image", "video")]
    missing = {name: specs[name] for name in cameras if name not in (frames or {})}
    if missing:  # encoded here as a build's preparation encodes them
        frames = {**(frames or {}), **camera_tables(
            episode, missing, frame_format(config),
            {name: stored_size(spec, config) for name, spec in missing.items()},
            codecs=config.camera_codecs)}
    tables = [(f"frames/{name}.lance", frames[name]) for name in cameras]
    tables.append(("data.lance", Rows(cols, _schema(tuple(specs.items())))))
    return tables


def write_episode(dest: Path, episode: Episode, cols: dict[str, Any],
                  specs: dict[str, StreamSpec], config: CacheConfig | None = None,
                  frames: dict[str, Any] | None = None) -> list[tuple[str, Any, list]]:
    """Write one aligned episode's Lance data files under ``dest``, uncommitted (invisible
    until :func:`~robocache.data.build.commit.commit` adds them; a writer killed here leaves
    no rows). Returns ``(table path relative to dest, schema, fragments)`` in the order of
    :func:`episode_tables`. Safe to run in parallel processes (each writes its own files).
    Many episodes go into one write with :class:`Batch`."""
    batch = Batch(1, 1)
    batch.add(episode.index, episode_tables(episode, cols, specs, config, frames))
    return batch.write(dest)


class Batch:
    """Episodes' tables gathered for one Lance write per table (:meth:`write`): a fragment
    holds many episodes, so the cost of a write and of the commit that follows is shared by
    all of them and the number of fragments grows with the bytes cached, not the episodes.

    Args:
        rows: :meth:`full` once the aligned rows (``data.lance``) reach this many.
        nbytes: or once the batch's Arrow tables (frames included) reach this many bytes.
    """

    def __init__(self, rows: int, nbytes: int):
        self.max_rows, self.max_bytes = rows, nbytes
        self.indices: list[int] = []
        self.tables: dict[str, list] = {}
        self.rows = self.nbytes = 0

    def __len__(self) -> int:
        return len(self.indices)

    def add(self, index: int, tables: list[tuple[str, Any]]) -> None:
        """Add episode ``index``'s :func:`episode_tables` (Arrow tables or :class:`Rows`)."""
        self.indices.append(int(index))
        for rel, table in tables:
            self.tables.setdefault(rel, []).append(table)
            self.nbytes += table.nbytes
            if rel == "data.lance":
                self.rows += table.num_rows

    def full(self) -> bool:
        return self.rows >= self.max_rows or self.nbytes >= self.max_bytes

    def write(self, dest: Path) -> list[tuple[str, Any, list]]:
        """Write every table's gathered rows under ``dest`` as Lance data files, uncommitted
        (frames first, ``data.lance`` last, as :func:`write_episode`), and empty the batch.
        Returns ``(table path relative to dest, schema, fragments)``."""
        pa = require("pyarrow", "data", "Arrow tables")

        written = []
        for rel, tables in self.tables.items():
            if isinstance(tables[0], Rows):
                table = Rows.concat(tables)
            else:
                table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
            written.append((rel, table.schema, write_files(table, dest / rel)))
        self.indices, self.tables, self.rows, self.nbytes = [], {}, 0, 0
        return written


def write_files(data, uri: Path) -> list:
    """Lance data files of ``data`` (a table or a record batch reader) for the dataset at
    ``uri``, uncommitted; returns their fragments for
    :func:`~robocache.data.build.commit.commit`. One file per ``max_rows_per_file`` rows
    (Lance's default, 1M rows)."""
    from lance.fragment import write_fragments

    schema = data.schema
    if not _committed(uri):  # mode "create" (not "append"): Lance warns of no dataset otherwise
        try:
            return write_fragments(data, str(uri), schema, mode="create")
        except OSError:
            if not _committed(uri):  # not the race with the first commit: a real failure
                raise
    return write_fragments(data, str(uri), schema, mode="append")
