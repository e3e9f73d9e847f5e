"""Hostile input: whatever the bytes, decoding raises ``DecodeError`` (streams: ``StreamError``)
or returns a value; never another exception, never a hang, never an allocation larger than
the input justifies."""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import struct
import tracemalloc
import uuid
from collections.abc import Callable
from typing import Any

import msgpack
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests._params import UNICODE
from vf_mm.errors import DecodeError, FrameTooLargeError, StreamError, TornFrameError
from vf_mm.wire import StreamReader, packb, unpackb, write_stream

pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")

MB = 1 << 20
EXT_TENSOR = 1  # the tensor extension code, as vf_mm/wire/_format.py documents it
TENSOR_HEAD = struct.Struct("<BBBBB")  # u8 version, u8 flags, u8 dtype code, u8 ndim, u8 pad
FUZZ = settings(
    max_examples=300,
    deadline=None,  # no wall-clock deadline: a hang fails through pytest-timeout
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,
    database=None,
)


def _seed_messages() -> list[bytes]:
    g = torch.Generator().manual_seed(0)
    return [
        bytes(packb({"t": torch.randn(3, 4, generator=g), "ids": [1, 2, 3]})),
        bytes(packb([torch.arange(5, dtype=torch.int16), np.ones((2, 2), dtype=np.float64)])),
        bytes(
            packb(
                {
                    "bf": torch.ones(2, 3, dtype=torch.bfloat16),
                    "u4": torch.zeros(3, dtype=torch.uint8).view(torch.uint4),
                }
            )
        ),
        bytes(packb(torch.tensor(1.5))),
        bytes(
            packb(
                {
                    "when": dt.datetime(2024, 1, 2, tzinfo=dt.UTC),
                    "d": dt.date(2020, 1, 1),
                    "u": uuid.UUID(int=7),
                }
            )
        ),
        bytes(packb({"x": torch.ones(2)}, tensor_format="foreign")),
        msgpack.packb(
            {b"__torch_tensor__": True, b"dtype": "<f4", b"shape": [2], b"data": b"\x00" * 8}
        ),
        msgpack.packb({"__torch_tensor__": True, "dtype": "int64", "shape": [2], "data": [1, 2]}),
        bytes(packb({"s": "text", "n": None, "f": 1.5, "b": b"\x00\x01", "l": list(range(20))})),
    ]


SEEDS = _seed_messages()


def decode_all_ways(data: bytes | bytearray | memoryview) -> None:
    """Decode under every ``tensors`` mode; only DecodeError may escape."""
    for tensors in ("auto", "torch", "numpy"):
        with contextlib.suppress(DecodeError):
            unpackb(data, tensors=tensors)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["flip", "set", "truncate", "insert", "delete", "overwrite"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "set" and data:
            data[pos] = draw(st.sampled_from([0x00, 0xFF, 0x7F, 0x80, 0x40, 0xC1, 0xDD, 0xC9]))
        elif kind == "truncate":
            del data[pos:]
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=9))
        elif kind == "delete":
            del data[pos : pos + draw(st.integers(1, 9))]
        elif kind == "overwrite":
            chunk = draw(st.binary(min_size=1, max_size=9))
            data[pos : pos + len(chunk)] = chunk
    return bytes(data)


@FUZZ
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(data: bytes) -> None:
    decode_all_ways(data)


@FUZZ
@given(mutated())
def test_fuzz_mutated_messages(data: bytes) -> None:
    decode_all_ways(data)
    decode_all_ways(bytearray(data))  # writable input takes other code paths


@st.composite
def tensor_ext(draw: st.DrawFn) -> bytes:
    """A tensor extension with every header field drawn freely (mostly near-valid)."""
    version = draw(st.sampled_from([1, 1, 1, 0, 2, 255]))
    flags = draw(st.integers(0, 255))
    code = draw(st.integers(0, 45))
    ndim = draw(st.integers(0, 6) | st.integers(60, 255))
    pad = draw(st.integers(0, 70))
    shape = draw(
        st.lists(
            st.integers(0, 4) | st.sampled_from([2**32, 2**40, 2**63, 2**64 - 1]),
            min_size=min(ndim, 8),
            max_size=min(ndim, 8),
        )
    )
    body = TENSOR_HEAD.pack(version, flags, code, ndim, pad)
    body += b"".join(struct.pack("<Q", n) for n in shape)
    body += draw(st.binary(max_size=80))
    wrap = draw(st.sampled_from(["top", "list", "map"]))
    ext = msgpack.ExtType(EXT_TENSOR, body)
    obj = ext if wrap == "top" else [1, ext] if wrap == "list" else {"k": ext}
    return msgpack.packb(obj)


