"""The videos package's internal tier: what sibling packages use and users have no
need of. Only vf_mm's own packages import this module (the architecture test allows
``vf_mm.<package>._internal`` and no other private module); it carries no stability
promise.
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
