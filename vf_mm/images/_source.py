"""The forms an image source may take, and how errors name one.

``classify`` sorts a source into one kind (a PIL image, encoded bytes, a ``data:``
URL, a local path, a ``file://`` URL, an ``http(s)://`` URL), unwrapping content-part
dicts first. ``describe`` names a source in an error message: short, and free of
secrets (no base64 payload, no query string, no credentials).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from enum import Enum
from typing import Any
from urllib.parse import urlsplit

from PIL import Image

from vf_mm._text import shorten
from vf_mm.errors import ImageDecodeError, UnsafeImageSourceError, VideoDecodeError

__all__ = ["Kind", "Source", "classify", "describe", "looks_like_bare_base64", "unwrap_part"]

_MAX_SHOWN = 120  # characters of a URL or path shown in an error
_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*):")
_BASE64ISH = re.compile(r"^[A-Za-z0-9+/=\s_-]{256,}$")


class Kind(Enum):
    PIL = "pil"
    ARRAY = "array"
    BYTES = "bytes"
    DATA_URL = "data_url"
    PATH = "path"
    FILE_URL = "file_url"
    HTTP_URL = "http_url"


@dataclass(frozen=True, slots=True)
class Source:
    kind: Kind
    value: Any  # Image.Image | numpy array | bytes-like | str | os.PathLike


#: each medium's two part types: the OpenAI-style URL part, and vf_mm's / transformers' own
_PART_TYPES = {"image": ("image_url", "image"), "video": ("video_url", "video")}


def unwrap_part(part: dict[str, Any], *, medium: str = "image") -> Any:
    """The source inside a content part of ``medium`` (``"image"`` or ``"video"``):
    OpenAI ``{"type": "image_url", "image_url": {"url": ...}}`` (or ``"image_url":
    "..."``), vf_mm ``{"type": "image", "image": ...}``, or transformers' ``{"type":
    "image", "url" | "path": ...}`` (exactly one of the three); likewise ``video_url`` /
    ``video``. Anything else is that medium's ``DecodeError`` naming the part's shape."""
    url_type, own_type = _PART_TYPES[medium]
    refuse = ImageDecodeError if medium == "image" else VideoDecodeError
    kind = part.get("type")
    if kind == url_type:
        inner = part.get(url_type)
        if isinstance(inner, dict):
            inner = inner.get("url")
        if not isinstance(inner, str):
            raise refuse(
                f'{_article(url_type)} "{url_type}" content part needs '
                f'{{"{url_type}": {{"url": "..."}}}}, got {_shape(part)}'
            )
        return inner
    if kind == own_type:
        present = [k for k in (own_type, "url", "path") if part.get(k) is not None]
        if len(present) != 1:
            raise refuse(
                f'{_article(own_type)} "{own_type}" content part needs exactly one of '
                f'"{own_type}", "url" or "path", got {_shape(part)}'
            )
        inner = part[present[0]]
        if isinstance(inner, dict):
            raise refuse(
                f'{_article(own_type)} "{own_type}" content part cannot hold another content part'
            )
        return inner
    raise refuse(
        f'a content part of type {kind!r} holds no {medium} (expected "{own_type}" or "{url_type}")'
    )


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


def _shape(part: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k!r}: {type(v).__name__}" for k, v in part.items()) + "}"


def classify(source: Any) -> Source:
    """Sort ``source`` into its ``Kind`` (content parts unwrapped). Raises
    ``ImageDecodeError`` for a value that is no image source and
    ``UnsafeImageSourceError`` for a URL scheme we never read."""
    if isinstance(source, dict):
        source = unwrap_part(source)
    if isinstance(source, Image.Image):
        return Source(Kind.PIL, source)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return Source(Kind.BYTES, source)
    if _is_array(source):
        return Source(Kind.ARRAY, source)
    if isinstance(source, os.PathLike):
        return Source(Kind.PATH, source)
    if isinstance(source, str):
        match = _SCHEME.match(source)
        # one letter before ":" is a Windows drive (C:\...), not a scheme
        scheme = match.group(1).lower() if match and len(match.group(1)) > 1 else None
        if scheme is None:
            return Source(Kind.PATH, source)
        if scheme == "data":
            return Source(Kind.DATA_URL, source)
        if scheme in ("http", "https"):
            return Source(Kind.HTTP_URL, source)
        if scheme == "file":
            return Source(Kind.FILE_URL, source)
        raise UnsafeImageSourceError(
            f"URL scheme {scheme!r} is not read (only data:, file:, http: and https:); "
            "for a local file whose name has a colon, pass a pathlib.Path or './name'"
        )
    raise ImageDecodeError(
        f"an image source must be a PIL image, an (H, W[, C]) uint8 array, bytes, a "
        f"data:/file:/http(s): URL, a path or a content-part dict, not {type(source).__name__}"
    )


def _is_array(value: Any) -> bool:
    shape = getattr(value, "shape", None)
    return isinstance(shape, tuple) and hasattr(value, "dtype") and hasattr(value, "__array__")


def array_to_image(array: Any) -> Image.Image:
    """An ``(H, W)``, ``(H, W, 1)``, ``(H, W, 3)`` or ``(H, W, 4)`` uint8 array (numpy, or
    anything with ``__array__``: a CPU torch tensor) as a PIL image (L, RGB or RGBA).
    Anything else is refused naming its shape and dtype: a float array in [0, 1] or a
    channels-first tensor would otherwise become a wrong picture without a word."""
    import numpy as np

    try:
        data = np.asarray(array)
    except Exception as exc:  # a CUDA tensor, one that requires grad, ...
        raise ImageDecodeError(
            f"a {type(array).__name__} cannot be read as an image array ({exc}); pass a CPU "
            "uint8 array (e.g. tensor.detach().cpu().numpy()) or a PIL image"
        ) from None
    shape, dtype = tuple(data.shape), data.dtype
    if data.ndim == 3 and data.shape[2] == 1:
        data = data[:, :, 0]
    if dtype != np.uint8:
        raise ImageDecodeError(
            f"an image array must be uint8 (0-255), not {dtype} (shape {shape}); for floats "
            "in [0, 1] pass (array * 255).round().astype(np.uint8)"
        )
    if data.ndim == 2 or (data.ndim == 3 and data.shape[2] in (3, 4)):
        return Image.fromarray(np.ascontiguousarray(data))
    raise ImageDecodeError(
        f"an image array must be (H, W), (H, W, 3) or (H, W, 4), not shape {shape}"
        + (
            " (channels first? transpose it to (H, W, C))"
            if len(shape) == 3 and shape[0] in (1, 3, 4)
            else ""
        )
    )


def _redact_url(url: str) -> str:
    """The URL without credentials, query string or fragment (signed URLs carry secrets
    there), shortened."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return shorten(url.split("?", 1)[0].split("#", 1)[0], _MAX_SHOWN, keep_end=True)
    netloc = parts.netloc
    if "@" in netloc:
        netloc = "…@" + netloc.rsplit("@", 1)[1]
    shown = f"{parts.scheme}://{netloc}{parts.path}"
    if parts.query or parts.fragment:
        shown += "?…"
    return shorten(shown, _MAX_SHOWN, keep_end=True)


