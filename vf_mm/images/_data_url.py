"""``data:`` URLs (RFC 2397) to bytes.

Accepted: ``data:image/<subtype>[;param=value]*;base64,<payload>`` for an image, and for a
video ``data:video/<subtype>...`` or ``data:application/octet-stream...`` (an ``image/*``
URL is refused with a pointer to image parts: a still image is not a one-frame video).
One function for both media, each refused with its own error types. The payload may
hold ASCII whitespace (line-wrapped base64, as ``base64.encodebytes`` writes it) and
URL-safe characters (``-``/``_``); anything else that is not base64, or wrong padding,
is an ``ImageDecodeError``. Validation is strict and costs no pass of its own: the
decoder validates as it decodes, refusing any character outside the alphabet and padding
anywhere but at the end or of the wrong length. Whitespace and URL-safe characters are
translated away first, only where present (found with ``bytes.find``, i.e. memchr).
The decoder is pybase64's (SIMD) where installed; binascii's strict mode
(``a2b_base64(strict_mode=True)``) is the authority: a payload pybase64 refuses is
decoded again by binascii, which accepts it or names the problem, so what is accepted is
exactly what binascii accepts (pybase64 is stricter about a lone trailing ``=``, and
never laxer). A media type other than ``image/*`` is refused (the bytes
are then sniffed by the decoder anyway: ``image/jpeg`` holding PNG bytes loads as the
PNG it is). ``image/svg+xml`` is refused here: SVG is a vector format we do not render.
The size is checked from the payload's length before anything is decoded.
"""

from __future__ import annotations

import binascii
from collections.abc import Callable

from vf_mm.errors import (
    ImageDecodeError,
    ImageTooLargeError,
    MediaError,
    VideoDecodeError,
    VideoTooLargeError,
)

_fast_b64decode: Callable[..., bytes] | None
try:  # SIMD base64: ~0.03 ms for a 600 kB PNG where binascii takes ~1.5 ms
    from pybase64 import b64decode as _fast_b64decode
except ImportError:  # pragma: no cover - a declared dependency; binascii does the same
    _fast_b64decode = None

__all__ = ["b64decode_strict", "decode_data_url"]

_WHITESPACE = b"\t\n\r\f\v "  # deleted from a payload (one translate pass, no regex)
_URLSAFE = bytes.maketrans(b"-_", b"+/")
_RARE = tuple(bytes([c]) for c in _WHITESPACE + b"-_")


def b64decode_strict(payload: bytes) -> bytes:
    """``payload`` decoded as strict base64 (the 64 characters, padding only at the end
    and of the right length). Raises ``ImageDecodeError`` naming the problem."""
    if _fast_b64decode is not None:
        try:
            return _fast_b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            pass  # binascii decides, and names the problem
    try:
        return binascii.a2b_base64(payload, strict_mode=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageDecodeError(f"data: URL payload is not valid base64 ({exc})") from None


#: What each medium's data: URLs may say of themselves, and the errors that refuse them.
_MEDIA: dict[str, tuple[type[MediaError], type[MediaError], str]] = {
    "image": (ImageDecodeError, ImageTooLargeError, "data:image/png;base64,..."),
    "video": (VideoDecodeError, VideoTooLargeError, "data:video/mp4;base64,..."),
}


def _refused_media_type(media_type: str, medium: str) -> str | None:
    """Why a data: URL of ``media_type`` is not taken for ``medium`` (None: it is)."""
    if medium == "image":
        if not media_type.startswith("image/"):
            return f"data: URL media type {media_type or '(none)'!r} is not an image type"
        if media_type == "image/svg+xml":
            return "SVG (image/svg+xml) is a vector format and is not decoded"
        return None
    if media_type.startswith("image/"):
        return (
            f"data: URL media type {media_type!r} is an image, not a video; pass it as an "
            'image part, or a list of frames as {"type": "video", "video": [...]}'
        )
    if not (media_type.startswith("video/") or media_type == "application/octet-stream"):
        return f"data: URL media type {media_type or '(none)'!r} is not a video type (video/*)"
    return None


def decode_data_url(url: str, *, max_bytes: int, medium: str = "image") -> bytes:
    """The bytes a ``data:`` URL holds.

    Args:
        url: A ``data:image/...;base64,`` URL (``medium="video"``: a ``data:video/...`` or
            ``data:application/octet-stream`` one).
        max_bytes: The most decoded bytes accepted.
        medium: ``"image"`` or ``"video"``: which errors refuse it.

    Raises:
        ImageDecodeError: Not a base64 data URL of an image (``VideoDecodeError`` for a
            video).
        ImageTooLargeError: Over ``max_bytes`` (``VideoTooLargeError`` for a video).
    """
    decode_error, too_large, example = _MEDIA[medium]
    comma = url.find(",")
    if comma < 0:
        raise decode_error("data: URL without a ',' before its payload")
    header = url[5:comma].strip()
    params = [p.strip() for p in header.split(";")]
    media_type = params[0].lower()
    if not params[-1].lower() == "base64" or len(params) < 2:
        raise decode_error(f"data: URL {'data:' + header!r} is not base64; write {example}")
    refused = _refused_media_type(media_type, medium)
    if refused is not None:
        raise decode_error(refused)
    payload_len = len(url) - comma - 1
    # 4 base64 characters hold 3 bytes; whitespace only makes the real size smaller
    if payload_len // 4 * 3 > max_bytes + 3:
        raise too_large(
            f"data: URL payload of about {payload_len // 4 * 3} bytes is over max_bytes={max_bytes}"
        )
    # isascii is O(1) for a str (CPython records it); the slice only on the rare path
    if not url.isascii() and not url[comma + 1 :].isascii():
        raise decode_error("data: URL payload holds non-ASCII characters")
    payload = url[comma + 1 :].encode("ascii")
    # whitespace and URL-safe characters are rare: look for them (memchr, ~10 us a byte
    # value for 1 MB) before paying for a translate pass (~0.4 ms)
    if any(payload.find(c) >= 0 for c in _RARE):
        payload = payload.translate(_URLSAFE, _WHITESPACE)
    try:
        data = b64decode_strict(payload)
    except ImageDecodeError as exc:
        raise decode_error(exc.reason) from None
    if len(data) > max_bytes:
        raise too_large(f"data: URL payload of {len(data)} bytes is over max_bytes={max_bytes}")
    return data
