"""TF (``tf2_msgs/TFMessage`` on ``/tf`` and ``/tf_static``) as pose streams, and chains of
frames composed over time.

Every (parent, child) pair that a bag's TF messages carry becomes two streams,
``tf.<parent>.<child>.position`` (float64 ``[3]``, metres: the child's origin in the parent
frame) and ``tf.<parent>.<child>.orientation`` (float64 ``[4]`` **wxyz**, a quaternion stream:
aligned by slerp), frame names without a leading slash and slashes as dots. A ``/tf`` pair is
timed by each transform's ``header.stamp`` (or the message's log time, as every other topic);
a ``/tf_static`` pair is constant: its value held from the first to the last time of the
episode's other streams (a later static message that changes it takes effect at its log time).

A requested chain ``(source, target)`` — ``base_link`` → ``tool0`` — gives the pose of
``target`` in ``source``'s frame, ``tf.<source>.<target>.*``, composed along the tree (up from
``source`` to the common ancestor, inverted, then down to ``target``) at every time one of its
moving links has a sample, within the span where all of them have one: each moving link is
aligned there with the project's alignment (linear for positions, slerp for rotations), then
the links are composed in float64. A pair published directly is its own chain. A chain whose
frames the tree does not connect, a frame with two parents or a loop fails the episode with
one line naming the frames.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from robocache.errors import DataError

TF = "tf2_msgs/msg/TFMessage"
TF_STATIC_TOPIC = "/tf_static"


def frame(name: str) -> str:
    """A frame id as streams name it: no leading slash (ROS 1 frames often have one)."""
    return name.lstrip("/")


def stream_base(parent: str, child: str) -> str:
    return ".".join(("tf", parent.replace("/", "."), child.replace("/", ".")))


def extract(msg) -> list[tuple[str, str, int, list[float]]]:
    """A TFMessage's transforms: ``(parent, child, header stamp ns, [x, y, z, qw, qx, qy,
    qz])`` each."""
    out = []
    for tr in msg.transforms:
        h, t, r = tr.header, tr.transform.translation, tr.transform.rotation
        out.append((frame(h.frame_id), frame(tr.child_frame_id),
                    h.stamp.sec * 1_000_000_000 + h.stamp.nanosec,
                    [t.x, t.y, t.z, r.w, r.x, r.y, r.z]))
    return out


@dataclass
class _Pair:
    static: bool
    ns: list[int] = field(default_factory=list)
    log_ns: list[int] = field(default_factory=list)
    values: list[list[float]] = field(default_factory=list)


@dataclass
class Link:
    """One (parent, child) pair's samples: int64 ns ``[S]``, float64 ``[S, 7]`` (xyz, wxyz)."""

    parent: str
    child: str
    ns: np.ndarray
    values: np.ndarray
    static: bool
    log_ns: np.ndarray


def links(topics: list[tuple[str, list[int], list[list]]], use_log: bool) -> list[Link]:
    """The pairs of TF topics ``(topic, log ns of each message, extract() of each message)``,
    in the order first seen; a ``/tf`` pair timed by header stamps unless ``use_log`` (or its
    stamps are all zero), checked non-decreasing.

    Raises:
        DataError: a pair's time going backwards, a pair on both topics.
    """
    pairs: dict[tuple[str, str], _Pair] = {}
    where: dict[tuple[str, str], str] = {}
    for topic, log_ns, messages in topics:
        static = topic == TF_STATIC_TOPIC
        for log, transforms in zip(log_ns, messages, strict=True):
            for parent, child, stamp, value in transforms:
                key = (parent, child)
                p = pairs.get(key)
                if p is None:
                    p = pairs[key] = _Pair(static)
                    where[key] = topic
                elif where[key] != topic:
                    raise DataError(f"TF pair {parent} → {child} is on both {where[key]} and "
                                    f"{topic}; a transform is either static or not.")
                p.ns.append(stamp)
                p.log_ns.append(log)
                p.values.append(value)
    out = []
    for (parent, child), p in pairs.items():
        stamps, logs = np.asarray(p.ns, np.int64), np.asarray(p.log_ns, np.int64)
        ns = logs if use_log or p.static or not stamps.any() else stamps
        back = np.flatnonzero(np.diff(ns) < 0)
        if back.size:
            i = int(back[0]) + 1
            raise DataError(f"topic {where[(parent, child)]} transform {parent} → {child} "
                            f"sample {i}: time goes backwards ({int(ns[i - 1])} ns, then "
                            f"{int(ns[i])} ns).")
        out.append(Link(parent, child, ns, np.asarray(p.values, np.float64).reshape(-1, 7),
                        p.static, logs))
    return out


