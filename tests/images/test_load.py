"""load_image over every source form: bytes, data: URLs, paths, file://, PIL, parts."""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
from PIL import Image

from vf_mm.errors import (
    ImageDecodeError,
    ImageError,
    ImageFetchError,
    UnsafeImageSourceError,
)
from vf_mm.images import ImagePolicy, load_image

from ._make import encode, gradient, pixels, png_bytes

PNG = png_bytes()
EXPECTED = pixels(gradient())
DATA_URL = "data:image/png;base64," + base64.b64encode(PNG).decode()


def same(image: Image.Image) -> bool:
    return (
        image.mode == "RGB" and image.size == gradient().size and (pixels(image) == EXPECTED).all()
    )


@pytest.fixture
def png_file(tmp_path: Path) -> Path:
    path = tmp_path / "a picture.png"
    path.write_bytes(PNG)
    return path


@pytest.mark.parametrize("wrap", [bytes, bytearray, memoryview])
def test_encoded_bytes(wrap):
    assert same(load_image(wrap(PNG)))


def test_data_url():
    assert same(load_image(DATA_URL))


def test_path_as_str_and_as_path(png_file: Path):
    assert same(load_image(str(png_file)))
    assert same(load_image(png_file))


def test_file_url(png_file: Path):
    assert same(load_image(png_file.as_uri()))  # spaces percent-encoded


def test_the_result_is_fully_loaded_before_it_is_returned(png_file: Path):
    image = load_image(png_file)
    png_file.unlink()  # a lazy image would fail now
    assert image.getpixel((3, 2)) == tuple(int(v) for v in EXPECTED[2, 3])


def test_a_pil_image_is_not_modified_and_not_returned_itself():
    original = Image.new("RGBA", (3, 2), (10, 20, 30, 0))
    original.info["note"] = "mine"
    before = original.tobytes()
    out = load_image(original)
    assert out is not original
    assert out.mode == "RGB" and out.getpixel((0, 0)) == (255, 255, 255)
    assert original.mode == "RGBA" and original.tobytes() == before
    assert original.info == {"note": "mine"}


def test_an_rgb_pil_image_comes_back_as_a_copy():
    original = gradient()
    out = load_image(original)
    assert out is not original
    out.putpixel((0, 0), (1, 2, 3))
    assert original.getpixel((0, 0)) == (0, 0, 0)


def test_a_pil_image_with_exif_orientation_is_rotated_in_a_copy():
    exif = Image.Exif()
    exif[0x0112] = 6
    original = gradient(16, 8)
    original.info["exif"] = exif.tobytes()
    out = load_image(original)
    assert out.size == (8, 16)
    assert original.size == (16, 8) and original.getexif()[0x0112] == 6


def test_a_lazy_truncated_pil_image_is_a_decode_error():
    import io

    lazy = Image.open(io.BytesIO(encode(gradient(64, 64), "BMP")[:500]))
    with pytest.raises(ImageDecodeError):
        load_image(lazy)


@pytest.mark.parametrize(
    "part",
    [
        {"type": "image_url", "image_url": {"url": DATA_URL}},
        {"type": "image_url", "image_url": {"url": DATA_URL, "detail": "high"}},
        {"type": "image_url", "image_url": DATA_URL},
        {"type": "image", "image": PNG},
        {"type": "image", "image": DATA_URL},
        {"type": "image", "image": gradient()},
        {"type": "image", "url": DATA_URL},
    ],
)
def test_content_parts(part):
    assert same(load_image(part))


def test_content_part_with_a_path(png_file: Path):
    assert same(load_image({"type": "image", "path": str(png_file)}))
    assert same(load_image({"type": "image", "image": png_file}))
    assert same(load_image({"type": "image_url", "image_url": {"url": png_file.as_uri()}}))


@pytest.mark.parametrize(
    "part",
    [
        {"type": "text", "text": "hi"},
        {"type": "image_url", "image_url": {}},
        {"type": "image_url"},
        {"type": "image"},
        {"type": "image", "image": PNG, "url": DATA_URL},
        {"type": "image", "image": {"type": "image", "image": PNG}},
        {"image_url": {"url": DATA_URL}},
    ],
)
def test_malformed_content_parts(part):
    with pytest.raises(ImageDecodeError):
        load_image(part)


@pytest.mark.parametrize("value", [None, 3, 1.5, ["a"], object()])
def test_values_that_are_no_image_source(value):
    with pytest.raises(ImageDecodeError, match="image source"):
        load_image(value)


@pytest.mark.parametrize("url", ["ftp://example.com/a.png", "javascript:alert(1)", "s3://b/k.png"])
def test_other_schemes_are_refused(url):
    with pytest.raises(UnsafeImageSourceError, match="scheme"):
        load_image(url)


