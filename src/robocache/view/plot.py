"""One episode as a static picture (``robocache inspect --plot FILE.png``), for people without
Rerun: every stream on one time axis, before and after alignment.

Layout: the whole episode on the left, a zoom on the right (``window``; default 24 grid steps,
or 0.5 s, from the middle of the episode) where single samples can be told apart. Top row: the
sample times of every stream (one lane each, its measured rate beside it) above the grid's
instants, events labelled; a camera lane's ticks are its frame times. Then one row per numeric
stream: the source's samples as markers, the aligned values as lines in the same colour (steps
for ``previous``/``nearest``), ``_is_pad`` steps shaded; one row per camera: the aligned frame's
offset from its step (ms) with the frame times as ticks. Event times run as dashed lines through
every row.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from robocache._optional import require
from robocache.view.episodes import EpisodeView, Opened

MAX_DIMS = 6
ZOOM_STEPS = 24
PAD_COLOR = "#b0b0b0"
EVENT_COLOR = "#7a3db8"


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """``(first, last)`` index of each run of ``True`` in ``mask``."""
    m = np.concatenate([[False], np.asarray(mask, bool), [False]])
    edges = np.flatnonzero(np.diff(m.astype(np.int8)))
    return [(int(a), int(b) - 1) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def _rate(t: np.ndarray, kind: str) -> str:
    """A lane's label: the measured rate (median interval), or the count of events."""
    if kind == "event":
        return f"{len(t)} event{'s' if len(t) != 1 else ''}"
    d = np.diff(t)
    d = d[d > 0]
    return f"{1.0 / float(np.median(d)):.1f} Hz" if d.size else "sparse"


def _shade_pad(ax, t: np.ndarray, pad: np.ndarray, rate: float) -> None:
    for a, b in _runs(pad):
        ax.axvspan(t[a] - 0.5 / rate, t[b] + 0.5 / rate, color=PAD_COLOR, alpha=0.35, lw=0,
                   zorder=0)


def _band(k: int, window: tuple[float, float], tn, vn, tg, vg):
    """Map dimension ``k``'s values onto band ``[1.2 k, 1.2 k + 1]`` by their range inside
    ``window`` (native ``tn, vn`` and aligned ``tg, vg``, either may be ``None``)."""
    seen = [v[(t >= window[0]) & (t <= window[1])] for t, v in ((tn, vn), (tg, vg))
            if t is not None]
    seen = np.concatenate(seen) if seen else np.zeros(0)
    seen = seen[np.isfinite(seen)]
    lo, hi = (float(seen.min()), float(seen.max())) if seen.size else (0.0, 1.0)
    width = hi - lo if hi > lo else 1.0
    return lambda v: (np.asarray(v, np.float64) - lo) / width + 1.2 * k


def _default_window(t0: float, t1: float, view: EpisodeView,
                    events: list[float]) -> tuple[float, float]:
    """The zoom: 24 grid steps (0.5 s without a grid) around the first event away from the
    ends (events mark contacts and gripper changes), else from the episode's middle."""
    span = ZOOM_STEPS / view.rate_hz if view.rate_hz else 0.5
    if t1 - t0 <= span:
        return t0, t1
    inside = [t for t in sorted(events) if t0 + span / 2 <= t <= t1 - span / 2]
    start = inside[0] - span / 2 if inside else 0.5 * (t0 + t1)
    return start, min(t1, start + span)


def _times(opened: Opened, view: EpisodeView) -> dict[str, np.ndarray]:
    """Native sample times per stream shown (cameras: frame times)."""
    out = {}
    for name, spec in view.specs.items():
        if spec.kind in ("image", "video") and name in view.cameras:
            out[name] = np.asarray(view.frame_times(name), np.float64)
        elif view.native is not None and name in view.native.streams:
            out[name] = np.asarray(view.native.streams[name].times, np.float64)
    return out


