"""Frames: how vf_mm lays messages one after another in a file, a pipe or a socket.

The layout (a self-checking stream header, then a 16-byte head and a payload per frame,
each frame of a ``FrameKind``) is specified in ``docs/formats/wire.md`` ("Frames").
Invariants this module keeps: a length over ``max_frame_bytes`` is refused from the head,
before any payload is read; a stream cut off inside a frame is *torn*
(``TornFrameError``, every frame before it whole); a payload whose size, crc32 or kind
does not match its head is corrupt (``CorruptFrameError``); each reader names the kinds
it accepts.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Collection
from enum import IntEnum
from typing import Any, NamedTuple

from vf_mm.errors import CorruptFrameError, FrameTooLargeError, StreamHeaderError, TornFrameError

STREAM_MAGIC = b"\x93VFMM\r\n\x1a"
STREAM_VERSION = 1
STREAM_HAS_CRC = 0x01
STREAM_HEADER_SIZE = 16
FRAME_HEADER_SIZE = 16
DEFAULT_MAX_FRAME_BYTES = 4 << 30  # 4 GiB

_STREAM_HEADER = struct.Struct("<8sHHI")
_FRAME_HEADER = struct.Struct("<QII")
_LENGTH = struct.Struct("<Q")


class FrameKind(IntEnum):
    """What a frame's payload is (the head's ``kind`` word)."""

    DATA = 0
    """A message of the stream's content."""
    END = 1
    """A writer's end-of-stream marker (the last frame of a stream file, or a ZeroMQ
    sender's last message); the transport that writes it defines its payload."""


class FrameHeader(NamedTuple):
    """A frame head as read. ``kind`` is the raw value: ``check_frame`` says whether the
    reader accepts it."""

    length: int
    crc: int
    kind: int


def stream_header(*, checksum: bool = True) -> bytes:
    """The 16 bytes a stream starts with.

    Args:
        checksum: Sets ``STREAM_HAS_CRC``: the stream's frames carry a crc32.
    """
    head = struct.pack("<8sHH", STREAM_MAGIC, STREAM_VERSION, STREAM_HAS_CRC if checksum else 0)
    return head + struct.pack("<I", zlib.crc32(head))


def parse_stream_header(data: Any) -> bool:
    """Check the stream header at the start of ``data``.

    Args:
        data: The stream's first bytes (at least 16).

    Returns:
        Whether its frames carry a crc32.

    Raises:
        StreamHeaderError: Anything else: fewer than 16 bytes, another magic, a failed
            header crc32, another version, an unknown flag.
    """
    head = bytes(memoryview(data)[:STREAM_HEADER_SIZE])
    if len(head) < STREAM_HEADER_SIZE:
        if head and not STREAM_MAGIC.startswith(head[: len(STREAM_MAGIC)]):
            raise StreamHeaderError("not a vf_mm stream (bad magic)")
        raise StreamHeaderError(
            f"stream is {len(head)} bytes long: shorter than its {STREAM_HEADER_SIZE}-byte header"
        )
    magic, version, flags, crc = _STREAM_HEADER.unpack(head)
    if magic != STREAM_MAGIC:
        raise StreamHeaderError(f"not a vf_mm stream (magic {magic!r})")
    if zlib.crc32(head[:12]) != crc:
        raise StreamHeaderError("the stream header fails its checksum (corrupted bytes)")
    if version != STREAM_VERSION:
        raise StreamHeaderError(
            f"stream version {version} is not supported (this vf_mm reads {STREAM_VERSION})"
        )
    if flags & ~STREAM_HAS_CRC:
        raise StreamHeaderError(f"unknown stream flags {flags:#x} (written by a newer vf_mm?)")
    return bool(flags & STREAM_HAS_CRC)


def frame_header(message: Any, *, kind: FrameKind = FrameKind.DATA, checksum: bool = True) -> bytes:
    """The 16-byte frame head for an encoded ``message``.

    Args:
        message: The encoded message (its length and crc32 go into the head).
        kind: The frame's kind.
        checksum: Whether to fill in the crc32 (0 when off, as the stream header must
            then say).
    """
    n = memoryview(message).nbytes
    crc = _crc(FrameKind(kind), _LENGTH.pack(n), message) if checksum else 0
    return _FRAME_HEADER.pack(n, crc, FrameKind(kind))


