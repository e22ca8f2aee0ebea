"""NVDEC decoding of a batch's GOPs kept as video (:mod:`robocache.data.video_store`).

Each GOP's packets, in decode order, go to an NVDEC decoder through PyNvVideoCodec's
``PacketData`` (no container, no demuxer): H.264 and HEVC packets as MP4 stores them (NAL
units with length prefixes, parameter sets in the ``avcC``/``hvcC`` configuration) are
rewritten as an Annex B byte stream with the parameter sets before each GOP's keyframe.
Every packet's ``pts`` numbers its frame in display order, so each decoded frame names the
frame it is. A GOP is closed, so the GOPs of a batch go through one decoder one after the
other as one stream, each ended by an end-of-sequence NAL unit. The decoded NV12 frames that
were asked for are copied into one staging tensor on the decoder's own CUDA stream (waited
for before the decoder reuses its output memory), and converted to RGB in one launch with
the arithmetic of FFmpeg's swscale, so that a frame decoded here equals the CPU path's (PyAV
decode, then swscale) bit for bit: NVDEC's YUV output is the codec's reconstruction, which
every conforming decoder gives exactly, and the conversion is
:mod:`robocache.reference.yuv`'s.

Several decoders run at once on threads (one per task; a task decodes its share of the GOPs
one after the other): four decoders on an H200 decode 480x640 H.264 front to back at 6,107
frames/s (benchmarks/results/video-nvdec-h200-2026-12-02.json). Decoders live on in the
process that made them, one pool per GPU and codec.

Only H.264 and HEVC, 8-bit 4:2:0, even sizes go to NVDEC (the combinations tested exact);
AV1 (LeRobot's default codec) is not decodable by the NVDEC of Hopper GPUs (H100/H200,
``Codec not supported on this GPU``), so it, and any other stream, is decoded on the CPU,
with one warning naming the codec.
"""

from __future__ import annotations

import functools
import os
import threading

import numpy as np
import torch

# FFmpeg's decoder name -> PyNvVideoCodec's codec
CODECS = {"h264": "H264", "hevc": "HEVC"}
# decoders working at once for one batch (on an H200, 480x640 H.264 windows: 4 decoders
# 2,743 distinct frames/s against 8 decoders' 2,465 in the same run;
# benchmarks/results/nvdec-serve-variants-h200-2026-12-02.json)
THREADS = 4
#: Whether a batch served on a CUDA device decodes its H.264/HEVC GOPs with NVDEC (True, the
#: default, where PyNvVideoCodec is installed) or on CPU threads (False: the same pixels; for
#: comparing the two, or a host whose CPU cores are free and faster than its NVDEC engines).
ENABLED = True
_START = b"\0\0\0\1"


@functools.cache
def annexb_header(codec: str, extradata: bytes) -> tuple[bytes, int]:
    """The parameter sets of an H.264 ``avcC`` / HEVC ``hvcC`` configuration as Annex B NAL
    units, and the byte length of the packets' NAL size prefixes (0: the packets are Annex B
    already, the configuration too or empty)."""
    if not extradata or extradata[:3] == b"\0\0\1" or extradata[:4] == _START:
        return extradata, 0
    nals = []
    if codec == "h264":
        size, at = (extradata[4] & 3) + 1, 6
        groups = [extradata[5] & 31]  # sequence parameter sets, then picture parameter sets
        for g in range(2):
            count = groups[0] if g == 0 else extradata[at - 1]
            for _ in range(count):
                n = int.from_bytes(extradata[at:at + 2], "big")
                nals.append(extradata[at + 2:at + 2 + n])
                at += 2 + n
            at += 1
    else:
        size, at = (extradata[21] & 3) + 1, 23
        for _ in range(extradata[22]):
            count = int.from_bytes(extradata[at + 1:at + 3], "big")
            at += 3
            for _ in range(count):
                n = int.from_bytes(extradata[at:at + 2], "big")
                nals.append(extradata[at + 2:at + 2 + n])
                at += 2 + n
    return b"".join(_START + nal for nal in nals), size


def annexb(packet: bytes, size: int) -> bytes:
    """A packet of NAL units with ``size``-byte length prefixes as Annex B (start codes)."""
    if not size:
        return packet
    out, at = [], 0
    while at + size <= len(packet):
        n = int.from_bytes(packet[at:at + size], "big")
        out.append(packet[at + size:at + size + n])
        at += size + n
    return b"".join(_START + nal for nal in out)


class Unsupported(Exception):
    """NVDEC here does not decode the stream (the codec, or a GOP it fails on)."""


_pools: dict[tuple, list] = {}
_lock = threading.Lock()


def _take(gpu: int, codec: str, size: tuple[int, int]):
    """A decoder (and the CUDA stream it works on) for ``codec`` streams of frames of
    ``size`` (height, width) on ``gpu`` from this process's pool, made when the pool is empty
    (a decoder made for smaller frames cannot take larger ones: NVDEC's ReconfigureDecoder
    fails, seen on an H200)."""
    key = (os.getpid(), gpu, codec, size)
    with _lock:
        pool = _pools.setdefault(key, [])
        if pool:
            return pool.pop()
    import PyNvVideoCodec as nvc

    stream = torch.cuda.Stream(device=gpu)
    decoder = nvc.CreateDecoder(gpuid=gpu, codec=getattr(nvc.cudaVideoCodec, CODECS[codec]),
                                cudacontext=0, cudastream=stream.cuda_stream,
                                usedevicememory=True)
    return decoder, stream


