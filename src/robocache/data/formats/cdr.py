"""Bulk decoding of the common ROS 2 messages from their CDR bytes, without a message object
per sample.

ROS 2 serializes messages as CDR (little-endian here: the 4-byte encapsulation header
``00 01 00 00``); a primitive is aligned to its size relative to the end of that header,
a string is a uint32 length (with its NUL) and the bytes, a sequence a uint32 count and the
elements. For the fixed layouts read by :mod:`robocache.data.formats.rosbag` (a header, maybe
a second frame-id string, then float64s; or a lone scalar) every message's field offsets
follow from its string lengths, so a topic's messages are decoded together with NumPy
gathers. JointState messages are walked once per layout (joint names, array lengths) and
gathered together; CompressedImage messages are walked one by one with ``struct``. Each
function returns ``None`` (or raises) where its layout does not hold (big-endian CDR, a message
too short); the caller then decodes with mcap-ros2-support, which names the message.

ROS 1 serializes the same fields packed: no encapsulation header, no alignment, strings
without their NUL, and ``std_msgs/Header`` led by a ``uint32 seq``. Each function takes the
wire format (:data:`CDR` or :data:`ROS1`), so ROS 1 bags are decoded in bulk by the same code.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Wire:
    """How a serialization lays fields out: bytes before the body (the CDR encapsulation
    header), whether primitives are aligned to their size, the bytes of a string's length
    that are its NUL, and the bytes before a header's stamp (ROS 1's ``seq``)."""

    prefix: int
    aligned: bool
    nul: int
    seq: int


CDR = Wire(prefix=4, aligned=True, nul=1, seq=0)
ROS1 = Wire(prefix=0, aligned=False, nul=0, seq=4)

_Q = (6, 3, 4, 5)  # the wxyz float64 indices of a quaternion stored xyzw after a point
# type -> (has a header, frame-id strings after it, float64 indices in stream order)
LAYOUTS: dict[str, tuple[bool, int, tuple[int, ...]]] = {
    "geometry_msgs/msg/Pose": (False, 0, (0, 1, 2, *_Q)),
    "geometry_msgs/msg/PoseStamped": (True, 0, (0, 1, 2, *_Q)),
    "geometry_msgs/msg/PoseWithCovarianceStamped": (True, 0, (0, 1, 2, *_Q)),
    "geometry_msgs/msg/Transform": (False, 0, (0, 1, 2, *_Q)),
    "geometry_msgs/msg/TransformStamped": (True, 1, (0, 1, 2, *_Q)),
    **{f"geometry_msgs/msg/{t}": (False, 0, tuple(range(6)))
       for t in ("Twist", "Accel", "Wrench")},
    **{f"geometry_msgs/msg/{t}Stamped": (True, 0, tuple(range(6)))
       for t in ("Twist", "Accel", "Wrench")},
    **{f"geometry_msgs/msg/{t}": (False, 0, (0, 1, 2)) for t in ("Point", "Vector3")},
    **{f"geometry_msgs/msg/{t}Stamped": (True, 0, (0, 1, 2)) for t in ("Point", "Vector3")},
    "geometry_msgs/msg/Quaternion": (False, 0, (3, 0, 1, 2)),
    "geometry_msgs/msg/QuaternionStamped": (True, 0, (3, 0, 1, 2)),
    # orientation (xyzw), its covariance [9], angular velocity, [9], linear acceleration
    "sensor_msgs/msg/Imu": (True, 0, (3, 0, 1, 2, 13, 14, 15, 25, 26, 27)),
    "sensor_msgs/msg/MagneticField": (True, 0, (0, 1, 2)),
    # child_frame_id; pose (7) and its covariance [36], then the twist
    "nav_msgs/msg/Odometry": (True, 1, (0, 1, 2, *_Q, 43, 44, 45, 46, 47, 48)),
}


def _packed(raw: list[bytes], wire: Wire = CDR
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """All messages in one uint8 buffer: (buffer, body start and body length of each), or
    ``None`` unless every message is little-endian CDR (ROS 1: always little-endian)."""
    lengths = np.fromiter(map(len, raw), np.int64, len(raw))
    if len(raw) == 0 or lengths.min() < wire.prefix:
        return None
    buf = np.frombuffer(b"".join(raw), np.uint8)
    starts = np.r_[0, np.cumsum(lengths)[:-1]]
    if wire.prefix and not (np.all(buf[starts] == 0) and np.all(buf[starts + 1] == 1)):
        return None
    return buf, starts + wire.prefix, lengths - wire.prefix


def _gather(buf: np.ndarray, at: np.ndarray, dtype: str, count: int = 1) -> np.ndarray:
    """``count`` consecutive values of ``dtype`` at byte offsets ``at`` (``[N, count]``)."""
    size = np.dtype(dtype).itemsize
    idx = at[:, None] + np.arange(count * size)[None, :]
    return np.ascontiguousarray(buf[idx]).view(dtype)


def _align(off, n: int, wire: Wire = CDR):
    return (off + n - 1) // n * n if wire.aligned else off


def vectors(raw: list[bytes], type_: str, wire: Wire = CDR
            ) -> tuple[np.ndarray, np.ndarray | None] | None:
    """The float64 values ``[N, K]`` (stream order of :data:`LAYOUTS`) and header stamps
    (int64 ns ``[N]``, or ``None`` without a header) of ``N`` messages of ``type_``."""
    header, strings, idx = LAYOUTS[type_]
    packed = _packed(raw, wire)
    if packed is None:
        return None
    buf, body, size = packed
    off = np.zeros(len(raw), np.int64)
    stamps = None
    if header:
        if size.min() < 12 + wire.seq:
            return None
        at = body + wire.seq
        sec = _gather(buf, at, "<i4")[:, 0].astype(np.int64)
        nsec = _gather(buf, at + 4, "<u4")[:, 0].astype(np.int64)
        stamps = sec * 1_000_000_000 + nsec
        off = wire.seq + 12 + _gather(buf, at + 8, "<u4")[:, 0].astype(np.int64)
    for _ in range(strings):
        off = _align(off, 4, wire)
        if np.any(off + 4 > size):
            return None
        off = off + 4 + _gather(buf, body + off, "<u4")[:, 0].astype(np.int64)
    off = _align(off, 8, wire)
    if np.any(off + 8 * (max(idx) + 1) > size):
        return None
    block = _gather(buf, body + off, "<f8", max(idx) + 1)
    return block[:, list(idx)], stamps


def scalars(raw: list[bytes], dtype: str, wire: Wire = CDR) -> np.ndarray | None:
    """The ``data`` of ``std_msgs`` scalar messages (one value at the body's start)."""
    packed = _packed(raw, wire)
    if packed is None or packed[2].min() < np.dtype(dtype).itemsize:
        return None
    buf, body, _ = packed
    return _gather(buf, body, np.dtype(dtype).newbyteorder("<").str)[:, 0].astype(dtype)


_U32 = struct.Struct("<I")
_STAMP = struct.Struct("<iI")


def _string_end(data: bytes, off: int, wire: Wire = CDR) -> int:
    off = _align(off, 4, wire)
    return off + 4 + _U32.unpack_from(data, off)[0]


def _body(data: bytes, wire: Wire) -> memoryview:
    if wire.prefix and data[:2] != b"\x00\x01":
        raise ValueError("not little-endian CDR")
    return memoryview(data)[wire.prefix:]


def joint_state(data: bytes, wire: Wire = CDR) -> tuple[int, tuple]:
    """One ``sensor_msgs/JointState``: (stamp ns, (names, position, velocity, effort)),
    the arrays float64 views of ``data``."""
    body = _body(data, wire)
    sec, nsec = _STAMP.unpack_from(body, wire.seq)
    off = _align(_string_end(body, wire.seq + 8, wire), 4, wire)
    count = _U32.unpack_from(body, off)[0]
    off += 4
    names = []
    for _ in range(count):
        off = _align(off, 4, wire)
        n = _U32.unpack_from(body, off)[0]
        names.append(bytes(body[off + 4:off + 4 + n - wire.nul]).decode())
        off += 4 + n
    arrays = []
    for _ in range(3):
        off = _align(off, 4, wire)
        n = _U32.unpack_from(body, off)[0]
        off += 4
        if n:
            off = _align(off, 8, wire)
        arrays.append(np.frombuffer(body, "<f8", n, off))
        off += 8 * n
    return sec * 1_000_000_000 + nsec, (tuple(names), *arrays)


def compressed_image(data: bytes, wire: Wire = CDR) -> tuple[int, bytes]:
    """One ``sensor_msgs/CompressedImage``: (stamp ns, its image bytes)."""
    body = _body(data, wire)
    sec, nsec = _STAMP.unpack_from(body, wire.seq)
    off = _string_end(body, wire.seq + 8, wire)  # frame_id
    off = _string_end(body, off, wire)  # format
    off = _align(off, 4, wire)
    n = _U32.unpack_from(body, off)[0]
    if off + 4 + n > len(body):
        raise ValueError("the image bytes run past the message")
    return sec * 1_000_000_000 + nsec, bytes(body[off + 4:off + 4 + n])


def joint_states(raw: list[bytes], wire: Wire = CDR) -> tuple[np.ndarray, list[tuple]] | None:
    """``N`` ``sensor_msgs/JointState`` messages: (stamps int64 ns ``[N]``, groups), a group
    ``(names, rows, [position, velocity, effort])`` per run of messages laid out alike (the
    same frame id length, joint names and array lengths), each array float64
    ``[len(rows), count]``. The first message of a group is walked; the others are checked
    byte for byte against its names and counts, then gathered together."""
    packed = _packed(raw, wire)
    if packed is None or packed[2].min() < 12 + wire.seq:
        return None
    buf, body, size = packed
    at = body + wire.seq
    stamps = _gather(buf, at, "<i4")[:, 0].astype(np.int64) * 1_000_000_000 + \
        _gather(buf, at + 4, "<u4")[:, 0].astype(np.int64)
    head = wire.seq + 12 + _gather(buf, at + 8, "<u4")[:, 0].astype(np.int64)
    groups, todo = [], np.arange(len(raw))
    while todo.size:
        i = int(todo[0])
        _, (names, *arrays) = joint_state(raw[i], wire)
        # the layout of message i: its names' bytes, then each array's count and data offset
        data = memoryview(raw[i])[wire.prefix:]
        off = int(head[i])
        spans = []
        for a in arrays:
            count_at = _string_list_end(data, off, wire) if not spans else spans[-1][1] + \
                8 * spans[-1][2]
            count_at = _align(count_at, 4, wire)
            start = count_at + 4
            if len(a):
                start = _align(start, 8, wire)
            spans.append((count_at, start, len(a)))
        fixed = bytes(data[int(head[i]):spans[0][0]])
        same = head[todo] == head[i]
        cand = todo[same]
        if len(fixed):
            same_names = np.all(_gather(buf, body[cand] + head[i], "u1", len(fixed)) ==
                                np.frombuffer(fixed, np.uint8), axis=1)
        else:
            same_names = np.ones(len(cand), bool)
        for count_at, _, count in spans:
            same_names &= _gather(buf, body[cand] + count_at, "<u4")[:, 0] == count
        end = spans[-1][1] + 8 * spans[-1][2]
        rows = cand[same_names & (size[cand] >= end)]
        if rows.size == 0 or rows[0] != i:  # message i does not fit its own layout
            return None
        groups.append((names, rows, [_gather(buf, body[rows] + start, "<f8", count)
                                     for _, start, count in spans]))
        todo = np.setdiff1d(todo, rows, assume_unique=True)
    return stamps, groups


def _string_list_end(body, off: int, wire: Wire = CDR) -> int:
    """The offset after a ``string[]`` starting at ``off``."""
    off = _align(off, 4, wire)
    count = _U32.unpack_from(body, off)[0]
    off += 4
    for _ in range(count):
        off = _string_end(body, off, wire)
    return off
