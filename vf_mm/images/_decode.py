"""Encoded bytes to a fully decoded RGB image, and any PIL image to RGB.

Checks run in this order, each before any pixel is decoded: empty input, ``max_bytes``,
the format (sniffed from the bytes, ``policy.formats`` only), then width and height
from the header (zero-sized, ``max_pixels``). Only then are the pixels decoded, with
``.load()``, so corrupt or truncated data fails here and not in a later resize.

Truncation does not depend on Pillow's process-wide ``ImageFile.LOAD_TRUNCATED_IMAGES``
(another library may have set it, and with it Pillow pads a cut-off image with grey):
the decoder reads through a stream that records whether it ran out of data while
decoding pixels, and that is an error whatever the flag says.

Conversion to RGB does what ``transformers`` does (``image_utils.load_image`` then the
Qwen2-VL image processor's ``image_transforms.convert_to_rgb``): rotate by the EXIF
Orientation tag, then composite an image with alpha (an ``A`` band, or a
``transparency`` entry: palette or single-colour transparency) onto white, and
``Image.convert("RGB")`` anything else.
"""

from __future__ import annotations

import io
import struct

from PIL import Image, ImageOps, UnidentifiedImageError

from vf_mm._text import describe_exception
from vf_mm.errors import ImageDecodeError, ImageError, ImageTooLargeError
from vf_mm.images._policy import ImagePolicy

__all__ = ["check_dimensions", "decode_bytes", "decode_bytes_as_is", "plain_png", "to_rgb"]

_ORIENTATION = 0x0112
_WHITE = (255, 255, 255, 255)
_MAGIC_HINTS: tuple[tuple[int, bytes, str], ...] = (
    (0, b"%PDF", "a PDF document"),
    (0, b"%!PS", "PostScript/EPS (not decoded: it would run Ghostscript)"),
    (0, b"\xc5\xd0\xd3\xc6", "PostScript/EPS (not decoded: it would run Ghostscript)"),
    (0, b"8BPS", "a Photoshop PSD file"),
    (0, b"\x00\x00\x01\x00", "a Windows ICO file"),
    (4, b"ftypheic", "HEIC (needs a HEIF plugin)"),
    (4, b"ftypheix", "HEIC (needs a HEIF plugin)"),
    (4, b"ftypmif1", "HEIF (needs a HEIF plugin)"),
    (0, b"\x00\x00\x00\x0cjP  ", "JPEG 2000"),
    (0, b"\xff\x4f\xff\x51", "JPEG 2000"),
)


class _SensingReader(io.BytesIO):
    """A ``BytesIO`` that records a read finding no data while ``armed``: the pixel
    decoder asked for more than the file holds, i.e. the file is truncated. (Pillow
    sees the same event and, unless ``LOAD_TRUNCATED_IMAGES`` is set, raises.)"""

    def __init__(self, data: bytes | bytearray | memoryview) -> None:
        super().__init__(data)
        self.armed = False
        self.ran_out = False

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        if self.armed and not chunk and size != 0:
            self.ran_out = True
        return chunk


def _registered(formats: tuple[str, ...]) -> list[str]:
    """The formats Pillow has an opener for (others, e.g. AVIF in a build without it,
    are skipped: ``Image.open`` fails on an unknown id instead of trying the next)."""
    Image.init()
    return [f for f in formats if f in Image.OPEN]


_SIGNATURES: tuple[tuple[int, bytes, str], ...] = (
    (0, b"\x89PNG\r\n\x1a\n", "PNG"),
    (0, b"\xff\xd8\xff", "JPEG"),
    (0, b"GIF87a", "GIF"),
    (0, b"GIF89a", "GIF"),
    (0, b"BM", "BMP"),
    (8, b"WEBP", "WEBP"),
    (0, b"II*\x00", "TIFF"),
    (0, b"MM\x00*", "TIFF"),
    (4, b"ftypavif", "AVIF"),
)


def _zero_size(head: bytes, fmt: str) -> tuple[int, int] | None:
    """Width and height from a PNG or GIF header when one of them is 0."""
    if fmt == "PNG" and len(head) >= 24 and head[12:16] == b"IHDR":
        width, height = struct.unpack(">II", head[16:24])
    elif fmt == "GIF" and len(head) >= 10:
        width, height = struct.unpack("<HH", head[6:10])
    else:
        return None
    return (width, height) if width == 0 or height == 0 else None


def _not_an_image(data: bytes | bytearray | memoryview, policy: ImagePolicy) -> str:
    head = bytes(data[:1024])
    for offset, magic, fmt in _SIGNATURES:
        if head[offset : offset + len(magic)] == magic:
            zero = _zero_size(head, fmt)
            if zero is not None:
                return f"zero-sized image ({zero[0]}x{zero[1]})"
            if fmt not in policy.formats:
                return f"{fmt} is not one of the formats read {list(policy.formats)}"
            return f"corrupt {fmt} header (Pillow cannot identify it)"
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n").lower()
    if text.startswith((b"<svg", b"<?xml")) and b"<svg" in text:
        return "SVG is a vector format and is not decoded"
    if text.startswith((b"<!doctype html", b"<html", b"<head", b"<body")):
        return "the data is HTML, not an image (an error page?)"
    if text.startswith((b"{", b"[")):
        return "the data is JSON or text, not an image"
    for offset, magic, name in _MAGIC_HINTS:
        if head[offset : offset + len(magic)] == magic:
            return f"the data is {name}, not one of the formats read {list(policy.formats)}"
    return f"the data is not an image in a format read {list(policy.formats)}"


