"""``encode_lossless``: raw frames as a video file that decodes back to them exactly.

The frames are encoded with FFV1, FFmpeg's lossless intra-frame codec, in Matroska
(``.mkv``), pixel format ``bgr0``: the RGB bytes go through untouched (no YUV conversion,
so no rounding; this FFV1 build refuses ``rgb24`` and ``gbrp``, and ``yuv444p`` is not
exact), and ``frame.to_ndarray(format="rgb24")`` gives them back bit for bit. The frame
rate is stated in the container when Matroska can state it exactly (its
``DefaultDuration`` is whole nanoseconds and FFmpeg reads it back as a fraction of terms
up to 30000: 30, 29.97, 30000/1001, 2.5 survive, 3.14159 does not). Otherwise (an unknown
rate, or one the container would round) the file states no rate, and whoever stores it
keeps the rate beside it (a part's ``"frame_rate"``, which ``load_video`` applies to a
file that states none). Every encoding is decoded back before it is returned, and kept
only when its ``video_hash`` is the original's.

Used where a clip must leave the process as bytes: the results store's assets, and vLLM
content_parts (a ``data:`` URL the server decodes itself).
"""

from __future__ import annotations

import io
from fractions import Fraction
from typing import Any

from vf_mm.errors import MissingDependencyError, VideoDecodeError
from vf_mm.videos._hash import video_hash
from vf_mm.videos._limits import VideoLimits
from vf_mm.videos._load import load_video
from vf_mm.videos._video import Video

__all__ = ["encode_lossless"]

#: Matroska states a rate FFmpeg reads back exactly only as a fraction of terms <= this.
_MATROSKA_RATE_TERMS = 30000
#: the time base of a file that states no rate: frames are placed at their times in ms
_RATELESS_TIME_BASE = Fraction(1, 1000)


def _av() -> Any:
    try:
        import av
    except ImportError as exc:
        raise MissingDependencyError("encoding a video needs PyAV: pip install 'av>=14'") from exc
    return av


def _stated_rate(fps: float) -> Fraction | None:
    """The fraction Matroska may state for ``fps``: terms up to 30000, and exactly ``fps``
    as a float; None when there is none."""
    rate = Fraction(fps).limit_denominator(_MATROSKA_RATE_TERMS)
    if float(rate) == fps and 0 < rate.numerator <= _MATROSKA_RATE_TERMS:
        return rate
    return None


def _encode(video: Video, rate: Fraction | None) -> bytes:
    """FFV1 in Matroska, pixel format ``bgr0``; ``rate`` stated in the file, or (None) no
    rate: each frame at its time in milliseconds (every 1 ms when the rate is unknown)."""
    av = _av()
    out = io.BytesIO()
    with av.open(out, mode="w", format="matroska") as container:
        stream = container.add_stream("ffv1", rate=rate) if rate else container.add_stream("ffv1")
        stream.width, stream.height = video.width, video.height
        stream.pix_fmt = "bgr0"
        if rate is None:
            stream.time_base = _RATELESS_TIME_BASE
            stream.codec_context.time_base = _RATELESS_TIME_BASE
            stream.codec_context.framerate = Fraction(0, 1)
        for index, pixels in enumerate(video.frames):
            frame = av.VideoFrame.from_ndarray(pixels, format="rgb24")
            if rate is None:
                frame.time_base = _RATELESS_TIME_BASE
                frame.pts = round(index * 1000 / video.fps) if video.fps else index
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return out.getvalue()


def encode_lossless(video: Video, *, limits: VideoLimits | None = None) -> bytes:
    """``video`` as a ``.mkv`` file (FFV1, ``bgr0``) that loads back to the same hash.

    ``load_video`` of the file, with the part's ``"frame_rate"`` set to ``video.fps``
    when it is known, has ``video``'s ``video_hash``: checked by decoding the file back
    before it is returned. The rate is stated in the file when Matroska states it exactly,
    else left to the part (module docstring).

    Args:
        video: The decoded clip.
        limits: The limits the check decodes the file within (``VideoLimits()`` when None).

    Raises:
        VideoDecodeError: No encoding keeps the video exactly (never seen; a safeguard
            against an FFmpeg that behaves otherwise).
    """
    want = video_hash(video)
    rates = [_stated_rate(video.fps)] if video.fps is not None else []
    tried = []
    for rate in [r for r in rates if r is not None] + [None]:
        data = _encode(video, rate)
        part: dict[str, Any] = {"type": "video", "video": data}
        if video.fps is not None:
            part["frame_rate"] = video.fps
        back = load_video(part, limits=limits)
        if video_hash(back) == want:
            return data
        tried.append(f"rate {rate if rate is not None else 'none'}: fps {back.fps!r}")
    raise VideoDecodeError(
        f"could not encode {video!r} losslessly: decoding the FFV1 file back gave another "
        f"video ({'; '.join(tried)})"
    )
