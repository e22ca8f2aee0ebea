"""Any ROS message with numeric fields as numeric streams, from its definition alone.

The message definition (parsed by ``rosbags``' type system: ``nodes`` maps each type to its
fields, as ``Typestore.fielddefs``) is walked once per topic into leaves, each one stream
``<topic>.<field path>`` (nested fields joined with dots):

- a numeric field (``bool``, ``byte``, ``char``, ``int8`` .. ``uint64``, ``float32``,
  ``float64``): a scalar of its own dtype;
- a fixed array ``T[N]`` of a numeric type: ``[N]``; a sequence ``T[]``: ``[N]`` with ``N``
  fixed by the first message (a later message of another length fails its episode; a
  sequence the first message leaves empty is not a stream);
- a nested message: its own leaves, except that one whose fields are all scalars of one
  numeric dtype (``geometry_msgs/Vector3``, ``Point``) is one ``[K]`` stream in field order,
  and a quaternion (fields ``x, y, z, w``) is a ``[4]`` **wxyz** quaternion stream;
- ``builtin_interfaces/Time`` and ``Duration`` (ROS 1 ``time``, ``duration``): int64
  nanoseconds;
- the top-level ``header`` times the message and is not a stream; strings, arrays of
  messages and sequences of messages are not read (listed as left out).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from robocache.errors import DataError

NUMERIC = {"bool": "bool", "byte": "uint8", "char": "uint8", "octet": "uint8",
           "int8": "int8", "uint8": "uint8", "int16": "int16", "uint16": "uint16",
           "int32": "int32", "uint32": "uint32", "int64": "int64", "uint64": "uint64",
           "float32": "float32", "float64": "float64"}
TIMES = ("builtin_interfaces/msg/Time", "builtin_interfaces/msg/Duration")
HEADER = "std_msgs/msg/Header"
BASE, NAME, ARRAY, SEQUENCE = 1, 2, 3, 4  # rosbags' Nodetype values

# packages whose messages are the middleware's own, not robot data
NOT_DATA = ("rcl_interfaces/", "rosgraph_msgs/", "diagnostic_msgs/", "lifecycle_msgs/",
            "action_msgs/", "statistics_msgs/", "rosbag2_interfaces/", "type_description_"
            "interfaces/", "service_msgs/", "unique_identifier_msgs/")


@dataclass(frozen=True)
class Leaf:
    """One stream of a message: ``path`` (dotted field path, the stream name's tail),
    ``attrs`` (the attributes read under ``path``: one per column of a merged message, else
    empty), ``dtype``, ``size`` (``None``: a scalar; ``-1``: a sequence, sized by the first
    message), ``kind`` (``"value"``, ``"time"`` or ``"quaternion"``)."""

    path: str
    attrs: tuple[str, ...]
    dtype: str
    size: int | None
    kind: str = "value"


def _node(desc) -> tuple[int, object]:
    kind, spec = desc
    return int(getattr(kind, "value", kind)), spec


def leaves(nodes: dict, type_: str) -> tuple[list[Leaf], list[str]]:
    """The leaves of ``type_`` and the field paths left out (strings excepted).

    Raises:
        KeyError: ``type_`` is not in ``nodes``.
    """
    out: list[Leaf] = []
    left: list[str] = []
    _walk(nodes, type_, "", out, left, top=True)
    return out, left


def _walk(nodes, type_: str, prefix: str, out: list, left: list, top: bool = False) -> None:
    for name, desc in nodes[type_][1]:
        path = f"{prefix}{name}"
        node, spec = _node(desc)
        if node == BASE:
            if spec[0] in NUMERIC:
                out.append(Leaf(path, (), NUMERIC[spec[0]], None))
        elif node == NAME:
            if top and name == "header" and spec == HEADER:
                continue
            if spec in TIMES:
                out.append(Leaf(path, (), "int64", None, "time"))
                continue
            if spec not in nodes:
                left.append(path)
                continue
            fields = [(n, _node(d)) for n, d in nodes[spec][1]]
            dtypes = {NUMERIC.get(s[0]) if k == BASE else None for _, (k, s) in fields}
            if len(dtypes) == 1 and None not in dtypes and len(fields) > 1:
                attrs = tuple(n for n, _ in fields)
                if attrs == ("x", "y", "z", "w"):
                    out.append(Leaf(path, ("w", "x", "y", "z"), dtypes.pop(), 4, "quaternion"))
                else:
                    out.append(Leaf(path, attrs, dtypes.pop(), len(attrs)))
            else:
                _walk(nodes, spec, path + ".", out, left)
        else:  # ARRAY (spec: element, length) or SEQUENCE (spec: element, bound)
            element, length = spec
            k, s = _node(element)
            if k == BASE and s[0] in NUMERIC:
                out.append(Leaf(path, (), NUMERIC[s[0]], length if node == ARRAY else -1))
            else:
                left.append(path)


def _get(msg, path: str):
    for part in path.split("."):
        msg = getattr(msg, part)
    return msg


def extract(msg, plan: list[Leaf]) -> list:
    """One message's values, one per leaf (scalars as Python numbers, arrays as NumPy)."""
    row = []
    for leaf in plan:
        v = _get(msg, leaf.path)
        if leaf.kind == "time":
            row.append(v.sec * 1_000_000_000 + v.nanosec)
        elif leaf.attrs:
            row.append([getattr(v, a) for a in leaf.attrs])
        elif leaf.size is None:
            row.append(v)
        elif isinstance(v, (bytes, bytearray)):
            row.append(np.frombuffer(v, np.uint8))
        else:
            row.append(np.asarray(v, leaf.dtype))
    return row


def columns(topic: str, rows: list[list], plan: list[Leaf]):
    """``(leaf, data [N, ...])`` of each leaf over a topic's messages; a sequence the first
    message leaves empty is dropped.

    Raises:
        DataError: a sequence whose length changes, naming the topic, message and field.
    """
    n = len(rows)
    for j, leaf in enumerate(plan):
        values = [r[j] for r in rows]
        if leaf.size == -1:
            sizes = [len(v) for v in values]
            if not sizes or sizes[0] == 0:
                continue
            bad = next((i for i, s in enumerate(sizes) if s != sizes[0]), None)
            if bad is not None:
                raise DataError(f"topic {topic} message {bad}: field {leaf.path} holds "
                                f"{sizes[bad]} values, the first message {sizes[0]}.")
            yield leaf, np.asarray(values, leaf.dtype).reshape(n, sizes[0])
        elif leaf.size is None:
            yield leaf, np.asarray(values, leaf.dtype).reshape(n)
        else:
            yield leaf, np.asarray(values, leaf.dtype).reshape(n, leaf.size)