def parse_frame_header(
    head: Any,
    *,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
    index: int = 0,
    offset: int = -1,
) -> FrameHeader:
    """Unpack a 16-byte frame head.

    Args:
        head: The head's bytes; fewer than 16 mean the input ended inside it.
        max_frame_bytes: The largest frame length accepted.
        index: The frame's number, for error messages.
        offset: The frame's byte offset (-1: not a file), for error messages.

    Raises:
        TornFrameError: Fewer than 16 bytes.
        FrameTooLargeError: A length over ``max_frame_bytes``.
    """
    head = memoryview(head).cast("B")
    if head.nbytes < FRAME_HEADER_SIZE:
        raise torn_frame(index, offset, FRAME_HEADER_SIZE, head.nbytes, "header")
    header = FrameHeader(*_FRAME_HEADER.unpack_from(head))
    if header.length > max_frame_bytes:
        raise FrameTooLargeError(
            f"{_where(index, offset)} declares {header.length} bytes, over "
            f"max_frame_bytes={max_frame_bytes} (a corrupt length, or raise the limit)",
            offset=offset,
            length=header.length,
            limit=max_frame_bytes,
        )
    return header


def check_frame(
    header: FrameHeader,
    payload: Any,
    *,
    checksum: bool,
    kinds: Collection[FrameKind] = (FrameKind.DATA,),
    index: int = 0,
    offset: int = -1,
) -> FrameKind:
    """Check ``payload`` (the whole of it) against its ``header``; returns its kind.

    Args:
        header: The frame's parsed head.
        payload: The frame's message bytes.
        checksum: What the stream header said (whether frames carry a crc32).
        kinds: The frame kinds allowed here.
        index: The frame's number, for error messages.
        offset: The frame's byte offset in its file (-1: not a file), for error messages.

    Returns:
        The frame's kind.

    Raises:
        CorruptFrameError: The payload's size is not the declared length, it fails its
            crc32 (or the crc32 field is not 0 in a stream without checksums), or its kind
            is not in ``kinds``.
    """
    where = _where(index, offset)
    size = memoryview(payload).nbytes
    if size != header.length:
        raise CorruptFrameError(
            f"{where} declares {header.length} bytes but carries {size} (truncated or padded)",
            offset=offset,
            index=index,
        )
    if header.kind not in kinds:
        accepted = ", ".join(f"{FrameKind(k).name} ({int(k)})" for k in sorted(kinds))
        found = (
            FrameKind(header.kind).name
            if header.kind in FrameKind._value2member_map_
            else "unknown: written by a newer vf_mm, or corrupted"
        )
        raise CorruptFrameError(
            f"{where} is of kind {header.kind} ({found}); this reader accepts {accepted}",
            offset=offset,
            index=index,
        )
    kind = FrameKind(header.kind)
    expected = _crc(kind, _LENGTH.pack(header.length), payload) if checksum else 0
    if header.crc != expected:
        raise CorruptFrameError(f"{where} fails its checksum", offset=offset, index=index)
    return kind


def torn_frame(index: int, offset: int, expected: int, available: int, part: str) -> TornFrameError:
    """The error for frame ``index`` whose ``part`` ("header" or "payload") needs
    ``expected`` bytes where the input has only ``available`` left."""
    return TornFrameError(
        f"stream is torn: {_where(index, offset)} needs a {expected}-byte {part} but only "
        f"{available} bytes follow; the {index} frames before it are whole",
        offset=offset,
        index=index,
        expected=expected,
        available=available,
    )


def _where(index: int, offset: int) -> str:
    return f"frame {index} at byte offset {offset}" if offset >= 0 else f"frame {index}"


def _crc(kind: FrameKind, length_bytes: bytes, payload: Any) -> int:
    """A frame's crc32: over its length bytes and payload, and for a kind other than
    ``DATA`` its kind word before them, so a flipped kind bit between two kinds a reader
    accepts is caught, while a ``DATA`` frame's bytes stay what they were before other
    kinds existed."""
    start = 0 if kind == FrameKind.DATA else zlib.crc32(struct.pack("<I", kind))
    return zlib.crc32(payload, zlib.crc32(length_bytes, start))
