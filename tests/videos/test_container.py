"""Containers recognised from their first bytes; everything else named for what it is."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from vf_mm.errors import VideoDecodeError
from vf_mm.videos._container import sniff_container

from ._make import encode, moving_square, mp4, webm


def _image(fmt: str) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(buffer, fmt)
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("data", "demuxer"),
    [
        (mp4, "mov"),
        (webm, "matroska"),
        (lambda: encode(moving_square(2), fmt="avi", codec="mpeg4", pix_fmt=None), "avi"),
        (lambda: encode(moving_square(2), fmt="mpegts", codec="mpeg4", pix_fmt=None), "mpegts"),
        (lambda: encode(moving_square(2), fmt="mov", codec="png", pix_fmt="rgb24"), "mov"),
    ],
)
def test_video_containers_are_recognised(data, demuxer):
    assert sniff_container(data()).demuxer == demuxer


@pytest.mark.parametrize(
    ("data", "look"),
    [
        (_image("PNG"), "a PNG image"),
        (_image("JPEG"), "a JPEG image"),
        (_image("GIF"), "a GIF image"),
        (_image("WEBP"), "a WebP image"),
        (_image("BMP"), "a BMP image"),
        (_image("TIFF"), "a TIFF image"),
        (b"\0\0\0\x1cftypavif\0\0\0\0", "an AVIF image"),
        (b"\0\0\0\x18ftypheic\0\0\0\0", "a HEIC image"),
        (b"  <!DOCTYPE html><html><body>404</body></html>", "HTML or XML text"),
        (b"this is not a video\n", "text"),
        (b"ID3\x04\0\0\0\0\0\0", "MP3 audio"),
        (b"OggS\0\x02" + b"\0" * 30, "an Ogg file"),
        (b"", "empty"),
        (b"\x01\x02\x03\x04\x05\x06\x07\x08\x09", "unknown bytes starting 01 02 03"),
    ],
)
def test_other_bytes_are_refused_saying_what_they_look_like(data, look):
    with pytest.raises(VideoDecodeError, match="not a video") as caught:
        sniff_container(data)
    assert look in str(caught.value)


def test_an_image_is_pointed_to_image_parts():
    with pytest.raises(VideoDecodeError, match="pass it as an image"):
        sniff_container(_image("PNG"))


def test_a_playlist_never_reaches_ffmpeg():
    """HLS would make FFmpeg's probe open the URLs inside (behind the guard's back)."""
    playlist = b"#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:10,\nhttp://169.254.169.254/x.ts\n"
    with pytest.raises(VideoDecodeError, match="text"):
        sniff_container(playlist)
