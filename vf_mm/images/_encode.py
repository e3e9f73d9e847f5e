"""Encoding decoded images: ``encode_png`` (bytes) and ``png_data_url`` (a ``data:`` URL).

Every PNG vf_mm writes goes through ``encode_png``: the results store's assets, the HTML
report's conversions of formats browsers do not show, and the ``data:`` URLs sent to
servers that take URLs (vLLM content_parts, OpenAI APIs). Those get the pixels
``load_image`` decoded, losslessly, never the original URL (a server would fetch whatever
it is told to). PNG is lossless whatever the level: level 1 is fast, and the size hardly
matters next to sending pixels at all.
"""

from __future__ import annotations

import base64
import io

from PIL import Image

__all__ = ["encode_png", "png_data_url"]


def encode_png(image: Image.Image, *, compress_level: int = 1) -> bytes:
    """``image`` as PNG bytes (``compress_level`` 0-9: speed against size, never quality)."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=compress_level)
    return buffer.getvalue()


def png_data_url(image: Image.Image) -> str:
    """``image`` as a ``data:image/png;base64,...`` URL."""
    return "data:image/png;base64," + base64.b64encode(encode_png(image)).decode("ascii")
