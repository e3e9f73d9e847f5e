"""The asset references of a run directory, defined once: ``assets/<hash>.png`` for an
image (``hash`` its ``image_hash``) and ``assets/<hash>.<ext>`` for a video (``hash`` its
``video_hash``, ``ext`` its container's extension). ``results`` writes them; ``training``,
``report`` and ``results``' own readers recognise them by these functions only, so a
reference one accepts, every other accepts too.

A reference is exactly that text: 32 lowercase hex digits, nothing before or after (a
trailing newline included), so a string that only looks like one is never read as a
file of the run.
"""

from __future__ import annotations

import re

from vf_mm.videos import VIDEO_EXTENSIONS

#: The folder (inside a run directory) that holds the image and video assets.
ASSETS_DIR = "assets"

_IMAGE = re.compile(rf"{ASSETS_DIR}/([0-9a-f]{{32}})\.png")
_VIDEO = re.compile(rf"{ASSETS_DIR}/([0-9a-f]{{32}})\.({'|'.join(VIDEO_EXTENSIONS)})")


def image_asset_ref(digest: str) -> str:
    """The reference to the image whose ``image_hash`` is ``digest``."""
    return f"{ASSETS_DIR}/{digest}.png"


def video_asset_ref(digest: str, ext: str) -> str:
    """The reference to the video whose ``video_hash`` is ``digest``, in an ``ext`` file."""
    return f"{ASSETS_DIR}/{digest}.{ext}"


def image_asset_hash(ref: object) -> str | None:
    """The image hash ``ref`` names, or ``None`` when it is not an image asset reference."""
    match = _IMAGE.fullmatch(ref) if isinstance(ref, str) else None
    return None if match is None else match.group(1)


def video_asset_hash(ref: object) -> tuple[str, str] | None:
    """``(video hash, extension)`` of a video asset reference, or ``None``."""
    match = _VIDEO.fullmatch(ref) if isinstance(ref, str) else None
    return None if match is None else (match.group(1), match.group(2))
