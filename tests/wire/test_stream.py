"""Specification of framed streams: ``write_stream`` / ``read_stream`` / ``StreamReader`` /
``StreamWriter`` / ``repair_stream``."""

from __future__ import annotations

import contextlib
import gc
import io
import struct
import tracemalloc
import warnings
import weakref
import zlib
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import pytest
import torch

from vf_mm.errors import (
    CorruptFrameError,
    DecodeError,
    FrameTooLargeError,
    StreamError,
    StreamHeaderError,
    TornFrameError,
)
from vf_mm.wire import (
    FrameKind,
    StreamReader,
    StreamWriter,
    frame_header,
    packb,
    read_stream,
    repair_stream,
    unpackb,
    write_stream,
)

HEADER = 16  # stream header bytes
FRAME_HEAD = 16  # frame header bytes
MAGIC = b"\x93VFMM\r\n\x1a"


def make_items() -> list[Any]:
    g = torch.Generator().manual_seed(0)
    return [
        {"step": 0, "tokens": [1, 2, 3], "t": torch.randn(4, 5, generator=g)},
        "a plain string",
        {"step": 1, "img": np.arange(60, dtype=np.uint8).reshape(3, 4, 5), "b": b"\x00\x01"},
        [torch.arange(7, dtype=torch.int64), {"bf": torch.ones(3, dtype=torch.bfloat16)}],
        {"last": torch.full((2, 3), 7.5)},
    ]


def assert_items_equal(got: Any, ref: Any) -> None:
    if isinstance(ref, torch.Tensor):
        assert type(got) is torch.Tensor and got.dtype == ref.dtype
        assert torch.equal(got, ref)
    elif isinstance(ref, np.ndarray):
        assert type(got) is np.ndarray and got.dtype == ref.dtype
        assert np.array_equal(got, ref)
    elif isinstance(ref, dict):
        assert isinstance(got, dict) and set(got) == set(ref)
        for k in ref:
            assert_items_equal(got[k], ref[k])
    elif isinstance(ref, (list, tuple)):
        assert isinstance(got, list) and len(got) == len(ref)
        for g, r in zip(got, ref, strict=True):
            assert_items_equal(g, r)
    else:
        assert got == ref


def frame_starts(data: bytes) -> list[int]:
    """Offsets of every frame in a whole stream, by walking the headers."""
    starts = []
    pos = HEADER
    while pos < len(data):
        starts.append(pos)
        (n,) = struct.unpack_from("<Q", data, pos)
        pos += FRAME_HEAD + n
    assert pos == len(data)
    return starts


@pytest.fixture
def items() -> list[Any]:
    return make_items()


@pytest.fixture
def stream_bytes(items: list[Any]) -> bytes:
    buf = io.BytesIO()
    assert write_stream(buf, items) == len(items)
    return buf.getvalue()


# -- round trips ---------------------------------------------------------------------------


def test_roundtrip_path(tmp_path: Path, items: list[Any]) -> None:
    path = tmp_path / "s.vfmm"
    assert write_stream(path, items) == len(items)
    assert_items_equal(list(read_stream(path)), items)
    assert_items_equal(list(read_stream(str(path))), items)


def test_roundtrip_bytesio(items: list[Any]) -> None:
    buf = io.BytesIO()
    write_stream(buf, items)
    buf.seek(0)
    assert_items_equal(list(read_stream(buf)), items)


def test_empty_stream(tmp_path: Path) -> None:
    path = tmp_path / "empty.vfmm"
    assert write_stream(path, []) == 0
    assert path.stat().st_size == HEADER
    assert list(read_stream(path)) == []


def stream_head(version: int = 1, flags: int = 1) -> bytes:
    """A stream header as documented: magic, u16 version, u16 flags, crc32 of those 12 bytes."""
    head = MAGIC + struct.pack("<HH", version, flags)
    return head + struct.pack("<I", zlib.crc32(head))


def test_layout_matches_the_documented_format(stream_bytes: bytes, items: list[Any]) -> None:
    assert stream_bytes[:HEADER] == stream_head(1, 1)
    starts = frame_starts(stream_bytes)
    assert len(starts) == len(items)
    for start, item in zip(starts, items, strict=True):
        n, crc, kind = struct.unpack_from("<QII", stream_bytes, start)
        message = stream_bytes[start + FRAME_HEAD : start + FRAME_HEAD + n]
        assert kind == 0  # a stream file holds DATA frames only
        assert crc == zlib.crc32(message, zlib.crc32(struct.pack("<Q", n)))
        assert message == bytes(packb(item))
        assert frame_header(message) == stream_bytes[start : start + FRAME_HEAD]


