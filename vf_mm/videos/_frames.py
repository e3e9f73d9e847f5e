"""Raw frames to a ``(T, H, W, 3)`` uint8 array: a numpy array, or a list of frames.

Every result is a new array (the caller's buffer is never kept, so it cannot change a
frame after ``load_video`` returns), checked against the limits *before* it is
allocated. Arrays are refused, naming shape and dtype, where a guess could produce a
wrong picture without a word: floats (0..1 or 0..255?), channels first, a single image
that would read as a grey video.

A list's frames go one by one through ``vf_mm.images.load_image`` (under the same
``ImagePolicy``), so a frame of any PIL mode becomes RGB exactly as an image does:
alpha composited onto white, palettes applied, grey replicated.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image

from vf_mm.errors import ImageError, ImageTooLargeError, VideoDecodeError, VideoTooLargeError
from vf_mm.images import ImagePolicy, load_image
from vf_mm.videos._limits import (
    VideoLimits,
    check_duration,
    check_frame_count,
    check_frame_size,
)
from vf_mm.videos._source import is_array

__all__ = ["frames_from_array", "frames_from_list"]


def _check(count: int, height: int, width: int, fps: float | None, limits: VideoLimits) -> None:
    check_frame_size(width, height, limits)
    check_frame_count(count, height * width * 3, limits, stated="the source holds")
    if fps is not None:
        check_duration(count / fps, limits, how=f"{count} frames at {fps:g} fps")


def _as_numpy(array: Any) -> np.ndarray:
    try:
        return np.asarray(array)
    except Exception as exc:  # a CUDA tensor, one that requires grad, ...
        raise VideoDecodeError(
            f"a {type(array).__name__} cannot be read as a frames array ({exc}); pass a CPU "
            "uint8 array (e.g. tensor.detach().cpu().numpy())"
        ) from None


def frames_from_array(
    array: Any, *, fps: float | None, limits: VideoLimits, policy: ImagePolicy
) -> np.ndarray:
    """A ``(T, H, W, 3)`` RGB, ``(T, H, W)`` or ``(T, H, W, 1)`` grey, or ``(T, H, W, 4)``
    RGBA uint8 array as a new ``(T, H, W, 3)`` array (grey replicated to R=G=B; RGBA
    composited onto white, as images are)."""
    data = _as_numpy(array)
    shape, dtype = tuple(data.shape), data.dtype
    if dtype != np.uint8:
        raise VideoDecodeError(
            f"a frames array must be uint8 (0-255), not {dtype} (shape {shape}); for floats "
            "in [0, 1] pass (array * 255).round().astype(np.uint8)"
        )
    if data.ndim == 3 and shape[2] in (3, 4):
        raise VideoDecodeError(
            f"a frames array of shape {shape} reads as one (H, W, C) image, not a video; a "
            "video is (T, H, W, 3) (array[None] for a single frame) or (T, H, W) grey"
        )
    if data.ndim == 3:
        data = data[..., None]
    if data.ndim != 4 or data.shape[3] not in (1, 3, 4):
        hint = ""
        if data.ndim == 4 and data.shape[1] in (1, 3, 4):
            hint = " (channels first? transpose it to (T, H, W, C): array.transpose(0, 2, 3, 1))"
        raise VideoDecodeError(
            f"a frames array must be (T, H, W, 3) RGB or (T, H, W) grey, not shape {shape}{hint}"
        )
    if 0 in data.shape:
        raise VideoDecodeError(f"a frames array must hold at least one frame, got shape {shape}")
    count, height, width, channels = data.shape
    _check(count, height, width, fps, limits)
    if channels == 4:  # RGBA: through load_image frame by frame, as a list is
        return frames_from_list(list(data), fps=fps, limits=limits, policy=policy)
    if channels == 1:
        return np.repeat(data, 3, axis=3)  # a new C-contiguous array
    return np.array(data, order="C", copy=True)


def _frame_size(frame: Any, index: int) -> tuple[int, int]:
    """``(width, height)`` of a frame, read without converting it."""
    if isinstance(frame, Image.Image):
        return frame.size
    if is_array(frame):
        shape = tuple(frame.shape)
        if len(shape) in (2, 3) and 0 not in shape[:2]:
            return int(shape[1]), int(shape[0])
        raise VideoDecodeError(
            f"frame {index} is an array of shape {shape}; a frame is (H, W, 3) or (H, W)"
        )
    raise VideoDecodeError(
        f"frame {index} is a {type(frame).__name__}; a frame must be a PIL image or an "
        "(H, W, 3) / (H, W) uint8 array (load encoded frames with vf_mm.images.load_image first)"
    )


def frames_from_list(
    frames: list[Any] | tuple[Any, ...],
    *,
    fps: float | None,
    limits: VideoLimits,
    policy: ImagePolicy,
) -> np.ndarray:
    """A list of same-sized frames (PIL images of any mode, or uint8 arrays) as a new
    ``(T, H, W, 3)`` array. Sizes are read first, all of them, so a list whose frames
    differ is refused (naming the first that differs) before any frame is converted."""
    if len(frames) == 0:
        raise VideoDecodeError("a list of frames must hold at least one frame")
    if len(frames) > limits.max_frames:  # before reading any frame's size
        raise VideoTooLargeError(
            f"the source holds {len(frames)} frames, over max_frames={limits.max_frames}"
        )
    width, height = _frame_size(frames[0], 0)
    for index in range(1, len(frames)):
        size = _frame_size(frames[index], index)
        if size != (width, height):
            raise VideoDecodeError(
                f"frame {index} is {size[0]}x{size[1]} but frame 0 is {width}x{height}: "
                "every frame of a video must have the same size"
            )
    _check(len(frames), height, width, fps, limits)
    out = np.empty((len(frames), height, width, 3), dtype=np.uint8)
    for index, frame in enumerate(frames):
        try:
            image = load_image(frame, policy=policy)
        except ImageError as exc:
            error = VideoTooLargeError if isinstance(exc, ImageTooLargeError) else VideoDecodeError
            raise error(f"frame {index}: {exc.reason}") from exc
        out[index] = np.asarray(image)
    return out
