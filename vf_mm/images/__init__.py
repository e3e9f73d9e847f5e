"""Every image that enters vf_mm passes here: ``load_image``, ``ImagePolicy``, ``image_hash``.

``load_image(source, *, policy=None, where=None)`` turns a PIL image, encoded bytes, a
``data:`` URL, a local path or ``file://`` URL, an ``http(s)://`` URL, or a content part
into a decoded, upright RGB ``PIL.Image.Image``, reading only what ``policy`` allows.
``image_hash(image)`` is the content hash vf_mm uses for ``mm_hashes`` and image assets.
``source_key(source, policy=...)`` identifies a source without decoding it (a data URL's
string, a file's inode, size and times; none for PIL images, arrays and http(s)), so a
cache of processed images recognises a repeated source before reading it (``_key.py``
says what each key covers and why).

Sources (``_source.py``)
    Strings are sorted by scheme: ``data:``, ``http:``/``https:``, ``file:``; a string
    with no scheme (or a one-letter Windows drive) is a local path. Any other scheme
    (``ftp:``, ``gopher:``, ...) is refused. A bare base64 string is *not* guessed at
    (transformers tries it): it is a path, and the error for a missing path that looks
    like base64 says to wrap it as ``data:image/png;base64,...``.

Safety (``_guard.py``, ``_fetch.py``, ``_local.py``)
    Network off by default. When on: http(s) only, no credentials in URLs, an allow-list
    of domains if given, every resolved address public (never loopback, private,
    link-local/metadata, CGNAT, multicast, reserved, or IPv6 forms embedding those),
    numeric hosts only as canonical dotted quads, the connection pinned to the checked
    address, every redirect re-checked, bodies capped at ``max_bytes``, one deadline
    for the whole fetch. Local paths: any (``local_roots=None``), or only inside the
    roots after resolving symlinks and ``..``; regular files only, read bounded.

What the decoder does with each kind of image (``_decode.py``; the conversion is the
one transformers applies: ``image_utils.load_image`` rotates by EXIF and the Qwen2-VL
image processor's ``convert_to_rgb`` composites alpha onto white)

    ============================ ===============================================================
    input                        result
    ============================ ===============================================================
    RGB (PNG, JPEG, WebP, ...)   as decoded
    RGBA, LA, PA                 alpha-composited onto white, then RGB (as convert_to_rgb)
    palette (P) / L / RGB with   the transparency applied (via RGBA), composited onto white
    a ``transparency`` entry
    palette without transparency ``convert("RGB")`` through the palette
    L (8-bit grey), 1-bit        grey replicated to R=G=B; 1-bit gives 0 and 255
    I;16 / I / F (16-bit grey,   ``convert("RGB")`` as transformers does: values are *clipped*
    32-bit int, float)           to 0..255, not rescaled (a 16-bit image over 255 is white);
                                 rescale it yourself and pass a PIL image if that matters
    CMYK (JPEG)                  Pillow's ``convert("RGB")`` (no colour management)
    ICC profiles                 not applied (pixel values as stored), like transformers
    EXIF Orientation 2..8        rotated/flipped upright (``ImageOps.exif_transpose``), as
                                 transformers' ``load_image``; unreadable EXIF is ignored
    animated GIF/PNG/WebP, MPO,  the first frame (frame 0 as Pillow numbers it: for APNG the
    multi-page TIFF              default image); later frames are never decoded
    0x0 / 0-byte / empty         ``ImageDecodeError``
    truncated or corrupt         ``ImageDecodeError`` (never grey padding, whatever
                                 ``ImageFile.LOAD_TRUNCATED_IMAGES`` says; a PNG cut before
                                 IEND counts as truncated)
    more than ``max_pixels``     ``ImageTooLargeError`` from the header, before decoding;
                                 Pillow's own DecompressionBombError/-Warning is mapped to it
    not an image, SVG, HTML,     ``ImageDecodeError`` saying what the bytes look like
    a format outside ``policy.formats`` (EPS, PSD, ICO, PDF, HEIC, JPEG 2000, ...)
    a PIL image passed in        not modified (its pixels are loaded if lazy); its current
                                 frame is used; the result is a new object
    ============================ ===============================================================

Where vLLM may differ (read in its source, not run here): its ``convert_image_mode``
composites only ``RGBA`` onto white and converts ``LA`` and palette transparency with a
plain ``convert("RGB")``; vf_mm follows transformers.
"""

from __future__ import annotations

from vf_mm.images._data_url import decode_data_url
from vf_mm.images._encode import encode_png, png_data_url
from vf_mm.images._fetch import Fetcher
from vf_mm.images._hash import image_hash
from vf_mm.images._key import source_key
from vf_mm.images._load import load_image, load_image_with_png
from vf_mm.images._policy import ImagePolicy

__all__ = [
    "png_data_url",
    "encode_png",
    "decode_data_url",
    "Fetcher",
    "ImagePolicy",
    "image_hash",
    "source_key",
    "load_image",
    "load_image_with_png",
]
