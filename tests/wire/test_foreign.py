"""Specification of the foreign tensor layout: ``{"__torch_tensor__": True, "dtype", "shape",
"data"}`` maps, as verifiers and prime-rl write them with plain msgpack."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import ml_dtypes
import msgpack
import numpy as np
import pytest
import torch

from vf_mm.errors import DecodeError
from vf_mm.wire import Encoder, StreamReader, StreamWriter, packb, unpackb
from vf_mm.wire.dtypes import DTYPES

pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")

REPO = Path(__file__).resolve().parents[2]
KEY = "__torch_tensor__"
TORCH_DTYPES = [d.name for d in DTYPES if hasattr(torch, d.name)]
_CARRIER = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def tbytes(t: torch.Tensor) -> bytes:
    t = t.detach()
    if t.element_size() == 16:
        t = torch.view_as_real(t)
    return t.view(_CARRIER[t.element_size()]).contiguous().numpy().tobytes()


def random_tensor(name: str, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    dtype = getattr(torch, name)
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(0, 256, (*shape, dtype.itemsize), dtype=torch.uint8, generator=g)
    return raw.view(dtype)[..., 0]


def verifiers_map(t: torch.Tensor, dtype: Any = None) -> dict[str, Any]:
    """What verifiers' msgpack encoder puts on the wire for a tensor."""
    t = t.detach().contiguous().cpu()
    if dtype is None:
        dtype = str(t.dtype).removeprefix("torch.")
    return {KEY: True, "dtype": dtype, "shape": list(t.shape), "data": tbytes(t)}


def plain(obj: Any) -> bytes:
    return msgpack.packb(obj, use_bin_type=True)


# -- decoding the foreign layout ---------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "spelling"),
    [
        ("float32", "float32"),
        ("float32", "torch.float32"),
        ("float32", "<f4"),
        ("float32", "f4"),
        ("float32", "float"),
        ("float64", "<f8"),
        ("float64", "double"),
        ("float16", "half"),
        ("float16", "<f2"),
        ("bfloat16", "bfloat16"),
        ("bfloat16", "torch.bfloat16"),
        ("int64", "int64"),
        ("int64", "<i8"),
        ("int64", "long"),
        ("int64", "torch.int64"),
        ("int32", "<i4"),
        ("int16", "short"),
        ("uint8", "|u1"),
        ("uint8", "uint8"),
        ("bool", "bool"),
        ("bool", "|b1"),
        ("complex64", "<c8"),
        ("complex64", "cfloat"),
        ("float8_e4m3fn", "torch.float8_e4m3fn"),
    ],
)
def test_dtype_spellings(name: str, spelling: str) -> None:
    t = random_tensor(name, (2, 3), seed=1)
    out = unpackb(plain({"x": verifiers_map(t, spelling)}))["x"]
    assert type(out) is torch.Tensor
    assert out.dtype == t.dtype and out.shape == t.shape
    assert tbytes(out) == tbytes(t)


def test_verifiers_style_float32_and_grid() -> None:
    pixel_values = torch.randn(4, 6)
    grid = torch.tensor([[1, 2, 2]], dtype=torch.int64)
    msg = plain(
        {
            "mm_items": {
                "image": [
                    {
                        "pixel_values": verifiers_map(pixel_values),
                        "image_grid_thw": verifiers_map(grid),
                    }
                ]
            },
            "prompt_ids": [1, 2, 3],
        }
    )
    out = unpackb(msg)
    item = out["mm_items"]["image"][0]
    assert torch.equal(item["pixel_values"], pixel_values)
    assert torch.equal(item["image_grid_thw"], grid)
    assert item["image_grid_thw"].dtype == torch.int64
    assert out["prompt_ids"] == [1, 2, 3]


def test_bytes_keys_and_extra_fields() -> None:
    t = torch.randn(3, 2)
    arr = t.numpy()
    msg = plain(
        [
            {
                b"__torch_tensor__": True,
                b"data": arr.tobytes(),
                b"dtype": arr.dtype.str,
                b"shape": arr.shape,
                b"device": "cpu",
                b"requires_grad": False,
            },
            {
                b"__torch_tensor__": True,
                b"data": arr.tobytes(),
                b"dtype": b"float32",
                b"shape": [6],
            },
        ]
    )
    out = unpackb(msg)
    assert torch.equal(out[0], t)
    assert torch.equal(out[1], t.reshape(6))


def test_bfloat16_bits_from_uint16_view() -> None:
    t = random_tensor("bfloat16", (5,), seed=3)
    data = t.view(torch.uint16).numpy().tobytes()
    msg = plain({KEY: True, "dtype": "bfloat16", "shape": [5], "data": data})
    out = unpackb(msg)
    assert out.dtype == torch.bfloat16 and tbytes(out) == tbytes(t)
    as_np = unpackb(msg, tensors="numpy")
    assert as_np.dtype == np.dtype(ml_dtypes.bfloat16)
    assert as_np.tobytes() == data