def _give(gpu: int, codec: str, size: tuple[int, int], item) -> None:
    with _lock:
        _pools.setdefault((os.getpid(), gpu, codec, size), []).append(item)


def decode_gops(jobs: list, gpu: int, streams: set) -> list:
    """Decode ``jobs`` on one decoder per codec and frame size, one GOP after the other. A job is
    ``(packets, gop, slots, stage, tag)``: a :class:`~robocache.data.video_store.VideoPackets`,
    a GOP of it, ``{packet index: row of stage}`` of the frames wanted, and the uint8 ``[N,
    H * W * 3 / 2]`` tensor on GPU ``gpu`` their NV12 bytes are copied into. Returns the
    ``tag`` of each job NVDEC failed on (for the CPU to decode), and adds the CUDA streams it
    used to ``streams``."""
    from robocache.data.cameras import _warn_once

    by_codec: dict[tuple[str, tuple[int, int]], list] = {}  # per codec and frame size
    for job in jobs:
        by_codec.setdefault((job[0].configs[job[1]][0], tuple(job[0].frame_shape[:2])),
                            []).append(job)
    failed = []
    for (codec, size), mine in by_codec.items():
        try:
            decoder, stream = _take(gpu, codec, size)
        except Exception as e:  # noqa: BLE001 - NVDEC's errors are untyped; the CPU decides
            failed += [job[-1] for job in mine]
            _warn_failed(_warn_once, codec, e)
            continue
        streams.add(stream)
        try:
            _decode_run(decoder, stream, mine)
        except Exception as e:  # noqa: BLE001
            failed += [job[-1] for job in mine]  # the decoder is not reused
            _warn_failed(_warn_once, codec, e)
        else:
            _give(gpu, codec, size, (decoder, stream))
    return failed


def _warn_failed(warn, codec: str, e: Exception) -> None:
    said = (str(e).strip().splitlines() or [""])[0]
    warn(f"nvdec-failed-{codec}", f"NVDEC failed on {codec} video ({type(e).__name__}: "
         f"{said}); such groups of pictures are decoded on the CPU.")


# an end-of-sequence NAL unit: the next picture starts a new coded video sequence
_END_OF_SEQUENCE = {"h264": _START + b"\x0a", "hevc": _START + b"\x48\x01"}


def _decode_run(decoder, stream, jobs: list) -> None:
    """Feed ``jobs``' GOPs (one codec) to ``decoder`` as one stream, each GOP ended by an
    end-of-sequence NAL unit (the next keyframe starts a new sequence), the run by NVDEC's
    end of stream (one wait for the last frames, not one per GOP: 2,465 against 1,635 frames/s
    with 8 decoders on an H200, nvdec-serve-variants-h200-2026-12-02.json); each packet's
    ``pts`` its frame's number in the run in display order, which the frame it decodes to
    carries back (NVDEC hands the decoded frames the packets' times sorted, so times in
    decode order would name B-frames wrongly)."""
    import PyNvVideoCodec as nvc

    wanted: dict[int, tuple[torch.Tensor, int]] = {}

    def keep(frames) -> None:
        copied = False
        for f in frames:
            slot = wanted.pop(int(f.getPTS()), None)
            if slot is not None:
                frame = torch.from_dlpack(f)
                stage, row = slot
                if frame.numel() != stage.shape[1]:  # a padded surface (tiny frames)
                    raise Unsupported(f"NV12 frames of shape {tuple(frame.shape)}")
                stage[row].copy_(frame.reshape(-1))
                copied = True
        if copied:  # the decoder writes its next frames into the same memory
            stream.synchronize()

    def end() -> None:
        packet = nvc.PacketData()
        packet.bsl, packet.decode_flag = 0, nvc.VideoPacketFlag.ENDOFSTREAM
        keep(decoder.Decode(packet))

    base = 0
    with torch.cuda.stream(stream):
        for packets, g, slots, stage, _ in jobs:
            a, b = int(packets.gop_starts[g]), int(packets.gop_starts[g + 1])
            codec, extradata = packets.configs[g]
            head, size = annexb_header(codec, extradata)
            raw = packets.data.numpy()
            order = (a + np.argsort(packets.dts[a:b], kind="stable")).tolist()
            for k, p in enumerate(order):
                pts = base + p - a  # in display order: NVDEC hands frames the sorted times
                unit = annexb(raw[packets.offsets[p]:packets.offsets[p + 1]].tobytes(), size)
                if k == 0:
                    unit = head + unit
                if k == len(order) - 1:
                    unit += _END_OF_SEQUENCE[codec]
                data = np.frombuffer(unit, np.uint8)
                row = slots.get(p)
                if row is not None:
                    wanted[pts] = (stage, row)
                packet = nvc.PacketData()
                packet.bsl_data, packet.bsl, packet.pts = data.ctypes.data, data.size, pts
                keep(decoder.Decode(packet))
            base += b - a
        end()
    if wanted:
        raise Unsupported(f"{len(wanted)} frames not decoded")
