"""The videos package's internal tier (docs/architecture.md): library code only.

The video guard's default limits (``VideoLimits()`` carries them for users).
"""

from __future__ import annotations

from vf_mm.videos._limits import (
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_DECODED_BYTES,
    DEFAULT_MAX_DURATION_S,
    DEFAULT_MAX_FRAMES,
    DEFAULT_MAX_PIXELS_PER_FRAME,
)

__all__ = [
    "DEFAULT_MAX_BYTES",
    "DEFAULT_MAX_DECODED_BYTES",
    "DEFAULT_MAX_DURATION_S",
    "DEFAULT_MAX_FRAMES",
    "DEFAULT_MAX_PIXELS_PER_FRAME",
]