def test_data_as_list_variant() -> None:
    t = torch.tensor([[1.5, -2.0, 3.25], [0.0, 4.0, -0.5]])
    i = torch.tensor([3, -4, 5], dtype=torch.int64)
    b = torch.tensor([1.0, 2.5], dtype=torch.bfloat16)
    msg = plain(
        [
            {KEY: True, "dtype": "torch.float32", "shape": [2, 3], "data": t.tolist()},
            {KEY: True, "dtype": "int64", "shape": [3], "data": i.tolist()},
            {KEY: True, "dtype": "bfloat16", "shape": [2], "data": b.float().tolist()},
            {KEY: True, "dtype": "float32", "shape": [0], "data": []},
        ]
    )
    out = unpackb(msg)
    assert out[0].dtype == torch.float32 and torch.equal(out[0], t)
    assert out[1].dtype == torch.int64 and torch.equal(out[1], i)
    assert out[2].dtype == torch.bfloat16 and torch.equal(out[2], b)
    assert out[3].shape == (0,)
    as_np = unpackb(msg, tensors="numpy")
    assert as_np[0].dtype == np.float32 and np.array_equal(as_np[0], t.numpy())
    assert as_np[1].dtype == np.int64 and as_np[1].tolist() == [3, -4, 5]
    assert as_np[2].dtype == np.dtype(ml_dtypes.bfloat16)


def test_nested_and_next_to_native_tensors() -> None:
    native = random_tensor("float32", (3, 3), seed=4)
    native_np = np.arange(5, dtype=np.int16)
    foreign = random_tensor("bfloat16", (2, 2), seed=5)
    obj = {
        "native": native,
        "np": native_np,
        "list": [1, verifiers_map(foreign), {"deeper": [verifiers_map(foreign)]}],
        "after": random_tensor("int8", (4,), seed=6),
    }
    out = unpackb(packb(obj))
    assert tbytes(out["native"]) == tbytes(native)
    assert isinstance(out["np"], np.ndarray) and out["np"].tolist() == list(range(5))
    assert out["list"][0] == 1
    for got in (out["list"][1], out["list"][2]["deeper"][0]):
        assert type(got) is torch.Tensor and got.dtype == torch.bfloat16
        assert tbytes(got) == tbytes(foreign)
    assert tbytes(out["after"]) == tbytes(obj["after"])
    # tensors="numpy" converts foreign maps too
    as_np = unpackb(packb(obj), tensors="numpy")
    assert isinstance(as_np["list"][1], np.ndarray)
    assert as_np["list"][1].tobytes() == tbytes(foreign)


def test_foreign_map_at_top_level_and_as_sole_content() -> None:
    t = torch.arange(6, dtype=torch.int32).reshape(2, 3)
    out = unpackb(plain(verifiers_map(t)))
    assert torch.equal(out, t)


def test_key_inside_native_tensor_bytes_is_not_revived() -> None:
    # the bytes of a foreign map, stored as the *data* of a native uint8 tensor
    payload = plain(verifiers_map(torch.ones(2)))
    carrier = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    out = unpackb(packb({"blob": carrier, "raw": payload}))
    assert tbytes(out["blob"]) == payload
    assert out["raw"] == payload  # bytes values are never parsed


@pytest.mark.parametrize(
    "obj",
    [
        "__torch_tensor__",
        {"text": "the key __torch_tensor__ appears in user text"},
        {"__torch_tensor__": "True", "dtype": "float32", "shape": [1], "data": b"\x00" * 4},
        {"__torch_tensor__": 1, "dtype": "float32", "shape": [1], "data": b"\x00" * 4},
        {"__torch_tensor__": False, "dtype": "float32", "shape": [1], "data": b"\x00" * 4},
        {"__torch_tensor__": None},
        {"notes": ["__torch_tensor__", {"__torch_tensor__x": True}]},
        [{"k": "__torch_tensor__"}, b"__torch_tensor__"],
    ],
    ids=range(8),
)
def test_lookalikes_are_left_untouched(obj: Any) -> None:
    assert unpackb(plain(obj)) == obj
    assert unpackb(packb(obj)) == obj
    both = {"t": torch.ones(2), "o": obj}
    out = unpackb(packb(both))
    assert out["o"] == obj


# -- malformed foreign maps --------------------------------------------------------------


def _good() -> dict[str, Any]:
    return {KEY: True, "dtype": "float32", "shape": [2, 2], "data": b"\x00" * 16}


def _without(field: str) -> dict[str, Any]:
    d = _good()
    del d[field]
    return d


def _with(**kw: Any) -> dict[str, Any]:
    return {**_good(), **kw}