def hold_static(link: Link, start: int, end: int) -> Link:
    """A static pair held over ``[start, end]`` ns: its first value at ``start``, each later
    static message's at its log time, the last at ``end``."""
    ns = np.concatenate([[min(start, int(link.ns[0]))], link.ns[1:], [max(end, int(link.ns[-1]))]])
    values = np.concatenate([link.values[:1], link.values[1:], link.values[-1:]])
    return Link(link.parent, link.child, ns.astype(np.int64), values, True, link.log_ns)


def _parents(all_links: list[Link]) -> dict[str, Link]:
    """child -> its link; a frame with two parents or a loop raises."""
    up: dict[str, Link] = {}
    for link in all_links:
        seen = up.get(link.child)
        if seen is not None and seen.parent != link.parent:
            a, b = sorted((seen.parent, link.parent))
            raise DataError(f"TF frame {link.child} has two parents, {a} and {b}; a TF tree "
                            "gives each frame one.")
        up[link.child] = link
    for start in up:
        path, f = [start], start
        while f in up:
            f = up[f].parent
            if f in path:
                loop = path[path.index(f):] + [f]
                raise DataError(f"TF frames {' → '.join(reversed(loop))} form a loop; a TF "
                                "tree has none.")
            path.append(f)
    return up


def _to_root(f: str, up: dict[str, Link]) -> list[str]:
    path = [f]
    while path[-1] in up:
        path.append(up[path[-1]].parent)
    return path


def chain(all_links: list[Link], source: str, target: str) -> list[tuple[Link, bool]]:
    """The links from ``source`` to ``target``: ``(link, inverted)`` in composition order.

    Raises:
        DataError: a frame in no link, frames the tree does not connect, two parents, a loop.
    """
    up = _parents(all_links)
    frames = {f for link in all_links for f in (link.parent, link.child)}
    for f in (source, target):
        if f not in frames:
            raise DataError(f"TF chain {source} → {target}: frame {f} is in no transform of "
                            f"the bag (frames: {sorted(frames)}).")
    a, b = _to_root(source, up), _to_root(target, up)
    common = next((f for f in a if f in b), None)
    if common is None:
        raise DataError(f"TF chain {source} → {target}: no transforms link them ({source}'s "
                        f"tree has root {a[-1]}, {target}'s has root {b[-1]}).")
    ups = [(up[f], True) for f in a[:a.index(common)]]
    downs = [(up[f], False) for f in reversed(b[:b.index(common)])]
    return ups + downs


def compose(links_: list[tuple[Link, bool]]) -> tuple[np.ndarray, np.ndarray]:
    """The composed pose over time: int64 ns ``[T]``, float64 ``[T, 7]`` (xyz, wxyz).

    Times: every sample time of a moving link within the span where all moving links have
    samples (no extrapolation); a chain of static links only: the span of the first.
    """
    import torch

    from robocache.ops.align import Stream, align
    from robocache.ops.geometry import quat_apply, quat_conjugate, quat_multiply

    moving = [link for link, _ in links_ if not link.static] or [links_[0][0]]
    lo = max(int(link.ns[0]) for link in moving)
    hi = min(int(link.ns[-1]) for link in moving)
    ns = np.unique(np.concatenate([link.ns for link in moving]))
    ns = ns[(ns >= lo) & (ns <= hi)]
    origin = int(ns[0]) if len(ns) else 0
    target = torch.from_numpy((ns - origin) / 1e9)
    pos = torch.zeros(len(ns), 3, dtype=torch.float64)
    rot = torch.zeros(len(ns), 4, dtype=torch.float64)
    rot[:, 0] = 1
    for link, inverted in links_:
        t = torch.from_numpy((link.ns - origin) / 1e9)
        v = torch.from_numpy(link.values)
        q = v[:, 3:] / v[:, 3:].norm(dim=-1, keepdim=True)
        got = align({"p": Stream(v[:, :3], t), "q": Stream(q, t, method="slerp")}, target,
                    validate=False)
        p, q = got["p"], got["q"]
        if inverted:  # the parent's pose in the child's frame
            q = quat_conjugate(q)
            p = -quat_apply(q, p)
        pos = pos + quat_apply(rot, p)
        rot = quat_multiply(rot, q)
        rot = rot / rot.norm(dim=-1, keepdim=True)
    return ns.astype(np.int64), torch.cat([pos, rot], -1).numpy()
