"""A zarr chunk overwritten with junk: every episode it holds rows of is quarantined, naming it;
none is cached with the garbage.

Each case records a row of docs/reliability.md's table (see faultlib).
"""

from __future__ import annotations

import faultlib as fl
import lance
import numpy as np
import pytest
import zarr

from robocache.data.cache import build

# episodes that start inside chunk 1 (rows 100:200), end in it, lie wholly in it, or cross it
ENDS = np.cumsum([60, 83, 40, 17, 90, 110])
CHUNK = 100


def buffer(root, seed: int = 0):
    from numcodecs import Blosc

    rng = np.random.default_rng(seed)
    n = int(ENDS[-1])
    g = zarr.open_group(str(root / "rb.zarr"), mode="w", zarr_format=2)
    g.create_array("data/state", shape=(n, 4), chunks=(CHUNK, 4), dtype="float32",
                   compressors=Blosc(cname="lz4", clevel=5, shuffle=Blosc.SHUFFLE))[:] = \
        rng.normal(size=(n, 4)).astype(np.float32)
    g.create_array("data/action", shape=(n, 2), chunks=(CHUNK, 2), dtype="float32")[:] = \
        rng.normal(size=(n, 2)).astype(np.float32)
    g.create_array("meta/episode_ends", shape=(len(ENDS),), dtype="int64")[:] = ENDS
    return root / "rb.zarr"


@pytest.mark.parametrize("how", ["payload", "whole"])
def test_a_junk_chunk_quarantines_every_episode_it_feeds(tmp_path, how):
    """``payload``: the chunk's Blosc header kept, its payload random (decodes without error
    into garbage: NaN in some rows, 3e38 in others); ``whole``: every byte random (a decode
    error)."""
    src = buffer(tmp_path)
    chunk = src / "data" / "state" / "1.0"
    raw = chunk.read_bytes()
    rng = np.random.default_rng(7)
    keep = 16 if how == "payload" else 0
    chunk.write_bytes(raw[:keep] + rng.bytes(len(raw) - keep))
    m = build(src, tmp_path / "c", rate_hz="native", progress=False, device="cpu",
              source_options={"fps": 10.0})
    touched = [i for i, (a, b) in enumerate(zip(np.r_[0, ENDS[:-1]], ENDS, strict=True))
               if a < 2 * CHUNK and b > CHUNK]
    quarantined = sorted(q["index"] for q in m["quarantined"])
    table = lance.dataset(str(tmp_path / "c" / "data.lance")).to_table()
    cached = np.stack(table.column("state").to_numpy(zero_copy_only=False))
    ok = quarantined == touched and all("data/state/1.0" in q["reason"]
                                        for q in m["quarantined"]) and \
        float(np.abs(cached).max()) < 10 and \
        m["counts"]["read"] == m["counts"]["cached"] + m["counts"]["quarantined"]
    fl.record(f"a zarr chunk's {'payload' if keep else 'bytes'} overwritten with junk "
              "(Blosc-LZ4)", f"the {len(touched)} episodes with rows in it quarantined, "
              "naming the chunk; no garbage cached", lost=not ok)
    assert ok, (quarantined, touched, m["quarantined"][:1], float(np.abs(cached).max()))