@pytest.mark.parametrize(
    "bad",
    [
        _without("dtype"),
        _without("shape"),
        _without("data"),
        _with(data=b"\x00" * 15),
        _with(data=b"\x00" * 17),
        _with(data=b""),
        _with(dtype="float31"),
        _with(dtype="torch.nothing"),
        _with(dtype="object"),
        _with(dtype="O"),
        _with(dtype="<U4"),
        _with(dtype="datetime64[ns]"),
        _with(dtype="i4,i4"),
        _with(dtype=""),
        _with(dtype=5),
        _with(dtype=None),
        _with(shape=[-1, 2]),
        _with(shape=[2.0, 2]),
        _with(shape=[True, 4]),
        _with(shape="2,2"),
        _with(shape=None),
        _with(shape=[1] * 65),
        _with(shape=[2**40, 2**40]),
        _with(data="\x00" * 16),
        _with(data=None),
        _with(data=7),
        _with(data=[1, 2, 3]),
        _with(data=[[1, 2], [3]]),
        _with(data=["a", "b", "c", "d"]),
    ],
    ids=lambda d: repr({k: v for k, v in d.items() if k != KEY})[:60],
)
def test_malformed_foreign_maps_raise_decode_error(bad: dict[str, Any]) -> None:
    for tensors in ("auto", "torch", "numpy"):
        with pytest.raises(DecodeError):
            unpackb(plain({"ok": 1, "bad": [bad]}), tensors=tensors)


def test_wrong_byte_count_names_bytes() -> None:
    with pytest.raises(DecodeError, match="bytes"):
        unpackb(plain(_with(data=b"\x00" * 15)))


@pytest.mark.parametrize(
    "name",
    [
        "S3",
        "V8",
        "O",
        "U3",
        "M8",
        "m8[s]",
        "c",
        "void",
        "a",
        "a5",
    ],
)
def test_non_numeric_dtype_names_refused_quietly(name: str) -> None:
    msg = plain({KEY: True, "dtype": name, "shape": [1], "data": b"\x00" * 8})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(DecodeError):
            unpackb(msg)
    assert [str(w.message) for w in caught] == []


def test_bad_dtype_is_named() -> None:
    with pytest.raises(DecodeError, match="float31"):
        unpackb(plain(_with(dtype="float31")))


@pytest.mark.parametrize("typestr", [">f4", ">i8", ">u2"])
def test_big_endian_typestr_is_not_misread(typestr: str) -> None:
    values = np.array([1, 2, 3], dtype=typestr)
    msg = plain({KEY: True, "dtype": typestr, "shape": [3], "data": values.tobytes()})
    out = unpackb(msg)
    assert out.tolist() == [1, 2, 3]
    assert out.dtype == getattr(torch, np.dtype(typestr).newbyteorder("<").name)
    as_np = unpackb(msg, tensors="numpy")
    assert as_np.tolist() == [1, 2, 3]
    assert as_np.dtype == np.dtype(typestr).newbyteorder("<")


@pytest.mark.parametrize("name", ["uint4", "int2", "bits8", "float4_e2m1fn_x2"])
def test_list_data_for_unbuildable_dtype(name: str) -> None:
    with pytest.raises(DecodeError):
        unpackb(plain({KEY: True, "dtype": name, "shape": [2], "data": [1, 0]}))


@pytest.mark.parametrize("tensors", ["auto", "numpy"])
@pytest.mark.parametrize(
    ("name", "values"),
    [
        ("uint8", [300, 1]),
        ("uint8", [-1, 1]),
        ("int8", [1, 200]),
        ("int32", [float("nan"), 0]),
        ("int16", [float("inf"), 0]),
        ("bool", [2, 0]),
    ],
)
def test_list_data_out_of_range(name: str, values: list[Any], tensors: str) -> None:
    # never wrapped or clipped silently
    msg = plain({KEY: True, "dtype": name, "shape": [2], "data": values})
    with pytest.raises(DecodeError):
        unpackb(msg, tensors=tensors)


@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16"])
def test_list_data_floats_round_to_nearest(name: str) -> None:
    values = [0.1, 1 / 3, -2.5]
    msg = plain({KEY: True, "dtype": name, "shape": [3], "data": values})
    expected = torch.tensor(values, dtype=getattr(torch, name))
    out = unpackb(msg)
    assert out.dtype == expected.dtype and tbytes(out) == tbytes(expected)


def test_list_data_complex_emits_no_warning() -> None:
    msg = plain({KEY: True, "dtype": "complex64", "shape": [2], "data": [1.0, 2.0]})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = unpackb(msg)
    assert [str(w.message) for w in caught] == []
    assert out.dtype == torch.complex64 and out.tolist() == [1 + 0j, 2 + 0j]


# -- tensor_format="foreign" ---------------------------------------------------------------


