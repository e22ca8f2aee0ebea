"""TFRecord files and ``tf.train.Example`` / ``SequenceExample`` messages, without TensorFlow.

A TFRecord file is a run of records, each framed as::

    uint64 length (little-endian) | uint32 masked CRC32C of the 8 length bytes
    data[length]                  | uint32 masked CRC32C of the data

where ``masked(c) = ((c >> 15) | (c << 17)) + 0xa282ead8 (mod 2**32)``. :func:`scan` walks
the framing of a file by its headers alone (to index records), :func:`read_record` reads one
record and checks both CRCs. A broken length (bad CRC, or a file that ends inside a record)
stops the walk: the records after it cannot be located.

The messages are declared here from their wire layout (field numbers and types) and built with
``protobuf`` at import; parsing yields plain NumPy arrays (``float32``, ``int64``) or lists of
``bytes``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from robocache._optional import require
from robocache.errors import DataError, MissingDependencyError

_HEADER = struct.Struct("<QI")
_MASK_DELTA = 0xA282EAD8


def _crc32c():
    return require("google_crc32c", "data", "Verifying TFRecord checksums",
                   "google-crc32c").value


def masked_crc32c(data: bytes) -> int:
    """The masked CRC32C TFRecord stores after the length and after the data."""
    crc = _crc32c()(data)
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF


def frame(data: bytes) -> bytes:
    """One framed record (what a TFRecord writer appends for ``data``)."""
    length = struct.pack("<Q", len(data))
    return (length + struct.pack("<I", masked_crc32c(length)) + data
            + struct.pack("<I", masked_crc32c(data)))


@dataclass
class Scan:
    """The records of one file: ``offsets`` / ``lengths`` of each record's data, and ``error``
    (why the walk stopped early, ``None`` when it reached the end of the file cleanly)."""

    offsets: list[int]
    lengths: list[int]
    error: str | None = None


def scan(path: Path) -> Scan:
    """Index the records of ``path`` from their headers (length CRCs checked, data skipped)."""
    crc = _crc32c()
    size = path.stat().st_size
    out = Scan([], [])
    with open(path, "rb") as f:
        pos = 0
        while pos < size:
            head = f.read(12)
            if len(head) < 12:
                out.error = f"{path.name} is truncated at byte {pos} (a partial record header)"
                break
            length, length_crc = _HEADER.unpack(head)
            c = crc(head[:8])
            if ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + _MASK_DELTA) & 0xFFFFFFFF != length_crc:
                out.error = f"{path.name} has a corrupt record length at byte {pos} (CRC mismatch)"
                break
            end = pos + 12 + length + 4
            if end > size:
                out.error = (f"{path.name} is truncated at byte {size}: the record at byte {pos} "
                             f"needs {end - pos} bytes")
                break
            out.offsets.append(pos + 12)
            out.lengths.append(length)
            pos = end
            f.seek(pos)
    return out


def read_record(f, offset: int, length: int, name: str) -> bytes:
    """Read the record whose data starts at ``offset`` of the open file ``f`` and check its
    data CRC.

    Raises:
        DataError: the data CRC does not match, or the file ends early.
    """
    f.seek(offset)
    data, crc = f.read(length), f.read(4)  # two reads: slicing one buffer would copy the data
    if len(data) < length or len(crc) < 4:
        raise DataError(f"{name} is truncated inside the record at byte {offset - 12}.")
    if masked_crc32c(data) != struct.unpack("<I", crc)[0]:
        raise DataError(f"{name}: the record at byte {offset - 12} is corrupt (data CRC "
                        "mismatch).")
    return data


def _messages():
    """Build Feature, Features, FeatureList, FeatureLists, Example and SequenceExample."""
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError as e:
        raise MissingDependencyError("protobuf", "data", "Reading TFRecord examples") from e
    F = descriptor_pb2.FieldDescriptorProto
    file = descriptor_pb2.FileDescriptorProto(name="robocache/tf_example.proto",
                                              package="robocache.tfexample", syntax="proto3")

    def message(name, *fields, nested=()):
        m = file.message_type.add(name=name)
        for nest in nested:
            m.nested_type.add().CopyFrom(nest)
        for number, fname, ftype, label, type_name, oneof in fields:
            field = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                field.type_name = type_name
            if oneof is not None:
                field.oneof_index = oneof
        return m

    rep, opt = F.LABEL_REPEATED, F.LABEL_OPTIONAL
    pkg = ".robocache.tfexample."

    def map_entry(name, value_type):
        entry = descriptor_pb2.DescriptorProto(name=name)
        entry.options.map_entry = True
        entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=opt)
        entry.field.add(name="value", number=2, type=F.TYPE_MESSAGE, label=opt,
                        type_name=pkg + value_type)
        return entry

    message("BytesList", (1, "value", F.TYPE_BYTES, rep, None, None))
    message("FloatList", (1, "value", F.TYPE_FLOAT, rep, None, None))
    message("Int64List", (1, "value", F.TYPE_INT64, rep, None, None))
    feature = message("Feature", (1, "bytes_list", F.TYPE_MESSAGE, opt, pkg + "BytesList", 0),
                      (2, "float_list", F.TYPE_MESSAGE, opt, pkg + "FloatList", 0),
                      (3, "int64_list", F.TYPE_MESSAGE, opt, pkg + "Int64List", 0))
    feature.oneof_decl.add(name="kind")
    message("Features", (1, "feature", F.TYPE_MESSAGE, rep, pkg + "Features.FeatureEntry", None),
            nested=[map_entry("FeatureEntry", "Feature")])
    message("FeatureList", (1, "feature", F.TYPE_MESSAGE, rep, pkg + "Feature", None))
    message("FeatureLists", (1, "feature_list", F.TYPE_MESSAGE, rep,
                             pkg + "FeatureLists.FeatureListEntry", None),
            nested=[map_entry("FeatureListEntry", "FeatureList")])
    message("Example", (1, "features", F.TYPE_MESSAGE, opt, pkg + "Features", None))
    message("SequenceExample", (1, "context", F.TYPE_MESSAGE, opt, pkg + "Features", None),
            (2, "feature_lists", F.TYPE_MESSAGE, opt, pkg + "FeatureLists", None))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(file)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(pkg[1:] + name))
            for name in ("Feature", "Example", "SequenceExample")}


_CLASSES: dict | None = None


def classes() -> dict:
    """The message classes (``Feature``, ``Example``, ``SequenceExample``), built once."""
    global _CLASSES
    if _CLASSES is None:
        _CLASSES = _messages()
    return _CLASSES


def feature_values(feature) -> np.ndarray | list[bytes]:
    """A ``Feature``'s values: float32 / int64 arrays, or a list of ``bytes``."""
    kind = feature.WhichOneof("kind")
    if kind == "float_list":
        return np.array(feature.float_list.value, np.float32)
    if kind == "int64_list":
        return np.array(feature.int64_list.value, np.int64)
    if kind == "bytes_list":
        return list(feature.bytes_list.value)
    return np.zeros(0, np.float32)  # an empty Feature: no values


def _parse(name: str, data: bytes):
    from google.protobuf.message import DecodeError

    message = classes()[name]()
    try:
        message.ParseFromString(data)
    except DecodeError as e:
        raise DataError(f"a record is not a tf.train.{name} ({e}).") from e
    return message


def parse_example(data: bytes) -> dict[str, np.ndarray | list[bytes]]:
    """Parse a serialized ``tf.train.Example`` into ``{key: values}``.

    Raises:
        DataError: the bytes are not an Example.
    """
    example = _parse("Example", data)
    return {k: feature_values(v) for k, v in example.features.feature.items()}


def parse_sequence_example(data: bytes) -> tuple[dict, dict]:
    """Parse a serialized ``tf.train.SequenceExample`` into ``(context, feature_lists)``:
    ``{key: values}`` and ``{key: [values per step]}``.

    Raises:
        DataError: the bytes are not a SequenceExample.
    """
    example = _parse("SequenceExample", data)
    context = {k: feature_values(v) for k, v in example.context.feature.items()}
    lists = {k: [feature_values(f) for f in v.feature]
             for k, v in example.feature_lists.feature_list.items()}
    return context, lists
