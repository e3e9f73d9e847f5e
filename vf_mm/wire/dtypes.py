"""The table of element types the codec puts on the wire, public so that codecs of other
formats carrying the same tensors (vLLM's multi-modal kwargs) resolve dtypes the same way.

Each dtype has a one-byte wire code that never changes meaning (new dtypes get new
codes), its torch name, its size in bytes, and, where numpy has it, a numpy dtype.
Tensors are always written little-endian in C order. torch and numpy are looked up
lazily: importing this module imports neither.

``DTYPES`` is the table; ``by_code`` / ``by_name`` / ``from_numpy`` / ``from_torch``
find a ``WireDType`` (unknown ones raise ``DecodeError`` or ``EncodeError``);
``numpy_dtype`` / ``torch_dtype`` give the library's dtype for one, and
``torch_module`` imports torch or raises ``MissingDependencyError``.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from functools import cache
from typing import Any

from vf_mm.errors import DecodeError, EncodeError, MissingDependencyError

__all__ = [
    "DTYPES",
    "WireDType",
    "by_code",
    "by_name",
    "from_numpy",
    "from_torch",
    "numpy_dtype",
    "torch_dtype",
    "torch_module",
]


@dataclass(frozen=True, slots=True)
class WireDType:
    """One element type of the wire.

    Args:
        code: Its wire code.
        name: Its torch name.
        itemsize: Its size in bytes.
        numpy: Its numpy name, when numpy has it.
        ml_dtypes: Its ``ml_dtypes`` name, for the types numpy lacks (bfloat16, float8).
    """

    code: int
    name: str  # torch's attribute name: torch.<name>
    itemsize: int
    numpy: str | None = None  # numpy dtype string, where numpy has the type
    ml_dtypes: str | None = None  # the ml_dtypes name that gives numpy this type

    @property
    def carrier(self) -> str:
        """A plain numpy dtype of the same width, used to move the raw bytes."""
        return {1: "u1", 2: "<u2", 4: "<u4", 8: "<u8", 16: "<c16"}[self.itemsize]


DTYPES: tuple[WireDType, ...] = (
    WireDType(1, "bool", 1, "|b1"),
    WireDType(2, "uint8", 1, "|u1"),
    WireDType(3, "int8", 1, "|i1"),
    WireDType(4, "int16", 2, "<i2"),
    WireDType(5, "uint16", 2, "<u2"),
    WireDType(6, "int32", 4, "<i4"),
    WireDType(7, "uint32", 4, "<u4"),
    WireDType(8, "int64", 8, "<i8"),
    WireDType(9, "uint64", 8, "<u8"),
    WireDType(10, "float16", 2, "<f2"),
    WireDType(11, "bfloat16", 2, None, "bfloat16"),
    WireDType(12, "float32", 4, "<f4"),
    WireDType(13, "float64", 8, "<f8"),
    WireDType(14, "complex32", 4),
    WireDType(15, "complex64", 8, "<c8"),
    WireDType(16, "complex128", 16, "<c16"),
    WireDType(17, "float8_e4m3fn", 1, None, "float8_e4m3fn"),
    WireDType(18, "float8_e5m2", 1, None, "float8_e5m2"),
    WireDType(19, "float8_e4m3fnuz", 1, None, "float8_e4m3fnuz"),
    WireDType(20, "float8_e5m2fnuz", 1, None, "float8_e5m2fnuz"),
    WireDType(21, "float8_e8m0fnu", 1, None, "float8_e8m0fnu"),
    WireDType(22, "float4_e2m1fn_x2", 1),
    *(WireDType(22 + n, f"uint{n}", 1) for n in range(1, 8)),  # 23..29
    *(WireDType(29 + n, f"int{n}", 1) for n in range(1, 8)),  # 30..36
    WireDType(37, "bits8", 1),
    WireDType(38, "bits16", 2),
    WireDType(39, "bits1x8", 1),
    WireDType(40, "bits2x4", 1),
    WireDType(41, "bits4x2", 1),
)

_BY_CODE: dict[int, WireDType] = {d.code: d for d in DTYPES}
_BY_NAME: dict[str, WireDType] = {d.name: d for d in DTYPES}

# Other spellings found in foreign payloads (str(torch.dtype) minus "torch.", numpy aliases).
_ALIASES = {
    "half": "float16",
    "float": "float32",
    "double": "float64",
    "short": "int16",
    "int": "int32",
    "long": "int64",
    "cfloat": "complex64",
    "cdouble": "complex128",
    "chalf": "complex32",
    "bool_": "bool",
}

if sys.byteorder != "little":  # pragma: no cover - no big-endian CI
    raise ImportError("vf_mm.wire supports little-endian hosts only")


def by_code(code: int) -> WireDType:
    """The dtype with wire code ``code``.

    Args:
        code: A wire code.

    Raises:
        DecodeError: A code not in the table.
    """
    try:
        return _BY_CODE[code]
    except KeyError:
        raise DecodeError(f"unknown tensor dtype code {code}") from None


def by_name(name: str) -> WireDType:
    """Resolve a dtype spelled as torch or numpy would print it.

    Args:
        name: ``'torch.bfloat16'``, ``'float32'``, ``'<f4'``, ...

    Raises:
        DecodeError: A name not in the table.
    """
    key = name.removeprefix("torch.")
    key = _ALIASES.get(key, key)
    found = _BY_NAME.get(key)
    if found is not None:
        return found
    dtype = parse_numpy_dtype(name)
    try:
        if dtype is None:
            raise EncodeError(name)
        return from_numpy(dtype)
    except EncodeError:
        raise DecodeError(f"unknown tensor dtype {name!r}") from None


def parse_numpy_dtype(name: str) -> Any:
    """``np.dtype(name)``, or None for anything numpy refuses or warns about."""
    np = _numpy()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            return np.dtype(name)
        except (TypeError, ValueError, Warning):
            return None


def torch_module() -> Any:
    """torch, imported on first need, with a clear error when it is not installed."""
    torch = sys.modules.get("torch")
    if torch is not None:
        return torch
    try:
        import torch
    except ImportError as exc:
        raise MissingDependencyError(
            "this message holds torch tensors but torch is not installed; "
            "install torch or decode with tensors='numpy'"
        ) from exc
    return torch


def _numpy() -> Any:
    import numpy

    return numpy


@cache
def torch_dtype(wire: WireDType) -> Any:
    """The torch dtype for ``wire``.

    Args:
        wire: A wire dtype.

    Raises:
        MissingDependencyError: This torch lacks it.
    """
    torch = torch_module()
    dtype = getattr(torch, wire.name, None)
    if dtype is None:
        raise MissingDependencyError(f"this torch ({torch.__version__}) has no dtype {wire.name}")
    return dtype


@cache
def _torch_index() -> dict[Any, WireDType]:
    torch = torch_module()
    return {getattr(torch, d.name): d for d in DTYPES if hasattr(torch, d.name)}


def from_torch(dtype: Any) -> WireDType:
    """The wire dtype of a torch dtype.

    Args:
        dtype: A torch dtype.

    Raises:
        EncodeError: A dtype the wire cannot carry.
    """
    try:
        return _torch_index()[dtype]
    except KeyError:
        raise EncodeError(f"torch dtype {dtype} cannot be put on the wire") from None


@cache
def numpy_dtype(wire: WireDType) -> Any:
    """The numpy dtype for ``wire``.

    Args:
        wire: A wire dtype.

    Raises:
        MissingDependencyError: bfloat16 and float8 need the ml_dtypes package.
    """
    np = _numpy()
    if wire.numpy is not None:
        return np.dtype(wire.numpy)
    if wire.ml_dtypes is not None:
        try:
            import ml_dtypes
        except ImportError as exc:
            raise MissingDependencyError(
                f"numpy has no {wire.name}: install ml_dtypes, or decode with tensors='torch'"
            ) from exc
        return np.dtype(getattr(ml_dtypes, wire.ml_dtypes))
    raise DecodeError(f"numpy has no equivalent of {wire.name}: decode with tensors='torch'")


@cache
def _numpy_index() -> dict[Any, WireDType]:
    np = _numpy()
    return {np.dtype(d.numpy): d for d in DTYPES if d.numpy is not None}


def from_numpy(dtype: Any) -> WireDType:
    """The wire dtype of a numpy dtype, either byte order (the encoder swaps to little-endian).

    Args:
        dtype: A numpy dtype.

    Raises:
        EncodeError: A dtype the wire cannot carry.
    """
    np = _numpy()
    dtype = np.dtype(dtype)
    # ml_dtypes registers bfloat16 and the float8s under their own names (kind 'V' or 'f')
    found = _BY_NAME.get(dtype.name)
    if found is None or found.ml_dtypes is None:
        found = _numpy_index().get(dtype.newbyteorder("<")) if dtype.kind in "biufc" else None
    if found is None:
        raise EncodeError(f"numpy dtype {dtype!r} cannot be put on the wire")
    return found