def check_dimensions(width: int, height: int, policy: ImagePolicy) -> None:
    """Refuse a zero-sized image or one over ``max_pixels`` (from its header)."""
    if width <= 0 or height <= 0:
        raise ImageDecodeError(f"zero-sized image ({width}x{height})")
    if width * height > policy.max_pixels:
        raise ImageTooLargeError(
            f"{width}x{height} = {width * height} pixels is over "
            f"max_pixels={policy.max_pixels} (decompression bomb guard)"
        )


def decode_bytes(data: bytes | bytearray | memoryview, policy: ImagePolicy) -> Image.Image:
    """Decode one encoded image (its first frame) to RGB. Raises ``ImageDecodeError``,
    ``ImageTooLargeError``."""
    return decode_bytes_as_is(data, policy)[0]


#: PNG chunks a plain decoder ignores but a viewer may apply (colour management, EXIF
#: orientation, transparency, animation): a PNG holding one is not ``plain_png``
_APPLIED_CHUNKS = frozenset({b"iCCP", b"gAMA", b"cHRM", b"sRGB", b"eXIf", b"tRNS", b"acTL"})


def plain_png(data: bytes | bytearray | memoryview) -> bool:
    """Whether ``data`` is a PNG whose pixels any decoder shows as they are stored: 8-bit
    RGB (colour type 2), one frame, and none of the chunks in ``_APPLIED_CHUNKS``
    before its image data. Reads chunk headers only."""
    view = memoryview(data)
    if bytes(view[:8]) != b"\x89PNG\r\n\x1a\n" or len(view) < 33 or bytes(view[12:16]) != b"IHDR":
        return False
    if view[24] != 8 or view[25] != 2:  # bit depth, colour type
        return False
    at = 8
    while at + 8 <= len(view):
        length = struct.unpack(">I", view[at : at + 4])[0]
        kind = bytes(view[at + 4 : at + 8])
        if kind == b"IDAT":
            return True
        if kind in _APPLIED_CHUNKS:
            return False
        at += 12 + length
    return False


def decode_bytes_as_is(
    data: bytes | bytearray | memoryview, policy: ImagePolicy
) -> tuple[Image.Image, bool]:
    """``decode_bytes``, and whether the RGB image is the decoded first frame unchanged
    (nothing rotated, composited or converted)."""
    size = memoryview(data).nbytes
    if size == 0:
        raise ImageDecodeError("empty image data (0 bytes)")
    if size > policy.max_bytes:
        raise ImageTooLargeError(f"{size} bytes is over max_bytes={policy.max_bytes}")
    reader = _SensingReader(data)
    try:
        image = Image.open(reader, formats=_registered(policy.formats))
    except Image.DecompressionBombError as exc:
        raise ImageTooLargeError(f"decompression bomb refused by Pillow ({exc})") from None
    except Image.DecompressionBombWarning as exc:  # when warnings are errors
        raise ImageTooLargeError(f"decompression bomb refused by Pillow ({exc})") from None
    except UnidentifiedImageError:
        raise ImageDecodeError(_not_an_image(data, policy)) from None
    except Exception as exc:  # Pillow's header parsers raise many types on bad input
        raise ImageDecodeError(f"corrupt image header ({describe_exception(exc)})") from None
    try:
        check_dimensions(*image.size, policy)
        reader.armed = True
        image.load()  # frame 0: Image.open leaves every format there
        reader.armed = False
        if reader.ran_out:
            raise ImageDecodeError(
                "truncated: the data ends before the image does "
                f"({image.format} {image.width}x{image.height}, {size} bytes)"
            )
        result = to_rgb(image, owned=True)
    except BaseException as exc:
        image.close()
        if isinstance(exc, ImageError) or not isinstance(exc, Exception):
            raise
        if isinstance(exc, (Image.DecompressionBombError, Image.DecompressionBombWarning)):
            raise ImageTooLargeError(f"decompression bomb refused by Pillow ({exc})") from None
        raise ImageDecodeError(
            f"corrupt or truncated {image.format} data ({describe_exception(exc)})"
        ) from None
    if result is not image:
        image.close()
        return result, False
    return result, True


def _orientation(image: Image.Image) -> int:
    try:
        value = image.getexif().get(_ORIENTATION, 1)
    except Exception:  # unreadable EXIF: keep the image as stored
        return 1
    return value if isinstance(value, int) and 2 <= value <= 8 else 1


def to_rgb(image: Image.Image, *, owned: bool) -> Image.Image:
    """An upright RGB image. ``owned=False`` (the caller's image): never modified,
    a new object is returned even when nothing changes. ``owned=True``: ``image`` may be
    returned as it is."""
    try:
        image.load()
        if _orientation(image) != 1:
            image = ImageOps.exif_transpose(image)
            owned = True
        if "A" in image.getbands() or image.info.get("transparency") is not None:
            rgba = image.convert("RGBA")
            return Image.alpha_composite(Image.new("RGBA", rgba.size, _WHITE), rgba).convert("RGB")
        if image.mode == "RGB":
            return image if owned else image.copy()
        return image.convert("RGB")
    except ImageError:
        raise
    except (ValueError, OSError, struct.error) as exc:
        raise ImageDecodeError(
            f"cannot convert mode {image.mode} to RGB ({describe_exception(exc)})"
        ) from None
