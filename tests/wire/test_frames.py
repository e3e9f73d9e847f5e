"""Specification of the public frame API: ``stream_header`` / ``parse_stream_header``,
``frame_header`` / ``parse_frame_header`` / ``check_frame`` and ``FrameKind``.

The layout is spelled out here as ``vf_mm/wire/_frames.py`` documents it, so a change to
the bytes fails these tests instead of following along."""

from __future__ import annotations

import struct
import zlib
from typing import Any

import numpy as np
import pytest

from vf_mm.errors import (
    CorruptFrameError,
    FrameTooLargeError,
    StreamError,
    StreamHeaderError,
    TornFrameError,
)
from vf_mm.wire import (
    FRAME_HEADER_SIZE,
    STREAM_HEADER_SIZE,
    FrameHeader,
    FrameKind,
    check_frame,
    frame_header,
    packb,
    parse_frame_header,
    parse_stream_header,
    stream_header,
)

MAGIC = b"\x93VFMM\r\n\x1a"
MESSAGE = bytes(packb({"step": 3, "tokens": list(range(40)), "note": "a frame's payload"}))
BOTH = (FrameKind.DATA, FrameKind.END)


def documented_stream_header(version: int = 1, flags: int = 1) -> bytes:
    head = MAGIC + struct.pack("<HH", version, flags)
    return head + struct.pack("<I", zlib.crc32(head))


def documented_frame_header(message: bytes, kind: int, checksum: bool) -> bytes:
    length = struct.pack("<Q", len(message))
    start = zlib.crc32(struct.pack("<I", kind)) if kind else 0  # a DATA frame's: none
    crc = zlib.crc32(message, zlib.crc32(length, start)) if checksum else 0
    return length + struct.pack("<II", crc, kind)


def flips(data: bytes, start: int, stop: int) -> list[tuple[int, bytes]]:
    """Every single-bit flip of ``data[start:stop]``, as (bit number, flipped bytes)."""
    out = []
    for pos in range(start, stop):
        for bit in range(8):
            flipped = bytearray(data)
            flipped[pos] ^= 1 << bit
            out.append(((pos - start) * 8 + bit, bytes(flipped)))
    return out


# -- kinds -----------------------------------------------------------------------------------


def test_frame_kinds_have_fixed_wire_values() -> None:
    # the values are on the wire: a kind never changes meaning
    assert {kind.name: kind.value for kind in FrameKind} == {"DATA": 0, "END": 1}


def test_frame_header_refuses_a_kind_that_does_not_exist() -> None:
    with pytest.raises(ValueError):
        frame_header(MESSAGE, kind=9)  # type: ignore[arg-type]


# -- stream headers --------------------------------------------------------------------------


@pytest.mark.parametrize("checksum", [True, False])
def test_stream_header_round_trip(checksum: bool) -> None:
    head = stream_header(checksum=checksum)
    assert len(head) == STREAM_HEADER_SIZE == 16
    assert head == documented_stream_header(flags=int(checksum))
    assert parse_stream_header(head) is checksum
    assert stream_header() == stream_header(checksum=True)


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"", "shorter than its 16-byte header"),
        (MAGIC[:5], "shorter than its 16-byte header"),
        (b"garbage", "not a vf_mm stream (bad magic)"),
        (b"garbage that is not a stream", "not a vf_mm stream (magic b'garbage '"),
        (documented_stream_header(version=2), "stream version 2 is not supported"),
        (documented_stream_header(version=0), "stream version 0 is not supported"),
        (documented_stream_header(flags=0x8001), "unknown stream flags 0x8001"),
        (documented_stream_header(flags=0x0002), "unknown stream flags 0x2"),
        (MAGIC + struct.pack("<HHI", 1, 1, 0), "fails its checksum"),
    ],
    ids=[
        "empty",
        "short",
        "short-bad-magic",
        "bad-magic",
        "version-2",
        "version-0",
        "unknown-flags",
        "unknown-flag-bit-1",
        "bad-crc",
    ],
)
def test_bad_stream_header(data: bytes, says: str) -> None:
    with pytest.raises(StreamHeaderError) as info:
        parse_stream_header(data)
    assert says in str(info.value)


def test_every_flipped_stream_header_bit_is_caught() -> None:
    # a flip cannot switch checksums off either: the header checks itself
    for checksum in (True, False):
        for _, data in flips(stream_header(checksum=checksum), 0, STREAM_HEADER_SIZE):
            with pytest.raises(StreamHeaderError):
                parse_stream_header(data)


