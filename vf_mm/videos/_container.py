"""Which containers are read, recognised by their first bytes.

The demuxer is chosen here, from the bytes' signature, and forced when FFmpeg opens
them: FFmpeg's own probing would try some 400 formats, among them playlists and lists
of files (HLS, concat) that open further files or URLs behind the ``ImagePolicy``'s
back, and image formats that make a photo a one-frame "video". Read:

    ================== ================================== =========================
    container          signature                          FFmpeg demuxer
    ================== ================================== =========================
    MP4, MOV, M4V, 3GP a box ``ftyp``/``moov``/``mdat``/    ``mov`` (external data
                       ``free``/``skip``/``wide`` at 4..8  references stay off)
    Matroska, WebM     EBML ``1A 45 DF A3``                ``matroska``
    AVI                ``RIFF....AVI``                     ``avi``
    MPEG-TS            sync byte 0x47 every 188 bytes      ``mpegts``
    ================== ================================== =========================

Anything else is a ``VideoDecodeError`` saying what the bytes look like: an image
(PNG, JPEG, GIF, WebP, BMP, TIFF, AVIF/HEIF), audio (MP3, FLAC, WAV, Ogg), HTML or
other text, nothing at all, or unknown bytes (their first bytes in hex).
"""

from __future__ import annotations

from dataclasses import dataclass

from vf_mm.errors import VideoDecodeError

__all__ = [
    "VIDEO_EXTENSIONS",
    "VIDEO_MEDIA_TYPES",
    "Container",
    "sniff_container",
    "video_extension",
]

#: The file extensions of the containers read, one per container (``video_extension``).
VIDEO_EXTENSIONS = ("mp4", "mov", "webm", "mkv", "avi", "ts")
#: The media type of each (``data:`` URLs, HTML players).
VIDEO_MEDIA_TYPES = {"mp4": "video/mp4", "mov": "video/quicktime", "webm": "video/webm",
                     "mkv": "video/x-matroska", "avi": "video/x-msvideo", "ts": "video/mp2t"}  # fmt: skip
_EBML = b"\x1a\x45\xdf\xa3"
_DOCTYPE = b"\x42\x82"

_MP4_BOXES = frozenset({b"ftyp", b"moov", b"mdat", b"free", b"skip", b"wide"})
#: ftyp brands of still-image formats in the MP4 box structure (HEIF family).
_IMAGE_BRANDS = {
    b"avif": "an AVIF image",
    b"avis": "an AVIF image sequence",
    b"heic": "a HEIC image",
    b"heix": "a HEIC image",
    b"mif1": "a HEIF image",
    b"msf1": "a HEIF image sequence",
}
_TS_PACKET = 188


@dataclass(frozen=True, slots=True)
class Container:
    demuxer: str  # FFmpeg's demuxer name, forced when opening
    label: str  # what errors call it


def _looks_like(data: bytes) -> str:
    """What bytes that are not a video container read look like, for the error."""
    if not data:
        return "empty (0 bytes)"
    signatures = (
        (b"\x89PNG\r\n\x1a\n", "a PNG image"),
        (b"\xff\xd8\xff", "a JPEG image"),
        (b"GIF87a", "a GIF image"),
        (b"GIF89a", "a GIF image"),
        (b"II*\x00", "a TIFF image"),
        (b"MM\x00*", "a TIFF image"),
        (b"BM", "a BMP image"),
        (b"ID3", "MP3 audio"),
        (b"fLaC", "FLAC audio"),
        (b"OggS", "an Ogg file (audio or Theora video; not read)"),
    )
    for magic, name in signatures:
        if data.startswith(magic):
            return name
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "a WebP image"
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "WAV audio"
    if len(data) >= 2 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0:
        return "MPEG audio (MP3) or an unknown stream"
    head = data[:512].lstrip()
    if head[:1] == b"<":
        return "HTML or XML text"
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        text = ""
    if text and all(c.isprintable() or c.isspace() for c in text):
        return "text"
    return "unknown bytes starting " + data[:8].hex(" ")


def sniff_container(data: bytes | bytearray | memoryview) -> Container:
    """The container ``data`` is in, or ``VideoDecodeError`` saying what it is instead."""
    head = bytes(memoryview(data)[:4096])
    if head[4:8] in _MP4_BOXES:
        if head[4:8] == b"ftyp" and head[8:12] in _IMAGE_BRANDS:
            raise VideoDecodeError(
                f"the bytes are {_IMAGE_BRANDS[head[8:12]]}, not a video; pass it as an image"
            )
        return Container("mov", "MP4/MOV")
    if head.startswith(b"\x1a\x45\xdf\xa3"):
        return Container("matroska", "Matroska/WebM")
    if head[:4] == b"RIFF" and head[8:12] == b"AVI ":
        return Container("avi", "AVI")
    if len(head) > 2 * _TS_PACKET and head[0] == head[_TS_PACKET] == head[2 * _TS_PACKET] == 0x47:
        return Container("mpegts", "MPEG-TS")
    look = _looks_like(head)
    hint = "; pass it as an image" if " image" in look and "sequence" not in look else ""
    raise VideoDecodeError(
        f"the bytes are {look}, not a video in a container vf_mm reads "
        f"(MP4/MOV, Matroska/WebM, AVI, MPEG-TS){hint}"
    )


def _matroska_doctype(head: bytes) -> bytes | None:
    """The EBML header's DocType (``b"webm"``, ``b"matroska"``), or None if not found."""
    at = head.find(_DOCTYPE, 4, 64)
    if at < 0 or at + 2 >= len(head):
        return None
    first = head[at + 2]
    width = 9 - first.bit_length() if first else 0  # an EBML varint's length
    if not 1 <= width <= 8:
        return None
    size = first & ((1 << (8 - width)) - 1)
    for byte in head[at + 3 : at + 2 + width]:
        size = (size << 8) | byte
    start = at + 2 + width
    return head[start : start + size].rstrip(b"\0")


def video_extension(data: bytes | bytearray | memoryview) -> str:
    """The extension (``VIDEO_EXTENSIONS``) of the container ``data`` is in.

    Read from its first bytes: ``mp4`` (MP4, M4V, 3GP), ``mov`` (the QuickTime brand), ``webm``
    or ``mkv`` (by the Matroska DocType), ``avi``, ``ts``.

    Args:
        data: The file's bytes (its first bytes suffice).

    Raises:
        VideoDecodeError: Bytes in none of them.
    """
    head = bytes(memoryview(data)[:4096])
    if head[4:8] in _MP4_BOXES:
        brand = head[8:12] if head[4:8] == b"ftyp" else b""
        return "mp4" if brand and brand != b"qt  " else "mov"
    if head.startswith(_EBML):
        return "webm" if _matroska_doctype(head) == b"webm" else "mkv"
    if head[:4] == b"RIFF" and head[8:12] == b"AVI ":
        return "avi"
    if len(head) > 2 * _TS_PACKET and head[0] == head[_TS_PACKET] == head[2 * _TS_PACKET] == 0x47:
        return "ts"
    sniff_container(head)  # raises, saying what the bytes are
    raise VideoDecodeError("the bytes are in no video container vf_mm reads")
