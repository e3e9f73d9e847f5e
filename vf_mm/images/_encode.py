"""Encoding decoded images: ``encode_png`` (bytes) and ``png_data_url`` (a ``data:`` URL).

Every PNG vf_mm writes goes through ``encode_png``: the results store's assets, the HTML
report's conversions of formats browsers do not show, the ``data:`` URLs sent to
servers that take URLs (vLLM content_parts, OpenAI APIs), and the trainer wire's bytes of
an image given as pixels. Those get the pixels ``load_image`` decoded, losslessly, never
the original URL (a server would fetch whatever it is told to). PNG is lossless whatever
the level: level 1 is fast, and the size hardly matters next to sending pixels at all.

Two writers. Pillow's (``filtered=True``, the default) picks a filter per row, which
makes smaller files that are slow to encode and to decode (every row is unfiltered
again). Ours (``filtered=False``, RGB only) writes every row with filter 0 (None) and
nothing but the pixels: a file any PNG reader accepts, and one Pillow decodes at about
the speed of a bare ``zlib`` inflate (1.7-2.7x faster than its own file,
``bench/png_decode.py``), at the cost of size where filters help the compressor (about
1.8x for a photo). It is for bytes that vf_mm itself decodes again (the trainer's
rebuild), where decode time matters more than size.
"""

from __future__ import annotations

import base64
import io
import struct
import zlib

import numpy as np
from PIL import Image

__all__ = ["encode_png", "png_data_url"]

_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: the most bytes one IDAT chunk holds (a chunk's length field allows 2**31 - 1)
_MAX_IDAT = 1 << 30


def encode_png(image: Image.Image, *, compress_level: int = 1, filtered: bool = True) -> bytes:
    """``image`` as PNG bytes.

    Args:
        image: The image.
        compress_level: 0-9: speed against size, never quality.
        filtered: True: Pillow's writer (adaptive row filters, and what Pillow writes
            from ``image.info``: an ICC profile, a transparency colour). False, for an RGB
            image: our writer, 8-bit RGB (colour type 2), not interlaced, every row
            filtered with 0 (None), the pixels alone in IDAT chunks (no other chunk,
            nothing from ``image.info``, so a decoder gives back exactly these pixels).
            Faster to write and 1.7-2.7x faster to decode than Pillow's file; larger where
            filters help the compressor (about 1.8x for a photo). Any other mode, or a
            zero-sized image, goes to Pillow's writer as with True.
    """
    if filtered or image.mode != "RGB" or image.width == 0 or image.height == 0:
        buffer = io.BytesIO()
        image.save(buffer, format="PNG", compress_level=compress_level)
        return buffer.getvalue()
    return _unfiltered_rgb_png(image, compress_level)


def _chunk(kind: bytes, data: bytes | memoryview) -> list[bytes | memoryview]:
    crc = zlib.crc32(data, zlib.crc32(kind))
    return [struct.pack(">I", len(data)) + kind, data, struct.pack(">I", crc)]


def _unfiltered_rgb_png(image: Image.Image, compress_level: int) -> bytes:
    """Signature, IHDR, IDAT (the zlib stream of the rows, each prefixed by filter byte
    0), IEND. The row-prefixed buffer is built by numpy, whole, never row by row."""
    width, height = image.size
    rows = np.empty((height, width * 3 + 1), dtype=np.uint8)
    rows[:, 0] = 0
    rows[:, 1:] = np.frombuffer(image.tobytes(), dtype=np.uint8).reshape(height, width * 3)
    stream = memoryview(zlib.compress(rows.data, compress_level))
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    parts: list[bytes | memoryview] = [_SIGNATURE, *_chunk(b"IHDR", ihdr)]
    for start in range(0, len(stream), _MAX_IDAT):
        parts += _chunk(b"IDAT", stream[start : start + _MAX_IDAT])
    parts += _chunk(b"IEND", b"")
    return b"".join(parts)


def png_data_url(image: Image.Image) -> str:
    """``image`` as a ``data:image/png;base64,...`` URL.

    Args:
        image: The image.
    """
    return "data:image/png;base64," + base64.b64encode(encode_png(image)).decode("ascii")