# -- frame heads: round trips ----------------------------------------------------------------


@pytest.mark.parametrize("checksum", [True, False])
@pytest.mark.parametrize("kind", list(FrameKind))
def test_frame_head_round_trip(kind: FrameKind, checksum: bool) -> None:
    head = frame_header(MESSAGE, kind=kind, checksum=checksum)
    assert len(head) == FRAME_HEADER_SIZE == 16
    assert head == documented_frame_header(MESSAGE, kind, checksum)
    header = parse_frame_header(head)
    assert header == FrameHeader(
        length=len(MESSAGE), crc=struct.unpack("<I", head[8:12])[0], kind=kind
    )
    got = check_frame(header, MESSAGE, checksum=checksum, kinds=BOTH)
    assert got is kind


def test_frame_header_defaults_to_a_checksummed_data_frame() -> None:
    assert frame_header(MESSAGE) == documented_frame_header(MESSAGE, 0, True)


@pytest.mark.parametrize(
    "payload",
    [
        MESSAGE,
        bytearray(MESSAGE),
        memoryview(MESSAGE),
        np.frombuffer(MESSAGE, dtype=np.uint8),
        packb({"t": np.arange(6.0)}),  # packb's memoryview of an aligned buffer
        b"",
    ],
    ids=["bytes", "bytearray", "memoryview", "ndarray", "packb-view", "empty"],
)
def test_any_contiguous_buffer_is_a_payload(payload: Any) -> None:
    head = frame_header(payload)
    assert parse_frame_header(head).length == memoryview(payload).nbytes
    assert check_frame(parse_frame_header(head), payload, checksum=True) is FrameKind.DATA


def test_check_frame_accepts_only_data_unless_told_otherwise() -> None:
    header = parse_frame_header(frame_header(MESSAGE, kind=FrameKind.END))
    with pytest.raises(CorruptFrameError, match=r"kind 1 \(END\); this reader accepts DATA \(0\)"):
        check_frame(header, MESSAGE, checksum=True)
    assert check_frame(header, MESSAGE, checksum=True, kinds=BOTH) is FrameKind.END


# -- frame heads: corruption -----------------------------------------------------------------


def test_every_flipped_length_bit_is_caught_when_the_payload_is_whole() -> None:
    head = frame_header(MESSAGE)
    for bit, flipped in flips(head, 0, 8):
        with pytest.raises((CorruptFrameError, FrameTooLargeError)) as info:
            check_frame(parse_frame_header(flipped), MESSAGE, checksum=True)
        if bit < 32:  # a length under the 4 GiB default limit: the size gives it away
            assert isinstance(info.value, CorruptFrameError), bit
            assert "truncated or padded" in str(info.value)


def test_every_flipped_length_bit_is_caught_when_the_payload_is_read_by_it() -> None:
    # a reader that takes `length` bytes off a byte stream gets a payload of the flipped
    # length, so the sizes agree: the crc32 (over the length bytes and the payload) tells
    source = MESSAGE + bytes(range(256)) * 16
    head = frame_header(MESSAGE)
    checked = 0
    for _, flipped in flips(head, 0, 8):
        header = parse_frame_header(flipped, max_frame_bytes=1 << 64)
        if header.length > len(source):
            continue
        with pytest.raises(CorruptFrameError, match="fails its checksum"):
            check_frame(header, source[: header.length], checksum=True)
        checked += 1
    assert checked >= 12


@pytest.mark.parametrize("checksum", [True, False])
def test_every_flipped_crc_bit_is_caught(checksum: bool) -> None:
    head = frame_header(MESSAGE, checksum=checksum)
    for _, flipped in flips(head, 8, 12):
        with pytest.raises(CorruptFrameError, match="fails its checksum"):
            check_frame(parse_frame_header(flipped), MESSAGE, checksum=checksum)


def test_every_flipped_payload_bit_is_caught() -> None:
    header = parse_frame_header(frame_header(MESSAGE))
    for _, payload in flips(MESSAGE, 0, len(MESSAGE)):
        with pytest.raises(CorruptFrameError, match="fails its checksum"):
            check_frame(header, payload, checksum=True)


def test_without_checksums_the_payload_is_not_checked() -> None:
    # the stream header said so: the crc32 field is 0 and carries nothing to check against
    header = parse_frame_header(frame_header(MESSAGE, checksum=False))
    payload = bytearray(MESSAGE)
    payload[5] ^= 0xFF
    assert check_frame(header, payload, checksum=False) is FrameKind.DATA
    with pytest.raises(CorruptFrameError):  # a checksummed head read as unchecksummed
        check_frame(parse_frame_header(frame_header(MESSAGE)), MESSAGE, checksum=False)


