"""``VideoLimits``: how much of a video ``load_video`` reads and decodes.

A video multiplies everything an image costs by its frame count, so the limits bound
each dimension separately *and* the decoded total: a short clip of huge frames and a
long clip of small ones are both refused before their memory is spent. Plain frozen
data (hashable, picklable, safe to share between threads and processes).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from vf_mm.errors import VideoTooLargeError

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_DECODED_BYTES",
    "DEFAULT_MAX_DURATION_S",
    "DEFAULT_MAX_FRAMES",
    "DEFAULT_MAX_PIXELS_PER_FRAME",
    "VideoLimits",
    "check_duration",
    "check_frame_count",
    "check_frame_size",
]

#: 256 MiB of encoded bytes (a file, a data: URL's payload, an HTTP body).
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
#: Decoded frames: 68 s at 30 fps. Models sample a few dozen frames of a clip; a
#: longer video is better cut (or sampled) before it enters a conversation.
DEFAULT_MAX_FRAMES = 2048
#: Ten minutes, by the container's metadata and by frames / frame rate.
DEFAULT_MAX_DURATION_S = 600.0
#: 16 Mi pixels (4096 x 4096): 4K UHD (3840 x 2160) fits, an 8K frame does not.
DEFAULT_MAX_PIXELS_PER_FRAME = 4096 * 4096
#: 4 GiB of decoded RGB (T x H x W x 3 bytes, the size of ``Video.frames``): about 690
#: frames of 1080p or 1550 of 720p. The per-dimension limits alone would allow
#: 2048 x 4096 x 4096 x 3 bytes (96 GiB); this is the limit that bounds memory.
DEFAULT_MAX_DECODED_BYTES = 4 * 1024 * 1024 * 1024


def _positive_int(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"VideoLimits.{name} must be a positive int, got {value!r}")


@dataclass(frozen=True, slots=True)
class VideoLimits:
    """What ``load_video`` reads and decodes at most.

    Every limit is checked as early as the source allows: ``max_bytes`` before decoding;
    ``max_pixels_per_frame``, ``max_frames``, ``max_decoded_bytes`` and ``max_duration_s``
    from the container's header when it states them, and again while decoding, stopping at
    the first frame past a limit. Raw frames are checked before they are copied. Each
    refusal is a ``vf_mm.errors.VideoTooLargeError`` naming the limit.

    Attributes:
        max_bytes: Encoded bytes read from a file, ``data:`` URL or HTTP body. It replaces
            the ``ImagePolicy``'s ``max_bytes`` for videos (the policy's other rules,
            network, hosts and local roots, apply unchanged).
        max_frames: Decoded frames.
        max_duration_s: Seconds, from the container's duration and from frames divided by
            the frame rate (when the rate is known).
        max_pixels_per_frame: Width x height of one frame.
        max_decoded_bytes: ``T x H x W x 3``, the memory the decoded frames take.
    """

    max_bytes: int = DEFAULT_MAX_BYTES
    max_frames: int = DEFAULT_MAX_FRAMES
    max_duration_s: float = DEFAULT_MAX_DURATION_S
    max_pixels_per_frame: int = DEFAULT_MAX_PIXELS_PER_FRAME
    max_decoded_bytes: int = DEFAULT_MAX_DECODED_BYTES

    def __post_init__(self) -> None:
        _positive_int("max_bytes", self.max_bytes)
        _positive_int("max_frames", self.max_frames)
        _positive_int("max_pixels_per_frame", self.max_pixels_per_frame)
        _positive_int("max_decoded_bytes", self.max_decoded_bytes)
        duration = self.max_duration_s
        if (
            isinstance(duration, bool)
            or not isinstance(duration, (int, float))
            or not math.isfinite(duration)
            or duration <= 0
        ):
            raise ValueError(
                f"VideoLimits.max_duration_s must be a positive finite number, got {duration!r}"
            )
        object.__setattr__(self, "max_duration_s", float(duration))

    def replace(self, **changes: Any) -> VideoLimits:
        """A copy with ``changes`` applied (and validated)."""
        return dataclasses.replace(self, **changes)


def check_frame_size(width: int, height: int, limits: VideoLimits) -> None:
    """Refuse one frame of ``width x height`` over ``max_pixels_per_frame``."""
    if width * height > limits.max_pixels_per_frame:
        raise VideoTooLargeError(
            f"frames of {width}x{height} = {width * height} pixels are over "
            f"max_pixels_per_frame={limits.max_pixels_per_frame}"
        )


def check_frame_count(
    count: int, frame_bytes: int, limits: VideoLimits, *, stated: str = ""
) -> None:
    """Refuse ``count`` frames of ``frame_bytes`` decoded bytes each, over ``max_frames``
    or ``max_decoded_bytes``. ``stated`` says where the count comes from when it is not
    the frames decoded so far (``"the header states"``)."""
    said = f"{stated} " if stated else ""
    if count > limits.max_frames:
        raise VideoTooLargeError(
            f"{said}{count} frames, over max_frames={limits.max_frames}"
            if stated
            else f"more than max_frames={limits.max_frames} frames (stopped at frame {count})"
        )
    if count * frame_bytes > limits.max_decoded_bytes:
        raise VideoTooLargeError(
            f"{said}{count} frames of {frame_bytes} bytes = {count * frame_bytes} decoded bytes, "
            f"over max_decoded_bytes={limits.max_decoded_bytes}"
        )


def check_duration(seconds: float, limits: VideoLimits, *, how: str) -> None:
    """Refuse a duration over ``max_duration_s``; ``how`` says how it was measured."""
    if seconds > limits.max_duration_s:
        raise VideoTooLargeError(
            f"{seconds:.3f} s ({how}) is over max_duration_s={limits.max_duration_s:g}"
        )