def test_policy_roots_apply_to_paths_and_file_urls(png_file: Path, tmp_path: Path):
    inside = ImagePolicy(local_roots=(tmp_path,))
    assert same(load_image(png_file, policy=inside))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    confined = ImagePolicy(local_roots=(elsewhere,))
    for source in (
        png_file,
        str(png_file),
        png_file.as_uri(),
        str(elsewhere / ".." / png_file.name),
    ):
        with pytest.raises(UnsafeImageSourceError):
            load_image(source, policy=confined)


def test_a_symlink_pointing_out_of_the_roots_is_refused(png_file: Path, tmp_path: Path):
    root = tmp_path / "root"
    root.mkdir()
    (root / "link.png").symlink_to(png_file)
    with pytest.raises(UnsafeImageSourceError, match="outside"):
        load_image(root / "link.png", policy=ImagePolicy(local_roots=(root,)))
    assert same(load_image(root / "link.png"))  # trusted code may follow it


def test_missing_file():
    with pytest.raises(ImageFetchError, match="no such file"):
        load_image("/nonexistent/dir/a.png")


@pytest.mark.parametrize("fmt", ["BMP", "JPEG"])  # JPEG's base64 starts with "/9j/"
def test_bare_base64_is_not_guessed_but_the_error_says_how_to_wrap_it(fmt):
    bare = base64.b64encode(encode(gradient(64, 64), fmt)).decode()
    with pytest.raises(ImageFetchError) as info:
        load_image(bare)
    assert "data:image/png;base64" in str(info.value)
    assert bare[100:200] not in str(info.value)  # the blob itself is not repeated


def test_errors_name_the_source_and_where_without_the_base64_payload():
    bad = "data:image/png;base64," + base64.b64encode(b"not an image" * 1000).decode()
    with pytest.raises(ImageDecodeError) as info:
        load_image(bad, where="message 2, part 1")
    text = str(info.value)
    assert "message 2, part 1" in text
    assert "data:image/png;base64" in text
    assert len(text) < 400
    assert info.value.where == "message 2, part 1"


def test_where_defaults_to_nothing():
    with pytest.raises(ImageError) as info:
        load_image(b"junk")
    assert info.value.where is None
    assert str(info.value).startswith("image <4 bytes>: ")


def test_policy_must_be_an_image_policy():
    with pytest.raises(TypeError):
        load_image(PNG, policy={"allow_network": True})  # type: ignore[arg-type]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_does_not_hang(tmp_path: Path):
    fifo = tmp_path / "pipe.png"
    os.mkfifo(fifo)
    with pytest.raises(UnsafeImageSourceError, match="regular file"):
        load_image(fifo)


# -- arrays ---------------------------------------------------------------------------


def test_uint8_arrays_of_grey_rgb_and_rgba_load_as_rgb():
    import numpy as np

    rgb = np.random.default_rng(0).integers(0, 256, (12, 20, 3), dtype=np.uint8)
    out = load_image(rgb)
    assert out.mode == "RGB" and out.size == (20, 12)
    assert np.array_equal(np.asarray(out), rgb)
    grey = rgb[:, :, 0]
    assert np.array_equal(np.asarray(load_image(grey))[:, :, 1], grey)
    assert np.array_equal(np.asarray(load_image(grey[:, :, None])), np.asarray(load_image(grey)))
    rgba = np.dstack([rgb, np.zeros((12, 20), np.uint8)])  # fully transparent: white
    assert (np.asarray(load_image(rgba)) == 255).all()
    image = load_image({"type": "image", "image": rgb})  # inside a content part too
    rgb[:] = 0  # the caller changing its array later does not reach the loaded image
    assert np.asarray(image).any()


@pytest.mark.parametrize(
    ("array", "match"),
    [
        ("float01", r"must be uint8 \(0-255\), not float32 .*\* 255"),
        ("chw", r"not shape \(3, 12, 20\) \(channels first\? transpose it"),
        ("4d", r"not shape \(1, 12, 20, 3\)"),
    ],
)
def test_arrays_that_are_not_pictures_are_refused_naming_shape_and_dtype(array, match):
    import numpy as np

    value = {
        "float01": np.zeros((12, 20, 3), np.float32),
        "chw": np.zeros((3, 12, 20), np.uint8),
        "4d": np.zeros((1, 12, 20, 3), np.uint8),
    }[array]
    with pytest.raises(ImageDecodeError, match=match):
        load_image(value, where="message 0, part 1")


def test_an_array_that_numpy_cannot_read_is_an_image_error_not_a_crash():
    import torch

    with pytest.raises(ImageDecodeError, match=r"Tensor cannot be read as an image array.*detach"):
        load_image(torch.zeros(8, 8, 3, requires_grad=True))
