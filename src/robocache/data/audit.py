"""Audit a cache: per-episode checks of its numeric streams, timing, length and tasks.

    >>> report = audit("/data/droid.cache")                  # AuditConfig() thresholds
    >>> [e["index"] for e in report["episodes"] if e["flags"]]
    >>> ds = RobotDataset("/data/droid.cache", audit=report)  # serve the unflagged episodes

The cache is read, never written: one streaming scan of ``data.lance`` (the index columns,
each numeric stream and every stream's pad column, :data:`SCAN_ROWS` rows a batch), episodes
gathered as their rows arrive and checked :data:`CHUNK_ROWS` rows at a time with the
vectorised checks of :mod:`robocache.ops.audit`, on the GPU when there is one. Memory is
bounded by a chunk plus, per episode, a few numbers and its trajectory signature
(:data:`SHIFT_PHASES` x ``signature_points`` samples x the dimensions of the signature
streams, float16, and a mask) for the near-duplicate search (and, for the pixel checks, a
few batches of frames and the indexes of two or three cameras, 24 bytes a frame: see
:func:`_pixels`). A camera's timing is checked from the offset of the frame served at each
step; its pixels (black, uniform and repeated frames) from a second pass, over its frame
table in (episode, frame) order, decoded a batch at a time by serving's decoders (nvJPEG on
a GPU; cameras kept as video GOP by GOP; ``cameras=False`` skips it), the next batches read
meanwhile, across cameras, as serving reads them.

Every threshold is a field of :class:`AuditConfig` (a CLI option of ``robocache audit``);
ranges are in units of the dataset's q01..q99 range per dimension (``stats.json``), so one
setting fits joints in radians and grippers in metres alike. The report is a JSON-ready dict
(schema in docs/curation.md); :func:`flagged` reads the episodes to drop from it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from robocache.errors import DataError

#: The report's format (``"format"`` field); a reader refuses any other.
REPORT_FORMAT = "robocache-audit/1"
#: Rows per batch of the scan of ``data.lance``.
SCAN_ROWS = 1 << 16
#: Rows of whole episodes checked at once (the last chunk holds what is left).
CHUNK_ROWS = 1 << 20
#: Episodes compared at once by the near-duplicate search (a block of distances
#: ``[NEAR_BLOCK, E]`` float32).
NEAR_BLOCK = 1024

#: Every flag an episode can carry, in the order the report lists them.
FLAGS = ("short", "timestamp_gap", "timestamp_jitter", "stream_gap", "nonfinite",
         "out_of_range", "jump", "frozen", "idle", "gripper_unused", "camera_black",
         "camera_constant", "camera_duplicate", "duplicate", "near_duplicate", "task_empty",
         "task_unknown", "quarantined")
#: Samples of a signature per ``signature_step_s``: the shifted comparisons' resolution.
SHIFT_PHASES = 4
#: Camera frames decoded at once by the pixel checks, at most ...
FRAME_BATCH = 1024
#: ... and at most this many bytes of decoded pixels (a GOP of a video may hold more); on a
#: GPU 4 times as many (the frames decode into its memory, and larger nvJPEG batches spread
#: each call's fixed cost).
FRAME_BYTES = 1 << 27
#: Pixels of a frame (at least; strided evenly) whose mean and standard deviation say whether
#: it is black or uniform: a 480x640 frame's every 4th pixel of every 4th row. All of them
#: cost 23 ms a frame on the development VM's CPU, 4 times its decode; repeats are compared
#: on every pixel.
STAT_PIXELS = 150 * 150
#: Batches of camera frames read ahead of their decode by the pixel checks, each on a thread
#: of its own (as serving reads; Lance's reads release the GIL), across cameras.
READ_AHEAD = 4

#: Task strings that say no task was recorded (compared lower-case, stripped).
PLACEHOLDER_TASKS = ("unknown", "none", "null", "n/a", "na", "nan", "task", "default",
                     "undefined", "todo", "tbd", "<unknown>", "-")


@dataclass
class AuditConfig:
    """The thresholds of :func:`audit` (each a ``robocache audit`` option of the same name).

    Ranges are per dimension, in units of the dataset's ``q99 - q01`` (``stats.json``);
    a dimension whose range is 0 (constant in the whole dataset) never jumps and is never out
    of range.

    Attributes:
        gap_periods: a gap is a step between timestamps longer than this many grid periods;
            a stream's gap is a run of steps without its sample (padded) longer than this
            many of the stream's own periods (``1 / source_rate_hz``); a camera's gap is a
            served frame older or newer than this many of its periods.
        jitter: timestamp jitter flagged above this root mean square deviation of the steps
            from the grid's period, as a fraction of the period.
        jump: a step of a numeric stream that changes some dimension by more than this
            fraction of its range is a jump (0.5: half the range in one step).
        range_margin: a value below ``q01 - m * range`` or above ``q99 + m * range`` is out
            of range.
        frozen_s: a stream that repeats its value exactly (every dimension) for longer than
            this is frozen, seconds.
        idle_s: an episode whose idle streams are all still for longer than this is idle,
            seconds.
        idle_tolerance: still: no dimension changes by more than this fraction of its range
            in a step.
        idle_keys: the streams that must be still (default: ``observation.state*`` and
            ``action*`` streams, else every numeric float stream).
        gripper_keys: gripper streams (default: numeric streams whose name holds
            ``gripper``); a stream given as ``name:DIM`` checks that dimension only.
        gripper_span: a gripper is unused in an episode whose values span less than this
            fraction of its range.
        min_steps: episodes with fewer steps are short (16: a usual action chunk).
        near_duplicate: two episodes are near-duplicates when their signatures (the
            signature streams in units of the range, sampled every ``signature_step_s`` from
            the first step) differ by at most this root mean square over the samples both
            have, and those cover at least ``min_overlap`` of the longer's (a copy cut short
            at its end matches its original).
        signature_points: samples of a signature (an episode longer than
            ``signature_points * signature_step_s`` is compared on its start).
        signature_step_s: seconds between a signature's samples.
        min_overlap: the fraction of the longer signature two must share to be compared.
        max_shift_s: a copy cut at its start by up to this many seconds is matched too: each
            signature is also compared shifted in time, in steps of a quarter of
            ``signature_step_s`` refined between them (0: no shift).
        signature_keys: the signature's streams (default: as ``idle_keys``).
        known_tasks: tasks an episode may carry (default: any non-empty task that is not a
            placeholder such as ``unknown`` or ``n/a``, :data:`PLACEHOLDER_TASKS`).
        cameras: decode every camera frame for the pixel checks (black, constant and
            duplicated frames); off, cameras get the timing checks only.
        black_level: a frame whose mean is at most this fraction of full scale is black
            (mean and standard deviation over about :data:`STAT_PIXELS` pixels, every
            pixel of frames up to 150x150, an even stride of rows and columns beyond).
        constant_std: a frame (not black) whose standard deviation is at most this fraction
            of full scale is constant (a uniform image).
        camera_fraction: a camera is flagged black (constant) in an episode where more than
            this fraction of its frames are.
    """

    gap_periods: float = 2.0
    jitter: float = 0.1
    jump: float = 0.5
    range_margin: float = 0.5
    frozen_s: float = 1.0
    idle_s: float = 3.0
    idle_tolerance: float = 1e-3
    idle_keys: Sequence[str] | None = None
    gripper_keys: Sequence[str] | None = None
    gripper_span: float = 0.05
    min_steps: int = 16
    near_duplicate: float = 0.01
    signature_points: int = 64
    signature_step_s: float = 0.5
    min_overlap: float = 0.8
    max_shift_s: float = 2.0
    signature_keys: Sequence[str] | None = None
    known_tasks: Sequence[str] | None = None
    cameras: bool = True
    black_level: float = 0.03
    constant_std: float = 0.01
    camera_fraction: float = 0.1

    def check(self) -> None:
        """Raise :class:`DataError` naming the first field out of its domain."""
        for name in ("gap_periods", "jitter", "jump", "range_margin", "frozen_s", "idle_s",
                     "max_shift_s",
                     "idle_tolerance", "gripper_span", "near_duplicate", "black_level",
                     "constant_std", "camera_fraction"):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, (int, float))
                                               and math.isfinite(value) and value >= 0):
                raise DataError(f"audit threshold `{name}` must be a finite number >= 0; got "
                                f"{value!r}.")
        if not (isinstance(self.signature_step_s, (int, float)) and self.signature_step_s > 0
                and 0 < self.min_overlap <= 1):
            raise DataError("audit settings `signature_step_s` must be > 0 seconds and "
                            f"`min_overlap` in (0, 1]; got {self.signature_step_s!r}, "
                            f"{self.min_overlap!r}.")
        for name, low in (("min_steps", 0), ("signature_points", 1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise DataError(f"audit setting `{name}` must be an integer >= {low}; got "
                                f"{value!r}.")

    def thresholds(self) -> dict[str, Any]:
        return {k: (list(v) if isinstance(v, (list, tuple)) else v)
                for k, v in dataclasses.asdict(self).items()}


@dataclass
class _Stream:
    """A numeric stream's audit plan: its columns and per-dimension bounds."""

    name: str
    column: str
    dim: int
    dtype: np.dtype
    lo: np.ndarray
    hi: np.ndarray
    jump: np.ndarray
    still: np.ndarray
    scale: np.ndarray  # 1 / range (0 where the range is 0)
    q01: np.ndarray
    moving: bool  # some dimension varies in the dataset
    period: float  # the stream's own period, seconds


