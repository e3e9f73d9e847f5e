"""encode_png: Pillow's writer by default, and our unfiltered RGB writer (filtered=False),
whose files every reader takes and whose pixels come back exactly."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from vf_mm.images import _encode, encode_png, load_image

from ._make import gradient, pixels

SIZES = [(1, 1), (1, 9), (9, 1), (3, 5), (17, 4), (255, 3), (1024, 768)]


def noise(width: int, height: int, seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB")


def flat(width: int, height: int) -> Image.Image:
    return Image.new("RGB", (width, height), (12, 200, 77))


def chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    """A PNG's chunks as (type, body), each CRC checked."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    out, pos = [], 8
    while pos < len(data):
        (length,) = struct.unpack_from(">I", data, pos)
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        (crc,) = struct.unpack_from(">I", data, pos + 8 + length)
        assert zlib.crc32(kind + body) == crc, kind
        out.append((kind, body))
        pos += 12 + length
    assert pos == len(data)
    return out


def pillow_writes(image: Image.Image, **params: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", **params)
    return buffer.getvalue()


@pytest.mark.parametrize("make", [noise, flat], ids=["noise", "flat"])
@pytest.mark.parametrize(("width", "height"), SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_unfiltered_png_round_trips_through_pillow_and_load_image(make, width, height):
    image = make(width, height)
    data = encode_png(image, filtered=False)
    with Image.open(io.BytesIO(data)) as opened:
        assert (opened.format, opened.mode, opened.size) == ("PNG", "RGB", (width, height))
        assert (pixels(opened) == pixels(image)).all()
    loaded = load_image(data)
    assert loaded.mode == "RGB"
    assert (pixels(loaded) == pixels(image)).all()


def test_unfiltered_png_is_exactly_ihdr_idat_iend_with_filter_byte_zero():
    image = noise(13, 7)
    found = chunks(encode_png(image, filtered=False))
    kinds = [kind for kind, _ in found]
    assert kinds[0] == b"IHDR" and kinds[-1] == b"IEND" and set(kinds[1:-1]) == {b"IDAT"}
    assert struct.unpack(">IIBBBBB", found[0][1]) == (13, 7, 8, 2, 0, 0, 0)
    assert found[-1][1] == b""
    rows = np.frombuffer(zlib.decompress(b"".join(b for _, b in found[1:-1])), np.uint8)
    rows = rows.reshape(7, 13 * 3 + 1)
    assert (rows[:, 0] == 0).all()
    assert (rows[:, 1:] == pixels(image).reshape(7, -1)).all()


@pytest.mark.parametrize("level", [0, 1, 6, 9])
def test_compress_level_changes_size_never_pixels(level):
    image = gradient(200, 100)
    data = encode_png(image, compress_level=level, filtered=False)
    assert (pixels(load_image(data)) == pixels(image)).all()
    if level == 0:  # stored blocks: the rows plus zlib's framing
        assert len(data) > 100 * (200 * 3 + 1)
    else:
        assert len(data) < 100 * (200 * 3 + 1)


def test_a_long_stream_is_split_across_idat_chunks(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(_encode, "_MAX_IDAT", 1000)
    image = noise(64, 32)
    data = encode_png(image, filtered=False)
    idat = [body for kind, body in chunks(data) if kind == b"IDAT"]
    assert len(idat) > 3 and all(len(b) == 1000 for b in idat[:-1])
    assert (pixels(Image.open(io.BytesIO(data))) == pixels(image)).all()
    assert (pixels(load_image(data)) == pixels(image)).all()


def test_nothing_from_image_info_is_written():
    """Only the pixels: a transparency colour in ``info`` would make a reader composite
    those pixels onto white, and they would not come back as they are."""
    image = flat(4, 4)
    image.info["transparency"] = (12, 200, 77)
    assert b"tRNS" in pillow_writes(image)  # Pillow's writer would carry it
    data = encode_png(image, filtered=False)
    assert [kind for kind, _ in chunks(data)] == [b"IHDR", b"IDAT", b"IEND"]
    assert load_image(data).getpixel((0, 0)) == (12, 200, 77)


def test_filtered_is_pillows_writer_as_it_was():
    image = gradient(40, 30)
    for level in (1, 6):
        assert encode_png(image, compress_level=level) == pillow_writes(image, compress_level=level)
        assert encode_png(image, compress_level=level, filtered=True) == pillow_writes(
            image, compress_level=level
        )
    assert encode_png(image) == pillow_writes(image, compress_level=1)


@pytest.mark.parametrize("mode", ["L", "LA", "RGBA", "P", "I;16", "1", "CMYK"])
def test_other_modes_fall_back_to_pillows_writer(mode):
    image = gradient(9, 5, mode) if mode != "CMYK" else Image.new("CMYK", (9, 5), (1, 2, 3, 4))
    if mode == "CMYK":  # Pillow's PNG writer refuses it: so does ours
        with pytest.raises(OSError):
            encode_png(image, filtered=True)
        with pytest.raises(OSError):
            encode_png(image, filtered=False)
        return
    assert encode_png(image, filtered=False) == encode_png(image, filtered=True)
    assert encode_png(image, compress_level=6, filtered=False) == pillow_writes(
        image, compress_level=6
    )


def test_a_zero_sized_image_fails_as_pillows_writer_does():
    image = Image.new("RGB", (0, 3))
    with pytest.raises(Exception) as pillow:
        encode_png(image, filtered=True)
    with pytest.raises(type(pillow.value)):
        encode_png(image, filtered=False)
