"""data:video/... URLs to bytes: base64 only, video media types, size checked first."""

from __future__ import annotations

import base64

import pytest

from vf_mm.errors import VideoDecodeError, VideoTooLargeError
from vf_mm.images import decode_data_url


def decode_video(url: str, *, max_bytes: int) -> bytes:
    return decode_data_url(url, max_bytes=max_bytes, medium="video")


PAYLOAD = bytes(range(256)) * 4


def url(media: str = "video/mp4", payload: bytes = PAYLOAD) -> str:
    return f"data:{media};base64," + base64.b64encode(payload).decode()


@pytest.mark.parametrize(
    "media",
    ["video/mp4", "video/webm", "VIDEO/MP4", "video/mp4;codecs=avc1", "application/octet-stream"],
)
def test_video_media_types_decode(media):
    assert decode_video(url(media), max_bytes=10_000) == PAYLOAD


def test_line_wrapped_and_url_safe_base64_decode():
    wrapped = "data:video/mp4;base64," + base64.encodebytes(PAYLOAD).decode()
    assert decode_video(wrapped, max_bytes=10_000) == PAYLOAD
    urlsafe = "data:video/mp4;base64," + base64.urlsafe_b64encode(PAYLOAD).decode()
    assert decode_video(urlsafe, max_bytes=10_000) == PAYLOAD


def test_an_image_data_url_is_refused_with_a_pointer_to_images():
    with pytest.raises(VideoDecodeError, match="is an image, not a video"):
        decode_video(url("image/png"), max_bytes=10_000)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("data:video/mp4;base64", "without a ','"),
        ("data:video/mp4,rawbytes", "not base64"),
        ("data:text/html;base64,PGh0bWw+", "not a video type"),
        ("data:;base64,AAAA", "not a video type"),
        ("data:video/mp4;base64,@@@@", "not valid base64"),
        ("data:video/mp4;base64,AAA", "not valid base64"),
        ("data:video/mp4;base64,AAAA\u00e9", "non-ASCII"),
    ],
)
def test_malformed_urls_are_refused(text, message):
    with pytest.raises(VideoDecodeError, match=message):
        decode_video(text, max_bytes=10_000)


def test_size_is_checked_before_decoding_and_after():
    with pytest.raises(VideoTooLargeError, match="about"):  # from the payload's length
        decode_video(url(payload=b"\0" * 5000), max_bytes=1000)
    with pytest.raises(VideoTooLargeError, match="1001 bytes is over max_bytes=1000"):
        decode_video(url(payload=b"\0" * 1001), max_bytes=1000)
    assert decode_video(url(payload=b"\0" * 1000), max_bytes=1000) == b"\0" * 1000