@dataclass
class _Episodes:
    """Per-episode results gathered chunk after chunk."""

    index: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    metrics: list[dict[str, Any]] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)
    signatures: list[np.ndarray] = field(default_factory=list)
    valid: list[np.ndarray] = field(default_factory=list)


def _pick_device(device: str | torch.device | None) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def _select(names: Sequence[str], given: Sequence[str] | None, what: str,
            default: Callable[[str], bool]) -> list[str]:
    if given is None:
        return [n for n in names if default(n)]
    bad = [g for g in given if g.split(":")[0] not in names]
    if bad:
        raise DataError(f"`{what}` names {bad}, which are not numeric float streams of the "
                        f"cache; those are: {list(names)}.")
    return list(given)


def _plans(manifest: Mapping[str, Any], stats: Mapping[str, Any], config: AuditConfig,
           rate: float) -> dict[str, _Stream]:
    out = {}
    for name, s in manifest["streams"].items():
        if s["kind"] != "numeric" or np.dtype(s["dtype"]).kind != "f" or name not in stats:
            continue
        st = stats[name]
        q01, q99 = (np.asarray(st[k], np.float64).reshape(-1) for k in ("q01", "q99"))
        lo_all, hi_all = (np.asarray(st[k], np.float64).reshape(-1) for k in ("min", "max"))
        width = q99 - q01
        ok = width > 0
        scale = np.where(ok, 1.0 / np.where(ok, width, 1.0), 0.0)
        src = s.get("source_rate_hz") or rate
        out[name] = _Stream(
            name, s["column"], int(np.prod(s["shape"])) if s["shape"] else 1,
            np.dtype(s["dtype"]),
            np.where(ok, q01 - config.range_margin * width, -np.inf),
            np.where(ok, q99 + config.range_margin * width, np.inf),
            np.where(ok & (config.jump > 0), config.jump * width, np.inf),
            config.idle_tolerance * np.where(ok, width, 0.0), scale, q01,
            bool((hi_all > lo_all).any()), 1.0 / min(float(src), rate))
    return out


def _episode_rows(manifest: Mapping[str, Any]) -> dict[int, int]:
    return {int(e["index"]): int(e["rows"]) for e in manifest["episodes"]}


