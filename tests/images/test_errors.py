"""The image errors: where they sit in the tree, how they print, that they pickle."""

from __future__ import annotations

import pickle

import pytest

from vf_mm.errors import (
    ImageDecodeError,
    ImageError,
    ImageFetchError,
    ImageTooLargeError,
    UnsafeImageSourceError,
    VfMmError,
)


@pytest.mark.parametrize(
    "cls", [UnsafeImageSourceError, ImageFetchError, ImageDecodeError, ImageTooLargeError]
)
def test_leaves_are_image_errors_and_value_errors(cls):
    assert issubclass(cls, ImageError)
    assert issubclass(cls, VfMmError)
    assert issubclass(cls, ValueError)


def test_message_names_source_and_where():
    exc = ImageDecodeError("truncated", source="http://x/a.png", where="message 2, part 1")
    assert str(exc) == "image http://x/a.png (message 2, part 1): truncated"
    assert str(ImageDecodeError("truncated")) == "truncated"
    assert str(ImageDecodeError("truncated", where="m0")) == "image (m0): truncated"


def test_attributes_set_later_show_in_the_message():
    exc = ImageFetchError("HTTP 404 Not Found", status=404)
    exc.source = "https://example.com/a.png"
    assert "https://example.com/a.png" in str(exc)
    assert exc.status == 404


def test_pickle_round_trip_keeps_everything():
    exc = ImageFetchError("HTTP 500", source="s", where="w", status=500)
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is ImageFetchError
    assert (back.reason, back.source, back.where, back.status) == ("HTTP 500", "s", "w", 500)
    assert str(back) == str(exc)
