"""Specification of the message codec: ``vf_mm.wire.packb`` / ``unpackb`` / ``Encoder``.

Every tensor test goes through the real bytes (``packb`` -> ``unpackb``) and compares
raw bits, never values, so NaN payloads, signed zeros and exotic dtypes are covered.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import gc
import struct
import subprocess
import sys
import threading
import time
import uuid
import warnings
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path, PurePosixPath
from typing import Any
from zoneinfo import ZoneInfo

import ml_dtypes
import msgpack
import numpy as np
import pydantic
import pytest
import torch

from tests.wire.test_foreign import FOREIGN_NO_WARNING
from vf_mm.errors import DecodeError, EncodeError, VfMmError
from vf_mm.wire import Decoder, Encoder, Ext, packb, unpackb
from vf_mm.wire.dtypes import DTYPES, by_name

pytestmark = [
    pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental"),
    pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta"),
    pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor"),
]

REPO = Path(__file__).resolve().parents[2]

# The tensor extension as vf_mm/wire/_format.py documents it (spelled out here, so a change
# to the format fails these tests instead of following it).
EXT_TENSOR = 1
TENSOR_LAYOUT_VERSION = 1
FLAG_TORCH = 0x01
TENSOR_HEAD = struct.Struct("<BBBBB")  # u8 version, u8 flags, u8 dtype code, u8 ndim, u8 pad
ALIGN = 64

TORCH_DTYPES = [d.name for d in DTYPES if hasattr(torch, d.name)]
NUMPY_DTYPES = [d.name for d in DTYPES if d.numpy is not None or d.ml_dtypes is not None]
NO_NUMPY_DTYPES = [d.name for d in DTYPES if d.numpy is None and d.ml_dtypes is None]

_CARRIER = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


# -- helpers ----------------------------------------------------------------------------


def np_dtype(name: str) -> np.dtype:
    wire = by_name(name)
    if wire.numpy is not None:
        return np.dtype(wire.numpy)
    return np.dtype(getattr(ml_dtypes, wire.ml_dtypes))


def random_tensor(name: str, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    """A contiguous tensor of ``shape`` whose bytes are uniformly random (every bit pattern)."""
    dtype = getattr(torch, name)
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (*shape, dtype.itemsize), dtype=torch.uint8, generator=g)
    out = raw.view(dtype)[..., 0]
    assert out.shape == shape and out.dtype == dtype
    return out


def random_array(name: str, shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    dtype = np_dtype(name)
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, size=(*shape, dtype.itemsize), dtype=np.uint8)
    out = raw.view(dtype)[..., 0]
    assert out.shape == shape and out.dtype == dtype
    return out


def tbytes(t: torch.Tensor) -> bytes:
    """The elements of ``t`` in C order, as raw bytes (works for every dtype and stride)."""
    t = t.detach()
    if t.element_size() == 16:
        t = torch.view_as_real(t)
    c = t.view(_CARRIER[t.element_size()]).contiguous()
    return c.numpy().tobytes()


def abytes(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a).tobytes()


def roundtrip(obj: Any, **kw: Any) -> Any:
    return unpackb(packb(obj), **kw)


def buffer_range(buf: Any) -> tuple[int, int]:
    arr = np.frombuffer(buf, dtype=np.uint8)
    return arr.ctypes.data, arr.ctypes.data + arr.nbytes


def assert_same_tensor(out: Any, ref: torch.Tensor) -> None:
    assert isinstance(out, torch.Tensor)
    assert out.dtype == ref.dtype
    assert out.shape == ref.shape
    assert tbytes(out) == tbytes(ref)


# -- torch round trips ------------------------------------------------------------------

SHAPES = [(), (0, 3), (7,), (2, 3, 5)]


def test_table_covers_installed_torch() -> None:
    # the parametrization below must not be vacuous
    assert len(TORCH_DTYPES) >= 16
    assert {"bfloat16", "float8_e4m3fn", "complex128", "bool"} <= set(TORCH_DTYPES)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)) or "scalar")
@pytest.mark.parametrize("name", TORCH_DTYPES)
def test_torch_roundtrip_bit_exact(name: str, shape: tuple[int, ...]) -> None:
    t = random_tensor(name, shape, seed=len(shape))
    buf = packb(t)
    out = unpackb(buf)
    assert_same_tensor(out, t)
    # and from an immutable copy of the bytes
    assert_same_tensor(unpackb(bytes(buf)), t)


def _non_contiguous(kind: str, t: torch.Tensor) -> torch.Tensor:
    if kind == "transposed":
        return t.transpose(0, 2)
    if kind == "permuted":
        return t.permute(2, 0, 1)
    if kind == "step":
        return t[::2, 1:, ::3]
    if kind == "expanded":
        return t[:, :1, :].expand(3, 6, 5)
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["transposed", "permuted", "step", "expanded"])
@pytest.mark.parametrize("name", TORCH_DTYPES)
def test_torch_non_contiguous(name: str, kind: str) -> None:
    base = random_tensor(name, (3, 4, 5), seed=7)
    t = _non_contiguous(kind, base)
    assert not t.is_contiguous()
    if kind == "expanded":
        assert 0 in t.stride()
    out = roundtrip(t)
    assert_same_tensor(out, t)
    assert out.is_contiguous()


@pytest.mark.parametrize("name", ["complex64", "complex128"])
def test_torch_conj_is_materialized(name: str) -> None:
    t = torch.randn(4, 3, dtype=getattr(torch, name))
    c = t.conj()
    assert c.is_conj()
    out = roundtrip(c)
    assert not out.is_conj()
    assert torch.equal(out, c)
    assert tbytes(out) == tbytes(c.resolve_conj())
    # the conjugate really happened: imaginary parts flipped
    assert torch.equal(out.imag, -t.imag)


def test_torch_neg_view_is_materialized() -> None:
    t = torch.randn(5, dtype=torch.complex64)
    n = torch._neg_view(t)
    assert n.is_neg()
    out = roundtrip(n)
    assert torch.equal(out, -t)


def test_torch_requires_grad_and_parameter() -> None:
    t = torch.randn(3, 4, requires_grad=True)
    y = t * 2  # a non-leaf with a grad_fn
    p = torch.nn.Parameter(torch.randn(2, 2))
    out = roundtrip({"leaf": t, "nonleaf": y, "param": p})
    for key, ref in (("leaf", t), ("nonleaf", y), ("param", p)):
        got = out[key]
        assert type(got) is torch.Tensor
        assert not got.requires_grad
        assert tbytes(got) == tbytes(ref)


def test_torch_int_extremes() -> None:
    t = torch.tensor([0, 1, -1, 2**63 - 1, -(2**63)], dtype=torch.int64)
    u = torch.tensor([0, 2**64 - 1], dtype=torch.uint64)
    out = roundtrip([t, u])
    assert torch.equal(out[0], t)
    assert tbytes(out[1]) == tbytes(u)


def test_many_tensors_mixed_with_other_values() -> None:
    obj = {
        "a": "x" * 3,  # odd-length skeleton pieces between tensors
        "t1": random_tensor("float32", (3, 5)),
        "b": [1, 2, "yz"],
        "t2": random_tensor("bfloat16", (7,)),
        "t3": random_tensor("int8", (1, 1, 1, 1, 1)),
        "n": random_array("float64", (2, 2)),
        "same": [random_tensor("uint8", (9,), seed=3)] * 3,
        "tail": "end",
    }
    out = roundtrip(obj)
    assert set(out) == set(obj)
    assert out["a"] == "xxx" and out["b"] == [1, 2, "yz"] and out["tail"] == "end"
    for key in ("t1", "t2", "t3"):
        assert_same_tensor(out[key], obj[key])
    assert isinstance(out["n"], np.ndarray) and abytes(out["n"]) == abytes(obj["n"])
    assert len(out["same"]) == 3
    for got in out["same"]:
        assert_same_tensor(got, obj["same"][0])


# -- numpy round trips ------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)) or "scalar")
@pytest.mark.parametrize("name", NUMPY_DTYPES)
def test_numpy_roundtrip_bit_exact(name: str, shape: tuple[int, ...]) -> None:
    a = random_array(name, shape, seed=len(shape) + 1)
    out = roundtrip(a)
    assert type(out) is np.ndarray
    assert out.dtype == a.dtype
    assert out.shape == a.shape
    assert abytes(out) == abytes(a)


@pytest.mark.parametrize("name", NUMPY_DTYPES)
def test_numpy_non_contiguous(name: str) -> None:
    base = random_array(name, (4, 5, 6), seed=11)
    cases = [
        base.transpose(2, 0, 1),
        base[::2, ::-1, 1::3],
        np.broadcast_to(base[:, :1, :], (4, 7, 6)),
        base[..., 0],
    ]
    out = roundtrip(cases)
    for got, ref in zip(out, cases, strict=True):
        assert type(got) is np.ndarray
        assert got.dtype == ref.dtype and got.shape == ref.shape
        assert abytes(got) == abytes(ref)


@pytest.mark.parametrize(
    "typestr", [">i2", ">u2", ">i4", ">u4", ">i8", ">f2", ">f4", ">f8", ">c8", ">c16"]
)
def test_numpy_big_endian_comes_back_little_endian(typestr: str) -> None:
    rng = np.random.default_rng(5)
    little = rng.integers(0, 256, size=(3, 4 * np.dtype(typestr).itemsize), dtype=np.uint8)
    little = little.view(np.dtype(typestr).newbyteorder("<"))
    big = little.astype(typestr)
    assert big.dtype.byteorder == ">"
    out = roundtrip(big)
    assert out.dtype == np.dtype(typestr).newbyteorder("<")
    assert out.dtype.byteorder in ("<", "=")
    assert out.shape == big.shape
    assert abytes(out) == abytes(little)  # same values, every bit
    assert np.array_equal(out, big, equal_nan=True)


def test_numpy_native_aliases() -> None:
    arrays = [
        np.arange(3, dtype=np.longlong),
        np.arange(3, dtype=np.intc),
        np.arange(3, dtype=np.ulonglong),
        np.arange(3, dtype=np.int_),
        np.array([True, False]),
    ]
    for a, got in zip(arrays, roundtrip(arrays), strict=True):
        assert got.dtype == a.dtype and np.array_equal(got, a)


def test_numpy_zero_d_array_stays_array() -> None:
    a = np.array(2.5, dtype=np.float32)
    out = roundtrip(a)
    assert type(out) is np.ndarray and out.shape == () and out.dtype == np.float32
    assert out[()] == 2.5


# -- tensors="numpy" / "torch" conversions ----------------------------------------------


@pytest.mark.parametrize("name", NUMPY_DTYPES)
def test_torch_to_numpy_same_bits(name: str) -> None:
    t = random_tensor(name, (4, 3), seed=2)
    out = unpackb(packb(t), tensors="numpy")
    assert type(out) is np.ndarray
    assert out.dtype == np_dtype(name)
    assert out.shape == (4, 3)
    assert abytes(out) == tbytes(t)


@pytest.mark.parametrize("name", ["bfloat16", "float8_e4m3fn", "float8_e5m2"])
def test_ml_dtypes_arrays_for_exotic_floats(name: str) -> None:
    t = torch.tensor([1.0, -2.0, 0.5], dtype=getattr(torch, name))
    out = unpackb(packb(t), tensors="numpy")
    assert out.dtype == np.dtype(getattr(ml_dtypes, name))
    assert out.astype(np.float32).tolist() == [1.0, -2.0, 0.5]


@pytest.mark.parametrize("name", NO_NUMPY_DTYPES)
def test_torch_to_numpy_refused_without_numpy_equivalent(name: str) -> None:
    t = random_tensor(name, (3,))
    with pytest.raises(DecodeError, match=name):
        unpackb(packb(t), tensors="numpy")


@pytest.mark.parametrize("name", NUMPY_DTYPES)
def test_numpy_to_torch_same_bits(name: str) -> None:
    a = random_array(name, (2, 5), seed=3)
    out = unpackb(packb(a), tensors="torch")
    assert type(out) is torch.Tensor
    assert out.dtype == getattr(torch, name)
    assert out.shape == (2, 5)
    assert tbytes(out) == abytes(a)


def test_auto_gives_back_the_kind_that_was_sent() -> None:
    t = torch.arange(4)
    a = np.arange(4)
    out = roundtrip({"t": t, "a": a})
    assert type(out["t"]) is torch.Tensor
    assert type(out["a"]) is np.ndarray
    both_np = unpackb(packb({"t": t, "a": a}), tensors="numpy")
    assert all(type(v) is np.ndarray for v in both_np.values())
    both_t = unpackb(packb({"t": t, "a": a}), tensors="torch")
    assert all(type(v) is torch.Tensor for v in both_t.values())


def test_bad_tensors_argument() -> None:
    with pytest.raises(ValueError):
        unpackb(packb(1), tensors="jax")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Decoder(tensors="jax")  # type: ignore[arg-type]


# -- memory sharing, alignment, read-only ------------------------------------------------


def test_packb_returns_bytes_without_tensors_and_buffer_with() -> None:
    assert type(packb({"a": [1, 2, "x"], "b": b"\x00"})) is bytes
    assert type(packb(np.float32(1.0))) is bytes  # a numpy scalar is not a tensor
    buf = packb({"t": torch.ones(2)})
    view = memoryview(buf)
    assert view.nbytes == len(bytes(buf))
    assert not view.readonly


def test_zero_copy_torch_from_packb_buffer() -> None:
    t = torch.arange(1000, dtype=torch.float32).reshape(10, 100)
    buf = packb({"x": t})
    lo, hi = buffer_range(buf)
    out = unpackb(buf)["x"]
    assert lo <= out.data_ptr() and out.data_ptr() + out.nbytes <= hi
    # writable, and writes go to the message buffer
    before = bytes(buf)
    out[0, 0] = 42.0
    assert bytes(buf) != before
    assert unpackb(buf)["x"][0, 0].item() == 42.0


def test_zero_copy_numpy_from_packb_buffer_is_writable() -> None:
    a = np.arange(256, dtype=np.int32)
    buf = packb([a])
    lo, hi = buffer_range(buf)
    out = unpackb(buf)[0]
    assert lo <= out.ctypes.data and out.ctypes.data + out.nbytes <= hi
    assert out.flags.writeable
    out[3] = -7
    assert unpackb(buf)[0][3] == -7


def test_decoded_tensor_keeps_buffer_alive() -> None:
    buf = packb({"t": torch.arange(100_000, dtype=torch.int64), "a": np.arange(50_000)})
    out = unpackb(buf)
    del buf
    gc.collect()
    junk = [np.full(1_000_000, 0xFF, dtype=np.uint8) for _ in range(8)]  # reuse freed memory
    assert out["t"].sum().item() == sum(range(100_000))
    assert int(out["a"].sum()) == sum(range(50_000))
    del junk


def test_from_bytes_numpy_is_read_only() -> None:
    msg = bytes(packb(np.arange(10, dtype=np.float64)))
    out = unpackb(msg)
    assert not out.flags.writeable
    with pytest.raises(ValueError):
        out[0] = 1.0
    assert msg == bytes(packb(np.arange(10, dtype=np.float64)))


def test_from_bytes_no_warnings_in_process() -> None:
    msg = bytes(
        packb({"t": torch.ones(3), "a": np.ones(3), "b": torch.ones(2, dtype=torch.bfloat16)})
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = unpackb(msg)
    assert [str(w.message) for w in caught] == []
    assert torch.equal(out["t"], torch.ones(3))


def test_from_bytes_no_warnings_fresh_process() -> None:
    # torch's "not writable" warning fires once per process: check in a fresh one, under
    # -W error (a warning is an exception there, so one process checks every input: these
    # frames, and test_foreign.py's foreign tensor maps, whose own test is in the slow tier)
    code = FOREIGN_NO_WARNING + (
        "import torch\n"
        "from vf_mm.wire import packb, unpackb\n"
        "msg = bytes(packb({'t': torch.arange(6.0).reshape(2, 3), 'b': torch.ones(2, dtype=torch.bfloat16)}))\n"
        "out = unpackb(msg)\n"
        "assert out['t'].sum().item() == 15.0\n"
        "out = unpackb(msg, tensors='torch')\n"
        "print('ok')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
    assert "Warning" not in proc.stderr


def _data_offsets(buf: Any, tensors: list[Any]) -> list[int]:
    lo, _ = buffer_range(buf)
    offs = []
    for t in tensors:
        ptr = t.data_ptr() if isinstance(t, torch.Tensor) else t.ctypes.data
        offs.append(ptr - lo)
    return offs


def test_every_tensor_is_aligned_in_the_message() -> None:
    obj = [
        "a",
        random_tensor("uint8", (3,)),
        "bc",
        random_tensor("float64", (5, 1)),
        {"k": random_tensor("bfloat16", (1, 2, 3, 4, 5, 6, 7))},
        random_array("complex128", (3,)),
        7,
        random_tensor("int16", (1,)),
        random_array("bool", (1, 1, 1)),
    ]
    buf = packb(obj)
    lo, _ = buffer_range(buf)
    assert lo % ALIGN == 0  # packb output itself sits on an aligned address
    out = unpackb(buf)
    tensors = [out[1], out[3], out[4]["k"], out[5], out[7], out[8]]
    for off in _data_offsets(buf, tensors):
        assert off % ALIGN == 0, off
    # and the same offsets are found from a fresh bytes copy of the message
    msg = bytes(buf)
    lo2, _ = buffer_range(msg)
    out2 = unpackb(msg)
    tensors2 = [out2[1], out2[3], out2[4]["k"], out2[5], out2[7], out2[8]]
    for t in tensors2:
        ptr = t.data_ptr() if isinstance(t, torch.Tensor) else t.ctypes.data
        assert (ptr - lo2) % ALIGN == 0


@pytest.mark.parametrize("name", ["float32", "float64", "complex128", "int16", "bfloat16"])
def test_misaligned_message_still_decodes(name: str) -> None:
    t = random_tensor(name, (5, 3), seed=9)
    a = random_array("float64", (4,), seed=9)
    buf = bytes(packb({"t": t, "a": a}))
    shifted = bytearray(len(buf) + 1)
    shifted[1:] = buf
    view = memoryview(shifted)[1:]
    out = unpackb(view)
    assert_same_tensor(out["t"], t)
    assert abytes(out["a"]) == abytes(a)
    # the elements are naturally aligned (a copy was made where needed)
    assert out["t"].data_ptr() % t.element_size() == 0
    assert out["a"].ctypes.data % 8 == 0
    assert out["a"].flags.aligned


# -- other value types ------------------------------------------------------------------


@dataclasses.dataclass
class Inner:
    weights: torch.Tensor
    label: str = "x"


@dataclasses.dataclass
class Outer:
    name: str
    inner: Inner
    items: list[Inner]
    arr: np.ndarray
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)


def test_dataclasses_become_dicts() -> None:
    w1 = random_tensor("float32", (2, 2))
    w2 = random_tensor("bfloat16", (3,))
    obj = Outer("o", Inner(w1), [Inner(w2, "y"), Inner(w1, "z")], np.arange(3), {"k": 1})
    out = roundtrip(obj)
    assert set(out) == {"name", "inner", "items", "arr", "extra"}
    assert out["name"] == "o" and out["extra"] == {"k": 1}
    assert set(out["inner"]) == {"weights", "label"}
    assert_same_tensor(out["inner"]["weights"], w1)
    assert out["inner"]["label"] == "x"
    assert [i["label"] for i in out["items"]] == ["y", "z"]
    assert_same_tensor(out["items"][0]["weights"], w2)
    assert np.array_equal(out["arr"], np.arange(3))


def test_slots_dataclass() -> None:
    @dataclasses.dataclass(slots=True, frozen=True)
    class S:
        a: int
        b: tuple[int, ...]

    assert roundtrip([S(1, (2, 3)), S(4, ())]) == [{"a": 1, "b": [2, 3]}, {"a": 4, "b": []}]


class PInner(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)
    t: torch.Tensor
    note: str = "n"


class PModel(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(arbitrary_types_allowed=True)
    name: str
    hidden: torch.Tensor = pydantic.Field(exclude=True)
    inner: PInner
    when: dt.datetime
    aliased: int = pydantic.Field(default=3, alias="Aliased")


def test_pydantic_models_keep_every_field() -> None:
    hidden = random_tensor("float16", (4,))
    t = random_tensor("int32", (2,))
    when = dt.datetime(2024, 5, 6, 7, 8, 9, 123456)
    m = PModel(name="m", hidden=hidden, inner=PInner(t=t), when=when, Aliased=5)
    assert "hidden" not in m.model_dump()  # pydantic itself would drop it
    out = roundtrip(m)
    assert set(out) == {"name", "hidden", "inner", "when", "aliased"}
    assert out["name"] == "m" and out["when"] == when and out["aliased"] == 5
    assert_same_tensor(out["hidden"], hidden)
    assert set(out["inner"]) == {"t", "note"}
    assert_same_tensor(out["inner"]["t"], t)


def test_pydantic_extra_fields_kept() -> None:
    class Loose(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="allow")
        a: int

    assert roundtrip(Loose(a=1, b="two")) == {"a": 1, "b": "two"}


@pytest.mark.parametrize(
    "value",
    [
        dt.datetime(2024, 1, 2, 3, 4, 5, 678901),
        dt.datetime(2024, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
        dt.datetime(
            1999, 12, 31, 23, 59, 59, 1, tzinfo=dt.timezone(dt.timedelta(hours=-5, minutes=-30))
        ),
        dt.datetime(2024, 7, 1, 12, tzinfo=ZoneInfo("Europe/Paris")),
        dt.datetime.min,
        dt.datetime.max,
        dt.date(2024, 2, 29),
        dt.date(1, 1, 1),
        dt.time(0, 0),
        dt.time(23, 59, 59, 999999),
        dt.time(12, 30, tzinfo=dt.timezone(dt.timedelta(hours=9))),
        uuid.UUID("12345678-1234-5678-1234-567812345678"),
        uuid.UUID(int=2**128 - 1),  # fixed: parameter ids must match across xdist workers
    ],
    ids=repr,
)
def test_datetime_date_time_uuid_exact(value: Any) -> None:
    out = roundtrip({"v": value, "in_list": [value]})
    for got in (out["v"], out["in_list"][0]):
        assert type(got) is type(value)
        assert got == value
        if isinstance(value, dt.datetime | dt.time):
            assert (got.tzinfo is None) == (value.tzinfo is None)
            assert got.utcoffset() == value.utcoffset()
            assert got.isoformat() == value.isoformat()


def test_path_enum_set_tuple() -> None:
    class Color(enum.Enum):
        RED = "red"
        BLUE = 2

    class Level(enum.IntEnum):
        HIGH = 9

    obj = {
        "p": Path("/tmp/a b/c.png"),
        "pp": PurePosixPath("rel/x"),
        "e": [Color.RED, Color.BLUE, Level.HIGH],
        "s": {3, 1, 2},
        "fs": frozenset({"a", "b"}),
        "t": (1, (2, 3), ()),
    }
    out = roundtrip(obj)
    assert out["p"] == "/tmp/a b/c.png" and type(out["p"]) is str
    assert out["pp"] == "rel/x"
    assert out["e"] == ["red", 2, 9]
    assert type(out["e"][2]) is int
    assert sorted(out["s"]) == [1, 2, 3] and type(out["s"]) is list
    assert sorted(out["fs"]) == ["a", "b"]
    assert out["t"] == [1, [2, 3], []]


def test_numpy_scalars_become_python_numbers() -> None:
    obj = [
        np.int64(-5),
        np.uint8(200),
        np.float32(1.5),
        np.float64(2.25),
        np.bool_(True),
        np.int8(-1),
    ]
    out = roundtrip(obj)
    assert out == [-5, 200, 1.5, 2.25, True, -1]
    assert [type(v) for v in out] == [int, int, float, float, bool, int]


def test_bfloat16_numpy_scalar() -> None:
    out = roundtrip(ml_dtypes.bfloat16(1.5))
    assert out == 1.5 and type(out) is float


def test_maps_with_int_keys_and_plain_values() -> None:
    obj = {
        1: "one",
        -2: [None, True, False],
        2**40: {"nested": {0: 0.5}},
        "s": "ünïcode ✓",
        "big": 2**64 - 1,
        "neg": -(2**63),
        "f": float("inf"),
    }
    out = roundtrip(obj)
    assert out == obj
    assert sorted(k for k in out if type(k) is int) == [-2, 1, 2**40]


def test_deep_nesting() -> None:
    t = random_tensor("float32", (3,))
    obj: Any = {"leaf": t, "n": 0}
    for i in range(100):
        obj = [obj] if i % 2 else {"k": obj}
    out = roundtrip(obj)
    depth = 0
    while not (isinstance(out, dict) and "leaf" in out):
        out = out[0] if isinstance(out, list) else out["k"]
        depth += 1
    assert depth == 100
    assert_same_tensor(out["leaf"], t)


def test_bytes_values() -> None:
    obj = {"b": b"\x00\xff" * 1000, "ba": bytearray(b"xyz"), "empty": b"", "mv": memoryview(b"mv")}
    out = roundtrip(obj)
    assert out == {"b": b"\x00\xff" * 1000, "ba": b"xyz", "empty": b"", "mv": b"mv"}
    assert type(out["ba"]) is bytes


def test_large_token_lists() -> None:
    tokens = list(range(300_000))
    obj = {"prompt_ids": tokens, "logprobs": [-0.5] * 100_000, "mask": [True, False] * 1000}
    out = roundtrip(obj)
    assert out["prompt_ids"] == tokens
    assert out["logprobs"] == [-0.5] * 100_000
    assert out["mask"] == [True, False] * 1000


def test_unknown_ext_passes_through() -> None:
    msg = msgpack.packb({"x": msgpack.ExtType(42, b"opaque")})
    out = unpackb(msg)
    assert out["x"] == Ext(42, b"opaque")
    again = msgpack.unpackb(packb(out))
    assert again == {"x": msgpack.ExtType(42, b"opaque")}


# -- refusals and hooks -----------------------------------------------------------------


class Opaque:
    pass


@pytest.mark.parametrize(
    "make",
    [
        lambda: Opaque(),
        lambda: [1, {"deep": Opaque()}],
        lambda: torch.eye(3).to_sparse(),
        lambda: torch.eye(3).to_sparse_csr(),
        lambda: torch.quantize_per_tensor(torch.randn(4), 0.1, 0, torch.qint8),
        lambda: torch.empty(3, device="meta"),
        lambda: np.array([object(), 1], dtype=object),
        lambda: np.array(["a", "b"]),
        lambda: np.zeros(2, dtype=[("a", "<i4"), ("b", "<f4")]),
        lambda: np.zeros(2, dtype=np.longdouble),
        lambda: np.zeros(2, dtype="datetime64[ns]"),
        lambda: 2**64,
        lambda: -(2**63) - 1,
        lambda: {"k": 2**100},
        lambda: 1 + 2j,
        lambda: Opaque,  # a class, not an instance
    ],
    ids=[
        "object",
        "nested-object",
        "sparse-coo",
        "sparse-csr",
        "quantized",
        "meta",
        "np-object",
        "np-str",
        "np-structured",
        "np-longdouble",
        "np-datetime64",
        "int-2**64",
        "int-below-int64",
        "int-in-map",
        "complex",
        "class",
    ],
)
def test_unsupported_values_raise_encode_error(make: Any) -> None:
    value = make()
    with pytest.raises(EncodeError):
        packb(value)
    with pytest.raises(EncodeError):
        packb({"t": torch.ones(2), "bad": value}, tensor_format="ext")
    # EncodeError is a TypeError and a VfMmError
    assert issubclass(EncodeError, TypeError) and issubclass(EncodeError, VfMmError)


def test_encoder_state_is_clean_after_an_error() -> None:
    with pytest.raises(EncodeError):
        packb([torch.ones(100), np.ones(10), Opaque()])
    t = random_tensor("float32", (3,), seed=1)
    out = roundtrip(["ok", t])
    assert out[0] == "ok"
    assert_same_tensor(out[1], t)
    assert roundtrip([1, 2]) == [1, 2]


def test_enc_hook_handles_custom_type() -> None:
    seen = []

    class Point:
        def __init__(self, x: int, y: int) -> None:
            self.x, self.y = x, y

    def hook(obj: Any) -> Any:
        seen.append(obj)
        if isinstance(obj, Point):
            return {"x": obj.x, "y": obj.y}
        raise EncodeError(f"no {type(obj)}")

    enc = Encoder(enc_hook=hook)
    out = unpackb(enc.encode({"p": Point(1, 2), "t": torch.ones(2)}))
    assert out["p"] == {"x": 1, "y": 2}
    assert torch.equal(out["t"], torch.ones(2))
    assert len(seen) == 1 and isinstance(seen[0], Point)
    with pytest.raises(EncodeError):
        enc.encode(Opaque())
    # without a hook the same type is refused
    with pytest.raises(EncodeError):
        Encoder().encode(Point(1, 2))


class _Box:
    def __init__(self, value: Any) -> None:
        self.value = value


@pytest.mark.parametrize(
    "value",
    [
        torch.arange(3),
        np.arange(3),
        dt.datetime(2020, 1, 1),
        uuid.UUID(int=5),
        Path("/x"),
        Inner(torch.ones(1)),
    ],
    ids=["tensor", "ndarray", "datetime", "uuid", "path", "dataclass"],
)
def test_enc_hook_may_return_any_supported_value(value: Any) -> None:
    # what the hook returns is encoded like any value (msgspec semantics), tensors included
    enc = Encoder(enc_hook=lambda obj: obj.value)
    direct = bytes(packb({"v": value}))
    hooked = bytes(enc.encode({"v": _Box(value)}))
    assert hooked == direct


def test_enc_hook_returning_its_input_or_cycling_is_refused() -> None:
    with pytest.raises(EncodeError):
        Encoder(enc_hook=lambda obj: obj).encode(Opaque())

    class A:
        pass

    class B:
        pass

    flip = Encoder(enc_hook=lambda obj: B() if isinstance(obj, A) else A())
    with pytest.raises(EncodeError):
        flip.encode([A()])


def test_enum_with_rich_value() -> None:
    class Day(enum.Enum):
        EPOCH = dt.date(1970, 1, 1)
        WHERE = Path("/data")
        WHO = uuid.UUID(int=3)

    assert roundtrip([Day.EPOCH, Day.WHERE, Day.WHO]) == [
        dt.date(1970, 1, 1),
        "/data",
        uuid.UUID(int=3),
    ]


def test_numpy_datetime64_scalar() -> None:
    assert roundtrip(np.datetime64("2020-01-02T03:04:05")) == dt.datetime(2020, 1, 2, 3, 4, 5)


# -- the bytes are plain msgpack ---------------------------------------------------------


def test_message_is_valid_msgpack_with_tensor_ext() -> None:
    t = random_tensor("float32", (2, 3), seed=4)
    a = random_array("int16", (5,), seed=4)
    b = random_tensor("bfloat16", (), seed=4)
    when = dt.datetime(2024, 1, 2, 3, 4, 5)
    uid = uuid.UUID(int=12345)
    buf = packb({"t": t, "a": a, "b": b, "s": "str", "when": when, "uid": uid})
    exts: list[tuple[int, bytes]] = []

    def hook(code: int, data: bytes) -> Any:
        exts.append((code, data))
        return len(exts) - 1

    out = msgpack.unpackb(bytes(buf), ext_hook=hook, raw=False)
    assert out["s"] == "str"
    assert [code for code, _ in exts] == [EXT_TENSOR, EXT_TENSOR, EXT_TENSOR, 2, 5]
    assert exts[3][1] == when.isoformat().encode()
    assert exts[4][1] == uid.bytes

    def parse(payload: bytes) -> tuple[int, int, int, tuple[int, ...], bytes]:
        version, flags, code, ndim, pad = TENSOR_HEAD.unpack_from(payload)
        assert version == TENSOR_LAYOUT_VERSION
        assert pad < ALIGN
        shape = tuple(
            int.from_bytes(payload[5 + 8 * i : 13 + 8 * i], "little") for i in range(ndim)
        )
        start = TENSOR_HEAD.size + 8 * ndim + pad
        assert payload[TENSOR_HEAD.size + 8 * ndim : start] == bytes(pad)
        return flags, code, ndim, shape, payload[start:]

    flags, code, ndim, shape, data = parse(exts[out["t"]][1])
    assert flags & FLAG_TORCH and code == by_name("float32").code and shape == (2, 3)
    assert data == tbytes(t)
    flags, code, ndim, shape, data = parse(exts[out["a"]][1])
    assert not flags & FLAG_TORCH and code == by_name("int16").code and shape == (5,)
    assert data == abytes(a)
    flags, code, ndim, shape, data = parse(exts[out["b"]][1])
    assert ndim == 0 and shape == () and code == by_name("bfloat16").code
    assert data == tbytes(b)


def test_golden_tensor_message() -> None:
    # the documented layout, byte for byte: ext32 header, then version 1, flags (torch), dtype
    # code, ndim, pad, shape, zero padding up to offset 64, then the elements
    t = torch.tensor([1.0, 2.0], dtype=torch.float32)
    head = struct.pack("<BBBBB", 1, 1, 12, 1, 45) + struct.pack("<Q", 2)
    data = struct.pack("<2f", 1.0, 2.0)
    expected = struct.pack(">BIb", 0xC9, len(head) + 45 + len(data), 1) + head + bytes(45) + data
    assert bytes(packb(t)) == expected
    assert len(expected) == 64 + 8
    # numpy: flags 0
    assert bytes(packb(t.numpy())) == expected[:7] + b"\x00" + expected[8:]


def test_wire_dtype_codes_are_stable() -> None:
    # a code never changes meaning: messages written today must decode tomorrow
    expected = {
        "bool": 1, "uint8": 2, "int8": 3, "int16": 4, "uint16": 5, "int32": 6, "uint32": 7,
        "int64": 8, "uint64": 9, "float16": 10, "bfloat16": 11, "float32": 12, "float64": 13,
        "complex32": 14, "complex64": 15, "complex128": 16, "float8_e4m3fn": 17,
        "float8_e5m2": 18, "float8_e4m3fnuz": 19, "float8_e5m2fnuz": 20, "float8_e8m0fnu": 21,
        "float4_e2m1fn_x2": 22, "uint1": 23, "uint7": 29, "int1": 30, "int7": 36, "bits8": 37,
        "bits16": 38, "bits1x8": 39, "bits2x4": 40, "bits4x2": 41,
    }  # fmt: skip
    for name, code in expected.items():
        assert by_name(name).code == code, name
    for name in TORCH_DTYPES:
        t = random_tensor(name, (1,))
        payload = bytes(packb(t))[6:]  # past the ext32 header
        assert payload[2] == by_name(name).code
        assert payload[0] == 1 and payload[1] == FLAG_TORCH and payload[3] == 1


def test_plain_msgpack_decodes_everywhere() -> None:
    # a message written by plain msgpack decodes to the same Python values
    obj = {"a": [1, 2.5, None, True, "s", b"b"], "m": {"x": {"y": []}}}
    assert unpackb(msgpack.packb(obj, use_bin_type=True)) == obj


# -- token lists: encoded as plain msgpack would, whatever path writes them --------------


class _IntLike(int):
    pass


class _Level(enum.IntEnum):
    LOW = 3
    HIGH = 70_000


_INT_EDGES = [
    0, 1, 127, 128, 255, 256, 65_535, 65_536, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1,
    -1, -31, -32, -33, -127, -128, -129, -32_767, -32_768, -32_769, -(2**31), -(2**31) - 1,
    -(2**63),
]  # fmt: skip


@pytest.mark.parametrize(
    "obj",
    [
        _INT_EDGES * 4,
        tuple(_INT_EDGES * 4),
        list(range(-70_000, 70_000, 7)),
        {"ids": [5] * 100, "mask": [1, 0] * 50, "bools": [True, False] * 50},
        [1] * 40 + [True],
        [1] * 40 + [_Level.LOW, _Level.HIGH],
        [1] * 40 + [_IntLike(5)],
        [1] * 40 + [2.5],
        [1] * 40 + [None, "x", b"y"],
        {1: list(range(50)), -2: {"x": [list(range(40)), (7,) * 33]}},
        [[list(range(40))] * 3, ("a", list(range(40)))],
        {"deep": [[[[[[[[[list(range(64))]]]]]]]]]},
        [{"prompt_ids": list(range(i, i + 100))} for i in range(300)],
    ],
    ids=[
        "int-edges",
        "int-edges-tuple",
        "wide-range",
        "dict-of-lists",
        "bool-in-ints",
        "int-enum",
        "int-subclass",
        "float-in-ints",
        "mixed-scalars",
        "int-keys-nested",
        "lists-of-lists",
        "deeper-than-any-walk",
        "many-rollouts",
    ],
)
def test_token_lists_are_plain_msgpack(obj: Any) -> None:
    # the bytes of any value without tensors are exactly what msgpack itself writes
    assert packb(obj) == msgpack.packb(obj, use_bin_type=True)
    assert unpackb(packb(obj)) == msgpack.unpackb(msgpack.packb(obj), strict_map_key=False)


def test_long_lists_keep_every_other_type_exact() -> None:
    # values msgspec would write its own way (dates as strings, Decimal as text) take
    # vf_mm's path even inside a long list of ints
    when, day, uid = dt.datetime(2024, 1, 2, 3, 4, 5), dt.date(2024, 2, 29), uuid.UUID(int=7)
    out = roundtrip({"ids": [1] * 40 + [when, day, uid, Path("/p"), _Level.HIGH]})
    assert out["ids"] == [1] * 40 + [when, day, uid, "/p", 70_000]
    assert [type(v) for v in out["ids"][40:]] == [dt.datetime, dt.date, uuid.UUID, str, int]
    with pytest.raises(EncodeError):
        packb([1] * 40 + [decimal.Decimal("1.5")])


@pytest.mark.parametrize("bad", [2**64, -(2**63) - 1])
def test_out_of_range_int_in_a_long_list_is_refused(bad: int) -> None:
    with pytest.raises(EncodeError):
        packb([1] * 100 + [bad])
    with pytest.raises(EncodeError):
        packb({"ids": [1] * 100 + [bad], "t": torch.ones(2)})


def test_token_lists_next_to_tensors() -> None:
    ids = list(range(100_000, 101_000))
    t1, t2 = random_tensor("float32", (5, 3), seed=1), random_tensor("bfloat16", (7,), seed=2)
    obj = {"ids": ids, "t1": t1, "odd": "x", "more": [ids, (3,) * 50], "t2": t2, "tail": ids}
    buf = packb(obj)
    out = unpackb(buf)
    assert out["ids"] == ids and out["tail"] == ids and out["more"] == [ids, [3] * 50]
    assert_same_tensor(out["t1"], t1)
    assert_same_tensor(out["t2"], t2)
    for off in _data_offsets(buf, [out["t1"], out["t2"]]):
        assert off % ALIGN == 0
    # the skeleton around the tensors is the plain msgpack of the rest
    plain = {k: v for k, v in obj.items() if not isinstance(v, torch.Tensor)}
    no_tensors = unpackb(packb(plain))
    assert no_tensors == {k: v for k, v in out.items() if not isinstance(v, torch.Tensor)}


# -- reuse_buffer: a message is never overwritten while anything still holds it ---------


def _start(buf: Any) -> int:
    return buffer_range(buf)[0]


def test_reuse_buffer_reuses_a_dropped_message() -> None:
    enc = Encoder(reuse_buffer=True)
    first = enc.encode({"t": torch.arange(1000, dtype=torch.float32)})
    where = _start(first)
    del first
    second = enc.encode({"t": torch.ones(1000)})
    assert _start(second) == where
    assert torch.equal(unpackb(second)["t"], torch.ones(1000))


def test_reuse_buffer_never_overwrites_a_held_message() -> None:
    enc = Encoder(reuse_buffer=True)
    t = torch.arange(1000, dtype=torch.float32)
    held = enc.encode({"t": t})
    snapshot = bytes(held)
    other = enc.encode({"t": torch.zeros(1000)})
    assert _start(other) != _start(held)
    assert bytes(held) == snapshot
    del other
    # whatever still refers to a dropped message's memory keeps it from being reused
    keepers = {
        "a slice": lambda msg: msg[100:200],
        "a decoded tensor": lambda msg: unpackb(msg)["t"],
        "a numpy view": lambda msg: np.frombuffer(msg, dtype=np.uint8)[100:200],
    }
    for name, keep in keepers.items():
        msg = enc.encode({"t": t})
        kept, where, snapshot = keep(msg), _start(msg), bytes(msg)
        del msg
        gc.collect()
        later = enc.encode({"t": torch.full((1000,), 7.0)})
        assert _start(later) != where, name
        if isinstance(kept, torch.Tensor):
            assert torch.equal(kept, t), name
        else:
            assert bytes(kept) == snapshot[100:200], name
        del kept, later


def test_reuse_buffer_lets_go_of_a_buffer_much_bigger_than_the_message() -> None:
    enc = Encoder(reuse_buffer=True)
    big = enc.encode({"t": torch.zeros(1 << 20)})
    memory = weakref.ref(big.obj.base)  # the allocation the message is a view of
    del big
    same_size = enc.encode({"t": torch.ones(1 << 20)})
    assert same_size.obj.base is memory()
    del same_size
    small = enc.encode({"t": torch.ones(10)})
    assert memory() is None
    assert torch.equal(unpackb(small)["t"], torch.ones(10))


def test_without_reuse_buffer_each_message_is_independent() -> None:
    enc = Encoder()
    msgs = [enc.encode({"i": i, "t": torch.full((100,), float(i))}) for i in range(5)]
    for i, msg in enumerate(msgs):
        out = unpackb(msg)
        assert out["i"] == i and torch.equal(out["t"], torch.full((100,), float(i)))


# -- threads ----------------------------------------------------------------------------


class _YieldingPath:
    """A PathLike whose conversion lets other threads run in the middle of an encode."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __fspath__(self) -> str:
        time.sleep(0)  # releases the GIL mid-pack
        return self.path


