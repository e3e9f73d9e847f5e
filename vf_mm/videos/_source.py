"""The forms a video source takes, and how errors name one.

``unwrap`` takes the source out of a content part (and the part's ``"frame_rate"``);
``describe`` names a source in an error: short and free of secrets (strings, paths and
bytes are named as ``vf_mm.images`` names them: no base64 payload, query string or
credentials). Strings themselves are sorted by ``vf_mm.images.classify_source``, so a
scheme means the same for a video as for an image.
"""

from __future__ import annotations

import math
import numbers
import os
from typing import Any

from PIL import Image

from vf_mm._text import shorten
from vf_mm.errors import VideoDecodeError
from vf_mm.images._internal import describe_source, unwrap_part
from vf_mm.videos._video import Video

__all__ = ["describe", "is_array", "unwrap"]


def is_array(value: Any) -> bool:
    """A numpy array, or anything shaped like one (a CPU torch tensor)."""
    shape = getattr(value, "shape", None)
    return isinstance(shape, tuple) and hasattr(value, "dtype") and hasattr(value, "__array__")


def _shape(part: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k!r}: {type(v).__name__}" for k, v in part.items()) + "}"


def _frame_rate(part: dict[str, Any]) -> float | None:
    rate = part.get("frame_rate")
    if rate is None:
        return None
    if (
        isinstance(rate, bool)
        or not isinstance(rate, numbers.Real)
        or not math.isfinite(rate)
        or rate <= 0
    ):
        raise VideoDecodeError(
            f'a video part\'s "frame_rate" must be a positive number of frames per second, '
            f"got {rate!r}"
        )
    return float(rate)


def unwrap(source: Any) -> tuple[Any, float | None]:
    """``(source, frame_rate)``: the source inside a content part and the part's
    ``"frame_rate"`` (``None`` when absent), or ``(source, None)`` for anything else.

    Parts: ``{"type": "video", "video": ...}`` (or transformers' ``"url"`` / ``"path"``
    instead of ``"video"``; exactly one of the three) and OpenAI-style ``{"type":
    "video_url", "video_url": {"url": ...}}`` (or ``"video_url": "..."``). Processing
    options a part may carry (``fps``, ``num_frames``, ``min_pixels``, ``max_pixels``)
    are the processor's business and are ignored here.
    """
    if not isinstance(source, dict):
        return source, None
    return unwrap_part(source, medium="video"), _frame_rate(source)


def describe(source: Any) -> str:
    """A short, secret-free name for ``source`` in an error message."""
    if isinstance(source, dict):
        try:
            inner, _ = unwrap(source)
        except VideoDecodeError:
            return f"<content part {shorten(_shape(source), 80, keep_end=True)}>"
        return describe(inner)
    if isinstance(source, Video):
        return f"<Video {source.num_frames}x{source.height}x{source.width}>"
    if isinstance(source, (list, tuple)):
        return f"<{type(source).__name__} of {len(source)} frames>"
    if isinstance(source, Image.Image):
        return f"<PIL image {source.mode} {source.width}x{source.height}>"
    if is_array(source):
        return f"<{type(source).__name__} {tuple(source.shape)} {source.dtype}>"
    if isinstance(source, (str, os.PathLike, bytes, bytearray, memoryview)):
        return describe_source(source)
    return f"<{type(source).__name__}>"
