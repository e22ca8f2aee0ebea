"""``robocache.data.cache``: the cache build's public names, kept at this path.

The build lives in :mod:`robocache.data.build`, one module per stage (read → align → encode →
write → commit, driven by :mod:`robocache.data.build.run`); see its docstring for the cache's
layout and guarantees.
"""

from robocache.data.build.align import (
    align_episode,
    native_streams,
    snap_times,
    step_tasks,
    target_times,
)
from robocache.data.build.commit import commit
from robocache.data.build.config import (
    CacheConfig,
    column_name,
    decode_workers,
    default_method,
    parse_shard,
    parse_size,
)
from robocache.data.build.encode import stored_size
from robocache.data.build.manifest import CACHE_FORMAT, IDENTITY, is_cache, read_manifest
from robocache.data.build.read import (
    Prepared,
    load_episode,
    native_rate,
    open_specs,
    prepare_episode,
    prepared,
)
from robocache.data.build.run import Run, build, finish, locked_run
from robocache.data.build.stats import STATS_BATCH_ROWS
from robocache.data.build.write import write_episode, write_files

__all__ = ["CACHE_FORMAT", "IDENTITY", "STATS_BATCH_ROWS", "CacheConfig", "Prepared", "Run",
           "align_episode", "build", "column_name", "commit", "decode_workers", "default_method",
           "finish", "is_cache", "load_episode", "locked_run", "native_rate", "native_streams",
           "open_specs", "parse_shard", "parse_size", "prepare_episode", "prepared",
           "read_manifest", "snap_times", "step_tasks", "stored_size", "target_times",
           "write_episode", "write_files"]
