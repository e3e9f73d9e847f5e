"""``image_hash``: a content hash of an RGB image's pixels.

Exactly what is hashed (version 1)::

    sha256(b"vf_mm.image.v1\\0RGB\\0" + width.to_bytes(4, "big") + height.to_bytes(4, "big")
           + image.tobytes()).hexdigest()[:32]

``image.tobytes()`` is the raw RGB raster: 3 bytes per pixel, rows top to bottom,
no padding. So the hash depends on the decoded pixels and the dimensions only: not on
the file format or its compression, metadata (EXIF, ICC profile, PNG text), the file
name, or ``image.info``. The same pixels from PNG and from BMP hash the same; any
changed pixel, or the same bytes laid out in another shape (2x3 vs 3x2), hash
differently. The dimensions are in the hash because the raster alone does not fix
the shape. The prefix names the scheme, so a later scheme cannot collide with it.
sha256 rather than blake2b because CPUs with SHA extensions run it about twice as fast
(0.36 vs 0.77 ms for a 448x448 image here); 128 bits of it are kept.

Only RGB images are hashed (``load_image`` returns RGB): hashing another mode would
need a conversion choice (alpha over what colour?) that belongs to ``load_image``.
"""

from __future__ import annotations

import hashlib

from PIL import Image

__all__ = ["image_hash"]

_PREFIX = b"vf_mm.image.v1\0RGB\0"


def image_hash(image: Image.Image) -> str:
    """32 hex characters: sha256 (first 128 bits) of the RGB pixels and the size.

    See the module doc.

    Args:
        image: An RGB PIL image (what ``load_image`` returns).

    Raises:
        TypeError: Not a PIL image.
        ValueError: Not in mode RGB.
    """
    if not isinstance(image, Image.Image):
        raise TypeError(f"image_hash takes a PIL image, not {type(image).__name__}")
    if image.mode != "RGB":
        raise ValueError(
            f"image_hash takes an RGB image (the output of load_image), got mode {image.mode!r}"
        )
    width, height = image.size
    digest = hashlib.sha256(_PREFIX)
    digest.update(width.to_bytes(4, "big"))
    digest.update(height.to_bytes(4, "big"))
    digest.update(image.tobytes())
    return digest.hexdigest()[:32]
