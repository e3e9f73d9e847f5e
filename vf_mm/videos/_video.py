"""``Video``: decoded frames and the source's frame rate, immutable.

The invariants every ``Video`` holds, whoever made it (``load_video`` or a caller):

- ``frames`` is a ``numpy.ndarray`` of shape ``(T, H, W, 3)``, dtype ``uint8`` (RGB,
  rows top to bottom), C-contiguous, with ``T``, ``H`` and ``W`` all at least 1;
- ``frames`` is read-only, and so is every array it views: no one holding the video or
  its array can change a pixel under a cache keyed by ``video_hash``. An array that is
  writeable (or views writeable memory) is copied once on construction;
- ``fps`` is ``None`` (unknown) or a positive finite ``float``.

Equality is identity (``eq=False``): comparing two videos pixel by pixel is a choice to
make explicitly (``video_hash(a) == video_hash(b)``, or ``np.array_equal``).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import numpy as np

__all__ = ["Video", "locked"]


def _read_only_all_the_way(array: np.ndarray) -> bool:
    """True when ``array`` and every array it views are read-only (``bytes`` at the
    bottom of the chain are immutable too; any other owner is treated as writeable)."""
    current: object = array
    while isinstance(current, np.ndarray):
        if current.flags.writeable:
            return False
        current = current.base
    return current is None or isinstance(current, bytes)


def locked(array: np.ndarray) -> np.ndarray:
    """``array`` (owned by the caller of this function, never shared) made read-only, as
    a view: numpy refuses to make a view writeable again when its base is not."""
    array.flags.writeable = False
    return array.view()


@dataclass(frozen=True, slots=True, eq=False)
class Video:
    """Decoded frames ``(T, H, W, 3)`` uint8 RGB, read-only, and the source's frame rate.

    Attributes:
        frames: The frames.
        fps: The rate the source states: the container's average frame rate for a file,
            ``data:`` or http(s) URL; a content part's ``"frame_rate"`` for raw frames;
            ``None`` when unknown. It describes the source, not a sampling choice: a model's
            processor samples frames from it later.
    """

    frames: np.ndarray
    fps: float | None = None

    def __post_init__(self) -> None:
        frames = self.frames
        if not isinstance(frames, np.ndarray):
            raise TypeError(f"Video.frames must be a numpy array, not {type(frames).__name__}")
        if frames.dtype != np.uint8 or frames.ndim != 4 or frames.shape[3] != 3:
            raise ValueError(
                f"Video.frames must be (T, H, W, 3) uint8, got shape {frames.shape} {frames.dtype}"
            )
        if 0 in frames.shape:
            raise ValueError(f"Video.frames must not be empty, got shape {frames.shape}")
        if not (frames.flags.c_contiguous and _read_only_all_the_way(frames)):
            object.__setattr__(self, "frames", locked(np.array(frames, order="C", copy=True)))
        fps = self.fps
        if fps is not None:
            if (
                isinstance(fps, bool)
                or not isinstance(fps, numbers.Real)
                or not math.isfinite(fps)
                or fps <= 0
            ):
                raise ValueError(f"Video.fps must be a positive finite number or None, got {fps!r}")
            object.__setattr__(self, "fps", float(fps))

    @property
    def num_frames(self) -> int:
        return int(self.frames.shape[0])

    @property
    def height(self) -> int:
        return int(self.frames.shape[1])

    @property
    def width(self) -> int:
        return int(self.frames.shape[2])

    @property
    def duration_s(self) -> float | None:
        """``num_frames / fps``; ``None`` when the frame rate is unknown."""
        return None if self.fps is None else self.num_frames / self.fps

    def __repr__(self) -> str:
        t, h, w, _ = self.frames.shape
        return f"Video(frames=<{t}x{h}x{w}x3 uint8>, fps={self.fps!r})"
