"""``video_hash``: a content hash of a video's frames and frame rate.

Exactly what is hashed (version 1)::

    sha256(b"vf_mm.video.v1\\0RGB\\0" + T.to_bytes(4, "big") + H.to_bytes(4, "big")
           + W.to_bytes(4, "big") + rate + frames.data).hexdigest()[:32]

where ``rate`` is ``b"\\0"`` when ``fps`` is None and ``b"\\1"`` followed by ``fps`` as a
big-endian IEEE double otherwise, and ``frames.data`` is the raw ``(T, H, W, 3)``
raster, frame after frame, rows top to bottom, no padding (``Video`` guarantees a
C-contiguous array, so the buffer is hashed where it lies, without a copy).

So the hash depends on the decoded pixels, the shape and the frame rate only: not on
the container or codec, metadata, the file name or where the video came from. Any
changed pixel, the same bytes in another shape, or another frame rate (the same frames
at 2 fps and at 30 fps are different videos to a model that reads timestamps) hash
differently. The frame rate is hashed as the float ``Video`` stores, so ``30`` and
``30.0`` agree. The prefix names the scheme: an image hash can never equal a video
hash. sha256 for the reason ``image_hash`` gives (SHA extensions make it the fastest
hash in ``hashlib`` on current CPUs); 128 bits of it are kept.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping
from typing import Any

from vf_mm.types import VIDEO_OPTIONS
from vf_mm.videos._video import Video

__all__ = ["video_hash", "video_mm_hash"]

_PREFIX = b"vf_mm.video.v1\0RGB\0"


def video_hash(video: Video) -> str:
    """32 hex characters: sha256 (first 128 bits) of the frames, their shape, the frame rate.

    See the module doc. Stable across processes and machines.

    Args:
        video: The decoded clip.
    """
    if not isinstance(video, Video):
        raise TypeError(f"video_hash takes a Video, not {type(video).__name__}")
    count, height, width, _ = video.frames.shape
    digest = hashlib.sha256(_PREFIX)
    digest.update(count.to_bytes(4, "big"))
    digest.update(height.to_bytes(4, "big"))
    digest.update(width.to_bytes(4, "big"))
    digest.update(b"\0" if video.fps is None else b"\1" + struct.pack(">d", video.fps))
    digest.update(video.frames.data)
    return digest.hexdigest()[:32]


def video_mm_hash(content_hash: str, part: Mapping[str, Any]) -> str:
    """The ``mm_hash`` of the clip a video ``part`` shows.

    Options change the tensors, so they change the hash: one ``mm_hash`` names one item, in
    the renderer's cache, a group frame's table and vLLM's encoder cache alike.

    Args:
        content_hash: The clip's ``video_hash``; the result itself when the part sets none
            of the processing options (``vf_mm.types.VIDEO_OPTIONS``).
        part: The video part; with options set (not None) the result is the sha256 hex of
            ``f"{content_hash}:{sorted(options.items())!r}"`` over them.
    """
    options = {key: part[key] for key in VIDEO_OPTIONS if part.get(key) is not None}
    if not options:
        return content_hash
    return hashlib.sha256(f"{content_hash}:{sorted(options.items())!r}".encode()).hexdigest()