@FUZZ
@given(tensor_ext())
def test_fuzz_tensor_headers(data: bytes) -> None:
    decode_all_ways(data)


@st.composite
def foreign_map(draw: st.DrawFn) -> bytes:
    values = (
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**64 - 1)
        | st.floats()
        | st.text(UNICODE, max_size=5)
        | st.binary(max_size=24)
    )
    dtype = draw(
        st.sampled_from(
            [
                "float32",
                "<f4",
                ">f8",
                "bfloat16",
                "torch.int64",
                "bool",
                "complex64",
                "float8_e5m2",
                "object",
                "V8",
                "S3",
                "M8[s]",
                "float31",
                "i4,i4",
            ]
        )
        | st.text(UNICODE, max_size=8)
        | values
    )
    shape = draw(
        st.lists(st.integers(-2, 5) | st.sampled_from([2**40, 2**63]), max_size=4) | values
    )
    data = draw(st.binary(max_size=64) | st.lists(values, max_size=6) | values)
    key = draw(st.sampled_from(["__torch_tensor__", b"__torch_tensor__"]))
    return msgpack.packb({"x": [{key: True, "dtype": dtype, "shape": shape, "data": data}]})


@FUZZ
@given(foreign_map())
def test_fuzz_foreign_maps(data: bytes) -> None:
    decode_all_ways(data)


