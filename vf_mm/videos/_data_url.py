"""``data:`` URLs (RFC 2397) holding a video, to bytes.

Accepted: ``data:video/<subtype>[;param=value]*;base64,<payload>`` and
``data:application/octet-stream;base64,...``. ``vf_mm.images.decode_data_url`` takes
``image/*`` only (an image's data URL must say it is one), so videos read theirs here,
under the same rules otherwise: the payload may hold ASCII whitespace and URL-safe
characters; anything else that is not base64 is a ``VideoDecodeError``; the size is
checked from the payload's length before anything is decoded. The media type is not
trusted for the format: the bytes are sniffed by the decoder (``video/webm`` holding MP4
bytes loads as the MP4 it is). An ``image/*`` data URL is refused with a pointer to
images: a still image is not a one-frame video.
"""

from __future__ import annotations

import base64
import binascii

from vf_mm.errors import VideoDecodeError, VideoTooLargeError

__all__ = ["decode_video_data_url"]

_WHITESPACE = b"\t\n\r\f\v "  # deleted from a payload (one translate pass, no regex)
_URLSAFE = bytes.maketrans(b"-_", b"+/")


def decode_video_data_url(url: str, *, max_bytes: int) -> bytes:
    """The bytes a ``data:video/...;base64,`` URL holds."""
    comma = url.find(",")
    if comma < 0:
        raise VideoDecodeError("data: URL without a ',' before its payload")
    header = url[5:comma].strip()
    params = [p.strip() for p in header.split(";")]
    media_type = params[0].lower()
    if len(params) < 2 or params[-1].lower() != "base64":
        raise VideoDecodeError(
            f"data: URL {'data:' + header!r} is not base64; write data:video/mp4;base64,..."
        )
    if media_type.startswith("image/"):
        raise VideoDecodeError(
            f"data: URL media type {media_type!r} is an image, not a video; pass it as an "
            'image part, or a list of frames as {"type": "video", "video": [...]}'
        )
    if not (media_type.startswith("video/") or media_type == "application/octet-stream"):
        raise VideoDecodeError(
            f"data: URL media type {media_type or '(none)'!r} is not a video type (video/*)"
        )
    payload_len = len(url) - comma - 1
    # 4 base64 characters hold 3 bytes; whitespace only makes the real size smaller
    if payload_len // 4 * 3 > max_bytes + 3:
        raise VideoTooLargeError(
            f"data: URL payload of about {payload_len // 4 * 3} bytes is over max_bytes={max_bytes}"
        )
    try:
        payload = url[comma + 1 :].encode("ascii")
    except UnicodeEncodeError:
        raise VideoDecodeError("data: URL payload holds non-ASCII characters") from None
    payload = payload.translate(_URLSAFE, _WHITESPACE)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise VideoDecodeError(f"data: URL payload is not valid base64 ({exc})") from None
    if len(data) > max_bytes:
        raise VideoTooLargeError(
            f"data: URL payload of {len(data)} bytes is over max_bytes={max_bytes}"
        )
    return data
