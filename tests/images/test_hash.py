"""image_hash: a hash of the RGB pixels and the size, nothing else."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from PIL import Image, PngImagePlugin

from vf_mm.images import image_hash, load_image

from ._make import encode, gradient


def test_the_documented_formula():
    image = gradient(5, 3)
    expected = hashlib.sha256(
        b"vf_mm.image.v1\0RGB\0" + (5).to_bytes(4, "big") + (3).to_bytes(4, "big") + image.tobytes()
    ).hexdigest()[:32]
    assert image_hash(image) == expected
    assert len(expected) == 32


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(arrays(np.uint8, st.tuples(st.integers(1, 12), st.integers(1, 12), st.just(3))))
def test_same_pixels_same_hash_across_lossless_encodings(array):
    image = Image.fromarray(array, "RGB")
    hashes = {
        image_hash(load_image(encode(image, fmt, **params)))
        for fmt, params in [
            ("PNG", {}),
            ("BMP", {}),
            ("TIFF", {}),
            ("WEBP", {"lossless": True, "exact": True}),
        ]
    }
    hashes.add(image_hash(load_image(image)))
    assert hashes == {image_hash(image)}


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(
    arrays(np.uint8, st.tuples(st.integers(1, 8), st.integers(1, 8), st.just(3))),
    st.data(),
)
def test_any_pixel_change_changes_the_hash(array, data):
    y = data.draw(st.integers(0, array.shape[0] - 1))
    x = data.draw(st.integers(0, array.shape[1] - 1))
    c = data.draw(st.integers(0, 2))
    delta = data.draw(st.integers(1, 255))
    changed = array.copy()
    changed[y, x, c] = (int(changed[y, x, c]) + delta) % 256
    assert image_hash(Image.fromarray(array, "RGB")) != image_hash(Image.fromarray(changed, "RGB"))


def test_the_shape_is_part_of_the_hash():
    raster = bytes(range(18))
    wide = Image.frombytes("RGB", (3, 2), raster)
    tall = Image.frombytes("RGB", (2, 3), raster)
    assert wide.tobytes() == tall.tobytes()
    assert image_hash(wide) != image_hash(tall)


def test_metadata_is_not_part_of_the_hash():
    plain = encode(gradient(), "PNG")
    info = PngImagePlugin.PngInfo()
    info.add_text("Comment", "hello")
    tagged = encode(gradient(), "PNG", pnginfo=info, dpi=(300, 300))
    assert plain != tagged
    assert image_hash(load_image(plain)) == image_hash(load_image(tagged))


def test_only_rgb_images_are_hashed():
    with pytest.raises(ValueError, match="RGB"):
        image_hash(Image.new("RGBA", (2, 2)))
    with pytest.raises(TypeError):
        image_hash(b"bytes")  # type: ignore[arg-type]
