"""Video cameras kept as video: the source's encoded packets in the cache, decoded per batch.

With ``camera_codec="video"`` a video camera (a LeRobot video feature, any MP4/MKV camera a
reader meets) is not decoded at ingest: :func:`packet_table` demuxes the episode's span of
its file and stores every frame's packet unchanged, one row per frame in display order
(``frames/<camera>.lance``), beside what decoding needs:

- ``pts``, ``dts`` (int64, the file's time base): display and decode order;
- ``gop`` (int64): the frame number, within the episode, of the first frame of the frame's
  group of pictures (GOP): the keyframe a decoder starts from. A GOP here is closed: its
  packets, decoded from its keyframe, give all of its frames (an open GOP, whose leading
  frames refer to the GOP before, is joined to that one);
- ``codec``, ``extradata``: FFmpeg's decoder name and the stream's codec configuration
  (``avcC``/``hvcC``/``av1C``), on the episode's first row (null on the others).

An episode's span must be whole GOPs: its first frame a keyframe, and no frame of it needing
a packet outside it (LeRobot's recordings are: each episode is encoded on its own). A span
that is not is refused with the episode, camera and reason (the episode is quarantined); such
a camera is stored with ``camera_codec="jpeg"``.

Serving (:class:`VideoPackets`): a batch's frames are grouped by GOP; each GOP needed is read
once (its packets, by row address, as :class:`~robocache.data.frames.LanceFrames` reads
frames) and decoded once, on threads that each keep their decoder from GOP to GOP (FFmpeg
decodes without the GIL), and its frames are converted to RGB with the same FFmpeg
conversion the ingest of decoded frames uses, so a frame served from video is the frame
LeRobot's PyAV decode gives, bit for bit.
"""

from __future__ import annotations

import functools
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from robocache._optional import require
from robocache.errors import DataError

# packets read past the span's end before the frames in it are known (B-frames come out of
# order: a frame shown inside the span may follow, in the file, one shown after it)
REORDER_PACKETS = 32


def _av():
    return require("av", "video", "Reading video streams")


# ``packet_table`` reads an MP4's packets from its sample table (robocache.data.mp4) where
# the file's first packets agree with PyAV's demuxer; False: always through the demuxer
MP4_INDEX = True
# packets compared with PyAV's demuxer before a file's sample table is trusted
CHECKED_PACKETS = 2 * REORDER_PACKETS


def _indexed(path, container, stream):
    """``path``'s sample table (:func:`robocache.data.mp4.video_track`) when it describes
    the stream PyAV opened (same time base and packet count) and its first
    :data:`CHECKED_PACKETS` packets are PyAV's (times, keyframe flags, sizes); else ``None``
    (the caller demuxes). Moves ``container``'s read position."""
    from fractions import Fraction

    from robocache.data.mp4 import video_track

    # HEVC: FFmpeg's seek steps back past leading pictures (RASL) that this does not model
    track = video_track(path) if MP4_INDEX and stream.codec_context.name != "hevc" else None
    if track is None or stream.time_base != Fraction(1, track.timescale) or \
            stream.frames != len(track.pts):
        return None
    k = 0
    for packet in container.demux(stream):
        if k == CHECKED_PACKETS or k == len(track.pts):
            break
        if not packet.size:
            continue
        if (packet.pts, packet.dts, bool(packet.is_keyframe), packet.size) != (
                track.pts[k], track.dts[k], track.key[k], track.size[k]):
            return None
        k += 1
    return track


@dataclass(frozen=True)
class _Source:
    """What :func:`packet_table` needs of a video file beyond its packets."""

    codec: str  # FFmpeg's decoder name
    extradata: bytes  # the stream's codec configuration
    time_base: float  # seconds a tick of pts and dts
    rate: float | None  # FFmpeg's average frame rate
    size: tuple[int, int]  # height, width
    track: object  # robocache.data.mp4.Track, or None: demuxed by PyAV


@functools.lru_cache(maxsize=64)
def _source(path: str, size: int, mtime_ns: int, mp4: bool) -> _Source:
    """``path``'s :class:`_Source`, read once a process while the file is unchanged (a
    LeRobot v3.0 file holds many episodes); ``mp4``: its sample table where trusted."""
    with _av().open(path) as container:
        stream = container.streams.video[0]
        ctx = stream.codec_context
        return _Source(ctx.name, bytes(ctx.extradata or b""), float(stream.time_base),
                       float(stream.average_rate or 0) or None, (ctx.height, ctx.width),
                       _indexed(path, container, stream) if mp4 else None)


