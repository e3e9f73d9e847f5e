"""Videos in the report: which frames the strip shows, and whether a browser plays the file.

A video part is shown as a strip of ``STRIP_FRAMES`` evenly spaced frames (the first and
the last among them), each a small embedded PNG, with the clip's frame count, frame rate
and size; and, when the stored file is one a browser plays (``browser_mime``: an MP4
holding H.264, VP9 or AV1, or a WebM holding VP8, VP9 or AV1), an HTML5 ``<video
controls>`` player of the file itself. Lossless ``.mkv`` files (the results store's raw
frames), AVI, MPEG-TS and MP4s of other codecs get the strip only.
"""

from __future__ import annotations

import io
from typing import Any

from vf_mm.errors import VideoError
from vf_mm.videos import VIDEO_MEDIA_TYPES, VideoLimits, read_video_bytes, video_extension

#: frames a video's strip shows (fewer when the clip has fewer)
STRIP_FRAMES = 6
#: a strip frame fits this box
STRIP_MAX_W, STRIP_MAX_H = 120, 90

#: what a browser plays: container -> codecs, by FFmpeg's canonical names
_PLAYABLE = {"mp4": frozenset({"h264", "vp9", "av1"}), "webm": frozenset({"vp8", "vp9", "av1"})}
_DEMUXER = {"mp4": "mov", "webm": "matroska"}


def strip_indices(count: int, n: int = STRIP_FRAMES) -> list[int]:
    """``min(n, count)`` frame indices spread evenly over ``0..count-1``, first and last
    included, increasing, without repeats."""
    if count <= 0:
        return []
    n = min(n, count)
    if n == 1:
        return [0]
    return sorted({round(i * (count - 1) / (n - 1)) for i in range(n)})


def browser_mime(data: bytes) -> str | None:
    """``"video/mp4"`` or ``"video/webm"`` when a browser plays ``data`` as it is (its
    container and its first video stream's codec), else None. ``data`` is a video
    ``vf_mm.videos.load_video`` has read (its container is known to be whole)."""
    try:
        ext = video_extension(data)
    except ValueError:
        return None
    if ext not in _PLAYABLE:
        return None
    mime, codecs = VIDEO_MEDIA_TYPES[ext], _PLAYABLE[ext]
    try:
        import av

        with av.open(io.BytesIO(data), mode="r", format=_DEMUXER[ext]) as container:
            codec: Any = container.streams.video[0].codec_context.codec
            name = getattr(codec, "canonical_name", None) or codec.name
    except Exception:  # no PyAV, or FFmpeg refuses: no player, the strip is still shown
        return None
    return mime if name in codecs else None


def data_url_bytes(url: str, *, max_bytes: int) -> bytes | str:
    """The bytes of a ``data:`` video URL (a video part another tool wrote), or why not."""
    try:
        return read_video_bytes(url, limits=VideoLimits(max_bytes=max_bytes))
    except VideoError as exc:
        return exc.reason
