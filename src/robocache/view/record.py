"""Episodes as a Rerun recording: every stream on one ``time`` timeline (seconds).

Entities (``<s>``: a stream name; ``i``: an episode index)::

    info                               the dataset: path, format, streams (static text)
    quarantined                        quarantined episodes with their reasons (static text)
    episode_i/info                     the episode's task(s), source file, problem (static)
    episode_i/native/<s>               numeric: one scalar series per dimension, named, drawn
                                       as points at the source's own sample times;
                                       camera: images (depth: depth images); event: text
    episode_i/native/task              the task, logged when it changes
    episode_i/aligned/<s>              numeric: the grid values as lines (also on the ``step``
                                       timeline); event: the text when it changes
    episode_i/aligned/<s>/is_pad       the ``_is_pad`` mask (1 = padded step)
    episode_i/aligned/<s>/age          events: seconds since the event shown (hold age)
    episode_i/aligned/<s>/frame        cameras: the source frame shown at each step (-1: none)
    episode_i/aligned/<s>/offset       cameras: that frame's time minus the step's (seconds)
    episode_i/aligned/task             the task per step, logged when it changes

Camera frames are decoded and sent ``chunk`` frames at a time, so a long episode never sits
decoded in memory. The default blueprint puts each stream's native points and aligned lines
in one plot, so an offset between them is seen at once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from robocache._optional import require
from robocache.view.episodes import CHUNK_FRAMES, EpisodeView, Opened

TIMELINE = "time"
STEP_TIMELINE = "step"
# Rerun's sinks encode and write on their own thread; when it falls behind (a busy machine)
# its queue of frames grows: one run of `robocache bench view` peaked at 757 MB on a 2-minute
# video instead of ~500 MB. Waiting for it every few chunks bounds what is queued.
FLUSH_EVERY_CHUNKS = 8


def _rr():
    return require("rerun", "view", "Viewing episodes in Rerun", "rerun-sdk")


def entity(*parts: str) -> str:
    """An entity path from parts, each escaped (stream names may hold ``/`` or spaces)."""
    rr = _rr()
    return "/".join(rr.escape_entity_path_part(str(p)) for p in parts)


def dim_names(opened: Opened, name: str, dim: int) -> list[str]:
    """The names of a numeric stream's dimensions: the source's (LeRobot ``names``) when it
    declares ``dim`` of them, else ``[0]``, ``[1]``..."""
    names = opened.names.get(name)
    return [str(n) for n in names] if names is not None and len(names) == dim else \
        [f"[{k}]" for k in range(dim)]


def _time(t: np.ndarray):
    return _rr().TimeColumn(TIMELINE, duration=np.asarray(t, np.float64))


def _scalars(rec, path: str, t: np.ndarray, values: np.ndarray, *, steps=None) -> None:
    rr = _rr()
    finite = np.isfinite(t)
    indexes = [_time(t[finite])]
    if steps is not None:
        indexes.append(rr.TimeColumn(STEP_TIMELINE, sequence=np.asarray(steps)[finite]))
    rec.send_columns(path, indexes=indexes,
                     columns=rr.Scalars.columns(scalars=np.asarray(values, np.float64)[finite]))


def _texts(rec, path: str, t: np.ndarray, texts) -> int:
    """Send ``texts`` at ``t`` (the finite times); returns the number sent."""
    rr = _rr()
    finite = np.isfinite(np.asarray(t, np.float64))
    if finite.any():
        rec.send_columns(path, indexes=[_time(np.asarray(t)[finite])],
                         columns=rr.TextLog.columns(text=[str(x) for x, f in zip(
                             texts, finite, strict=True) if f]))
    return int(finite.sum())


def _changes(t: np.ndarray, values) -> tuple[np.ndarray, list]:
    """The instants where ``values`` changes (the first included), and the new values."""
    values = list(values)
    keep = [k for k in range(len(values)) if k == 0 or values[k] != values[k - 1]]
    return np.asarray(t)[keep], [values[k] for k in keep]


def _images(rec, path: str, view: EpisodeView, name: str, chunk: int) -> int:
    """Send camera ``name``'s frames in chunks: as stored when they are JPEG/PNG (RGB),
    decoded otherwise (video, raw arrays, depth); returns the number sent."""
    rr = _rr()
    sent = 0
    media = view.media_type(name)
    if media is not None:  # JPEG/PNG as stored: the viewer decodes them
        for k, (t, blobs) in enumerate(view.encoded(name, chunk), start=1):
            rec.send_columns(path, indexes=[_time(t)], columns=rr.EncodedImage.columns(
                blob=blobs, media_type=[media] * len(blobs)))
            sent += len(blobs)
            if k % FLUSH_EVERY_CHUNKS == 0:
                rec.flush()
        return sent
    for k, (t, frames) in enumerate(view.frames(name, chunk), start=1):
        n, h, w = frames.shape[:3]
        depth = frames.dtype == np.uint16
        fmt = rr.components.ImageFormat(width=w, height=h, channel_datatype="U16" if depth
                                        else "U8", **({} if depth else {"color_model": "RGB"}))
        archetype = rr.DepthImage if depth else rr.Image
        rec.send_columns(path, indexes=[_time(t)], columns=archetype.columns(
            buffer=np.ascontiguousarray(frames).reshape(n, -1).view(np.uint8),
            format=[fmt] * n))
        sent += n
        if k % FLUSH_EVERY_CHUNKS == 0:
            rec.flush()
    return sent


def _markdown_info(opened: Opened) -> str:
    lines = [f"# {opened.path}", "", f"{opened.kind} of format `{opened.format}`; source: "
             f"`{opened.source}`", "", "| stream | kind | dtype | shape | rate (Hz) |",
             "|---|---|---|---|---|"]
    for name, s in opened.specs.items():
        lines.append(f"| `{name}` | {s.kind} | {s.dtype} | {tuple(s.shape)} | "
                     f"{'—' if s.rate_hz is None else f'{s.rate_hz:g}'} |")
    lines += [""] + [f"- {n}" for n in opened.notices]
    return "\n".join(lines)


def _markdown_quarantined(opened: Opened) -> str:
    if not opened.quarantined:
        return "No episode quarantined."
    return "\n".join(["# Quarantined episodes", ""] + [
        f"- episode {q['index']}: {q['reason']}" for q in opened.quarantined])


def log_episode(rec, opened: Opened, view: EpisodeView, chunk: int = CHUNK_FRAMES
                ) -> dict[str, int]:
    """Log one episode (entities in the module docstring); returns entity -> samples sent."""
    rr = _rr()
    root = f"episode_{view.index}"
    sent: dict[str, int] = {}
    info = [f"# episode {view.index}", "", f"source file: `{view.where}`", "",
            "task: " + ("; ".join(view.tasks) or "—")]
    if view.problem:
        info += ["", f"**quarantined**: {view.problem}"]
    if view.rate_hz:
        info += ["", f"aligned at {view.rate_hz:g} Hz"]
    rec.log(entity(root, "info"), rr.TextDocument("\n".join(info),
                                                  media_type=rr.MediaType.MARKDOWN), static=True)
    ep = view.native
    if ep is not None:
        for name, spec in view.specs.items():
            s = ep.streams.get(name)
            if s is None or len(s) == 0:
                continue
            path = entity(root, "native", name)
            if spec.kind == "numeric":
                values = np.asarray(s.data, np.float64).reshape(len(s), -1)
                rec.log(path, rr.SeriesPoints(names=dim_names(opened, name, values.shape[1]),
                                              marker_sizes=[2.0] * values.shape[1]),
                        static=True)
                _scalars(rec, path, s.times, values)
                sent[path] = len(s)
            elif spec.kind == "event":
                sent[path] = _texts(rec, path, s.times, s.data)
        frame_tasks = ep.meta.get("frame_tasks")
        if frame_tasks is not None and len(frame_tasks[0]):
            path = entity(root, "native", "task")
            sent[path] = _texts(rec, path, *_changes(*frame_tasks))
    for name in view.cameras:
        path = entity(root, "native", name)
        sent[path] = _images(rec, path, view, name, chunk)
    if view.aligned is not None:
        sent.update(_log_aligned(rec, opened, view, root))
    return sent


def _log_aligned(rec, opened: Opened, view: EpisodeView, root: str) -> dict[str, int]:
    from robocache.data.cache import column_name

    rr = _rr()
    cols, sent = view.aligned, {}
    t, steps = cols["timestamp"], cols["step"]

    def series(path: str, values, names: list[str]) -> None:
        rec.log(path, rr.SeriesLines(names=names), static=True)
        _scalars(rec, path, t, values, steps=steps)
        sent[path] = len(t)

    for name, spec in view.specs.items():
        col, path = column_name(name), entity(root, "aligned", name)
        if spec.kind == "numeric":
            values = np.asarray(cols[col], np.float64).reshape(len(t), -1)
            series(path, values, dim_names(opened, name, values.shape[1]))
        elif spec.kind == "event":
            shown = [None if v is None else str(v) for v in cols[col]]
            at, texts = _changes(t, shown)
            keep = [k for k, x in enumerate(texts) if x is not None]
            sent[path] = _texts(rec, path, at[keep], [texts[k] for k in keep])
            series(entity(root, "aligned", name, "age"), cols[f"{col}/age"], ["age (s)"])
        else:
            series(entity(root, "aligned", name, "frame"), cols[f"{col}/frame"],
                   ["source frame"])
            series(entity(root, "aligned", name, "offset"), cols[f"{col}/offset"],
                   ["frame time - step time (s)"])
        series(entity(root, "aligned", name, "is_pad"), cols[f"{col}_is_pad"], ["_is_pad"])
    path = entity(root, "aligned", "task")
    sent[path] = _texts(rec, path, *_changes(t, [str(x) for x in cols["task"]]))
    return sent


def blueprint(opened: Opened, view: EpisodeView):
    """The default layout for one episode: per numeric stream one plot of its native points
    and aligned lines together, its ``_is_pad`` beneath; cameras; events; the info texts."""
    rrb = require("rerun.blueprint", "view", "Viewing episodes in Rerun", "rerun-sdk")
    root = f"episode_{view.index}"
    plots, cameras, texts = [], [], []
    for name, spec in view.specs.items():
        native, aligned = entity(root, "native", name), entity(root, "aligned", name)
        if spec.kind == "numeric":
            plots.append(rrb.TimeSeriesView(name=name, contents=[native, aligned]))
            if view.aligned is not None:
                plots.append(rrb.TimeSeriesView(name=f"{name} _is_pad",
                                                contents=[f"{aligned}/is_pad"]))
        elif spec.kind == "event":
            texts.append(rrb.TextLogView(name=name, contents=[native, aligned]))
            if view.aligned is not None:
                plots.append(rrb.TimeSeriesView(name=f"{name} hold age",
                                                contents=[f"{aligned}/age", f"{aligned}/is_pad"]))
        else:
            cameras.append(rrb.Spatial2DView(name=name, origin=native))
            if view.aligned is not None:
                plots.append(rrb.TimeSeriesView(name=f"{name} frame offset",
                                                contents=[f"{aligned}/offset",
                                                          f"{aligned}/is_pad"]))
    side = [*cameras, *texts,
            rrb.TextLogView(name="task", contents=[entity(root, "native", "task"),
                                                   entity(root, "aligned", "task")]),
            rrb.TextDocumentView(name="episode", origin=entity(root, "info")),
            rrb.TextDocumentView(name="quarantined", origin="quarantined")]
    return rrb.Blueprint(rrb.Horizontal(rrb.Grid(*plots), rrb.Vertical(*side),
                                        column_shares=[3, 2]))


def record(rec, opened: Opened, indices: list[int], chunk: int = CHUNK_FRAMES,
           progress: Callable[[str], None] | None = None) -> dict[int, dict[str, int]]:
    """Log the dataset's info, its quarantined episodes and episodes ``indices`` to ``rec``
    (a ``rerun.RecordingStream`` with its sinks set); returns per episode the samples sent
    per entity."""
    rr = _rr()
    rec.log("info", rr.TextDocument(_markdown_info(opened), media_type=rr.MediaType.MARKDOWN),
            static=True)
    out: dict[int, dict[str, Any]] = {}
    for k, index in enumerate(indices):
        view = opened.episode(index)
        if k == 0:
            rec.send_blueprint(blueprint(opened, view))
        out[index] = log_episode(rec, opened, view, chunk)
        if progress is not None:
            progress(f"episode {index}")
    # after the episodes: a source's problems are known once its episodes are read
    rec.log("quarantined", rr.TextDocument(_markdown_quarantined(opened),
                                           media_type=rr.MediaType.MARKDOWN), static=True)
    return out
