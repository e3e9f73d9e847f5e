"""Encoded bytes to frames with PyAV, within the limits, whole or not at all.

What is decoded and how: the container is recognised from its bytes
(``_container.py``) and opened from memory; the first video stream that is not a cover
picture is decoded, every frame, each converted with ``frame.to_ndarray(format="rgb24")``
(FFmpeg's swscale): the decoding transformers' ``"pyav"`` video backend does, so the
pixels are the ones its processors see. Other streams (audio, subtitles) are skipped
without being decoded. The frame rate is the stream's ``average_rate``.

Rotation metadata (a phone's display matrix) is *not* applied: frames are returned as
stored, as transformers' backend returns them. (OpenCV, which vLLM reads videos with,
may rotate them by default; a rotated clip can then differ between the two.)

Limits, as early as the data allows:

- ``max_bytes`` before FFmpeg sees a byte;
- from the header: frame size, the stated frame count (MP4's sample count) and the
  stated duration (the video stream's, else the container's);
- while decoding, frame by frame, before a frame is stored: the count, the decoded
  bytes, the frame size (a resolution change mid-stream is refused: the frames would
  not stack), and the duration by timestamps and by count / frame rate.

Whole or not at all: FFmpeg errors while demuxing or decoding, a packet or frame
FFmpeg flags as corrupt, zero frames, or frames that stop short of the duration the
header states (a truncated WebM decodes without an error otherwise) are a
``VideoDecodeError``. Corruption a codec cannot detect (VP8/VP9 carry no checksums)
decodes to whatever the bytes say; that cannot be helped.

Memory: the output array is allocated once the first frame's size is known, sized by
the stated frame count when there is one, else grown by doubling (``ndarray.resize``,
in place where the allocator can), never past what the limits allow, and trimmed at
the end. One decoded RGB frame is held besides it.
"""

from __future__ import annotations

import io
import math
import re
from typing import Any

import numpy as np

from vf_mm.errors import MissingDependencyError, VideoDecodeError, VideoTooLargeError
from vf_mm.videos._container import Container, sniff_container
from vf_mm.videos._limits import (
    VideoLimits,
    check_duration,
    check_frame_count,
    check_frame_size,
)

__all__ = ["decode_video"]

_INITIAL_CAPACITY = 32
_MATROSKA_DURATION = re.compile(r"^(\d+):(\d{2}):(\d{2}(?:\.\d+)?)$")
#: Frames may end this many frame intervals before the stated duration (rounding in
#: the container's timestamps); a whole missing frame is more than that.
_TRUNCATION_SLACK = 0.5


def _av() -> Any:
    try:
        import av
    except ImportError as exc:
        raise MissingDependencyError(
            "decoding videos needs PyAV: pip install 'av>=14' (vf_mm's dependencies list it)"
        ) from exc
    return av


def _ffmpeg_reason(exc: Exception) -> str:
    """FFmpeg's message without PyAV's ``'<none>'`` file name."""
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def _stated_duration(container: Any, stream: Any) -> tuple[float | None, bool]:
    """``(seconds, of_the_video)``: the duration the header states, and whether it is the
    video stream's own (the stream's duration, Matroska's per-track ``DURATION`` tag, or
    the container's when the video is its only stream) rather than the whole container's
    (which may be an audio track's, longer than the video)."""
    if stream.duration is not None and stream.time_base is not None and stream.duration > 0:
        return float(stream.duration * stream.time_base), True
    tag = (stream.metadata or {}).get("DURATION")
    match = _MATROSKA_DURATION.match(tag.strip()) if isinstance(tag, str) else None
    if match:
        hours, minutes, seconds = match.groups()
        return int(hours) * 3600 + int(minutes) * 60 + float(seconds), True
    if container.duration is not None and container.duration > 0:
        return container.duration / 1_000_000, len(container.streams) == 1
    return None, False


def _video_stream(container: Any, av: Any) -> Any:
    """The first video stream that is not an attached (cover) picture."""
    attached = av.stream.Disposition.attached_pic
    for stream in container.streams.video:
        if not stream.disposition & attached:
            return stream
    kinds = sorted({s.type for s in container.streams})
    if container.streams.video:
        raise VideoDecodeError("no video stream: its only video is a cover picture")
    raise VideoDecodeError(
        "no video stream" + (f" (the file holds {', '.join(kinds)} only)" if kinds else "")
    )


def decode_video(
    data: bytes | bytearray | memoryview, limits: VideoLimits
) -> tuple[np.ndarray, float | None]:
    """``(frames, fps)``: every frame of the first video stream as a new C-contiguous
    ``(T, H, W, 3)`` uint8 array, and the stream's average frame rate (``None`` when the
    container states none). Raises ``VideoTooLargeError`` or ``VideoDecodeError``."""
    size = memoryview(data).nbytes
    if size > limits.max_bytes:
        raise VideoTooLargeError(f"{size} bytes, over max_bytes={limits.max_bytes}")
    container_kind = sniff_container(data)
    av = _av()
    try:
        container = av.open(io.BytesIO(data), mode="r", format=container_kind.demuxer)
    except av.FFmpegError as exc:
        raise VideoDecodeError(
            f"not a readable {container_kind.label} file ({_ffmpeg_reason(exc)})"
        ) from None
    with container:
        return _decode(container, _video_stream(container, av), container_kind, limits, av)


