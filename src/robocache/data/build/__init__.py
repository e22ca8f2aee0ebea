"""Build a training cache: every episode aligned to one rate, in a Lance dataset.

    $ robocache ingest data/sample/panda_multirate /tmp/panda.cache --rate 50

Layout of a cache directory::

    data.lance/         one row per (episode, step): episode_index, step, timestamp, task,
                        one column per stream (see below) and its `<column>_is_pad` mask
    frames/<col>.lance  camera streams: one row per source frame (episode_index, frame,
                        source_frame, timestamp, encoded: JPEG/PNG bytes; a source's own JPEG/PNG
                        bytes are kept as they came), see :mod:`robocache.data.cameras`
    stats.json          per-dimension mean, std, min, max, q01, q99 of every numeric stream
    manifest.json       source, rate, streams, episodes, quarantined episodes with reasons

Target times. At the source's own rate (``rate_hz="native"``, the default) the grid is the
source's frames: every sample of a stream at that rate lies within ``grid_tolerance_s`` of
``t0 + k / fps`` (``t0``: the episode's first such sample) and is stored at step ``k``
bit-exactly, in its own dtype; the step count comes from the frames, never from a float product.
A sample off that grid by more than the tolerance quarantines the episode, naming the stream,
the row and the offset. At any other rate the grid runs from the latest start to the earliest
end of the episode's numeric streams (continuous streams interpolate, never extrapolate), the
last instant included when the end lies within ``grid_tolerance_s`` of it. Either way, a source
timestamp within ``grid_tolerance_s`` of a grid instant is snapped onto it before alignment, so
``previous`` and ``nearest`` at that instant return that sample, never its neighbour. Per kind:

- numeric → ``method`` (default ``linear``; ``previous`` for integer/bool data) ``[D]`` in the
  stream's own dtype (``previous``/``nearest`` copy samples; interpolation rounds back to it).
- image / video → ``frame_index``: the source frame shown at each step (``<col>/frame``, -1 when
  none) and ``<col>/offset`` (t_frame - t_step, seconds). Video frames are decoded once here
  and stored like image frames (JPEG by default, ``camera_codec``). At the native rate a
  camera at that rate has a frame within ``grid_tolerance_s`` of every step, or the episode is
  quarantined (a missing frame, a variable frame rate, a timestamp jump).
- event (sparse strings) → ``previous``: the latest event so far (null before the first) and its
  age in seconds (``<col>/age``).

Stream names become column names with ``.`` replaced by ``/`` (Lance reserves ``.``).

Episodes are read, their videos decoded and their camera frames encoded ``decode_workers`` at a
time, ahead of the episode being aligned and written, in one of two ways (never a process pool
inside another; :func:`robocache.data.build.read.prepared`):

- threads (by default for fewer than :data:`~robocache.data.build.read.PROCESS_EPISODES`
  episodes, one worker, a source passed as an object, or videos NVDEC decodes;
  :func:`~robocache.data.build.read.preparation`):
  threads read and check the episodes, and their videos are decoded and encoded in
  ``decode_workers`` forked camera worker processes (:func:`robocache.data.cameras.worker_pool`;
  on the reading thread with one worker or in a daemonic process), NVDEC's on the threads;
  with NVDEC in a large build (``decode_processes``; by default from
  :data:`~robocache.data.build.read.PROCESS_EPISODES` episodes), in a lane process per GPU
  (:mod:`robocache.data.lanes`) and, with ``"auto"``, the camera worker processes beside
  them, each stream to whichever has room first;
- spawned processes (``decode_processes``; by default from
  :data:`~robocache.data.build.read.PROCESS_EPISODES` episodes of a source path whose videos,
  if any, PyAV decodes):
  ``decode_workers`` processes each read, check, decode, encode and (alignment on the CPU)
  align whole episodes, their videos decoded in the process itself with ``cores //
  decode_workers`` FFmpeg threads; no camera worker processes are started.

Either way the episodes are aligned many at a time
(:func:`~robocache.data.build.align.align_batch`) and written and committed in batches
(``batch_rows``, ``batch_bytes``: many episodes per Lance fragment), in the source's order,
so the cache holds the same rows and frame bytes whatever the number of workers and the way,
and what waits to be written is the episodes' JPEG/PNG bytes (a video is encoded as it
decodes), never their decoded pixels.

Idempotent per episode: an episode is cached once its batch's rows are committed, so a killed
run leaves whole episodes only; re-running drops the camera frames a killed run committed
without their rows, skips the episodes already in ``data.lance`` (resume) and re-checks the
rest. A malformed episode is quarantined alone with its reason and listed in the manifest;
``read = cached + quarantined`` always holds. Old Lance versions are removed as the build goes
and only fragments the build itself wrote are compacted, so a reader of the complete cache
a build resumes keeps its files (:class:`~robocache.data.build.commit.Committer`).

Modules, in the order an episode passes through them: :mod:`~robocache.data.build.read`
(read, check, decode and encode camera frames, on worker threads or processes),
:mod:`~robocache.data.build.align`,
:mod:`~robocache.data.build.encode` (camera storage; the frames are encoded by
:mod:`robocache.data.cameras`), :mod:`~robocache.data.build.write`,
:mod:`~robocache.data.build.commit`; :mod:`~robocache.data.build.run` drives them, and
:mod:`~robocache.data.build.manifest`, :mod:`~robocache.data.build.stats` and
:mod:`~robocache.data.build.config` hold the manifest, the statistics and the options. The lock
(one writer per cache) is :mod:`robocache.data.lock`.
"""

from robocache.data.build.config import CacheConfig
from robocache.data.build.run import build, locked_run

__all__ = ["CacheConfig", "build", "locked_run"]