def plot_episode(opened: Opened, view: EpisodeView, out: str | Path,
                 window: tuple[float, float] | None = None, dpi: int = 110) -> Path:
    """Draw ``view`` (see the module docstring) into the PNG ``out``.

    Args:
        opened: the cache or source the episode comes from (names, format, path).
        view: the episode (:meth:`robocache.view.episodes.Opened.episode`).
        out: the PNG file to write.
        window: ``(start, end)`` seconds of the zoom column; default: 24 grid steps (0.5 s
            without a grid) from the episode's middle.
        dpi: resolution.

    Returns:
        ``out`` as a path.

    Raises:
        DataError: the episode has nothing to draw (unreadable, and not in the cache), or
            ``window`` is empty.
    """
    from robocache.data.cache import column_name
    from robocache.errors import DataError

    require("matplotlib", "view", "Plotting episodes")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    times = _times(opened, view)
    cols = view.aligned
    grid = cols["timestamp"] if cols is not None else None
    spans = [t for t in times.values() if len(t)] + ([grid] if grid is not None else [])
    if not spans:
        raise DataError(f"episode {view.index} has nothing to plot: "
                        f"{view.problem or 'no samples'}.")
    t0, t1 = min(float(t[0]) for t in spans), max(float(t[-1]) for t in spans)
    events = [n for n, s in view.specs.items() if s.kind == "event" and n in times]
    window = window or _default_window(t0, t1, view, [float(t) for n in events
                                                      for t in times[n]])
    if not window[1] > window[0]:
        raise DataError(f"`window` (--plot-window) must be START:END with END > START seconds; "
                        f"got {window[0]}:{window[1]}.")
    numeric = [n for n, s in view.specs.items() if s.kind == "numeric"
               and (n in times or cols is not None)]
    cameras = [n for n, s in view.specs.items() if s.kind in ("image", "video")
               and (n in times or cols is not None)]
    lanes = [n for n in view.specs if n in times]
    rows = 1 + len(numeric) + len(cameras)
    heights = [0.45 * (len(lanes) + 1) + 0.4] + [2.0] * len(numeric) + [1.2] * len(cameras)
    fig, axes = plt.subplots(rows, 2, figsize=(16, sum(heights) + 1.6),
                             gridspec_kw={"height_ratios": heights, "width_ratios": [3, 2]},
                             sharex="col", squeeze=False)
    cmap = plt.get_cmap("tab10")

    # lane of sample times per stream, grid last
    for col_i, ax in enumerate(axes[0]):
        for k, name in enumerate(lanes):
            t = times[name]
            kind = view.specs[name].kind
            color = EVENT_COLOR if kind == "event" else ("#1f6fb4" if kind == "numeric"
                                                        else "#c0392b")
            if cols is not None:  # the steps where this stream is padded
                ax.broken_barh([(grid[a] - 0.5 / view.rate_hz, (b - a + 1) / view.rate_hz)
                                for a, b in _runs(cols[f"{column_name(name)}_is_pad"])],
                               (k + 0.55, 0.9), color=PAD_COLOR, alpha=0.6, lw=0)
            ax.vlines(t, k + 0.6, k + 1.4, color=color, lw=0.8 if col_i else 0.5)
            if kind == "event" and view.native is not None:
                texts = view.native.streams[name].data
                for tk, txt in zip(t, texts, strict=True):
                    if window[0] <= tk <= window[1] or col_i == 0:
                        ax.text(tk, k + 1, f" {txt}", fontsize=7, color=EVENT_COLOR,
                                ha="left", va="center", clip_on=True)
        labels = [f"{n}  ({_rate(times[n], view.specs[n].kind)})" for n in lanes]
        if grid is not None:
            ax.vlines(grid, -0.4, 0.4, color="black", lw=0.8 if col_i else 0.4)
            labels = [f"grid  ({view.rate_hz:g} Hz)"] + labels
            ax.set_yticks(range(len(lanes) + 1), labels)
        else:
            ax.set_yticks(range(1, len(lanes) + 1), labels)
        ax.set_ylim(-0.8 if grid is not None else 0.3, len(lanes) + 1.2)
        ax.tick_params(axis="y", labelsize=8, left=False, labelleft=col_i == 0)
        ax.set_title("sample times" + ("" if col_i == 0 else
                                        f"  (zoom {window[0]:.2f}–{window[1]:.2f} s)"),
                     fontsize=9, loc="left")

    # numeric streams: native markers, aligned lines, pad shaded; in the zoom each dimension
    # gets its own band, scaled to its range in the window, so single samples stand out
    for r, name in enumerate(numeric, start=1):
        method = view.methods.get(name, "linear")
        native = view.native.streams.get(name) if view.native is not None else None
        dims = view.specs[name].dim
        names = opened.names.get(name) or [f"[{k}]" for k in range(dims)]
        nv = np.asarray(native.data, np.float64).reshape(len(native), -1) \
            if native is not None else None
        av = np.asarray(cols[column_name(name)], np.float64).reshape(len(grid), -1) \
            if cols is not None else None
        steps = "steps-post" if method in ("previous", "nearest") else "default"
        shown = min(dims, MAX_DIMS)
        for col_i, ax in enumerate(axes[r]):
            if cols is not None:
                _shade_pad(ax, grid, cols[f"{column_name(name)}_is_pad"], view.rate_hz)
            for k in range(shown):
                c = cmap(k % 10)
                scale = (lambda v: v) if col_i == 0 else _band(
                    k, window, native.times if nv is not None else None,
                    nv[:, k] if nv is not None else None, grid,
                    av[:, k] if av is not None else None)
                if nv is not None:
                    ax.plot(native.times, scale(nv[:, k]), ".", color=c,
                            ms=4.5 if col_i else 2.5, zorder=3)
                if av is not None:
                    ax.plot(grid, scale(av[:, k]), "-", color=c, lw=1.0, alpha=0.8, zorder=2,
                            drawstyle=steps, label=names[k] if k < len(names) else f"[{k}]")
            if col_i == 0:
                more = f" (first {MAX_DIMS} of {dims} dims)" if dims > MAX_DIMS else ""
                how = method if cols is not None else "native"
                ax.set_ylabel(f"{name}\n{how}{more}", fontsize=8)
                if dims > 1:
                    ax.legend(handles=[Line2D([], [], color=cmap(k % 10), marker=".",
                                              label=names[k] if k < len(names) else f"[{k}]")
                                       for k in range(shown)],
                              fontsize=7, ncol=shown, loc="upper right", framealpha=0.6)
            else:
                ax.set_ylim(-0.3, 1.2 * shown - 0.1)
                ax.set_yticks([1.2 * k + 0.5 for k in range(shown)],
                              [names[k] if k < len(names) else f"[{k}]" for k in range(shown)])
                ax.set_ylabel("each dim scaled to\nits range in the zoom", fontsize=7)
            ax.tick_params(labelsize=7)

    # cameras: frame times as ticks, the aligned frame's offset from its step
    for r, name in enumerate(cameras, start=1 + len(numeric)):
        for col_i, ax in enumerate(axes[r]):
            if name in times:
                ax.vlines(times[name], 0, 1, transform=ax.get_xaxis_transform(),
                          color="#c0392b", lw=0.5 if col_i == 0 else 0.9, alpha=0.7)
            if cols is not None:
                c = column_name(name)
                _shade_pad(ax, grid, cols[f"{c}_is_pad"], view.rate_hz)
                ax.plot(grid, 1e3 * np.asarray(cols[f"{c}/offset"], np.float64), "-",
                        color="black", lw=1.0, drawstyle="steps-post")
                if col_i:
                    ax.plot(grid, 1e3 * np.asarray(cols[f"{c}/offset"], np.float64), "|",
                            color="black", ms=5)
            if cols is None:
                ax.set_yticks([])
            if col_i == 0:  # camera rows are short: the name inside, the unit beside
                ax.text(0.004, 0.94, name, transform=ax.transAxes, fontsize=8, va="top",
                        bbox={"facecolor": "white", "alpha": 0.8, "lw": 0})
                ax.set_ylabel("frame − step\n(ms)" if cols is not None else "frame times",
                              fontsize=7)
            ax.tick_params(labelsize=7)

    for ax in axes[1:].ravel():
        for name in events:
            for tk in times[name]:
                ax.axvline(tk, color=EVENT_COLOR, ls="--", lw=0.7, alpha=0.7)
    for col_i, (lo, hi) in enumerate([(t0, t1), window]):
        axes[0, col_i].set_xlim(lo, hi)
        axes[-1, col_i].set_xlabel("time (s)", fontsize=8)
    for ax in axes[:, 0]:
        ax.axvspan(*window, color="#f5d76e", alpha=0.18, lw=0, zorder=0)

    handles = [Line2D([], [], ls="", marker=".", color="black", label="native samples"),
               Line2D([], [], color="black",
                      label=f"aligned @ {view.rate_hz:g} Hz" if grid is not None else
                      "aligned: none (a source; --rate HZ aligns it)"),
               Line2D([], [], color="#c0392b", lw=0.8, label="camera frame times"),
               Line2D([], [], color=EVENT_COLOR, ls="--", label="events"),
               Patch(color=PAD_COLOR, alpha=0.35, label="_is_pad"),
               Patch(color="#f5d76e", alpha=0.3, label="zoom window")]
    tasks = "; ".join(view.tasks) or "—"
    title = (f"{opened.path} — episode {view.index} ({opened.format}) — task: {tasks}\n"
             f"source: {view.where}")
    if view.problem:
        title += f"\nquarantined: {view.problem}"
    fig.suptitle(title, fontsize=10, x=0.01, ha="left",
                 color="#b00000" if view.problem else "black")
    fig.legend(handles=handles, loc="upper right", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.6 / (sum(heights) + 1.6)))
    out = Path(out)
    fig.savefig(out, dpi=dpi)
    plt.close(fig)
    return out