def describe(source: Any) -> str:
    """A short, secret-free name for ``source`` in an error message."""
    if isinstance(source, dict):
        try:
            return describe(unwrap_part(source))
        except ImageDecodeError:
            return f"<content part {shorten(_shape(source), 80, keep_end=True)}>"
    if isinstance(source, Image.Image):
        return f"<PIL image {source.mode} {source.width}x{source.height}>"
    if isinstance(source, (bytes, bytearray, memoryview)):
        return f"<{memoryview(source).nbytes} bytes>"
    if isinstance(source, os.PathLike):
        return shorten(repr(os.fspath(source)), _MAX_SHOWN, keep_end=True)
    if isinstance(source, str):
        head = source[:5].lower()
        if head == "data:":
            comma = source.find(",", 0, 200)
            header = source[:comma] if comma >= 0 else source[:40]
            return f"{shorten(header, 80, keep_end=True)},… ({len(source)} chars)"
        if _SCHEME.match(source) and not re.match(r"^[A-Za-z]:", source):
            return _redact_url(source)
        if _BASE64ISH.match(source[:4096]):
            return f"{source[:16]!r}… ({len(source)} chars)"
        return shorten(repr(source), _MAX_SHOWN, keep_end=True)
    return f"<{type(source).__name__}>"


def looks_like_bare_base64(text: str) -> bool:
    """A long string of base64 characters only: likely an image someone forgot to wrap
    as ``data:image/...;base64,...`` (we do not guess; the error says how to wrap it)."""
    return bool(_BASE64ISH.match(text[:4096])) and "." not in text
