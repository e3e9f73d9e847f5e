"""Sorting sources into kinds, and naming them in errors without leaking secrets."""

from __future__ import annotations

from pathlib import Path, PureWindowsPath

import pytest
from PIL import Image

from vf_mm.errors import ImageDecodeError, UnsafeImageSourceError
from vf_mm.images._source import Kind, classify, describe


@pytest.mark.parametrize(
    ("source", "kind"),
    [
        (Image.new("RGB", (1, 1)), Kind.PIL),
        (b"x", Kind.BYTES),
        (bytearray(b"x"), Kind.BYTES),
        (memoryview(b"x"), Kind.BYTES),
        ("data:image/png;base64,AAAA", Kind.DATA_URL),
        ("Data:image/png;base64,AAAA", Kind.DATA_URL),
        ("http://example.com/a.png", Kind.HTTP_URL),
        ("HTTPS://example.com/a.png", Kind.HTTP_URL),
        ("file:///tmp/a.png", Kind.FILE_URL),
        ("/tmp/a.png", Kind.PATH),
        ("relative/a.png", Kind.PATH),
        ("C:\\images\\a.png", Kind.PATH),  # a drive letter is not a scheme
        ("c:/images/a.png", Kind.PATH),
        (Path("a.png"), Kind.PATH),
        (PureWindowsPath("a.png"), Kind.PATH),
        ({"type": "image_url", "image_url": {"url": "http://x.com/a"}}, Kind.HTTP_URL),
        ({"type": "image", "image": b"x"}, Kind.BYTES),
    ],
)
def test_classify(source, kind):
    assert classify(source).kind is kind


def test_unknown_schemes_are_refused():
    for url in ("ftp://a/b", "gopher://a/", "jar:file:///x!/a.png", "ab:c.png"):
        with pytest.raises(UnsafeImageSourceError):
            classify(url)


def test_not_a_source():
    with pytest.raises(ImageDecodeError):
        classify(42)


def test_describe_a_data_url_without_its_payload():
    url = "data:image/png;base64," + "A" * 100_000
    text = describe(url)
    assert text.startswith("data:image/png;base64,")
    assert "100022 chars" in text
    assert len(text) < 80


def test_describe_drops_credentials_and_query_strings():
    text = describe("https://user:hunter2@example.com/a.png?token=SECRET#frag")
    assert "hunter2" not in text and "SECRET" not in text and "user" not in text
    assert text.startswith("https://") and "example.com/a.png" in text


def test_describe_shortens_long_urls_and_paths():
    assert len(describe("https://example.com/" + "a" * 1000 + ".png")) <= 120
    assert len(describe("/data/" + "b" * 1000 + ".png")) <= 120
    assert describe("/data/x.png") == "'/data/x.png'"


def test_describe_other_sources():
    assert describe(Image.new("LA", (3, 2))) == "<PIL image LA 3x2>"
    assert describe(b"12345") == "<5 bytes>"
    assert describe(memoryview(b"12345")) == "<5 bytes>"
    assert describe({"type": "image", "image": b"123"}) == "<3 bytes>"
    assert describe(3) == "<int>"
    assert describe({"type": "text", "text": "x" * 500}).startswith("<content part")