def _demuxed(container, stream, start_s: float, end_s: float, tolerance_s: float,
             tb: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[bytes]]:
    """Packets of ``stream`` from the keyframe before ``start_s`` (file seconds) to
    :data:`REORDER_PACKETS` past ``end_s``, by PyAV's demuxer: pts, dts, keyframe flags and
    bytes, in decode order."""
    pts, dts, keys, data = [], [], [], []
    if start_s > 0:
        container.seek(int(start_s / tb), stream=stream, backward=True)
    after = 0
    for packet in container.demux(stream):
        if packet.pts is None or not packet.size:
            continue
        if packet.pts * tb > end_s + tolerance_s:
            after += 1
            if after >= REORDER_PACKETS:
                break
        pts.append(packet.pts)
        dts.append(packet.dts if packet.dts is not None else packet.pts)
        keys.append(bool(packet.is_keyframe))
        data.append(bytes(packet))
    return (np.asarray(pts, np.int64), np.asarray(dts, np.int64), np.asarray(keys, bool),
            data)


def seeked(track, t_s: float, tb: float) -> int:
    """The packet (index into ``track``, a :class:`robocache.data.mp4.Track`) where FFmpeg's
    backward seek to ``t_s`` seconds lands in an MP4: the last keyframe whose ``seek_target``
    is at most the target (they never decrease); the first packet when none is."""
    k = np.searchsorted(track.keyframes, np.searchsorted(
        track.seek_target, int(t_s / tb), side="right")) - 1
    return int(track.keyframes[k]) if k >= 0 else 0


def source(path) -> _Source:
    """What ingest reads of the video file ``path`` besides its packets (codec, time base,
    frame rate, size, and the MP4 sample table where trusted), once a process while the file
    is unchanged.

    Raises:
        OSError, av.error.FFmpegError: the file is missing or unreadable.
    """
    st = os.stat(path)
    return _source(os.fspath(path), st.st_size, st.st_mtime_ns, MP4_INDEX)


def _span(track, start_s: float, end_s: float, tolerance_s: float, tb: float) -> np.ndarray:
    """The packets :func:`_demuxed` gives for the same span, as indices into ``track``: from
    where FFmpeg's backward seek in an MP4 lands for ``start_s`` (``track.seek_target``) to
    :data:`REORDER_PACKETS` past ``end_s``."""
    n = len(track.pts)
    first = seeked(track, start_s, tb) if start_s > 0 else 0
    # a packet decoded after end_s is shown after it too (pts >= dts): the REORDER_PACKETS-th
    # late packet is at most that many past the first of those, unless empty packets intervene
    end = int(np.searchsorted(track.dts, int((end_s + tolerance_s) / tb) + 1))
    for upper in (min(n, end + REORDER_PACKETS + 1), n):
        pick = np.arange(first, upper)
        pick = pick[track.size[pick] > 0]
        late = track.pts[pick] * tb > end_s + tolerance_s
        stop = np.flatnonzero(late & (np.cumsum(late) >= REORDER_PACKETS))
        if len(stop) or upper == n:
            break
    return pick[:stop[0]] if len(stop) else pick