@pytest.mark.parametrize("name", TORCH_DTYPES)
def test_foreign_output_roundtrip_every_dtype(name: str) -> None:
    t = random_tensor(name, (3, 4), seed=8)
    nc = t.t()  # non-contiguous input
    msg = packb({"t": t, "nc": nc}, tensor_format="foreign")
    assert type(msg) is bytes  # no extension tensors: plain bytes
    seen = msgpack.unpackb(msg)  # plain msgpack, no ext_hook needed
    for key, ref in (("t", t), ("nc", nc)):
        m = seen[key]
        assert set(m) == {KEY, "dtype", "shape", "data"}
        assert m[KEY] is True
        assert isinstance(m["dtype"], str)
        assert m["shape"] == list(ref.shape)
        assert m["data"] == tbytes(ref)
    out = unpackb(msg)
    for key, ref in (("t", t), ("nc", nc)):
        got = out[key]
        assert type(got) is torch.Tensor
        assert got.dtype == ref.dtype and got.shape == ref.shape
        assert tbytes(got) == tbytes(ref)


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        (torch.float32, "float32"),
        (torch.bfloat16, "bfloat16"),
        (torch.int64, "int64"),
        (torch.bool, "bool"),
        (torch.float16, "float16"),
    ],
)
def test_foreign_dtype_names_match_verifiers(dtype: torch.dtype, expected: str) -> None:
    t = torch.zeros(2, dtype=dtype)
    m = msgpack.unpackb(packb(t, tensor_format="foreign"))
    assert m["dtype"] == expected


def test_foreign_bfloat16_layout() -> None:
    t = torch.tensor([1.0, -2.0, 3.5], dtype=torch.bfloat16)
    m = msgpack.unpackb(packb([t], tensor_format="foreign"))[0]
    assert m == {
        KEY: True,
        "dtype": "bfloat16",
        "shape": [3],
        "data": t.view(torch.uint16).numpy().tobytes(),
    }
    out = unpackb(packb([t], tensor_format="foreign"))[0]
    assert out.dtype == torch.bfloat16 and torch.equal(out, t)


def test_foreign_numpy_input() -> None:
    a = np.arange(6, dtype=">i4").reshape(2, 3)[:, ::-1]
    msg = packb(a, tensor_format="foreign")
    m = msgpack.unpackb(msg)
    assert m["dtype"] == "int32" and m["shape"] == [2, 3]
    assert m["data"] == np.ascontiguousarray(a.astype("<i4")).tobytes()
    assert unpackb(msg, tensors="numpy").tolist() == a.tolist()
    assert unpackb(msg).tolist() == a.tolist()


def test_foreign_encoder_object() -> None:
    enc = Encoder(tensor_format="foreign")
    msg = enc.encode({"t": torch.arange(3)})
    assert msgpack.unpackb(msg)["t"][KEY] is True
    with pytest.raises(ValueError):
        Encoder(tensor_format="json")  # type: ignore[arg-type]


# -- memory of foreign tensors ----------------------------------------------------------------


def test_foreign_from_writable_buffer_is_writable() -> None:
    msg = bytearray(plain(verifiers_map(torch.arange(4, dtype=torch.float32))))
    out = unpackb(msg, tensors="numpy")
    assert out.flags.writeable


def test_foreign_from_stream_is_writable(tmp_path: Path) -> None:
    path = tmp_path / "s.vfmm"
    with StreamWriter(path, encoder=Encoder(tensor_format="foreign")) as w:
        w.write({"t": np.arange(4, dtype=np.float32)})
    with StreamReader(path, tensors="numpy") as r:
        (item,) = list(r)
    assert item["t"].flags.writeable


def _fresh_process_warnings(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-W", "error", "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )


#: foreign tensor maps decoded from bytes and from a bytearray: checked for warnings in a
#: fresh process (torch warns once per process), under ``-W error``
FOREIGN_NO_WARNING = (
    "import msgpack, torch\n"
    "from vf_mm.wire import unpackb\n"
    "m = msgpack.packb({'__torch_tensor__': True, 'dtype': 'float32', 'shape': [2],"
    " 'data': b'\\x00' * 8})\n"
    "assert unpackb(m).tolist() == [0.0, 0.0]\n"
    "assert unpackb(bytearray(m)).tolist() == [0.0, 0.0]\n"
)


@pytest.mark.slow
def test_foreign_from_bytes_and_from_bytearray_emit_no_warning() -> None:
    """In a fresh process (torch warns once per process), under ``-W error``: a warning
    from either input type is an exception there, so one process checks both. Slow tier:
    the default tier's ``test_codec.py::test_from_bytes_no_warnings_fresh_process`` runs
    this same code in its fresh process (one process, not two, importing torch)."""
    code = FOREIGN_NO_WARNING + "print('ok')\n"
    proc = _fresh_process_warnings(code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"