def test_hand_built_stream_reads(items: list[Any]) -> None:
    # a stream written by another implementation of the documented layout
    data = stream_head()
    for item in items:
        message = bytes(packb(item))
        length = struct.pack("<Q", len(message))
        data += length + struct.pack("<II", zlib.crc32(message, zlib.crc32(length)), 0) + message
    assert_items_equal(list(read_stream(io.BytesIO(data))), items)


def test_writer_object(tmp_path: Path, items: list[Any]) -> None:
    path = tmp_path / "w.vfmm"
    with StreamWriter(path) as w:
        sizes = [w.write(item) for item in items]
        w.write_message(packb("pre-encoded"))
        assert w.frames_written == len(items) + 1
    assert sum(sizes) + FRAME_HEAD + len(packb("pre-encoded")) + HEADER == path.stat().st_size
    got = list(read_stream(path))
    assert_items_equal(got[:-1], items)
    assert got[-1] == "pre-encoded"


def test_tensors_from_a_stream_are_writable(tmp_path: Path, items: list[Any]) -> None:
    path = tmp_path / "s.vfmm"
    write_stream(path, items)
    got = list(read_stream(path))
    t = got[0]["t"]
    assert type(t) is torch.Tensor
    t[0, 0] = 123.0  # no error, no copy-on-write surprise
    assert t[0, 0].item() == 123.0
    img = got[2]["img"]
    assert img.flags.writeable
    img[0, 0, 0] = 9
    assert img[0, 0, 0] == 9


def test_stream_tensors_are_aligned_views(tmp_path: Path) -> None:
    # each frame sits in its own 64-byte-aligned buffer, so tensors are views, never copies
    path = tmp_path / "s.vfmm"
    write_stream(
        path, [{"s": "x" * i, "t": torch.arange(9.0), "a": np.arange(5.0)} for i in range(5)]
    )
    for item in read_stream(path):
        assert item["t"].data_ptr() % 64 == 0
        assert item["a"].ctypes.data % 64 == 0
        assert item["a"].flags.writeable and not item["a"].flags.owndata


def test_tensors_numpy_option(tmp_path: Path, items: list[Any]) -> None:
    path = tmp_path / "s.vfmm"
    write_stream(path, items)
    got = list(read_stream(path, tensors="numpy"))
    assert isinstance(got[0]["t"], np.ndarray)
    assert np.array_equal(got[0]["t"], items[0]["t"].numpy())


def test_checksum_off(tmp_path: Path, items: list[Any]) -> None:
    path = tmp_path / "s.vfmm"
    write_stream(path, items, checksum=False)
    data = path.read_bytes()
    assert data[:HEADER] == stream_head(1, 0)
    for start in frame_starts(data):
        assert struct.unpack_from("<QII", data, start)[1:] == (0, 0)
    assert_items_equal(list(read_stream(path)), items)
    # appending keeps the stream's own setting
    write_stream(path, ["more"], append=True)
    data = path.read_bytes()
    assert struct.unpack_from("<QII", data, frame_starts(data)[-1])[1:] == (0, 0)
    assert list(read_stream(path))[-1] == "more"
    with StreamReader(path) as r:
        assert r.checksum is False


def test_checksum_on_is_kept_when_appending(tmp_path: Path, items: list[Any]) -> None:
    path = tmp_path / "s.vfmm"
    write_stream(path, items[:1])
    write_stream(path, items[1:], append=True, checksum=False)
    data = path.read_bytes()
    for start in frame_starts(data):
        assert struct.unpack_from("<QII", data, start)[1] != 0
    assert_items_equal(list(read_stream(path)), items)


def test_raw_frames(stream_bytes: bytes, items: list[Any]) -> None:
    with StreamReader(io.BytesIO(stream_bytes), raw=True) as r:
        raws = list(r)
    assert len(raws) == len(items)
    for raw, item in zip(raws, items, strict=True):
        assert bytes(raw) == bytes(packb(item))
        assert_items_equal(unpackb(raw), item)