def _mutate_stream(data: st.DataObject, raw: bytearray, count: int) -> None:
    for _ in range(count):
        if not raw:
            break
        pos = data.draw(st.integers(0, len(raw) - 1))
        kind = data.draw(st.sampled_from(["flip", "truncate", "insert"]))
        if kind == "flip":
            raw[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif kind == "truncate":
            del raw[pos:]
        else:
            raw[pos:pos] = data.draw(st.binary(min_size=1, max_size=8))


def _stream_items() -> list[dict[str, Any]]:
    return [{"i": i, "t": torch.full((3,), float(i))} for i in range(3)]


def _stream_bytes() -> bytes:
    buf = io.BytesIO()
    write_stream(buf, _stream_items())
    return buf.getvalue()


STREAM = _stream_bytes()


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(st.data())
def test_fuzz_streams_only_stream_errors(data: st.DataObject) -> None:
    raw = bytearray(STREAM)
    _mutate_stream(data, raw, data.draw(st.integers(1, 3)))
    for errors in ("raise", "skip"):
        try:
            for _ in StreamReader(io.BytesIO(bytes(raw)), errors=errors, max_frame_bytes=MB):
                pass
        except (StreamError, DecodeError):
            pass


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(st.data())
def test_fuzz_streams_single_fault_never_misreads(data: st.DataObject) -> None:
    raw = bytearray(STREAM)
    _mutate_stream(data, raw, 1)
    got = []
    try:
        for item in StreamReader(io.BytesIO(bytes(raw)), max_frame_bytes=MB):
            got.append(item)
    except (StreamError, DecodeError):
        pass
    # nothing misread: the items read are a prefix of those written
    assert len(got) <= 3
    for i, item in enumerate(got):
        assert isinstance(item, dict) and item["i"] == i
        assert torch.equal(item["t"], torch.full((3,), float(i)))


# -- specific hostile inputs -------------------------------------------------------------------


def raw_tensor(
    version: int = 1,
    flags: int = 1,
    code: int = 12,
    shape: tuple[int, ...] = (2,),
    pad: int = 0,
    data: bytes = b"\x00" * 8,
    ndim: int | None = None,
) -> bytes:
    ndim = len(shape) if ndim is None else ndim
    body = TENSOR_HEAD.pack(version, flags, code, ndim, pad)
    body += b"".join(struct.pack("<Q", n) for n in shape) + bytes(pad) + data
    return msgpack.packb({"t": msgpack.ExtType(EXT_TENSOR, body)})


def raises_decode_error(data: bytes) -> Callable[[], None]:
    def run() -> None:
        with pytest.raises(DecodeError):
            unpackb(data)

    return run


def peak_bytes(fn: Callable[[], Any]) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_raw_tensor_helper_is_valid() -> None:
    out = unpackb(raw_tensor(data=struct.pack("<2f", 1.5, -2.0)))
    assert out["t"].tolist() == [1.5, -2.0]


def test_huge_declared_shape_tiny_payload() -> None:
    msg = raw_tensor(shape=(2**40, 2**40), data=b"\x00" * 16)

    def run() -> None:
        for tensors in ("auto", "numpy"):
            with pytest.raises(DecodeError, match="bytes"):
                unpackb(msg, tensors=tensors)

    assert peak_bytes(run) < 10 * MB


@pytest.mark.parametrize("shape", [(2**64 - 1,), (2**63, 2), (0, 2**64 - 1), (2**32, 2**32, 0)])
def test_overflowing_shapes(shape: tuple[int, ...]) -> None:
    msg = raw_tensor(shape=shape, data=b"")
    assert peak_bytes(raises_decode_error(msg)) < 10 * MB


@pytest.mark.parametrize("extra", [1, 4, 64])
def test_payload_longer_than_shape(extra: int) -> None:
    # the elements are *exactly* prod(shape) * itemsize bytes: surplus bytes are refused
    with pytest.raises(DecodeError, match="bytes"):
        unpackb(raw_tensor(shape=(2,), data=b"\x00" * (8 + extra)))
    with pytest.raises(DecodeError):
        unpackb(raw_tensor(shape=(0,), data=b"\x00" * extra))


@pytest.mark.parametrize("code", [0, 42, 100, 255])
def test_unknown_dtype_code(code: int) -> None:
    with pytest.raises(DecodeError, match="dtype"):
        unpackb(raw_tensor(code=code))


@pytest.mark.parametrize("ndim", [65, 100, 255])
def test_too_many_dims(ndim: int) -> None:
    with pytest.raises(DecodeError, match="dimensions"):
        unpackb(raw_tensor(shape=(1,) * ndim, data=b"\x00" * 4))
    with pytest.raises(DecodeError):
        unpackb(raw_tensor(shape=(), ndim=ndim, data=b""))


def test_64_dims_is_fine() -> None:
    out = unpackb(raw_tensor(shape=(1,) * 64, data=b"\x00" * 4))
    assert out["t"].shape == (1,) * 64


@pytest.mark.parametrize("version", [0, 2, 255])
def test_unknown_layout_version(version: int) -> None:
    with pytest.raises(DecodeError, match="version"):
        unpackb(raw_tensor(version=version))


def test_header_shorter_than_declared() -> None:
    with pytest.raises(DecodeError):
        unpackb(msgpack.packb(msgpack.ExtType(EXT_TENSOR, b"\x01\x01\x0c")))
    with pytest.raises(DecodeError):
        unpackb(
            msgpack.packb(
                msgpack.ExtType(EXT_TENSOR, TENSOR_HEAD.pack(1, 1, 12, 3, 0) + b"\x00" * 10)
            )
        )
    with pytest.raises(DecodeError):
        unpackb(
            msgpack.packb(
                msgpack.ExtType(EXT_TENSOR, TENSOR_HEAD.pack(1, 1, 12, 1, 60) + b"\x00" * 8)
            )
        )
    with pytest.raises(DecodeError):
        unpackb(msgpack.packb(msgpack.ExtType(EXT_TENSOR, b"")))


@pytest.mark.parametrize(
    "data",
    [
        b"\xdd\xff\xff\xff\xff" + b"\x01" * 5,  # array32 of 2**32-1 elements
        b"\xdf\xff\xff\xff\xff" + b"\x01" * 5,  # map32
        b"\xdb\xff\xff\xff\xff" + b"a" * 5,  # str32
        b"\xc6\xff\xff\xff\xff" + b"a" * 5,  # bin32
        b"\xc9\xff\xff\xff\xff\x01" + b"a" * 5,  # ext32 tensor
    ],
    ids=["array32", "map32", "str32", "bin32", "ext32"],
)
def test_huge_container_headers(data: bytes) -> None:
    assert peak_bytes(raises_decode_error(data)) < 10 * MB


def test_nesting_bomb() -> None:
    with pytest.raises(DecodeError):
        unpackb(b"\x91" * 100_000)
    with pytest.raises(DecodeError):
        unpackb(b"\x81\xa1k" * 50_000 + b"\xc0")


def test_trailing_garbage() -> None:
    msg = bytes(packb({"t": torch.ones(3)}))
    for tail in (b"\x00", b"\xc0", msg):
        with pytest.raises(DecodeError):
            unpackb(msg + tail)


def test_truncated_message_at_every_byte() -> None:
    msg = bytes(packb({"t": torch.arange(6, dtype=torch.float32).reshape(2, 3), "s": "x"}))
    for cut in range(len(msg)):
        with pytest.raises(DecodeError):
            unpackb(msg[:cut])


def test_bad_datetime_and_uuid_ext() -> None:
    for code, payload in ((2, b"not a date"), (3, b"\xff\xfe"), (4, b"25:99"), (5, b"short")):
        with pytest.raises(DecodeError):
            unpackb(msgpack.packb(msgpack.ExtType(code, payload)))


def test_stream_frame_declaring_2_to_60_bytes(tmp_path: Any) -> None:
    head = io.BytesIO()
    write_stream(head, [1])
    data = head.getvalue() + struct.pack("<QII", 2**60, 0, 0) + b"x" * 10
    path = tmp_path / "bomb.vfmm"
    path.write_bytes(data)

    def run() -> None:
        for source in (lambda: io.BytesIO(data), lambda: path):
            got = []
            with StreamReader(source()) as reader, pytest.raises(FrameTooLargeError) as info:
                for item in reader:
                    got.append(item)
            assert got == [1]
            assert info.value.length == 2**60

    assert peak_bytes(run) < 10 * MB


def test_stream_frame_over_max_in_torn_file(tmp_path: Any) -> None:
    # a file-backed torn frame is refused before its payload is allocated
    head = io.BytesIO()
    write_stream(head, [1])
    path = tmp_path / "t.vfmm"
    path.write_bytes(head.getvalue() + struct.pack("<QII", 1 << 30, 0, 0) + b"x" * 10)

    def run() -> None:
        with StreamReader(path) as reader, pytest.raises(TornFrameError):
            list(reader)

    assert peak_bytes(run) < 10 * MB


def test_stream_torn_frame_in_bytesio_allocates_little() -> None:
    head = io.BytesIO()
    write_stream(head, [1])
    data = head.getvalue() + struct.pack("<QII", 1 << 30, 0, 0) + b"x" * 10

    def run() -> None:
        with pytest.raises(TornFrameError):
            list(StreamReader(io.BytesIO(data)))

    assert peak_bytes(run) < 10 * MB


class _Pipe(io.RawIOBase):
    """A non-seekable source, like a pipe or a socket."""

    def __init__(self, data: bytes) -> None:
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, b: Any) -> int:
        return self._data.readinto(b)


