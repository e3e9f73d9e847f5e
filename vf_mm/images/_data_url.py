"""``data:`` URLs (RFC 2397) to bytes.

Accepted: ``data:image/<subtype>[;param=value]*;base64,<payload>``. The payload may
hold ASCII whitespace (line-wrapped base64, as ``base64.encodebytes`` writes it) and
URL-safe characters (``-``/``_``); anything else that is not base64, or wrong padding,
is an ``ImageDecodeError``. A media type other than ``image/*`` is refused (the bytes
are then sniffed by the decoder anyway: ``image/jpeg`` holding PNG bytes loads as the
PNG it is). ``image/svg+xml`` is refused here: SVG is a vector format we do not render.
The size is checked from the payload's length before anything is decoded.
"""

from __future__ import annotations

import base64
import binascii

from vf_mm.errors import ImageDecodeError, ImageTooLargeError

__all__ = ["decode_data_url"]

_WHITESPACE = b"\t\n\r\f\v "  # deleted from a payload (one translate pass, no regex)
_URLSAFE = bytes.maketrans(b"-_", b"+/")


def decode_data_url(url: str, *, max_bytes: int) -> bytes:
    """The bytes a ``data:image/...;base64,`` URL holds."""
    comma = url.find(",")
    if comma < 0:
        raise ImageDecodeError("data: URL without a ',' before its payload")
    header = url[5:comma].strip()
    params = [p.strip() for p in header.split(";")]
    media_type = params[0].lower()
    if not params[-1].lower() == "base64" or len(params) < 2:
        raise ImageDecodeError(
            f"data: URL {'data:' + header!r} is not base64; write data:image/png;base64,..."
        )
    if not media_type.startswith("image/"):
        raise ImageDecodeError(
            f"data: URL media type {media_type or '(none)'!r} is not an image type"
        )
    if media_type == "image/svg+xml":
        raise ImageDecodeError("SVG (image/svg+xml) is a vector format and is not decoded")
    payload_len = len(url) - comma - 1
    # 4 base64 characters hold 3 bytes; whitespace only makes the real size smaller
    if payload_len // 4 * 3 > max_bytes + 3:
        raise ImageTooLargeError(
            f"data: URL payload of about {payload_len // 4 * 3} bytes is over max_bytes={max_bytes}"
        )
    try:
        payload = url[comma + 1 :].encode("ascii")
    except UnicodeEncodeError:
        raise ImageDecodeError("data: URL payload holds non-ASCII characters") from None
    payload = payload.translate(_URLSAFE, _WHITESPACE)
    try:
        data = base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageDecodeError(f"data: URL payload is not valid base64 ({exc})") from None
    if len(data) > max_bytes:
        raise ImageTooLargeError(
            f"data: URL payload of {len(data)} bytes is over max_bytes={max_bytes}"
        )
    return data