def audit(cache: str | Path, config: AuditConfig | None = None, *,
          storage_options: Mapping[str, Any] | None = None,
          device: str | torch.device | None = None,
          progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Check every episode of the cache at ``cache`` and return the report.

    Args:
        cache: a cache directory or URI (``s3://bucket/prefix``...).
        config: the thresholds (default :class:`AuditConfig`).
        storage_options: object-store settings of a URI (Lance's names).
        device: where the checks run (default: CUDA when available, else the CPU).
        progress: called with (rows checked, rows in all) after each chunk.

    Returns:
        The report (docs/curation.md): ``format``, ``cache``, ``version`` (``data.lance``'s
        Lance version read), ``rate_hz``, ``thresholds``, ``episodes_checked``,
        ``flagged`` (episodes with a flag), ``counts`` (episodes per flag), ``streams``
        (the streams each check read) and ``episodes`` (one record per episode:
        ``index``, ``rows``, ``duration_s``, ``task``, ``flags``, ``why`` (one line per
        flag), ``metrics``).

    Raises:
        FileNotFoundError: no cache there.
        DataError: a threshold out of its domain, a key the cache lacks, a cache without a
            complete version, an object store that fails.
    """
    from robocache.data import snapshot, versions
    from robocache.data.location import LANCE, Location

    config = config or AuditConfig()
    config.check()
    location = Location(cache, storage_options)
    manifest = snapshot.servable(location, location.manifest())
    stats = manifest["stats"] if "stats" in manifest else \
        json.loads(location.read_text(manifest.get("stats_path", "stats.json")))
    rate = float(manifest["rate_hz"])
    plans = _plans(manifest, stats, config, rate)
    names = list(plans)
    default_motion = [n for n in names if n.startswith(("observation.state", "action"))] \
        or names
    idle = _select(names, config.idle_keys, "idle_keys", lambda n: n in default_motion)
    signature = _select(names, config.signature_keys, "signature_keys",
                        lambda n: n in default_motion)
    grippers = _select(names, config.gripper_keys, "gripper_keys",
                       lambda n: "gripper" in n.lower())
    expected = _episode_rows(manifest)
    wanted = np.fromiter(expected, np.int64, len(expected))
    streams = manifest["streams"]
    pads = {name: f"{s['column']}_is_pad" for name, s in streams.items()
            if s["kind"] in ("numeric", "image", "video")}
    cameras = {name: s for name, s in streams.items() if s["kind"] in ("image", "video")}
    columns = list(dict.fromkeys(
        ["episode_index", "step", "timestamp"] + [plans[n].column for n in names]
        + list(pads.values()) + [f"{s['column']}/offset" for s in cameras.values()]))
    dev = _pick_device(device)
    found = _Episodes()
    total = sum(expected.values())
    done = 0
    with LANCE.call(), location.reading("data.lance"):
        table = versions.open_table(location, manifest, "data.lance")
        version = table.version
        pending: dict[str, list[np.ndarray]] = {c: [] for c in columns}
        ready: list[tuple[int, dict[str, np.ndarray]]] = []
        ready_rows = 0
        for batch in table.to_batches(columns=columns, batch_size=SCAN_ROWS):
            arrays = _numpy(batch, columns)
            listed = np.isin(arrays["episode_index"], wanted)  # a build's newer rows: not yet
            for c in columns:
                pending[c].append(arrays[c] if listed.all() else arrays[c][listed])
            merged = {c: np.concatenate(v) if len(v) > 1 else v[0] for c, v in pending.items()}
            ep = merged["episode_index"]
            ids, counts = np.unique(ep, return_counts=True)
            complete = [int(i) for i, n in zip(ids, counts, strict=True)
                        if expected.get(int(i), -1) <= n]
            if complete:
                take = np.isin(ep, complete)
                for c in columns:
                    pending[c] = [merged[c][~take]]
                rows = {c: merged[c][take] for c in columns}
                ready.append((len(complete), rows))
                ready_rows += int(take.sum())
            else:
                pending = {c: [merged[c]] for c in columns}
            if ready_rows >= CHUNK_ROWS:
                done += _check_chunk(ready, plans, pads, cameras, idle, signature, grippers,
                                     config, rate, expected, dev, found)
                ready, ready_rows = [], 0
                if progress:
                    progress(done, total)
        left = {c: np.concatenate(v) if len(v) > 1 else v[0] for c, v in pending.items()}
        if len(left["episode_index"]):
            ready.append((0, left))  # episodes whose rows differ from the manifest's count
        done += _check_chunk(ready, plans, pads, cameras, idle, signature, grippers, config,
                             rate, expected, dev, found)
        if progress:
            progress(done, total)
        pixels = _pixels(location, manifest, cameras, expected, config, dev) \
            if config.cameras else {}
    return _report(location, manifest, version, config, plans, idle, signature, grippers,
                   found, dev, pixels)


def audit_source(source: str | Path, config: AuditConfig | None = None, *,
                 scratch: str | Path | None = None, device: str | torch.device | None = None,
                 options: Mapping[str, Any] | None = None,
                 progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Audit a source dataset: ingested at its own rate into a temporary cache (in
    ``scratch``, default the system's temporary folder; removed afterwards, whatever
    happens), audited as a cache. The source is only read. Episodes the ingest quarantines
    (a malformed episode, NaN values, timestamps off the grid...) are listed with the flag
    ``quarantined`` and the ingest's reason.

    Args:
        source: a dataset path (any format ``robocache ingest`` reads).
        options: the reader's options (``fps``, ``split``..., as ``robocache ingest``).

    Returns:
        The report of :func:`audit`, its ``source`` naming the dataset and ``cache`` None.

    Raises:
        DataError: an unreadable source, or the errors of :func:`audit`.
    """
    import shutil
    import tempfile

    from robocache.data.cache import build
    from robocache.data.formats import open_source

    src = open_source(Path(source), **dict(options or {}))
    tmp = Path(tempfile.mkdtemp(prefix="robocache-audit-", dir=scratch))
    try:
        build(src, tmp / "cache", progress=False, log=lambda msg: None,
              device=str(_pick_device(device)))
        report = audit(tmp / "cache", config, device=device, progress=progress)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {**report, "cache": None, "source": str(source)}


def _numpy(batch, columns: Sequence[str]) -> dict[str, np.ndarray]:
    from robocache._optional import require

    pc = require("pyarrow.compute", "data", "Arrow tables")
    out = {}
    for c in columns:
        col = batch.column(c)
        if hasattr(col.type, "list_size"):
            values = pc.list_flatten(col).to_numpy(zero_copy_only=False)
            out[c] = values.reshape(len(col), col.type.list_size)
        else:
            out[c] = col.to_numpy(zero_copy_only=False)
    return out


def _check_chunk(ready, plans: dict[str, _Stream], pads: dict[str, str],
                 cameras: dict[str, Any], idle: list[str], signature: list[str],
                 grippers: list[str], config: AuditConfig, rate: float,
                 expected: dict[int, int], dev: torch.device, found: _Episodes) -> int:
    """Check the episodes whose rows are in ``ready``; append their results to ``found``;
    return the rows checked."""
    from robocache.ops.audit import longest_runs, sample_every, stream_checks, timing_checks

    if not ready:
        return 0
    cols = ready[0][1].keys()
    rows = {c: np.concatenate([r[c] for _, r in ready]) if len(ready) > 1 else ready[0][1][c]
            for c in cols}
    order = np.lexsort((rows["step"], rows["episode_index"]))  # each episode's steps in order
    rows = {c: v[order] for c, v in rows.items()}
    ids, counts = np.unique(rows["episode_index"], return_counts=True)
    offsets_np = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    offsets = torch.from_numpy(offsets_np).to(dev)
    n = int(offsets_np[-1])
    period = 1.0 / rate
    times = torch.from_numpy(np.ascontiguousarray(rows["timestamp"], np.float64)).to(dev)
    gap, jitter = timing_checks(times, offsets, period)
    per: dict[str, dict[str, np.ndarray]] = {}
    still = torch.ones(n, dtype=torch.bool, device=dev)
    sig_parts = []
    for name, p in plans.items():
        values = torch.from_numpy(np.ascontiguousarray(rows[p.column])).to(dev)
        pad = torch.from_numpy(np.ascontiguousarray(rows[pads[name]], bool)).to(dev)
        c = stream_checks(values, offsets, pad, lo=torch.from_numpy(p.lo),
                          hi=torch.from_numpy(p.hi), jump=torch.from_numpy(p.jump),
                          still=torch.from_numpy(p.still))
        per[name] = {"nonfinite": c.nonfinite.cpu().numpy(),
                     "out_of_range": c.out_of_range.cpu().numpy(),
                     "jumps": c.jumps.cpu().numpy(), "max_step": c.max_step.cpu().numpy(),
                     "frozen_s": c.frozen.cpu().numpy() * period,
                     "gap_s": c.pad_run.cpu().numpy() * period,
                     "span": (c.span.cpu().double().numpy() * p.scale)}
        if name in idle:
            still &= c.still
        if name in signature:
            normed = (values.to(torch.float32) - torch.from_numpy(p.q01).to(dev, torch.float32)
                      ) * torch.from_numpy(p.scale).to(dev, torch.float32)
            # every quarter step: the shifted comparisons take every fourth from a phase
            sig, valid = sample_every(normed, offsets,
                                      config.signature_step_s * rate / SHIFT_PHASES,
                                      config.signature_points * SHIFT_PHASES)
            sig_parts.append(torch.nan_to_num(sig, nan=0.0, posinf=0.0, neginf=0.0))
    idle_steps = longest_runs(still, offsets).cpu().numpy() if idle else np.zeros(len(ids))
    sig = torch.cat(sig_parts, 2).cpu().numpy() if sig_parts else None
    valid = valid.cpu().numpy() if sig_parts else None
    camera = {}
    for name, s in cameras.items():
        off = rows[f"{s['column']}/offset"].astype(np.float64)
        pad = rows[pads[name]].astype(bool)
        cam_period = 1.0 / float(s.get("source_rate_hz") or rate)
        stale = np.where(pad, 0.0, np.abs(np.nan_to_num(off, nan=np.inf))) / cam_period
        worst = np.zeros(len(ids))
        np.maximum.at(worst, np.repeat(np.arange(len(ids)), counts), stale)
        runs = longest_runs(torch.from_numpy(pad), torch.from_numpy(offsets_np)).numpy()
        camera[name] = {"offset_periods": worst, "gap_s": runs * period}
    gap, jitter = gap.cpu().numpy(), jitter.cpu().numpy()
    value_cols = [plans[nm].column for nm in plans]
    for e, index in enumerate(ids.tolist()):
        a, b = offsets_np[e], offsets_np[e + 1]
        m: dict[str, Any] = {"timestamp_gap": float(gap[e]), "timestamp_jitter": float(jitter[e]),
                             "idle_s": float(idle_steps[e] * period),
                             "steps_expected": expected.get(index)}
        m["streams"] = {name: {k: (v[e].tolist() if k == "span" else float(v[e])
                                   if k in ("max_step", "frozen_s", "gap_s") else int(v[e]))
                               for k, v in d.items()} for name, d in per.items()}
        m["cameras"] = {name: {k: float(v[e]) for k, v in d.items()}
                        for name, d in camera.items()}
        found.index.append(index)
        found.rows.append(int(b - a))
        found.metrics.append(m)
        h = hashlib.sha256()
        for col in value_cols:
            h.update(np.ascontiguousarray(rows[col][a:b]).tobytes())
        found.digests.append(h.hexdigest()[:32] if value_cols else "")
        if sig is not None:  # (float16: a thousandth of the range is well below a distance)
            found.signatures.append(sig[e].astype(np.float16))
            found.valid.append(valid[e])
    return n


def _near_pairs(signatures: np.ndarray, valid: np.ndarray, threshold: float,
                min_overlap: float, dev: torch.device, shifts: int = 0,
                phases: int = 1) -> list[tuple[int, int, float]]:
    """Pairs ``(i, j, distance)``, i < j, of signatures whose root mean square difference over
    the samples both have is at most ``threshold``, those covering at least ``min_overlap``
    of the longer's samples.

    ``signatures`` ``[E, P * phases, D]`` are sampled ``phases`` times per step (zero where
    not ``valid [E, P * phases]``); each is compared as sampled (every ``phases``-th sample
    from the first) and shifted by ``1..shifts`` samples (every ``phases``-th from there: the
    episode's start cut), against every other as sampled. Between neighbouring shifts the
    distance is refined at the minimum of the parabola through three (the squared distance
    of two smooth trajectories is quadratic in their offset). :data:`NEAR_BLOCK` signatures
    against all at a time, as sums of products (three matrix products and a count a shift,
    float32 on a GPU, float64 on the CPU).
    """
    e, total, d = signatures.shape
    p = total // phases
    if e < 2 or p * d == 0:
        return []
    kind = torch.float32 if dev.type == "cuda" else torch.float64
    x = torch.from_numpy(np.ascontiguousarray(signatures)).to(dev, kind)
    m = torch.from_numpy(np.ascontiguousarray(valid)).to(dev, kind)

    def taken(shift: int):  # every phases-th sample from ``shift``: [E, P, D], [E, P]
        xs, ms = x[:, shift::phases][:, :p], m[:, shift::phases][:, :p]
        if xs.shape[1] < p:
            xs = torch.nn.functional.pad(xs, (0, 0, 0, p - xs.shape[1]))
            ms = torch.nn.functional.pad(ms, (0, p - ms.shape[1]))
        return xs, ms

    base, base_m = taken(0)
    base_flat, base_sq = base.reshape(e, p * d), (base * base).sum(2)
    length = base_m.sum(1)
    limit = threshold * threshold
    out: dict[tuple[int, int], float] = {}
    for start in range(0, e, NEAR_BLOCK):
        stop = min(e, start + NEAR_BLOCK)
        best = torch.full((stop - start, e), float("inf"), dtype=kind, device=dev)
        prev = cur = None
        for shift in range(shifts + 2):
            nxt = None
            if shift <= shifts:
                q, qm = taken(shift)
                q, qm = q[start:stop], qm[start:stop]
                both = qm @ base_m.T
                dist2 = ((q * q).sum(2) @ base_m.T + qm @ base_sq.T
                         - 2 * (q.reshape(len(q), p * d) @ base_flat.T))
                dist2 = (dist2 / (both * d).clamp(min=1)).clamp(min=0)
                longer = torch.maximum(length[None, :], length[start:stop, None])
                ok = (both >= min_overlap * longer - 1e-9) & (both > 0)
                nxt = torch.where(ok, dist2, torch.full_like(dist2, float("inf")))
                best = torch.minimum(best, nxt)
            if prev is not None and cur is not None and nxt is not None:
                best = torch.minimum(best, _vertex(prev, cur, nxt))
            prev, cur = cur, nxt
        rows = torch.arange(start, stop, device=dev)
        best[rows - start, rows] = float("inf")  # an episode against itself, shifted
        i, j = torch.nonzero(best <= limit, as_tuple=True)
        for a, b, v in zip((i + start).tolist(), j.tolist(), best[i, j].sqrt().tolist(),
                           strict=True):
            key = (min(a, b), max(a, b))
            out[key] = min(out.get(key, v), v)
    return [(a, b, v) for (a, b), v in sorted(out.items())]


def _vertex(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """The minimum of the parabola through ``(-1, a), (0, b), (1, c)`` where ``b`` is the
    least of the three and the parabola opens upwards, else ``b``; never below 0."""
    curve = a - 2 * b + c
    usable = torch.isfinite(curve) & (curve > 0) & (b <= a) & (b <= c)
    vertex = b - (a - c) ** 2 / (8 * torch.where(usable, curve, torch.ones_like(curve)))
    return torch.where(usable, vertex.clamp(min=0), b)


@dataclass
class _Camera:
    """A camera's frames to check: its frame table ``rel`` and, in (episode, frame) order,
    each frame's episode, number and row address (24 bytes a frame), cut into ``batches``
    (``[a, b)`` of those)."""

    name: str
    spec: Mapping[str, Any]
    rel: str
    table: Any
    episode: np.ndarray
    frame: np.ndarray
    address: np.ndarray
    batches: list[tuple[int, int]]

    @property
    def video(self) -> bool:
        return self.spec["codec"] == "video"

    def where(self, a: int, b: int) -> Callable[[int], str]:
        """Frame ``i`` of batch ``[a, b)`` named, for a decoder's error."""
        e, f = self.episode[a:b], self.frame[a:b]

        def where(i: int) -> str:
            return f"camera {self.name!r}, episode {int(e[i])}, frame {int(f[i])}"

        return where


def _camera(location, manifest, name: str, s: Mapping[str, Any], ids: np.ndarray,
            dev: torch.device) -> _Camera | None:
    """Camera ``name``'s frames of the episodes ``ids``, or None where it has no frame table:
    its index read (an int64 episode, frame and row address a frame) and cut into as few
    batches as hold at most :data:`FRAME_BATCH` frames and :data:`FRAME_BYTES` of pixels (4
    times as many on a GPU) each, of even sizes. Frames kept as video are cut at their GOPs'
    starts (a GOP longer than a batch is a batch of its own), so that each GOP is decoded
    once."""
    from robocache.data import versions
    from robocache.data.export import _scan
    from robocache.data.location import LANCE

    rel = f"frames/{name}.lance"
    video = s["codec"] == "video"
    with LANCE.call():
        try:
            table = versions.open_table(location, manifest, rel)
        except FileNotFoundError:
            return None
        index = _scan(location, rel, table,
                      ["episode_index", "frame"] + (["gop"] if video else []))
    ep, frame = index["episode_index"], index["frame"]
    order = np.lexsort((frame, ep))
    order = order[np.isin(ep[order], ids)]
    ep, frame, address = ep[order], frame[order], index["_rowaddr"][order]
    if video:  # where a batch may start: a GOP's first frame
        gop = index["gop"][order]
        first = np.ones(len(ep), bool)
        first[1:] = (ep[1:] != ep[:-1]) | (gop[1:] != gop[:-1])
        cuts = np.r_[np.flatnonzero(first), len(ep)]
    budget = FRAME_BYTES * (4 if dev.type == "cuda" else 1)
    step = max(1, min(FRAME_BATCH, budget // (int(np.prod(s["shape"]))
                                                   * np.dtype(s["dtype"]).itemsize)))
    if len(ep):  # as few batches, of even sizes (no small last one paying a call's fixed cost)
        step = -(-len(ep) // -(-len(ep) // step))
    batches = []
    a = 0
    while a < len(ep):
        b = min(a + step, len(ep))
        if video:  # the last GOP start in reach, else the end of the GOP at ``a``
            k = int(np.searchsorted(cuts, b, side="right")) - 1
            b = int(cuts[k]) if cuts[k] > a else int(cuts[k + 1])
        batches.append((a, b))
        a = b
    return _Camera(name, s, rel, table, ep, frame, address, batches)


def _read(location, cam: _Camera, a: int, b: int):
    """Batch ``[a, b)`` of ``cam``'s frames read by row address (on a reading thread: Lance's
    reads release the GIL): a JPEG/PNG camera's as :class:`EncodedFrames`, a video's as its
    table rows (made packets in order on the decoding thread: a GOP's decoder settings come
    from its episode's first row, which an earlier batch may hold)."""
    from robocache.data.export import _take
    from robocache.data.frames import EncodedFrames
    from robocache.data.location import LANCE
    from robocache.data.video_store import PACKET_COLUMNS

    columns = ["episode_index", "frame"] + (PACKET_COLUMNS if cam.video else ["encoded"])
    with LANCE.call():
        rows = _take(location, cam.rel, cam.table, cam.address[a:b], columns)
    if cam.video:
        return rows
    s = cam.spec
    return EncodedFrames.from_table(rows, tuple(s["shape"]), s["dtype"], s["codec"],
                                    cam.where(a, b))


def _decoded(location, manifest, cameras: Mapping[str, Any], ids: np.ndarray,
             dev: torch.device, opened: list[str]):
    """Every camera's frames of the episodes ``ids`` decoded as serving decodes them
    (:func:`robocache.data.cameras.decode_all`), camera after camera, each in (episode,
    frame) order whatever its table's row order: ``(camera, positions in ids, frame numbers,
    frames [N, C, H, W])`` a batch at a time (:func:`_camera`'s batches). ``opened`` gets the
    name of each camera whose frame table exists, in order.

    As serving does, :data:`READ_AHEAD` batches are read ahead of their decode, each on a
    thread of its own, across the cameras' boundaries (the next camera's table is opened and
    indexed on those threads while this one's batches are read); the decodes run one call at
    a time, in order, on the calling thread (nvJPEG decodes one call at a time; a video's GOP
    needs its episode's settings, which an earlier batch may hold)."""
    from collections import deque
    from concurrent.futures import ThreadPoolExecutor

    from robocache.data.cameras import decode_all
    from robocache.data.video_store import episode_packets

    names = [n for n, s in cameras.items() if s.get("codec") is not None]
    with ThreadPoolExecutor(READ_AHEAD, "robocache-audit-read") as pool:

        def plan(k: int):
            return pool.submit(_camera, location, manifest, names[k], cameras[names[k]], ids,
                               dev) if k < len(names) else None

        def batches():  # (camera, a, b) in order, each camera planned one camera ahead
            coming = plan(0)
            for k in range(len(names)):
                cam, coming = coming.result(), plan(k + 1)
                if cam is not None:
                    opened.append(cam.name)
                    for a, b in cam.batches:
                        yield cam, a, b

        jobs = batches()
        reads: deque = deque()

        def submit() -> None:
            job = next(jobs, None)
            if job is not None:
                reads.append((job, pool.submit(_read, location, *job)))

        try:
            for _ in range(READ_AHEAD):
                submit()
            configs: dict[int, tuple[str, bytes]] = {}  # a video's decoder settings by episode
            last = None
            while reads:
                (cam, a, b), read = reads.popleft()
                submit()
                frames = read.result()
                if cam.video:
                    if cam is not last:
                        configs = {}
                    frames = episode_packets(frames, np.arange(b - a), tuple(cam.spec["shape"]),
                                             configs)
                    frames.where = cam.where(a, b)
                last = cam
                yield (cam.name, np.searchsorted(ids, cam.episode[a:b]), cam.frame[a:b],
                       decode_all([(frames, torch.arange(b - a))], dev)[0])
        finally:  # left early (an error): the reads not started are dropped
            for _, read in reads:
                read.cancel()


def _ahead(items: Iterator[Any]) -> Iterator[Any]:
    """``items``, each next one produced on a thread while the caller uses this one (the
    next batch of frames decoded while this one is checked)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        coming = pool.submit(next, items, None)
        while (item := coming.result()) is not None:
            coming = pool.submit(next, items, None)
            yield item


def _pixels(location, manifest, cameras: Mapping[str, Any], expected: Mapping[int, int],
            config: AuditConfig, dev: torch.device) -> dict[str, dict[str, np.ndarray]]:
    """Per camera: each episode's frames, black frames, constant frames (by the decoded
    pixels: mean and standard deviation in units of full scale) and longest run of frames
    identical to the one before, from a scan of its frame table decoded as serving decodes it
    (:func:`_decoded`: nvJPEG on a GPU; video GOP by GOP on CPU threads). Arrays are indexed
    like ``sorted(expected)``.

    Three stages overlap, as serving's: :data:`READ_AHEAD` batches read (on as many threads),
    one decoded (on a thread) and one checked (here), camera after camera in (episode, frame)
    order: the results are those of one batch after the other. Memory: the encoded frames
    of ``READ_AHEAD + 1`` batches, the pixels of 2 (each at most :data:`FRAME_BYTES`, 4 times
    as many on a GPU) and the indexes (24 bytes a frame) of the cameras of those batches and
    of the next camera (two or three cameras' of a cache with more than ``READ_AHEAD + 2``
    batches a camera)."""
    ids = np.array(sorted(expected), np.int64)

    def zeros() -> dict[str, np.ndarray]:
        return {k: np.zeros(len(ids), np.int64) for k in ("frames", "black", "constant",
                                                           "repeated")}

    found: dict[str, dict[str, np.ndarray]] = {}
    opened: list[str] = []
    current = None
    for name, pos, frame, px in _ahead(_decoded(location, manifest, cameras, ids, dev,
                                                opened)):
        if name != current:  # the next camera's first batch
            current = name
            kind = np.dtype(cameras[name]["dtype"])
            full = float(np.iinfo(kind).max) if kind.kind in "ui" else 1.0
            res = found[name] = zeros()
            carry = None  # (episode position, frame number, pixels, run) of the last frame
        n = len(pos)
        # every k-th pixel of every k-th row (about STAT_PIXELS of them): a strided view
        k = max(1, math.ceil(math.sqrt(px.shape[-2] * px.shape[-1] / STAT_PIXELS)))
        sample = px[..., ::k, ::k].reshape(n, -1)
        values = sample.to(torch.float32)
        # mean and variance from the sums (a third of var_mean's time on the CPU)
        mean = values.mean(1)
        var = ((values * values).mean(1) - mean * mean).clamp(min=0)
        del values
        black = mean <= config.black_level * full
        constant = (var <= (config.constant_std * full) ** 2) & ~black
        same = np.zeros(n, bool)
        if n > 1:  # frames whose samples equal the one before's, compared whole
            near = (sample[1:] == sample[:-1]).all(1).cpu().numpy()
            for i in np.flatnonzero(near).tolist():
                same[i + 1] = torch.equal(px[i + 1], px[i])
        follows = np.r_[False, (pos[1:] == pos[:-1]) & (frame[1:] == frame[:-1] + 1)]
        if carry is not None and carry[0] == pos[0] and carry[1] + 1 == frame[0]:
            follows[0] = True
            same[0] = bool(torch.equal(carry[2], px[0]))
        rep = same & follows
        # each frame's run of repeats so far; the first run continues the last batch's
        at = np.arange(n)
        last_new = np.maximum.accumulate(np.where(~rep, at, -1))
        runs = at - last_new
        if carry is not None:
            runs = np.where(last_new < 0, runs + carry[3], runs)
        np.add.at(res["frames"], pos, 1)
        np.add.at(res["black"], pos, black.cpu().numpy().astype(np.int64))
        np.add.at(res["constant"], pos, constant.cpu().numpy().astype(np.int64))
        np.maximum.at(res["repeated"], pos, runs)
        carry = (int(pos[-1]), int(frame[-1]), px[-1].clone(), int(runs[-1]))
    return {name: found.get(name) or zeros() for name in opened}


def _report(location, manifest, version: int, config: AuditConfig, plans, idle, signature,
            grippers, found: _Episodes, dev: torch.device,
            pixels: Mapping[str, Mapping[str, np.ndarray]] | None = None) -> dict[str, Any]:
    rate = float(manifest["rate_hz"])
    meta = {int(e["index"]): e for e in manifest["episodes"]}
    known = None if config.known_tasks is None else set(config.known_tasks)
    placeholders = set(PLACEHOLDER_TASKS)
    # duplicates: the same digest as an earlier episode (by index)
    order = sorted(range(len(found.index)), key=lambda k: found.index[k])
    first_of: dict[str, int] = {}
    duplicate_of: dict[int, int] = {}
    for k in order:
        d = found.digests[k]
        if d and d in first_of:
            duplicate_of[k] = found.index[first_of[d]]
        else:
            first_of.setdefault(d, k)
    near: dict[int, list[tuple[int, float]]] = {}
    if found.signatures and config.near_duplicate > 0:
        step = config.signature_step_s / SHIFT_PHASES
        for a, b, dist in _near_pairs(np.stack(found.signatures), np.stack(found.valid),
                                      config.near_duplicate, config.min_overlap, dev,
                                      shifts=int(round(config.max_shift_s / step)),
                                      phases=SHIFT_PHASES):
            if found.digests[a] == found.digests[b]:
                continue  # exact copies are duplicates
            near.setdefault(a, []).append((found.index[b], dist))
            near.setdefault(b, []).append((found.index[a], dist))
    pixels = pixels or {}
    place = {e: i for i, e in enumerate(sorted(meta))}  # the pixel arrays' order
    records = []
    for k in order:
        index, rows, m = found.index[k], found.rows[k], found.metrics[k]
        for name, res in pixels.items():
            cam_period = 1.0 / float(manifest["streams"][name].get("source_rate_hz") or rate)
            i = place[index]
            m["cameras"].setdefault(name, {}).update(
                {"frames": int(res["frames"][i]), "black": int(res["black"][i]),
                 "constant": int(res["constant"][i]),
                 "repeated_s": float(res["repeated"][i] * cam_period)})
        task = meta.get(index, {}).get("task")
        why: dict[str, str] = {}
        if rows < config.min_steps:
            why["short"] = f"{rows} steps, fewer than {config.min_steps}"
        if m["timestamp_gap"] > config.gap_periods:
            why["timestamp_gap"] = (f"a step of {m['timestamp_gap']:.3g} periods between "
                                    f"timestamps (more than {config.gap_periods:g})")
        if m["timestamp_jitter"] > config.jitter:
            why["timestamp_jitter"] = (f"timestamp steps off the period by "
                                       f"{m['timestamp_jitter']:.3g} of it (rms)")
        gaps, nonfinite, ranges, jumps, frozen, unused = [], [], [], [], [], []
        for name, s in m["streams"].items():
            p = plans[name]
            if s["gap_s"] > config.gap_periods * p.period:
                gaps.append(f"{name} without samples for {s['gap_s']:.3g} s")
            if s["nonfinite"]:
                nonfinite.append(f"{name}: {s['nonfinite']} NaN/inf values")
            if s["out_of_range"]:
                ranges.append(f"{name}: {s['out_of_range']} steps beyond q01/q99 "
                              f"+- {config.range_margin:g} range")
            if s["jumps"]:
                jumps.append(f"{name}: {s['jumps']} steps, the largest {s['max_step']:.3g}x "
                             "the bound")
            if p.moving and s["frozen_s"] > config.frozen_s:
                frozen.append(f"{name} repeats one value for {s['frozen_s']:.3g} s")
        dark, flat, repeated = [], [], []
        for name, c in m["cameras"].items():
            cam_period = 1.0 / float(manifest["streams"][name].get("source_rate_hz") or rate)
            if c["offset_periods"] > config.gap_periods:
                gaps.append(f"{name} serves a frame {c['offset_periods']:.3g} periods away")
            elif c["gap_s"] > config.gap_periods * max(cam_period, 1.0 / rate):
                gaps.append(f"{name} without frames for {c['gap_s']:.3g} s")
            frames = max(c.get("frames", 0), 1)
            if c.get("black", 0) > config.camera_fraction * frames:
                dark.append(f"{name}: {c['black']} of {c['frames']} frames black")
            if c.get("constant", 0) > config.camera_fraction * frames:
                flat.append(f"{name}: {c['constant']} of {c['frames']} frames uniform")
            if c.get("repeated_s", 0.0) > config.frozen_s:
                repeated.append(f"{name} repeats one frame for {c['repeated_s']:.3g} s")
        for g in grippers:
            name, _, dim = g.partition(":")
            span = m["streams"][name]["span"]
            spans = [span[int(dim)]] if dim else span
            if max(spans, default=0.0) < config.gripper_span:
                unused.append(f"{g} spans {max(spans, default=0.0):.3g} of its range")
        for flag, items in (("stream_gap", gaps), ("nonfinite", nonfinite),
                            ("out_of_range", ranges), ("jump", jumps), ("frozen", frozen),
                            ("gripper_unused", unused), ("camera_black", dark),
                            ("camera_constant", flat), ("camera_duplicate", repeated)):
            if items:
                why[flag] = "; ".join(items)
        if idle and m["idle_s"] > config.idle_s:
            why["idle"] = f"{', '.join(idle)} still for {m['idle_s']:.3g} s"
        if k in duplicate_of:
            why["duplicate"] = f"the same values as episode {duplicate_of[k]}"
        if k in near:
            other, dist = min(near[k], key=lambda t: t[1])
            why["near_duplicate"] = (f"within {dist:.3g} (rms, range units) of episode {other}"
                                     + (f" and {len(near[k]) - 1} more" if len(near[k]) > 1
                                        else ""))
        text = (task or "").strip()
        if not text:
            why["task_empty"] = "no task"
        elif (known is not None and text not in known) or (known is None
                                                            and text.lower() in placeholders):
            why["task_unknown"] = f"task {text!r} is " + (
                "not a known task" if known is not None else "a placeholder")
        flags = [f for f in FLAGS if f in why]
        metrics = {"timestamp_gap": m["timestamp_gap"], "timestamp_jitter": m["timestamp_jitter"],
                   "idle_s": m["idle_s"],
                   "max_step": max((s["max_step"] for s in m["streams"].values()), default=0.0),
                   "frozen_s": max((s["frozen_s"] for s in m["streams"].values()), default=0.0),
                   "nonfinite": sum(s["nonfinite"] for s in m["streams"].values()),
                   "out_of_range": sum(s["out_of_range"] for s in m["streams"].values()),
                   "digest": found.digests[k]}
        if k in near:
            metrics["near"] = sorted(i for i, _ in near[k])
        record = {"index": index, "rows": rows, "duration_s": rows / rate, "task": task,
                  "flags": flags, "why": why, "metrics": metrics}
        if flags:  # the per-stream numbers of flagged episodes, for a closer look
            record["streams"] = m["streams"]
            if m["cameras"]:
                record["cameras"] = m["cameras"]
        records.append(record)
    for q in manifest.get("quarantined", []):  # episodes the build could not cache
        records.append({"index": int(q["index"]), "rows": 0, "duration_s": 0.0, "task": None,
                        "flags": ["quarantined"], "why": {"quarantined": str(q["reason"])},
                        "metrics": {}})
    counts = {f: sum(f in r["flags"] for r in records) for f in FLAGS}
    return {"format": REPORT_FORMAT, "cache": location.uri, "created": manifest.get("created"),
            "cache_version": int(manifest.get("version", 1)), "version": version,
            "rate_hz": rate, "device": str(dev),
            "thresholds": config.thresholds(),
            "streams": {"checked": list(plans), "idle": idle, "signature": signature,
                        "grippers": grippers},
            "episodes_checked": len(found.index),
            "flagged": sum(bool(r["flags"]) for r in records), "counts": counts,
            "episodes": records}


def score(record: Mapping[str, Any]) -> float:
    """How bad an episode of a report looks (what ``--plot`` and the table sort by): its
    flags first, then how far its worst measure is beyond its bound."""
    m = record["metrics"]
    return len(record["flags"]) * 1000.0 + min(999.0, sum(
        m.get(k, 0.0) for k in ("max_step", "nonfinite", "out_of_range", "idle_s")))


def read_report(report: str | Path | Mapping[str, Any]) -> dict[str, Any]:
    """An audit report: given as a dict, or read from a JSON file.

    Raises:
        DataError: not a JSON file of :data:`REPORT_FORMAT`.
    """
    if isinstance(report, Mapping):
        data = dict(report)
    else:
        try:
            data = json.loads(Path(report).read_text())
        except (OSError, ValueError) as e:
            raise DataError(f"{report}: not a readable audit report ({e}); write one with "
                            "`robocache audit CACHE --json > report.json`.") from e
    if not isinstance(data, dict) or data.get("format") != REPORT_FORMAT:
        raise DataError(f"{report if not isinstance(report, Mapping) else 'the report'}: not "
                        f"an audit report (format {REPORT_FORMAT!r}); write one with "
                        "`robocache audit CACHE --json > report.json`.")
    return data


def flagged(report: str | Path | Mapping[str, Any],
            flags: Iterable[str] | None = None) -> set[int]:
    """The episodes of an audit report that carry any of ``flags`` (default: any flag).

    Raises:
        DataError: not a report, or a flag that is not one of :data:`FLAGS`.
    """
    data = read_report(report)
    wanted = None if flags is None else set(flags)
    if wanted is not None and wanted - set(FLAGS):
        raise DataError(f"unknown audit flags {sorted(wanted - set(FLAGS))}; the flags are "
                        f"{list(FLAGS)}.")
    return {int(r["index"]) for r in data["episodes"]
            if r["flags"] and (wanted is None or wanted & set(r["flags"]))}