def test_stream_torn_frame_in_pipe_allocates_a_bounded_amount() -> None:
    # a pipe's size is unknown: the reader may buffer, but not up to the declared length
    head = io.BytesIO()
    write_stream(head, [1])
    data = head.getvalue() + struct.pack("<QII", (4 << 30) - 1, 0, 0) + b"x" * 10

    def run() -> None:
        got = []
        with pytest.raises(TornFrameError) as info:
            for item in StreamReader(_Pipe(data)):
                got.append(item)
        assert got == [1]
        assert info.value.available == 10

    assert peak_bytes(run) < 100 * MB


def test_non_contiguous_input_buffer() -> None:
    msg = bytes(packb([1, 2, 3]))
    doubled = np.frombuffer(bytes(b for c in msg for b in (c, 0)), dtype=np.uint8)[::2]
    with contextlib.suppress(DecodeError):  # refusing it cleanly is fine too
        assert unpackb(doubled) == [1, 2, 3]
    with contextlib.suppress(DecodeError):
        assert unpackb(memoryview(doubled)) == [1, 2, 3]


def test_non_buffer_inputs() -> None:
    for bad in ("text", None, 123, [1, 2], object()):
        with pytest.raises(DecodeError):
            unpackb(bad)  # type: ignore[arg-type]
