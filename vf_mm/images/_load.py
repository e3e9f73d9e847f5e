"""``load_image``: any image source to a decoded, upright RGB ``PIL.Image.Image``."""

from __future__ import annotations

from typing import Any

from PIL import Image

from vf_mm.errors import ImageError, ImageFetchError
from vf_mm.images._decode import check_dimensions, decode_bytes_as_is, plain_png, to_rgb
from vf_mm.images._fetch import Fetcher
from vf_mm.images._policy import ImagePolicy
from vf_mm.images._read import read_encoded
from vf_mm.images._source import (
    Kind,
    array_to_image,
    classify,
    describe,
    looks_like_bare_base64,
)

__all__ = ["load_image", "load_image_with_png"]

_DEFAULT_POLICY = ImagePolicy()
_DEFAULT_FETCHER = Fetcher()


def load_image(
    source: Any,
    *,
    policy: ImagePolicy | None = None,
    where: str | None = None,
    fetcher: Fetcher | None = None,
) -> Image.Image:
    """Load ``source`` as a fully decoded RGB image, as ``policy`` allows.

    The result is always a new object (a PIL image passed in is never modified) in mode
    ``RGB`` with its pixels loaded.

    Args:
        source: A PIL image; an ``(H, W[, C])`` uint8 array (grey, RGB or RGBA); encoded
            image bytes (``bytes``, ``bytearray``, ``memoryview``); a
            ``data:image/...;base64,`` URL; a local path (``str`` or ``os.PathLike``) or
            ``file://`` URL; an ``http(s)://`` URL; or a content part (``{"type":
            "image_url", "image_url": {"url": ...}}``, ``{"type": "image", "image": ...}``,
            or transformers' ``{"type": "image", "url" | "path": ...}``).
        policy: ``ImagePolicy()`` when None (any local path, no network).
        where: The image's place in a conversation (``"message 2, part 1"``), put in
            errors.
        fetcher: How http(s) is fetched (transport and DNS resolver); the default uses
            httpx and ``socket.getaddrinfo``.

    Raises:
        UnsafeImageSourceError: The policy refuses where it comes from.
        ImageFetchError: Reading it failed.
        ImageDecodeError: Not a whole image in a format the policy allows.
        ImageTooLargeError: Over the policy's byte or pixel limit.
    """
    return load_image_with_png(source, policy=policy, where=where, fetcher=fetcher)[0]


def load_image_with_png(
    source: Any,
    *,
    policy: ImagePolicy | None = None,
    where: str | None = None,
    fetcher: Fetcher | None = None,
) -> tuple[Image.Image, bytes | None]:
    """``load_image(source)``, and the source's own PNG bytes where they are the image.

    The bytes come back when they are a PNG that every decoder shows as exactly the loaded
    image (``plain_png``: 8-bit RGB, one frame, no transparency, orientation or
    colour-management chunk, and nothing converted in loading), else None. Storing those
    bytes stores the image without encoding it again (the results store's assets).

    Args:
        source: As for ``load_image``.
        policy: As for ``load_image``.
        where: As for ``load_image``.
        fetcher: As for ``load_image``.

    Returns:
        The loaded RGB image, and its source's PNG bytes or None.

    Raises:
        ImageError: As ``load_image`` raises (its subclasses name the cause).
    """
    policy = _DEFAULT_POLICY if policy is None else policy
    if not isinstance(policy, ImagePolicy):
        raise TypeError(f"policy must be an ImagePolicy, not {type(policy).__name__}")
    try:
        return _load(source, policy, fetcher or _DEFAULT_FETCHER)
    except ImageError as exc:
        if exc.source is None:
            exc.source = describe(source)
        if exc.where is None:
            exc.where = where
        raise


def _decoded(
    data: bytes | bytearray | memoryview, policy: ImagePolicy
) -> tuple[Image.Image, bytes | None]:
    image, as_is = decode_bytes_as_is(data, policy)
    return image, bytes(data) if as_is and plain_png(data) else None


def _load(source: Any, policy: ImagePolicy, fetcher: Fetcher) -> tuple[Image.Image, bytes | None]:
    found = classify(source)
    if found.kind is Kind.PIL:
        image: Image.Image = found.value
        check_dimensions(image.width, image.height, policy)
        return to_rgb(image, owned=False), None
    if found.kind is Kind.ARRAY:
        image = array_to_image(found.value)
        check_dimensions(image.width, image.height, policy)
        return to_rgb(image, owned=False), None  # a copy: fromarray may share the buffer
    try:
        data = read_encoded(found, policy, fetcher)
    except ImageFetchError as exc:
        if (
            isinstance(found.value, str)
            and found.kind is Kind.PATH
            and looks_like_bare_base64(found.value)
        ):
            exc.reason += (
                "; this looks like bare base64: pass it as data:image/png;base64,... "
                "(or as the decoded bytes)"
            )
        raise
    return _decoded(data, policy)
