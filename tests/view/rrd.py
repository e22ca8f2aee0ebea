"""Read a saved recording back with Rerun's own reader, per entity (for the view tests)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np


def read_rrd(path: Path) -> tuple[dict[str, dict], dict[str, str]]:
    """``(temporal, static)``: per entity path (without the leading ``/``) its samples in
    ``time`` order (``time`` int64 ns, ``step`` or ``None``, ``scalars`` float64 ``[n, D]``,
    ``text`` list, ``images`` count (decoded or JPEG/PNG), ``encoded`` count (JPEG/PNG),
    ``depth`` count); and the static text documents."""
    from rerun.chunk import RrdReader

    parts: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    static: dict[str, str] = {}
    for chunk in RrdReader(path).stream():
        batch = chunk.to_record_batch()
        path_ = chunk.entity_path.lstrip("/")
        names = batch.schema.names
        if chunk.is_static:
            if "TextDocument:text" in names:
                static[path_] = batch.column("TextDocument:text").to_pylist()[-1][0]
            continue
        if "time" not in names:
            continue
        p = parts[path_]
        p["time"].append(batch.column("time").cast("int64").to_numpy())
        if "step" in names:
            p["step"].append(batch.column("step").to_numpy())
        if "Scalars:scalars" in names:
            p["scalars"] += batch.column("Scalars:scalars").to_pylist()
        if "TextLog:text" in names:
            p["text"] += [v[0] for v in batch.column("TextLog:text").to_pylist()]
        for kind, col in (("images", "Image:buffer"), ("images", "EncodedImage:blob"),
                          ("encoded", "EncodedImage:blob"), ("depth", "DepthImage:buffer")):
            if col in names:
                p[kind].append(np.full(batch.num_rows, 1))
    out = {}
    for path_, p in parts.items():
        t = np.concatenate(p["time"])
        order = np.argsort(t, kind="stable")
        out[path_] = {
            "time": t[order],
            "step": np.concatenate(p["step"])[order] if p["step"] else None,
            "scalars": np.asarray(p["scalars"], np.float64)[order] if p["scalars"] else None,
            "text": [p["text"][k] for k in order] if p["text"] else None,
            "images": int(sum(len(x) for x in p["images"])),
            "depth": int(sum(len(x) for x in p["depth"])),
            "encoded": int(sum(len(x) for x in p["encoded"])),
        }
    return out, static


def ns(seconds) -> np.ndarray:
    """Seconds as Rerun stores durations: int64 nanoseconds."""
    return np.round(np.asarray(seconds, np.float64) * 1e9).astype(np.int64)


def assert_times(got: np.ndarray, seconds) -> None:
    """Times read back equal ``seconds`` to the nanosecond Rerun keeps (±1 ns of rounding)."""
    want = ns(seconds)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.abs(got - want).max(initial=0) <= 1