def packet_table(episode: int, path, start_s: float, end_s: float, tolerance_s: float,
                 shape: tuple[int, ...], where: str):
    """The frames table of the video ``path``'s span ``[start_s, end_s]`` (file seconds) kept as
    its packets (see the module docstring), and the frames' file seconds and frame numbers
    (as :func:`robocache.data.cameras.video_frames` gives them for the decoded path).

    Raises:
        DataError: the file is missing, unreadable or truncated, its frames are not of
            ``shape``, or the span is not whole GOPs (``where`` names the stream).
    """
    from robocache.data.cameras import _check_shape, _check_span, _frame_numbers

    pa = require("pyarrow", "data", "Arrow tables")
    av = _av()
    try:
        src = source(path)
        _check_shape((*src.size, 3), shape, where)
        codec, extradata, tb, rate, track = (src.codec, src.extradata, src.time_base,
                                             src.rate, src.track)
        if track is None:
            with av.open(str(path)) as container:
                pts_a, dts_a, keys_a, data = _demuxed(container, container.streams.video[0],
                                                      start_s, end_s, tolerance_s, tb)
        else:  # the same packets from the file's sample table
            pick = _span(track, start_s, end_s, tolerance_s, tb)
            pts_a, dts_a, keys_a = track.pts[pick], track.dts[pick], track.key[pick]
    except (av.error.FFmpegError, OSError, IndexError) as e:
        raise DataError(f"video {path}: cannot read ({type(e).__name__}: {e}).") from e
    t_all = pts_a * tb
    inside = (t_all >= start_s - tolerance_s) & (t_all <= end_s + tolerance_s)
    gop = _closed_gops(pts_a, keys_a)
    _check_whole(gop, inside, keys_a, where)
    order = np.flatnonzero(inside)[np.argsort(pts_a[inside], kind="stable")]
    times = (pts_a[order] * tb).tolist()
    past = t_all[t_all > end_s + tolerance_s]
    _check_span(path, times, end_s, tolerance_s, rate, float(past.min()) if len(past) else None)
    n = len(order)
    if track is None:
        encoded = pa.array([data[i] for i in order], pa.binary())
    else:
        try:
            buf, offsets = track.read(path, pick[order])
        except OSError as e:
            raise DataError(f"video {path}: cannot read ({type(e).__name__}: {e}).") from e
        encoded = pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(
            offsets.astype(np.int32)), pa.py_buffer(buf)])
    # each frame's GOP as the frame number of its first (display-order) frame
    first = np.full(gop.max() + 1 if len(gop) else 0, np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first, gop[order], np.arange(n))
    head = [None] * n
    configs = [None] * n
    if n:
        head[0], configs[0] = codec, extradata
    t = np.asarray(times, np.float64)
    table = pa.table({
        "episode_index": np.full(n, episode, np.int64), "frame": np.arange(n, dtype=np.int64),
        "source_frame": _frame_numbers(t, rate), "timestamp": t,
        "encoded": encoded, "pts": pts_a[order], "dts": dts_a[order],
        "gop": first[gop[order]], "codec": pa.array(head, pa.string()),
        "extradata": pa.array(configs, pa.binary())})
    return table, t, _frame_numbers(t, rate)


# raw frames (a camera whose source holds pixels) kept as video: H.264, yuv420p (what NVDEC
# decodes), a keyframe every 2 frames (LeRobot's recording GOP), CRF 18; "veryfast": x264
# encodes 480x640 frames at ~100/s a core where its default preset gives ~30
RAW_CODEC, RAW_OPTIONS = "libx264", {"g": "2", "crf": "18", "preset": "veryfast"}
RAW_ENCODER = "h264 yuv420p crf 18, keyframe every 2 frames"


def encoded_table(episode: int, frames: np.ndarray, times: np.ndarray, source: np.ndarray,
                  rate_hz: float | None, where: str):
    """The frames table of raw RGB frames (uint8 ``[N, H, W, 3]``, ``times`` and ``source``
    frame numbers ``[N]``) kept as video: encoded once (:data:`RAW_ENCODER`) into a
    temporary mp4, then stored as :func:`packet_table` stores a source's video, each frame's
    row with its own time and source frame number.

    Raises:
        DataError: the encoder refuses the frames, or they do not come back one packet each.
    """
    import os
    import tempfile

    from robocache.data.cameras import write_video

    fps = float(rate_hz) if rate_hz else 30.0
    n = len(frames)
    fd, path = tempfile.mkstemp(suffix=".mp4", prefix="robocache-raw-")
    os.close(fd)
    try:
        write_video(path, frames, fps, RAW_CODEC, RAW_OPTIONS)
        table, _, _ = packet_table(episode, path, 0.0, (n - 1) / fps, 0.25 / fps,
                                   tuple(frames.shape[1:]), where)
    finally:
        os.unlink(path)
    if table.num_rows != n:
        raise DataError(f"{where}: {n} frames encoded to {table.num_rows} packets; store the "
                        "camera with --camera-codec jpeg.")
    pa = require("pyarrow", "data", "Arrow tables")
    names = table.column_names
    table = table.set_column(names.index("timestamp"), "timestamp",
                             pa.array(np.asarray(times, np.float64)))
    return table.set_column(names.index("source_frame"), "source_frame",
                            pa.array(np.asarray(source, np.int64)))