def test_reader_offset_and_index_progress(stream_bytes: bytes, items: list[Any]) -> None:
    starts = frame_starts(stream_bytes)
    ends = [*starts[1:], len(stream_bytes)]
    r = StreamReader(io.BytesIO(stream_bytes))
    assert (r.offset, r.index) == (HEADER, 0)
    for i, end in enumerate(ends):
        next(r)
        assert (r.offset, r.index) == (end, i + 1)
    with pytest.raises(StopIteration):
        next(r)


def test_reader_does_not_hold_earlier_frames(tmp_path: Path) -> None:
    path = tmp_path / "big.vfmm"
    mb = 1 << 20
    write_stream(path, ({"i": i, "t": torch.full((mb // 4,), float(i))} for i in range(12)))
    refs = []
    tracemalloc.start()
    try:
        with StreamReader(path) as r:
            # (not enumerate: its cached result tuple would keep the last item alive)
            while (item := next(r, None)) is not None:
                i = len(refs)
                assert item["i"] == i and item["t"][0].item() == float(i)
                refs.append(weakref.ref(item["t"]))
                del item
                # the youngest generation only, the stricter check (a full collection frees
                # a superset), and a cheap one: a full one under tracemalloc, in a process
                # that has loaded models, takes ~0.3 CPU-s
                gc.collect(0)
                # every earlier item (and so its frame buffer) is gone
                assert all(ref() is None for ref in refs)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(refs) == 12
    assert peak < 4 * mb, peak


# -- torn streams --------------------------------------------------------------------------


def _expect_torn(data: bytes, n_whole: int, torn_start: int, *, path: Path) -> None:
    for source in ("path", "bytesio"):
        if source == "path":
            path.write_bytes(data)
            src: Any = path
        else:
            src = io.BytesIO(data)
        got = []
        reader = StreamReader(src)
        with pytest.raises(TornFrameError) as info:
            for item in reader:
                got.append(item)
        reader.close()
        assert len(got) == n_whole
        err = info.value
        assert err.offset == torn_start, (len(data), err.offset)
        assert err.index == n_whole
        assert reader.offset == torn_start
        assert reader.index == n_whole
        cut = len(data) - torn_start
        if cut < FRAME_HEAD:
            assert (err.expected, err.available) == (FRAME_HEAD, cut)
        else:
            assert err.available == cut - FRAME_HEAD
            assert err.expected > err.available
        assert isinstance(err, StreamError) and isinstance(err, ValueError)


def test_torn_at_every_byte_of_last_frame(tmp_path: Path, items: list[Any]) -> None:
    data = io.BytesIO()
    small = [*items[:3], {"t": torch.arange(5, dtype=torch.float32), "s": "tail"}]
    write_stream(data, small)
    data = data.getvalue()
    starts = frame_starts(data)
    last = starts[-1]
    assert len(data) - last > FRAME_HEAD + 64  # the frame has a header, padding and a tensor
    for cut in range(last + 1, len(data)):
        _expect_torn(data[:cut], len(small) - 1, last, path=tmp_path / "torn.vfmm")
    # the whole frames read the same as ever
    got = []
    with pytest.raises(TornFrameError):
        for item in read_stream(io.BytesIO(data[: len(data) - 1])):
            got.append(item)
    assert_items_equal(got, small[:-1])


def test_torn_inside_first_frame(tmp_path: Path, stream_bytes: bytes) -> None:
    first_end = frame_starts(stream_bytes)[1]
    for cut in (HEADER + 1, HEADER + FRAME_HEAD - 1, HEADER + FRAME_HEAD, first_end - 1):
        _expect_torn(stream_bytes[:cut], 0, HEADER, path=tmp_path / "t.vfmm")


def test_cut_at_frame_boundary_is_a_clean_end(stream_bytes: bytes, items: list[Any]) -> None:
    for k, start in enumerate(frame_starts(stream_bytes)):
        got = list(read_stream(io.BytesIO(stream_bytes[:start])))
        assert_items_equal(got, items[:k])


# -- headers -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\x93VF",
        MAGIC + b"\x01\x00",
        b"garbage that is not a stream at all",
        b"\x00" * 16,
        stream_head(version=2),
        stream_head(version=0),
        stream_head(flags=0x8001),
        stream_head(flags=0x0002),
        stream_head()[:-1] + bytes([stream_head()[-1] ^ 1]),
        MAGIC + struct.pack("<HHI", 1, 1, 0),
        msgpack.packb({"a": 1}) * 10,
    ],
    ids=[
        "empty",
        "short-magic",
        "short-header",
        "garbage",
        "zeros",
        "version-2",
        "version-0",
        "unknown-flags",
        "unknown-flag-bit-1",
        "bad-header-crc",
        "zero-header-crc",
        "msgpack",
    ],
)
def test_bad_stream_header(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "h.vfmm"
    path.write_bytes(data)
    with open(path, "rb") as f, pytest.raises(StreamHeaderError):
        list(read_stream(f))  # (a path: see test_bad_header_closes_the_file)
    with pytest.raises(StreamHeaderError):
        StreamReader(io.BytesIO(data))
    if data:
        with pytest.raises(StreamHeaderError):
            write_stream(path, [1], append=True)
        assert path.read_bytes() == data  # appending did not touch it


def test_bad_header_closes_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.vfmm"
    path.write_bytes(b"not a vf_mm stream, just text")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with contextlib.suppress(StreamHeaderError):
            StreamReader(path)
        with contextlib.suppress(StreamHeaderError):
            list(read_stream(path))
        gc.collect()
    assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []


# -- corruption ----------------------------------------------------------------------------


def test_flipped_payload_byte_raises_corrupt(
    tmp_path: Path, stream_bytes: bytes, items: list[Any]
) -> None:
    starts = frame_starts(stream_bytes)
    target = 1
    start, end = starts[target], starts[target + 1]
    for pos in range(start + FRAME_HEAD, end):
        data = bytearray(stream_bytes)
        data[pos] ^= 0x40
        got = []
        with pytest.raises(CorruptFrameError) as info:
            for item in read_stream(io.BytesIO(bytes(data))):
                got.append(item)
        assert len(got) == target
        assert info.value.offset == start and info.value.index == target


def test_flipped_payload_byte_skip_mode(
    tmp_path: Path, stream_bytes: bytes, items: list[Any]
) -> None:
    starts = frame_starts(stream_bytes)
    data = bytearray(stream_bytes)
    data[starts[2] + FRAME_HEAD + 10] ^= 0xFF
    path = tmp_path / "c.vfmm"
    path.write_bytes(bytes(data))
    with StreamReader(path, errors="skip") as r:
        got = list(r)
        skipped = r.skipped
    assert_items_equal(got, items[:2] + items[3:])
    assert len(skipped) == 1
    index, offset, error = skipped[0]
    assert (index, offset) == (2, starts[2])
    assert isinstance(error, CorruptFrameError)
    assert (error.index, error.offset) == (2, starts[2])


def test_flipped_crc_byte(stream_bytes: bytes) -> None:
    starts = frame_starts(stream_bytes)
    data = bytearray(stream_bytes)
    data[starts[0] + 8] ^= 1
    with pytest.raises(CorruptFrameError):
        list(read_stream(io.BytesIO(bytes(data))))


def test_every_frame_header_bit_flip_is_detected(stream_bytes: bytes, items: list[Any]) -> None:
    # length (covered by the crc), crc and the kind word: no single flip goes unnoticed
    starts = frame_starts(stream_bytes)
    start = starts[1]
    for pos in range(start, start + FRAME_HEAD):
        for bit in range(8):
            data = bytearray(stream_bytes)
            data[pos] ^= 1 << bit
            got = []
            with pytest.raises(StreamError):
                for item in read_stream(io.BytesIO(bytes(data)), max_frame_bytes=1 << 20):
                    got.append(item)
            assert_items_equal(got, items[:1])


def test_flipped_stream_header_bit_is_detected(stream_bytes: bytes) -> None:
    # a bit flip cannot turn checksums off for the whole stream either
    for pos in range(8, HEADER):
        for bit in range(8):
            data = bytearray(stream_bytes)
            data[pos] ^= 1 << bit
            with pytest.raises(StreamHeaderError):
                StreamReader(io.BytesIO(bytes(data)))


def test_flipped_kind_field_is_detected(stream_bytes: bytes, items: list[Any]) -> None:
    # a stream file holds DATA (0) frames only: a flip in the kind word cannot switch the
    # check off, so a second fault in the payload is still caught
    starts = frame_starts(stream_bytes)
    for pos in range(starts[1] + 12, starts[1] + 16):
        data = bytearray(stream_bytes)
        data[pos] ^= 0x01
        data[starts[2] - 1] ^= 0x01  # last byte of frame 1's message: "a plain string"
        got = []
        with pytest.raises(CorruptFrameError) as info:
            for item in read_stream(io.BytesIO(bytes(data))):
                got.append(item)
        assert_items_equal(got, items[:1])
        assert info.value.index == 1


@pytest.mark.parametrize("errors", ["raise", "skip"])
def test_a_frame_of_an_unknown_kind_in_a_file_is_corrupt(items: list[Any], errors: str) -> None:
    # a file holds DATA frames and END markers: any other kind is refused like a failed
    # checksum, and skipping it loses nothing after it
    message = bytes(packb("not data"))
    data = bytearray(stream_head())
    data += frame_header(packb(items[1])) + bytes(packb(items[1]))
    start = len(data)
    data += frame_header(message)[:12] + struct.pack("<I", 2) + message
    data += frame_header(packb(items[4])) + bytes(packb(items[4]))
    with StreamReader(io.BytesIO(bytes(data)), errors=errors) as reader:
        if errors == "raise":
            got = []
            with pytest.raises(CorruptFrameError, match=r"kind 2 \(unknown") as info:
                for item in reader:
                    got.append(item)
            assert got == [items[1]]
            assert (info.value.index, info.value.offset) == (1, start)
        else:
            got = list(reader)
            assert_items_equal(got, [items[1], items[4]])
            assert [(i, o, type(e)) for i, o, e in reader.skipped] == [
                (1, start, CorruptFrameError)
            ]


def test_an_end_marker_is_no_item_and_ended_says_whether_it_came_last(tmp_path: Path) -> None:
    path = tmp_path / "s.vfmm"
    with StreamWriter(path) as writer:
        writer.write("first")
        writer.write_end({"why": "done"})
    with StreamReader(path) as reader:
        assert list(reader) == ["first"] and reader.ends == [{"why": "done"}] and reader.ended
    with StreamWriter(path, append=True) as writer:  # an appended stream goes on after it
        writer.write("second")
    with StreamReader(path) as reader:
        assert list(reader) == ["first", "second"] and not reader.ended
        assert reader.ends == [{"why": "done"}]


def test_a_kind_flip_between_data_and_end_fails_the_checksum(items: list[Any]) -> None:
    """Both kinds are accepted in a file, so the crc32 of an END frame covers its kind:
    a group flipped into an end marker (or back) is corrupt, never silently no item."""
    data = bytearray(stream_head())
    data += frame_header(packb(items[1])) + bytes(packb(items[1]))
    end = bytes(packb({"sent": 1}))
    data += frame_header(end, kind=FrameKind.END) + end
    for frame_start in frame_starts(bytes(data)):
        flipped = bytearray(data)
        flipped[frame_start + 12] ^= 0x01
        with pytest.raises(CorruptFrameError, match="fails its checksum"):
            list(StreamReader(io.BytesIO(bytes(flipped))))


def test_undecodable_frame_skip_mode(tmp_path: Path) -> None:
    path = tmp_path / "d.vfmm"
    with StreamWriter(path) as w:
        w.write("first")
        w.write_message(b"\xc1")  # a valid frame holding invalid msgpack
        w.write("third")
    with pytest.raises(DecodeError) as info:
        list(read_stream(path))
    assert any("frame 1" in note for note in getattr(info.value, "__notes__", []))
    with StreamReader(path, errors="skip") as r:
        assert list(r) == ["first", "third"]
        assert [(i, type(e)) for i, _, e in r.skipped] == [(1, DecodeError)]
    with pytest.raises(ValueError):
        StreamReader(path, errors="ignore")


# -- size limits ---------------------------------------------------------------------------


def test_frame_too_large_on_write(tmp_path: Path) -> None:
    path = tmp_path / "big.vfmm"
    big = torch.zeros(1000)
    with pytest.raises(FrameTooLargeError) as info:
        write_stream(path, ["small", big, "never"], max_frame_bytes=512)
    assert info.value.limit == 512
    assert info.value.length == len(bytes(packb(big)))
    # the frames before it are whole and readable, nothing partial was written
    assert list(read_stream(path)) == ["small"]


def test_frame_too_large_on_read(tmp_path: Path) -> None:
    path = tmp_path / "big.vfmm"
    write_stream(path, ["small", torch.zeros(1000)])
    data = path.read_bytes()
    second = frame_starts(data)[1]
    for errors in ("raise", "skip"):
        got = []
        reader = StreamReader(path, max_frame_bytes=512, errors=errors)
        with reader, pytest.raises(FrameTooLargeError) as info:
            for item in reader:
                got.append(item)
        assert got == ["small"]
        assert info.value.offset == second
        assert info.value.limit == 512
        assert info.value.length == len(data) - second - FRAME_HEAD


# -- appending and repair ------------------------------------------------------------------


def test_append_to_whole_file(tmp_path: Path, items: list[Any]) -> None:
    path = tmp_path / "a.vfmm"
    write_stream(path, items[:2])
    assert write_stream(path, items[2:], append=True) == len(items) - 2
    assert_items_equal(list(read_stream(path)), items)


def test_append_creates_missing_file(tmp_path: Path, items: list[Any]) -> None:
    path = tmp_path / "new.vfmm"
    write_stream(path, items[:1], append=True)
    assert_items_equal(list(read_stream(path)), items[:1])


def test_append_to_file_object(items: list[Any]) -> None:
    buf = io.BytesIO()
    write_stream(buf, items[:2])
    write_stream(buf, items[2:], append=True)
    buf.seek(0)
    assert_items_equal(list(read_stream(buf)), items)


def test_append_to_torn_file_raises(tmp_path: Path, stream_bytes: bytes) -> None:
    path = tmp_path / "t.vfmm"
    torn = stream_bytes[:-3]
    path.write_bytes(torn)
    last = frame_starts(stream_bytes)[-1]
    with pytest.raises(TornFrameError) as info:
        write_stream(path, ["more"], append=True)
    assert info.value.offset == last
    assert path.read_bytes() == torn  # untouched


def test_repair_then_append(tmp_path: Path, items: list[Any], stream_bytes: bytes) -> None:
    starts = frame_starts(stream_bytes)
    for cut in (starts[-1] + 1, starts[-1] + FRAME_HEAD + 5, len(stream_bytes) - 1):
        path = tmp_path / f"r{cut}.vfmm"
        path.write_bytes(stream_bytes[:cut])
        removed = repair_stream(path)
        assert removed == cut - starts[-1]
        assert path.stat().st_size == starts[-1]
        assert repair_stream(path) == 0  # idempotent
        assert write_stream(path, [items[-1], "extra"], append=True) == 2
        assert_items_equal(list(read_stream(path)), [*items, "extra"])


def test_repair_whole_file_is_a_no_op(tmp_path: Path, stream_bytes: bytes) -> None:
    path = tmp_path / "w.vfmm"
    path.write_bytes(stream_bytes)
    assert repair_stream(path) == 0
    assert path.read_bytes() == stream_bytes


def test_repair_torn_first_frame(tmp_path: Path, stream_bytes: bytes, items: list[Any]) -> None:
    path = tmp_path / "f.vfmm"
    path.write_bytes(stream_bytes[: HEADER + 5])
    assert repair_stream(path) == 5
    assert list(read_stream(path)) == []
    write_stream(path, items, append=True)
    assert_items_equal(list(read_stream(path)), items)


def test_reader_survives_short_reads(items: list[Any], stream_bytes: bytes) -> None:
    class Trickle(io.RawIOBase):
        """A non-seekable pipe that hands out at most 7 bytes per call."""

        def __init__(self, data: bytes) -> None:
            self._data = memoryview(data)
            self._pos = 0

        def readable(self) -> bool:
            return True

        def readinto(self, b: Any) -> int:
            n = min(7, len(b), len(self._data) - self._pos)
            b[:n] = self._data[self._pos : self._pos + n]
            self._pos += n
            return n

    assert_items_equal(list(read_stream(Trickle(stream_bytes))), items)
    got = []
    with pytest.raises(TornFrameError):
        for item in read_stream(Trickle(stream_bytes[:-1])):
            got.append(item)
    assert_items_equal(got, items[:-1])
