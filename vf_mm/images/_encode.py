"""``png_data_url``: an image as a ``data:image/png;base64,...`` URL.

How vf_mm sends an image to a server that takes URLs (vLLM content_parts, OpenAI APIs):
the pixels ``load_image`` decoded, losslessly, never the original URL (a server would
fetch whatever it is told to). PNG level 1: fast, and the size hardly matters next to
sending pixels at all.
"""

from __future__ import annotations

import base64
import io

from PIL import Image

__all__ = ["png_data_url"]


def png_data_url(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=1)
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")
