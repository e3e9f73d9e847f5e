"""Decoding: every odd kind of image, and every way the bytes can be bad."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest
from PIL import Image, ImageFile

from vf_mm.errors import ImageDecodeError, ImageTooLargeError
from vf_mm.images import ImagePolicy, load_image
from vf_mm.images._decode import decode_bytes

from ._make import encode, gradient, pixels, png_header_only

POLICY = ImagePolicy()
WHITE = (255, 255, 255)


def _one_pixel(image: Image.Image) -> tuple[int, ...]:
    return tuple(int(v) for v in pixels(image)[0, 0])


# -- modes --------------------------------------------------------------------------


def test_rgb_round_trips_exactly():
    image = load_image(encode(gradient(), "PNG"))
    assert image.mode == "RGB"
    assert (pixels(image) == pixels(gradient())).all()


def test_rgba_is_composited_onto_white():
    rgba = Image.new("RGBA", (2, 1))
    rgba.putpixel((0, 0), (255, 0, 0, 0))  # fully transparent red -> white
    rgba.putpixel((1, 0), (255, 0, 0, 255))  # opaque red stays red
    out = load_image(encode(rgba, "PNG"))
    assert out.mode == "RGB"
    assert out.getpixel((0, 0)) == WHITE
    assert out.getpixel((1, 0)) == (255, 0, 0)


def test_half_transparent_rgba_blends_with_white():
    out = load_image(encode(Image.new("RGBA", (1, 1), (0, 0, 0, 128)), "PNG"))
    assert all(abs(v - 127) <= 1 for v in out.getpixel((0, 0)))  # not black: blended


def test_la_is_composited_onto_white():
    la = Image.new("LA", (2, 1))
    la.putpixel((0, 0), (100, 0))
    la.putpixel((1, 0), (100, 255))
    out = load_image(encode(la, "PNG"))
    assert out.getpixel((0, 0)) == WHITE
    assert out.getpixel((1, 0)) == (100, 100, 100)


def test_palette_with_transparency_composites_transparent_entries_onto_white():
    palette_image = Image.new("P", (2, 1))
    palette_image.putpalette([0, 0, 0, 200, 10, 20] + [0] * (256 * 3 - 6))
    palette_image.putpixel((0, 0), 0)
    palette_image.putpixel((1, 0), 1)
    data = encode(palette_image, "PNG", transparency=0)
    assert Image.open(io.BytesIO(data)).info.get("transparency") == 0  # (the case we mean)
    out = load_image(data)
    assert out.getpixel((0, 0)) == WHITE  # index 0 is transparent black
    assert out.getpixel((1, 0)) == (200, 10, 20)


def test_palette_without_transparency_goes_through_the_palette():
    palette_image = gradient().convert("P")
    out = load_image(encode(palette_image, "PNG"))
    assert (pixels(out) == pixels(palette_image.convert("RGB"))).all()


def test_cmyk_jpeg_is_converted_by_pillow():
    cmyk = Image.new("CMYK", (4, 4), (0, 255, 255, 0))  # red in CMYK
    data = encode(cmyk, "JPEG", quality=100)
    out = load_image(data)
    assert out.mode == "RGB"
    assert (pixels(out) == pixels(Image.open(io.BytesIO(data)).convert("RGB"))).all()
    r, g, b = out.getpixel((1, 1))
    assert r > 200 and g < 60 and b < 60


def test_16_bit_grey_is_clipped_like_transformers_not_rescaled():
    values = np.array([[0, 200, 255, 256, 1000, 65535]], dtype=np.uint16)
    data = encode(Image.fromarray(values), "PNG")
    assert Image.open(io.BytesIO(data)).mode == "I;16"
    out = pixels(load_image(data))[0, :, 0]
    assert out.tolist() == [0, 200, 255, 255, 255, 255]


def test_one_bit_images_become_black_and_white():
    bits = Image.new("1", (2, 1))
    bits.putpixel((1, 0), 1)
    out = load_image(encode(bits, "PNG"))
    assert out.getpixel((0, 0)) == (0, 0, 0)
    assert out.getpixel((1, 0)) == WHITE


def test_grey_becomes_rgb_with_equal_channels():
    out = load_image(encode(gradient().convert("L"), "PNG"))
    array = pixels(out)
    assert (array[..., 0] == array[..., 1]).all() and (array[..., 1] == array[..., 2]).all()


@pytest.mark.parametrize(
    ("orientation", "method"),
    [
        (2, Image.Transpose.FLIP_LEFT_RIGHT),
        (3, Image.Transpose.ROTATE_180),
        (6, Image.Transpose.ROTATE_270),
        (8, Image.Transpose.ROTATE_90),
    ],
)
def test_exif_orientation_is_applied(orientation, method):
    exif = Image.Exif()
    exif[0x0112] = orientation
    data = encode(gradient(16, 8), "JPEG", exif=exif.tobytes(), quality=95)
    stored = Image.open(io.BytesIO(data)).convert("RGB")
    out = load_image(data)
    assert (pixels(out) == pixels(stored.transpose(method))).all()
    if orientation in (6, 8):
        assert out.size == (8, 16)


def test_unreadable_exif_is_ignored():
    data = encode(gradient(16, 8), "JPEG", exif=b"Exif\x00\x00" + b"\xff" * 40, quality=95)
    out = load_image(data)
    assert out.size == (16, 8)
    assert (pixels(out) == pixels(Image.open(io.BytesIO(data)).convert("RGB"))).all()


def test_a_png_cut_before_iend_counts_as_truncated():
    data = encode(gradient(), "PNG")
    assert data.endswith(b"IEND\xaeB`\x82")
    Image.open(io.BytesIO(data[:-12])).load()  # Pillow itself accepts it
    with pytest.raises(ImageDecodeError, match="truncated"):
        load_image(data[:-12])


def test_animated_gif_gives_the_first_frame():
    red = Image.new("RGB", (4, 4), (255, 0, 0))
    blue = Image.new("RGB", (4, 4), (0, 0, 255))
    data = encode(red, "GIF", save_all=True, append_images=[blue], duration=50)
    assert getattr(Image.open(io.BytesIO(data)), "n_frames", 1) == 2
    assert load_image(data).getpixel((0, 0)) == (255, 0, 0)


def test_animated_png_gives_the_first_frame():
    red = Image.new("RGB", (4, 4), (255, 0, 0))
    blue = Image.new("RGB", (4, 4), (0, 0, 255))
    data = encode(red, "PNG", save_all=True, append_images=[blue])
    assert getattr(Image.open(io.BytesIO(data)), "n_frames", 1) == 2
    assert load_image(data).getpixel((0, 0)) == (255, 0, 0)


@pytest.mark.parametrize(
    ("fmt", "params"),
    [("BMP", {}), ("TIFF", {}), ("WEBP", {"lossless": True}), ("GIF", {})],
)
def test_other_accepted_formats(fmt, params):
    source = gradient().convert("P").convert("RGB") if fmt == "GIF" else gradient()
    out = load_image(encode(source, fmt, **params))
    assert (pixels(out) == pixels(source)).all()


# -- empty, zero-sized, truncated, corrupt ----------------------------------------


def test_zero_bytes():
    with pytest.raises(ImageDecodeError, match="empty"):
        load_image(b"")


@pytest.mark.parametrize(("width", "height"), [(0, 0), (0, 5), (5, 0)])
def test_zero_sized_header(width, height):
    with pytest.raises(ImageDecodeError, match="zero-sized"):
        load_image(png_header_only(width, height))


def test_zero_sized_pil_image():
    with pytest.raises(ImageDecodeError, match="zero-sized"):
        load_image(Image.new("RGB", (0, 3)))


TRUNCATABLE = [
    ("PNG", {}),
    ("JPEG", {"quality": 90}),
    ("GIF", {}),
    ("BMP", {}),
    ("TIFF", {}),
    ("WEBP", {}),
]


def _noisy() -> Image.Image:
    rng = np.random.default_rng(0)
    return Image.fromarray(rng.integers(0, 256, (48, 48, 3), dtype=np.uint8), "RGB")


@pytest.mark.parametrize("load_truncated", [False, True])
@pytest.mark.parametrize(("fmt", "params"), TRUNCATABLE)
@pytest.mark.parametrize("keep", [0.5, 0.9])
def test_truncated_data_is_an_error_whatever_pillows_global_flag_says(
    monkeypatch: pytest.MonkeyPatch, fmt, params, keep, load_truncated
):
    data = encode(_noisy(), fmt, **params)
    cut = data[: int(len(data) * keep)]
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", load_truncated)
    with pytest.raises(ImageDecodeError):
        load_image(cut)


@pytest.mark.parametrize(("fmt", "params"), TRUNCATABLE[:5])
def test_pillow_alone_would_pad_these_with_the_flag_set(
    monkeypatch: pytest.MonkeyPatch, fmt, params
):
    """The case the test above guards against really happens: with the global flag,
    Pillow returns a padded image without complaint."""
    cut = encode(_noisy(), fmt, **params)
    cut = cut[: len(cut) // 2]
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    Image.open(io.BytesIO(cut)).load()


def test_the_global_flag_is_left_as_it_was(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(ImageDecodeError):
        load_image(encode(_noisy(), "PNG")[:500])
    assert ImageFile.LOAD_TRUNCATED_IMAGES is True


def test_corrupt_pixel_data_is_an_error():
    data = bytearray(encode(_noisy(), "PNG"))
    data[100:140] = b"\x00" * 40  # inside IDAT: zlib stream and CRC broken
    with pytest.raises(ImageDecodeError):
        load_image(bytes(data))


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"hello, this is not an image at all", "not an image"),
        (b'<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"/>', "SVG"),
        (b'<?xml version="1.0"?>\n<svg xmlns="http://www.w3.org/2000/svg"/>', "SVG"),
        (b"<!DOCTYPE html><html><body>403</body></html>", "HTML"),
        (b'{"error": "not found"}', "JSON"),
        (b"%!PS-Adobe-3.0 EPSF-3.0\n%%BoundingBox: 0 0 10 10\n", "EPS"),
        (b"%PDF-1.7\n", "PDF"),
        (b"\x89PNG\r\n\x1a\n" + b"\x00" * 30, "PNG"),
    ],
)
def test_non_images_are_decode_errors_saying_what_they_look_like(data, says):
    with pytest.raises(ImageDecodeError, match=says):
        load_image(data)


def test_formats_outside_the_policy_are_refused():
    data = encode(gradient(), "BMP")
    assert load_image(data).size == gradient().size
    with pytest.raises(ImageDecodeError, match="BMP is not one of the formats"):
        load_image(data, policy=ImagePolicy(formats=("PNG",)))


def test_pillow_formats_outside_the_defaults_are_refused():
    data = encode(gradient(), "PCX")
    assert Image.open(io.BytesIO(data)).format == "PCX"  # Pillow itself would open it
    with pytest.raises(ImageDecodeError):
        load_image(data)
    assert load_image(data, policy=ImagePolicy(formats=("PCX",))).size == gradient().size


# -- size limits --------------------------------------------------------------------


def test_bytes_over_max_bytes():
    data = encode(gradient(), "PNG")
    with pytest.raises(ImageTooLargeError, match="max_bytes"):
        load_image(data, policy=ImagePolicy(max_bytes=len(data) - 1))
    assert load_image(data, policy=ImagePolicy(max_bytes=len(data))).size == gradient().size


def test_pixels_are_checked_from_the_header_before_decoding():
    # the file holds no pixel data: a decode would fail with ImageDecodeError, so
    # ImageTooLargeError shows that the size was refused first
    with pytest.raises(ImageTooLargeError, match="max_pixels"):
        load_image(png_header_only(9000, 9000))  # 81 Mpx: over ours, under Pillow's
    with pytest.raises(ImageDecodeError):
        load_image(png_header_only(9000, 9000), policy=ImagePolicy(max_pixels=10**8))


def test_a_small_pixel_limit_applies_to_real_images():
    data = encode(gradient(16, 12), "PNG")
    with pytest.raises(ImageTooLargeError):
        load_image(data, policy=ImagePolicy(max_pixels=16 * 12 - 1))
    assert load_image(data, policy=ImagePolicy(max_pixels=16 * 12)).size == (16, 12)


def test_pillows_decompression_bomb_error_becomes_too_large():
    with pytest.raises(ImageTooLargeError):  # 10 Gpx: Pillow raises before we look
        load_image(png_header_only(100_000, 100_000), policy=ImagePolicy(max_pixels=10**11))


def test_pillows_decompression_bomb_warning_as_error_becomes_too_large():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ImageTooLargeError):
            load_image(png_header_only(10_000, 10_000), policy=ImagePolicy(max_pixels=10**9))


def test_pil_images_over_the_pixel_limit():
    with pytest.raises(ImageTooLargeError):
        load_image(gradient(16, 12), policy=ImagePolicy(max_pixels=100))


def test_decode_bytes_returns_a_loaded_rgb_image():
    image = decode_bytes(memoryview(encode(gradient(), "JPEG")), POLICY)
    assert image.mode == "RGB"
    assert _one_pixel(image)  # pixels readable: decoded
