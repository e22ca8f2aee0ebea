"""Optional frame decoding for video streams: only the frames a sample needs.

Uses torchcodec when installed, else PyAV; neither is a core dependency.
"""

from __future__ import annotations

import numpy as np

from robocache.data.episode import VideoRef
from robocache.errors import MissingDependencyError


def decode_frames(ref: VideoRef, times: np.ndarray) -> np.ndarray:
    """Decode the frames shown at ``times`` (seconds from the episode start).

    Args:
        ref: the video file and the episode's offset inside it.
        times: float ``[K]`` seconds relative to the episode start.

    Returns:
        uint8 ``[K, H, W, 3]`` frames.

    Raises:
        MissingDependencyError: neither torchcodec nor PyAV is installed.
    """
    at = (np.asarray(times, np.float64) + ref.from_timestamp).tolist()
    try:
        from torchcodec.decoders import VideoDecoder
    except ImportError:
        VideoDecoder = None
    if VideoDecoder is not None:
        frames = VideoDecoder(str(ref.path)).get_frames_played_at(seconds=at).data  # [K,C,H,W]
        return frames.permute(0, 2, 3, 1).numpy()
    try:
        import av
    except ImportError as e:
        raise MissingDependencyError("torchcodec or av", "video", "Decoding video frames") from e
    out = []
    with av.open(str(ref.path)) as container:
        stream = container.streams.video[0]
        for t in at:
            container.seek(int(t / stream.time_base), stream=stream, backward=True)
            frame = None
            for candidate in container.decode(stream):
                if candidate.time is not None and candidate.time > t + 1e-6:
                    break
                frame = candidate
            out.append(frame.to_ndarray(format="rgb24"))
    return np.stack(out)
