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


@pytest.fixture(params=["pybase64", "binascii"])
def decoder(request, monkeypatch):
    """Every check below holds with the SIMD decoder and without it (binascii alone)."""
    import vf_mm.images._data_url as module

    if request.param == "binascii":
        monkeypatch.setattr(module, "_fast_b64decode", None)
    elif module._fast_b64decode is None:
        pytest.fail("pybase64 is pinned in requirements/lock.txt but does not import")
    return request.param


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        (B64[:-1], "not valid base64"),  # a padding character missing
        (B64 + "=", "not valid base64"),  # one too many
        (B64[:-2] + "=A", "not valid base64"),  # data after padding
        ("=" + B64[1:], "not valid base64"),  # padding first
        (B64[:8] + "=" + B64[9:], "not valid base64"),  # padding inside
        (B64[:10] + "*" + B64[11:], "not valid base64"),  # outside the alphabet
        (B64[:10] + "." + B64[11:], "not valid base64"),
        (B64[:10] + "\x00" + B64[11:], "not valid base64"),
        (B64[:-5], "not valid base64"),  # a length no padding makes whole
        (B64[:10] + "é" + B64[11:], "non-ASCII"),
        (B64[:10] + "\u3000" + B64[11:], "non-ASCII"),  # Unicode whitespace is not ASCII
    ],
)
def test_strict_base64_refuses(decoder, payload, says):
    assert B64.endswith("==")  # the cases are written for a payload with two "="
    with pytest.raises(ImageDecodeError, match=says):
        decode_data_url("data:image/png;base64," + payload, max_bytes=10**6)


@pytest.mark.parametrize(
    "payload",
    [
        B64,
        base64.encodebytes(PNG).decode(),  # wrapped at 76 with \n
        base64.encodebytes(PNG).decode().replace("\n", "\r\n"),
        " " + B64 + "\n",
        base64.urlsafe_b64encode(PNG).decode(),
        "\n".join(base64.urlsafe_b64encode(PNG).decode()[i : i + 64] for i in range(0, 2000, 64))
        + base64.urlsafe_b64encode(PNG).decode()[2000:],
    ],
)
def test_strict_base64_accepts_wrapped_and_url_safe(decoder, payload):
    assert decode_data_url("data:image/png;base64," + payload, max_bytes=10**6) == PNG


def test_both_decoders_accept_exactly_what_binascii_strict_accepts():
    """pybase64 is stricter in one place (a lone "=" after a whole group); binascii's
    strict mode is the authority, so the result never depends on which is installed."""
    import binascii
    import random

    from vf_mm.images._data_url import b64decode_strict

    rng = random.Random(0)
    alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    for _ in range(3000):
        payload = bytes(
            rng.choice(alphabet) if rng.random() < 0.8 else rng.choice(b"==*.A")
            for _ in range(rng.randint(0, 13))
        )
        try:
            expected = binascii.a2b_base64(payload, strict_mode=True)
        except binascii.Error:
            expected = None
        try:
            got = b64decode_strict(payload)
        except ImageDecodeError:
            got = None
        assert got == expected, payload


def test_a_corrupt_data_url_names_its_place_in_the_conversation():
    from vf_mm.errors import ImageDecodeError as Refused

    with pytest.raises(Refused, match="not valid base64") as raised:
        load_image(
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@@"}},
            where="message 3, part 1",
        )
    assert raised.value.where == "message 3, part 1"
    assert "message 3, part 1" in str(raised.value)