def _closed_gops(pts: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Each packet's GOP (decode order in, a GOP number out): a GOP starts at a keyframe, and
    one with a packet shown before its keyframe (an open GOP's leading frames) is joined to
    the GOP before it."""
    gop = np.maximum(np.cumsum(keys) - 1, 0)
    while len(gop):
        key_pts = np.full(gop.max() + 1, np.iinfo(np.int64).max, np.int64)
        np.minimum.at(key_pts, gop[keys], pts[keys])
        key_pts[0] = min(key_pts[0], pts[0])
        open_ = np.unique(gop[pts < key_pts[gop]])
        open_ = open_[open_ > 0]
        if not len(open_):
            break
        merged = np.zeros(gop.max() + 1, bool)
        merged[open_] = True
        gop = np.cumsum(~merged)[gop] - 1
    return gop


def _check_whole(gop: np.ndarray, inside: np.ndarray, keys: np.ndarray, where: str) -> None:
    """The span's packets (``inside``) are whole GOPs: each GOP it touches starts inside it,
    and a packet of such a GOP outside it comes after (decode order) all of the GOP's packets
    inside it.

    Raises:
        DataError: naming the reason.
    """
    if not inside.any():
        return
    at = np.arange(len(gop))  # GOP numbers are 0.. in decode order (each GOP's packets together)
    groups = int(gop.max()) + 1
    first = np.searchsorted(gop, np.arange(groups))
    touched = np.zeros(groups, bool)
    touched[gop[inside]] = True
    starts_inside = touched & ~(inside[first] & keys[first])
    last_inside = np.full(groups, -1, np.int64)
    np.maximum.at(last_inside, gop[inside], at[inside])
    crosses = np.zeros(groups, bool)
    crosses[gop[touched[gop] & ~inside & (at < last_inside[gop])]] = True
    bad = np.flatnonzero(starts_inside | crosses)
    if not len(bad):
        return
    if starts_inside[bad[0]]:  # the first GOP at fault, its first fault
        raise DataError(f"{where}: its span of the video starts inside a group of "
                        "pictures (its first frame is not a keyframe), so it cannot be "
                        "kept as video; ingest with --camera-codec jpeg.")
    raise DataError(f"{where}: frames of its span of the video need packets shown "
                    "after it (a group of pictures crosses its end), so it cannot be "
                    "kept as video; ingest with --camera-codec jpeg.")


@dataclass
class VideoPackets:
    """The packets of the GOPs a batch's frames need, read, and those frames: what
    :meth:`~robocache.data.frames.VideoFrames.read` returns; :meth:`decode` decodes them.

    ``data``/``offsets``: the GOPs' packets packed (``offsets`` int64 ``[P + 1]``), in display
    order, GOP after GOP; ``pts``, ``dts`` int64 ``[P]``; ``gop_starts`` int64 ``[G + 1]``:
    where each GOP's packets start; ``configs``: each GOP's ``(codec, extradata)``;
    ``wanted`` int64 ``[N]``: the packet index of each frame asked for (in the order the read
    renumbered them); ``where(i)`` names frame ``i`` in messages."""

    data: torch.Tensor
    offsets: np.ndarray
    pts: np.ndarray
    dts: np.ndarray
    gop_starts: np.ndarray
    configs: list[tuple[str, bytes]]
    wanted: np.ndarray
    frame_shape: tuple[int, ...]
    dtype: str = "uint8"
    codec: str = "video"
    where: object = None

    @property
    def channels(self) -> int:
        return 3

    def __len__(self) -> int:
        return len(self.wanted)

    def read(self, rows: torch.Tensor) -> tuple[VideoPackets, torch.Tensor]:
        """The packets ``rows`` need: already read, ``(self, rows)`` (as an in-memory store
        answers, for a batch read ahead)."""
        return self, rows

    def decode(self, rows: torch.Tensor, device: torch.device | str = "cpu") -> torch.Tensor:
        """Frames ``rows`` (int ``[N]``, indices into the frames asked for) decoded: uint8
        ``[N, 3, H, W]`` on ``device``; see :func:`decode_packs`.

        Raises:
            DataError: a packet fails to decode, or a frame is not among what its GOP's
                packets decode to (a damaged cache), naming the frame.
        """
        return decode_packs([(self, rows)], device)[0]

    def _name(self, i: int) -> str:
        return self.where(i) if callable(self.where) else f"frame {i}"

    def _decode_gop(self, g: int, wanted: set[int] | None, decoders: dict) -> dict:
        """GOP ``g``'s packets decoded in decode order from its keyframe: ``{pts: uint8
        [H, W, 3]}`` of the frames ``wanted`` (display timestamps; None: the first frame that
        comes out, as PyAV's frame). ``decoders``: (codec, extradata) -> (decoder, RGB
        converter), reused (flushed after each GOP) and filled here."""
        av = _av()
        from av.video.reformatter import VideoReformatter

        a, b = int(self.gop_starts[g]), int(self.gop_starts[g + 1])
        codec, extradata = self.configs[g]
        if (codec, extradata) not in decoders:
            ctx = av.CodecContext.create(codec, "r")
            if extradata:
                ctx.extradata = extradata
            ctx.thread_count = 1  # the GOPs of a batch are decoded on several threads
            decoders[codec, extradata] = (ctx, VideoReformatter())
        ctx, rgb = decoders[codec, extradata]
        got: dict = {}
        raw = self.data.numpy()

        def keep(frames) -> None:
            for f in frames:
                if wanted is None:
                    got.setdefault(None, f)
                elif f.pts in wanted:
                    got[f.pts] = rgb.reformat(f, format="rgb24").to_ndarray()

        try:
            for p in (a + np.argsort(self.dts[a:b], kind="stable")).tolist():
                packet = av.Packet(raw[self.offsets[p]:self.offsets[p + 1]].tobytes())
                packet.pts, packet.dts = int(self.pts[p]), int(self.dts[p])
                keep(ctx.decode(packet))
                if wanted is None and got:
                    break
            keep(ctx.decode(None))
            ctx.flush_buffers()  # ready for the next GOP
        except av.error.FFmpegError as e:
            decoders.pop((codec, extradata), None)
            first = int(np.flatnonzero(np.isin(self.pts[a:b], list(wanted)))[0]) \
                if wanted else 0
            raise DataError(f"a {codec} packet of the group of pictures holding "
                            f"{self._gop_name(g, first)} does not decode ({e}); the cache is "
                            "damaged: rebuild it with `robocache ingest SOURCE DEST "
                            "--overwrite`.") from e
        return got

    def _first_frame(self, g: int):
        """GOP ``g``'s first decoded frame, as PyAV gives it (its format and colour
        description)."""
        return self._decode_gop(g, None, {}).get(None)

    def _gop_name(self, g: int, at: int) -> str:
        packet = int(self.gop_starts[g]) + at
        hit = np.flatnonzero(self.wanted == packet)
        return self._name(int(hit[0])) if len(hit) else f"packet {packet}"


def decode_packs(packs: list[tuple[VideoPackets, torch.Tensor]],
                 device: torch.device | str = "cpu") -> list[torch.Tensor]:
    """Several cameras' frames decoded together: for each ``(packets, rows)`` (``rows`` int
    ``[N]``, indices into the frames ``packets`` was read for), uint8 ``[N, 3, H, W]`` on
    ``device``. Each GOP the frames need is decoded once, the GOPs of every camera at once:
    on a CUDA ``device`` by NVDEC where it decodes the stream (H.264 and HEVC, 8-bit 4:2:0:
    :mod:`robocache.data.nvdec_packets`; the same pixels as the CPU's), else, and for a GOP
    NVDEC fails on, on CPU threads, each task keeping its decoders from GOP to GOP for the
    call.

    Raises:
        DataError: a packet fails to decode, or a frame is not among what its GOP's packets
            decode to (a damaged cache), naming the frame.
    """
    from robocache.data import nvdec_packets as nvdec
    from robocache.data.cameras import _threads, nvdec_available
    from robocache.observability import metrics

    device = torch.device(device)
    gpu = device.type == "cuda" and nvdec.ENABLED and nvdec_available()
    cpu_jobs, gpu_jobs = [], []
    stages: list = [None] * len(packs)
    coeffs: list = [None] * len(packs)
    for k, (pack, rows) in enumerate(packs):
        packets = pack.wanted[rows.cpu().numpy()]
        gop = np.searchsorted(pack.gop_starts, packets, side="right") - 1
        for g in np.unique(gop).tolist():
            mine = np.flatnonzero(gop == g)
            colour = _nvdec_colour(pack, g) if gpu else None
            if colour is None:
                cpu_jobs.append((k, g, mine, packets[mine]))
                continue
            if stages[k] is None:
                h, w = pack.frame_shape[:2]
                stages[k] = torch.empty(len(packets), h * w * 3 // 2, dtype=torch.uint8,
                                        device=device)
                coeffs[k] = torch.zeros(len(packets), 6, dtype=torch.int32)
            coeffs[k][mine] = torch.tensor(colour, dtype=torch.int32)
            gpu_jobs.append((k, g, mine, packets[mine]))
    host: list = [None] * len(packs)

    def on_cpu(jobs: list) -> None:
        decoders: dict = {}  # this task's, reused from GOP to GOP
        for k, g, mine, wanted in jobs:
            pack = packs[k][0]
            got = pack._decode_gop(g, set(pack.pts[wanted].tolist()), decoders)
            for i, p in zip(mine.tolist(), wanted.tolist(), strict=True):
                frame = got.get(int(pack.pts[p]))
                if frame is None:
                    raise DataError(f"{pack._name(int(packs[k][1][i]))}: its packets do not "
                                    "decode to it (a damaged cache); rebuild the cache with "
                                    "`robocache ingest SOURCE DEST --overwrite`.")
                host[k][i] = frame

    streams: set = set()
    failed: list = []

    def on_gpu(jobs: list) -> None:
        failed.extend(nvdec.decode_gops(
            [(packs[k][0], g, dict(zip(wanted.tolist(), mine.tolist(), strict=True)), stages[k],
              (k, g, mine, wanted)) for k, g, mine, wanted in jobs],
            device.index if device.index is not None else torch.cuda.current_device(),
            streams))

    def allocate(jobs: list) -> None:
        for k, *_ in jobs:
            if host[k] is None:
                h, w = packs[k][0].frame_shape[:2]
                host[k] = np.empty((len(packs[k][1]), h, w, 3), np.uint8)

    def run(work: list) -> None:
        if len(work) > 1:
            with ThreadPoolExecutor(len(work)) as pool:
                for future in [pool.submit(f, part) for f, part in work]:
                    future.result()
        elif work:
            work[0][0](work[0][1])

    # the GOPs in one task per thread: a decoder opened once a task, not once a GOP (a
    # two-frame AV1 GOP at 480x640: 10.0 against 18.6 ms on one core of the development VM);
    # the threads end with the call (a process forked later inherits none)
    allocate(cpu_jobs)
    n_cpu, n_gpu = min(_threads(), len(cpu_jobs)), min(nvdec.THREADS, len(gpu_jobs))
    run([(on_cpu, cpu_jobs[i::n_cpu]) for i in range(n_cpu)] +
        [(on_gpu, gpu_jobs[i::n_gpu]) for i in range(n_gpu)])
    retried = list(failed)  # the GOPs NVDEC failed on, on the CPU
    allocate(retried)
    n_cpu = min(_threads(), len(retried))
    run([(on_cpu, retried[i::n_cpu]) for i in range(n_cpu)])
    cpu_jobs += retried
    metrics.count_frames("cpu", sum(len(job[2]) for job in cpu_jobs))
    metrics.count_frames("nvdec", sum(len(job[2]) for job in gpu_jobs) -
                         sum(len(job[2]) for job in retried))
    out = []
    for k, (pack, _) in enumerate(packs):
        h, w = pack.frame_shape[:2]
        if stages[k] is None:
            out.append(torch.from_numpy(host[k] if host[k] is not None else
                                        np.empty((0, h, w, 3), np.uint8)
                                        ).permute(0, 3, 1, 2).to(device))
            continue
        from robocache.kernels.yuv import nv12_to_rgb

        current = torch.cuda.current_stream(device)
        for stream in streams:
            current.wait_stream(stream)
        rgb = nv12_to_rgb(stages[k], h, w, coeffs[k].to(device))
        on_host = [job[2] for job in cpu_jobs if job[0] == k]
        if on_host:  # the GOPs NVDEC did not decode
            at = np.concatenate(on_host)
            rgb[torch.from_numpy(at).to(device)] = torch.from_numpy(
                host[k][at]).permute(0, 3, 1, 2).to(device)
        out.append(rgb)
    return out


_colours: dict[tuple[str, bytes], tuple | None] = {}


def _nvdec_colour(pack: VideoPackets, g: int) -> tuple | None:
    """The swscale coefficients (:func:`robocache.reference.yuv.coefficients`) of the matrix
    and range of GOP ``g``'s stream when NVDEC decodes it to what the CPU path gives, else
    None (warned once per codec and pixel format). Known per stream configuration: its first
    GOP seen is decoded once on the CPU for its first frame's colour description."""
    from robocache.data import nvdec_packets as nvdec
    from robocache.data.cameras import _warn_once
    from robocache.reference.yuv import coefficients

    key = pack.configs[g]
    if key in _colours:
        return _colours[key]
    codec = key[0]
    h, w = pack.frame_shape[:2]
    colour = None
    if codec not in nvdec.CODECS:
        _warn_once(f"nvdec-{codec}", f"{codec} video is decoded on the CPU: NVDEC decodes "
                   "H.264 and HEVC here (AV1 is not decodable by the NVDEC of Hopper GPUs).")
    else:
        frame = pack._first_frame(g)
        fmt = frame.format.name if frame is not None else "no frame"
        if frame is not None and fmt in ("yuv420p", "yuvj420p") and h % 2 == 0 and w % 2 == 0:
            colour = coefficients(frame.colorspace,
                                  fmt == "yuvj420p" or frame.color_range == 2)
        else:
            _warn_once(f"nvdec-{codec}-{fmt}", f"{codec} video in {fmt} at {h}x{w} is decoded "
                       "on the CPU: NVDEC decoding here is for 8-bit 4:2:0 of even sizes.")
    _colours[key] = colour
    return colour


#: The columns :func:`episode_packets` needs.
PACKET_COLUMNS = ["encoded", "pts", "dts", "gop", "codec", "extradata"]


def episode_packets(rows, wanted: np.ndarray, frame_shape: tuple[int, ...],
                    configs: dict[int, tuple[str, bytes]] | None = None) -> VideoPackets:
    """An episode's frames table rows (an Arrow table of :data:`PACKET_COLUMNS`, frames
    ``0..n-1`` in order) as :class:`VideoPackets` of the frames ``wanted`` (int ``[N]``).

    With ``configs`` the rows may hold whole GOPs of several episodes, in (episode, frame)
    order, with an ``episode_index`` column: each GOP decodes with its episode's ``(codec,
    extradata)``, from ``configs`` (episode -> config) where the episode's first row is not
    among ``rows``; ``configs`` gets the configs of those whose first row is.
    """
    from robocache.data.frames import EncodedFrames

    enc = EncodedFrames.from_table(rows, frame_shape, "uint8", "video")
    gop = rows.column("gop").to_numpy()
    if configs is None:
        episode, configs = np.zeros(len(gop), np.int64), {}
    else:
        episode = rows.column("episode_index").to_numpy()
    codec, extradata = rows.column("codec"), rows.column("extradata")
    for i in np.flatnonzero(codec.is_valid().to_numpy(zero_copy_only=False)).tolist():
        configs[int(episode[i])] = (codec[i].as_py(), extradata[i].as_py() or b"")
    first = np.ones(len(gop), bool)  # each GOP's first row
    first[1:] = (episode[1:] != episode[:-1]) | (gop[1:] != gop[:-1])
    starts = np.flatnonzero(first)
    lacking = sorted({int(e) for e in episode[starts]} - set(configs))
    if lacking:
        raise DataError(f"episode {lacking[0]}: its video's first frame (which holds the "
                        "decoder's settings) is missing from the frames table (a damaged "
                        "cache); rebuild it with `robocache ingest SOURCE DEST --overwrite`.")
    return VideoPackets(enc.data, enc.offsets.numpy(), rows.column("pts").to_numpy(),
                        rows.column("dts").to_numpy(), np.r_[starts, len(gop)],
                        [configs[int(episode[a])] for a in starts.tolist()],
                        np.asarray(wanted, np.int64), tuple(frame_shape))