def test_packb_is_thread_safe() -> None:
    barrier = threading.Barrier(4)
    big = {seed: random_tensor("float32", (64 * 1024,), seed=seed) for seed in range(4)}

    def work(seed: int) -> list[tuple[Any, Any]]:
        barrier.wait()
        results = []
        for i in range(40):
            obj = {
                "seed": seed,
                "i": i,
                "t": random_tensor("float32", (seed + 1, i % 5 + 1), seed=seed * 100 + i),
                "p": _YieldingPath(f"/seed{seed}/item{i}"),
                "a": random_array("int64", (i % 3,), seed=seed * 100 + i),
                "q": [_YieldingPath(f"/q{seed}"), random_tensor("int8", (seed + 2,), seed=i)],
                "big": big[seed],  # a copy large enough to release the GIL
                "s": "x" * (i + seed),
            }
            results.append((obj, packb(obj)))
        return results

    with ThreadPoolExecutor(4) as pool:
        all_results = list(pool.map(work, range(4)))
    # decode after every thread finished: no output buffer was reused by another call
    for results in all_results:
        for obj, buf in results:
            out = unpackb(buf)
            assert out["seed"] == obj["seed"] and out["i"] == obj["i"] and out["s"] == obj["s"]
            assert out["p"] == obj["p"].path and out["q"][0] == obj["q"][0].path
            assert_same_tensor(out["t"], obj["t"])
            assert_same_tensor(out["q"][1], obj["q"][1])
            assert_same_tensor(out["big"], obj["big"])
            assert abytes(out["a"]) == abytes(obj["a"])


def test_earlier_output_survives_later_calls() -> None:
    t1, t2 = random_tensor("float64", (50,), seed=1), random_tensor("float64", (50,), seed=2)
    b1 = packb(t1)
    snapshot = bytes(b1)
    b2 = packb(t2)
    assert bytes(b1) == snapshot
    assert_same_tensor(unpackb(b1), t1)
    assert_same_tensor(unpackb(b2), t2)


def test_decode_errors_are_value_errors() -> None:
    assert issubclass(DecodeError, ValueError)
    with pytest.raises(DecodeError):
        unpackb(b"\xc1")
    with pytest.raises(DecodeError):
        unpackb("not bytes")  # type: ignore[arg-type]