def _decode(
    container: Any, stream: Any, kind: Container, limits: VideoLimits, av: Any
) -> tuple[np.ndarray, float | None]:
    rate = stream.average_rate
    fps = float(rate) if rate is not None and rate > 0 else None
    if fps is not None and not math.isfinite(fps):
        fps = None
    width, height = stream.codec_context.width, stream.codec_context.height
    if width and height:
        check_frame_size(width, height, limits)
    stated, own = _stated_duration(container, stream)
    if stated is not None:
        check_duration(stated, limits, how="the header states")
    stated_count = stream.frames if stream.frames and stream.frames > 0 else None
    if stated_count is not None and width and height:
        check_frame_count(stated_count, width * height * 3, limits, stated="the header states")

    time_base = stream.time_base
    start = (
        float(stream.start_time * time_base)
        if stream.start_time is not None and time_base is not None
        else None
    )
    buffer: np.ndarray | None = None
    count = 0
    end = None  # seconds after start where the last decoded frame ends
    length = None  # the last decoded frame's duration in seconds
    try:
        for packet in container.demux(stream):
            if packet.is_corrupt:
                raise VideoDecodeError(
                    f"truncated or corrupt {kind.label} data: the packet after frame {count} "
                    "is incomplete"
                )
            for frame in packet.decode():
                if frame.is_corrupt:
                    raise VideoDecodeError(f"frame {count} is corrupt ({kind.label})")
                if buffer is None:
                    width, height = frame.width, frame.height
                    check_frame_size(width, height, limits)
                    capacity = _initial_capacity(stated_count, stated, fps, width, height, limits)
                    buffer = np.empty((capacity, height, width, 3), dtype=np.uint8)
                elif (frame.height, frame.width) != buffer.shape[1:3]:
                    raise VideoDecodeError(
                        f"frame {count} is {frame.width}x{frame.height} but earlier frames are "
                        f"{buffer.shape[2]}x{buffer.shape[1]}: a resolution change mid-stream "
                        "is not read"
                    )
                check_frame_count(count + 1, width * height * 3, limits)
                at = _seconds(frame.pts, frame.time_base or time_base)
                if at is not None:
                    if start is None:
                        start = at
                    check_duration(at - start, limits, how=f"frame {count}'s timestamp")
                if fps is not None:
                    check_duration(
                        (count + 1) / fps, limits, how=f"{count + 1} frames at {fps:g} fps"
                    )
                if count == buffer.shape[0]:
                    buffer = _grow(buffer, width * height * 3, limits)
                buffer[count] = frame.to_ndarray(format="rgb24")
                count += 1
                if at is not None and start is not None:
                    length = _seconds(frame.duration, frame.time_base or time_base)
                    if not length and fps is not None:
                        length = 1 / fps
                    end = at - start + (length or 0.0)
    except av.FFmpegError as exc:
        raise VideoDecodeError(
            f"corrupt or truncated {kind.label} data after {count} frames ({_ffmpeg_reason(exc)})"
        ) from None
    if buffer is None or count == 0:
        raise VideoDecodeError(f"the {kind.label} video stream holds no frames")
    if own and stated is not None and end is not None:
        _check_whole(stated, end, 1 / fps if fps is not None else length, count)
    if count != buffer.shape[0]:
        buffer.resize((count, *buffer.shape[1:]), refcheck=False)
    return buffer, fps


def _check_whole(stated: float, end: float, interval: float | None, count: int) -> None:
    """Refuse frames that end more than ``_TRUNCATION_SLACK`` frame intervals before the
    duration the header states for the video: the rest of the file is missing."""
    if interval and end < stated - _TRUNCATION_SLACK * interval:
        raise VideoDecodeError(
            f"truncated: the header states {stated:.3f} s but the frames stop at "
            f"{end:.3f} s ({count} frames)"
        )


def _seconds(value: int | None, time_base: Any) -> float | None:
    if value is None or time_base is None:
        return None
    return float(value * time_base)


def _initial_capacity(
    stated_count: int | None,
    stated: float | None,
    fps: float | None,
    width: int,
    height: int,
    limits: VideoLimits,
) -> int:
    """Frames to allocate before the first is stored: the stated count, else the stated
    duration times the rate, else a small start; never more than the limits allow."""
    if stated_count is not None:
        guess = stated_count
    elif stated is not None and fps is not None:
        guess = math.ceil(stated * fps) + 1
    else:
        guess = _INITIAL_CAPACITY
    allowed = min(limits.max_frames, limits.max_decoded_bytes // (width * height * 3))
    return max(1, min(guess, allowed))


def _grow(buffer: np.ndarray, frame_bytes: int, limits: VideoLimits) -> np.ndarray:
    """``buffer`` with room for more frames: double, up to what the limits allow (the
    caller has checked that one more frame is allowed, so there is room for one)."""
    allowed = min(limits.max_frames, limits.max_decoded_bytes // frame_bytes)
    capacity = min(max(2 * buffer.shape[0], 1), allowed)
    buffer.resize((capacity, *buffer.shape[1:]), refcheck=False)
    return buffer
