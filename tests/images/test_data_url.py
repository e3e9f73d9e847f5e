"""data: URLs: what is accepted, what is refused, and the size check before decoding."""

from __future__ import annotations

import base64

import pytest

from vf_mm.errors import ImageDecodeError, ImageTooLargeError
from vf_mm.images import load_image
from vf_mm.images._data_url import decode_data_url

from ._make import gradient, pixels, png_bytes

PNG = png_bytes()
B64 = base64.b64encode(PNG).decode()


@pytest.mark.parametrize(
    "url",
    [
        f"data:image/png;base64,{B64}",
        f"DATA:IMAGE/PNG;BASE64,{B64}",
        f"data:image/jpeg;base64,{B64}",  # the bytes decide the format, not the label
        f"data:image/png;name=a.png;base64,{B64}",
        "data:image/png;base64," + base64.encodebytes(PNG).decode(),  # line-wrapped
        "data:image/png;base64," + base64.urlsafe_b64encode(PNG).decode(),
    ],
)
def test_accepted(url):
    assert decode_data_url(url, max_bytes=10**6) == PNG
    assert (pixels(load_image(url)) == pixels(gradient())).all()


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("data:image/png;base64", "','"),
        (f"data:image/png,{B64}", "not base64"),
        (f"data:;base64,{B64}", "not an image type"),
        (f"data:text/html;base64,{B64}", "not an image type"),
        ("data:image/svg+xml;base64," + base64.b64encode(b"<svg/>").decode(), "SVG"),
        ("data:image/png;base64,@@@@", "not valid base64"),
        ("data:image/png;base64," + B64[:-2], "not valid base64"),  # bad padding
        ("data:image/png;base64,ÄÖÜ=", "non-ASCII"),
    ],
)
def test_refused(url, says):
    with pytest.raises(ImageDecodeError, match=says):
        decode_data_url(url, max_bytes=10**6)


def test_valid_base64_of_something_else_is_a_decode_error():
    url = "data:image/png;base64," + base64.b64encode(b"plain text, no image").decode()
    with pytest.raises(ImageDecodeError):
        load_image(url)


def test_the_size_is_checked_before_decoding():
    huge = "data:image/png;base64," + "A" * 4_000_000  # ~3 MB once decoded
    with pytest.raises(ImageTooLargeError, match="max_bytes"):
        decode_data_url(huge, max_bytes=1_000_000)
    assert decode_data_url("data:image/png;base64," + B64, max_bytes=len(PNG)) == PNG
    with pytest.raises(ImageTooLargeError):
        decode_data_url("data:image/png;base64," + B64, max_bytes=len(PNG) - 1)
