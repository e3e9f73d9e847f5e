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
from vf_mm.images import describe_source
from vf_mm.videos._video import Video

__all__ = ["describe", "is_array", "unwrap"]

#: Keys of a ``{"type": "video"}`` part that say where the video is (exactly one).
_SOURCE_KEYS = ("video", "url", "path")


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
    kind = source.get("type")
    if kind == "video_url":
        inner = source.get("video_url")
        if isinstance(inner, dict):
            inner = inner.get("url")
        if not isinstance(inner, str):
            raise VideoDecodeError(
                'a "video_url" content part needs {"video_url": {"url": "..."}}, '
                f"got {_shape(source)}"
            )
        return inner, _frame_rate(source)
    if kind == "video":
        present = [k for k in _SOURCE_KEYS if source.get(k) is not None]
        if len(present) != 1:
            raise VideoDecodeError(
                'a "video" content part needs exactly one of "video", "url" or "path", '
                f"got {_shape(source)}"
            )
        inner = source[present[0]]
        if isinstance(inner, dict):
            raise VideoDecodeError('a "video" content part cannot hold another content part')
        return inner, _frame_rate(source)
    raise VideoDecodeError(
        f'a content part of type {kind!r} holds no video (expected "video" or "video_url")'
    )


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