def test_every_flipped_kind_bit_is_caught_where_only_data_is_accepted() -> None:
    head = frame_header(MESSAGE)
    for _, flipped in flips(head, 12, 16):
        with pytest.raises(CorruptFrameError, match="this reader accepts DATA"):
            check_frame(parse_frame_header(flipped), MESSAGE, checksum=True)


@pytest.mark.parametrize("kind", list(FrameKind))
def test_kind_flips_between_accepted_kinds_fail_the_checksum(kind: FrameKind) -> None:
    # an END frame's crc32 covers its kind: where DATA and END are both accepted, the one
    # flip that turns one into the other fails the checksum; every other flip is unknown
    head = frame_header(MESSAGE, kind=kind)
    for bit, flipped in flips(head, 12, 16):
        header = parse_frame_header(flipped)
        with pytest.raises(CorruptFrameError, match="checksum" if bit == 0 else "unknown"):
            check_frame(header, MESSAGE, checksum=True, kinds=BOTH)


@pytest.mark.parametrize("delta", [-1, 1, -len(MESSAGE)])
def test_a_payload_of_another_size_is_corrupt(delta: int) -> None:
    header = parse_frame_header(frame_header(MESSAGE))
    payload = (MESSAGE + b"\x00")[: len(MESSAGE) + delta]
    with pytest.raises(CorruptFrameError) as info:
        check_frame(header, payload, checksum=True, index=4, offset=-1)
    assert f"frame 4 declares {len(MESSAGE)} bytes but carries {len(payload)}" in str(info.value)
    assert (info.value.index, info.value.offset) == (4, -1)


def test_errors_say_where_the_frame_is() -> None:
    payload = bytearray(MESSAGE)
    payload[0] ^= 1
    with pytest.raises(CorruptFrameError) as info:
        check_frame(
            parse_frame_header(frame_header(MESSAGE)), payload, checksum=True, index=7, offset=912
        )
    assert str(info.value) == "frame 7 at byte offset 912 fails its checksum"
    assert (info.value.index, info.value.offset) == (7, 912)
    assert isinstance(info.value, StreamError) and isinstance(info.value, ValueError)


# -- frame heads: torn and too large ---------------------------------------------------------


def test_a_torn_head() -> None:
    head = frame_header(MESSAGE)
    for cut in range(FRAME_HEADER_SIZE):
        with pytest.raises(TornFrameError) as info:
            parse_frame_header(head[:cut], index=3, offset=100)
        err = info.value
        assert (err.index, err.offset, err.expected, err.available) == (3, 100, 16, cut)
        assert "frame 3 at byte offset 100 needs a 16-byte header" in str(err)
        assert f"only {cut} bytes follow; the 3 frames before it are whole" in str(err)


def test_a_length_over_the_limit_is_refused_before_the_payload() -> None:
    head = frame_header(MESSAGE)
    assert parse_frame_header(head, max_frame_bytes=len(MESSAGE)).length == len(MESSAGE)
    with pytest.raises(FrameTooLargeError) as info:
        parse_frame_header(head, max_frame_bytes=len(MESSAGE) - 1, index=2, offset=64)
    err = info.value
    assert (err.length, err.limit, err.offset) == (len(MESSAGE), len(MESSAGE) - 1, 64)
    assert str(err).startswith(f"frame 2 at byte offset 64 declares {len(MESSAGE)} bytes")
    # the default limit is 4 GiB
    huge = struct.pack("<QII", (4 << 30) + 1, 0, 0)
    with pytest.raises(FrameTooLargeError):
        parse_frame_header(huge)
    assert parse_frame_header(struct.pack("<QII", 4 << 30, 0, 0)).length == 4 << 30


# -- one frame as a message ------------------------------------------------------------------


def test_a_stream_header_and_a_frame_are_a_one_frame_stream() -> None:
    # what a transport sends per message: everything checks with the frame API alone
    for kind in FrameKind:
        data = stream_header() + frame_header(MESSAGE, kind=kind) + MESSAGE
        checksum = parse_stream_header(data[:STREAM_HEADER_SIZE])
        header = parse_frame_header(data[STREAM_HEADER_SIZE : STREAM_HEADER_SIZE + 16])
        payload = memoryview(data)[STREAM_HEADER_SIZE + 16 :]
        assert check_frame(header, payload, checksum=checksum, kinds=BOTH) is kind
