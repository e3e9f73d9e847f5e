"""Decoding: one msgpack message -> Python objects, tensors viewing the message's memory.

msgspec's decoder hands each extension payload to our hook as a ``memoryview`` into
the caller's buffer, so a tensor is built with ``np.frombuffer`` on that view: no
copy, whatever its size. The only copy is for a tensor whose elements are not
naturally aligned in memory (a message sliced at an odd offset); messages from
``packb`` and stream frames are aligned. What a tensor costs beyond msgspec's own
decoding is a few microseconds of header parsing and object construction, whatever
its size; token lists cost what msgspec takes to build their Python ints.

Every length in the message is checked against the bytes actually present before
anything is built, so hostile input cannot make us allocate more than it holds.
"""

from __future__ import annotations

import ctypes
import datetime as dt
import math
import struct
import uuid
import warnings
from typing import Any, Literal

import msgspec
import numpy as np

from vf_mm.errors import DecodeError, VfMmError
from vf_mm.wire import dtypes
from vf_mm.wire._format import (
    EXT_DATE,
    EXT_DATETIME,
    EXT_TENSOR,
    EXT_TIME,
    EXT_UUID,
    FLAG_TORCH,
    FOREIGN_TENSOR_KEY,
    MAX_NDIM,
    TENSOR_HEAD,
    TENSOR_LAYOUT_VERSION,
)

TensorType = Literal["auto", "torch", "numpy"]
Ext = msgspec.msgpack.Ext

_FOREIGN_KEY_BYTES = FOREIGN_TENSOR_KEY.encode()
_BY_CODE = {d.code: d for d in dtypes.DTYPES}
_SHAPES = [struct.Struct(f"<{n}Q") for n in range(MAX_NDIM + 1)]
# what torch tensors are viewed through: the numpy dtype, else a same-width carrier
_CARRIERS = {
    d.code: np.dtype(d.numpy) if d.numpy is not None else np.dtype(d.carrier) for d in dtypes.DTYPES
}
_ISO_TYPES: dict[int, type[dt.date] | type[dt.time]] = {
    EXT_DATETIME: dt.datetime,
    EXT_DATE: dt.date,
    EXT_TIME: dt.time,
}


class Decoder:
    """Decodes vf_mm messages (and plain msgpack).

    Tensors share memory with the input. From a writable buffer (what ``packb`` and
    the stream reader produce) they are ordinary writable tensors that keep the buffer
    alive. From read-only ``bytes`` numpy arrays are read-only, and torch tensors must
    be treated as read-only (torch has no read-only tensors): pass a ``bytearray``, or
    ``.clone()`` the tensor, before writing into it.

    Also decodes the ``{"__torch_tensor__": True, "dtype", "shape", "data"}`` maps of
    verifiers and prime-rl into tensors (torch under ``"auto"``).

    A ``Decoder`` is stateless between calls and safe to share across threads.

    Args:
        tensors: What tensors come back as: ``"auto"`` gives each tensor back as the
            kind it was sent as (torch or numpy), ``"torch"`` makes them all torch
            tensors, ``"numpy"`` all numpy arrays (then torch is never imported; bfloat16
            and float8 need the ``ml_dtypes`` package, sub-byte dtypes are refused).
    """

    def __init__(self, *, tensors: TensorType = "auto") -> None:
        if tensors not in ("auto", "torch", "numpy"):
            raise ValueError(f"tensors must be 'auto', 'torch' or 'numpy', not {tensors!r}")
        self.tensors = tensors

    def decode(self, data: Any) -> Any:
        """Decode one message.

        Args:
            data: The message's bytes (``bytes``, ``bytearray``, ``memoryview``); tensors
                share its memory (see the class).

        Returns:
            The decoded object.

        Raises:
            DecodeError: The bytes are not a valid vf_mm message.
        """
        try:
            view = memoryview(data)
        except TypeError:
            raise DecodeError(
                f"cannot decode a {type(data).__qualname__}: need bytes-like"
            ) from None
        if not view.c_contiguous:
            raise DecodeError(
                "cannot decode a non-contiguous buffer: pass bytes or a contiguous view"
            )
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        call = _Call(view, self.tensors)
        try:
            obj = msgspec.msgpack.Decoder(ext_hook=call.ext_hook).decode(view)
            if call.may_hold_foreign(data):
                obj = _revive_foreign(obj, self.tensors)
        except VfMmError:
            raise
        except RecursionError:
            raise DecodeError("message nests deeper than the decoder allows") from None
        except (msgspec.DecodeError, ValueError, TypeError, OverflowError, MemoryError) as exc:
            raise DecodeError(f"malformed message ({len(view)} bytes): {exc}") from None
        finally:
            call.close()
        return obj


class _Call:
    """Per-call state of one ``decode``: the buffer and where its tensors were found.

    The costs that only tensors need (the buffer's address, silencing torch's warning
    about read-only memory) are paid at the first tensor, so a message without one
    decodes at msgspec's own speed."""

    __slots__ = ("base", "base_addr", "quiet", "spans", "tensors")

    def __init__(self, base: memoryview, tensors: TensorType) -> None:
        self.base = base
        self.base_addr = -1
        self.spans: list[tuple[int, int]] = []
        self.tensors = tensors
        self.quiet: warnings.catch_warnings | None = None

    def ext_hook(self, code: int, data: memoryview) -> Any:
        if code == EXT_TENSOR:
            if self.base_addr < 0:
                self.base_addr = _address(self.base)
                if self.base.readonly:
                    self.quiet = _ignore_readonly_warning()
            tensor, start = _tensor(data, self.tensors)
            start -= self.base_addr
            self.spans.append((start, start + len(data)))
            return tensor
        kind = _ISO_TYPES.get(code)
        if kind is not None:
            try:
                return kind.fromisoformat(bytes(data).decode())
            except (UnicodeDecodeError, ValueError):
                raise DecodeError(f"bad {kind.__name__} extension: {bytes(data[:64])!r}") from None
        if code == EXT_UUID:
            if len(data) != 16:
                raise DecodeError(f"a UUID extension holds 16 bytes, not {len(data)}")
            return uuid.UUID(bytes=bytes(data))
        return Ext(code, bytes(data))

    def close(self) -> None:
        if self.quiet is not None:
            self.quiet.__exit__(None, None, None)
            self.quiet = None

    def may_hold_foreign(self, data: Any) -> bool:
        """Whether a foreign tensor map might be present: its key appears outside our tensors.

        Searches only the bytes between tensor payloads (the "skeleton"), never the
        tensor data, so the check costs nothing that scales with tensor bytes (and
        searches ``bytes`` input in place).
        """
        base = self.base
        find = data.find if type(data) is bytes and len(data) == len(base) else None
        pos = 0
        for start, end in (*self.spans, (len(base), len(base))):  # in message order
            if start - pos >= len(_FOREIGN_KEY_BYTES):
                if find is not None:
                    if find(_FOREIGN_KEY_BYTES, pos, start) >= 0:
                        return True
                elif _FOREIGN_KEY_BYTES in base[pos:start].tobytes():
                    return True
            pos = end
        return False


def _address(view: memoryview) -> int:
    """Where ``view``'s first byte sits in memory."""
    if not view.readonly:
        return ctypes.addressof(ctypes.c_char.from_buffer(view))
    return np.frombuffer(view, dtype=np.uint8).ctypes.data


def _tensor(data: memoryview, tensors: TensorType) -> tuple[Any, int]:
    """The tensor an extension payload holds, and the payload's address."""
    size = len(data)
    if size < TENSOR_HEAD.size:
        raise DecodeError(f"tensor extension of {size} bytes is shorter than its header")
    version, flags, code, ndim, pad = TENSOR_HEAD.unpack_from(data)
    if version != TENSOR_LAYOUT_VERSION:
        raise DecodeError(f"tensor layout version {version} is not supported (this vf_mm reads 1)")
    wire = _BY_CODE.get(code) or dtypes.by_code(code)
    if ndim > MAX_NDIM:
        raise DecodeError(f"tensor declares {ndim} dimensions (at most {MAX_NDIM})")
    head = TENSOR_HEAD.size + 8 * ndim
    if head + pad > size:
        raise DecodeError("tensor extension is shorter than its declared header")
    shape = _SHAPES[ndim].unpack_from(data, TENSOR_HEAD.size)
    count = math.prod(shape)
    nbytes = count * wire.itemsize
    available = size - head - pad
    if nbytes != available:
        raise DecodeError(
            f"{wire.name} tensor of shape {list(shape)} needs {nbytes} bytes, "
            f"its extension holds {available}"
        )
    as_torch = tensors == "torch" or (tensors == "auto" and flags & FLAG_TORCH)
    offset = head + pad
    if as_torch and count:  # the address comes cheaply from the tensor
        array = np.frombuffer(data, dtype=_CARRIERS[wire.code], count=count, offset=offset)
        if array.flags.aligned:
            tensor = _torch_tensor(array, wire, shape)
            return tensor, tensor.data_ptr() - offset
    address = _address(data)
    return _build(data, offset, wire, shape, count, as_torch), address


def _build(
    buffer: Any,
    offset: int,
    wire: dtypes.WireDType,
    shape: tuple[int, ...],
    count: int,
    as_torch: bool,
) -> Any:
    """A tensor of ``shape`` over ``buffer[offset:]``, copied only if misaligned."""
    np_type = _CARRIERS[wire.code] if as_torch else dtypes.numpy_dtype(wire)
    array = np.frombuffer(buffer, dtype=np_type, count=count, offset=offset)
    if not array.flags.aligned:  # torch and numpy kernels assume aligned elements
        array = array.copy()
    if as_torch:
        return _torch_tensor(array, wire, shape)
    return array.reshape(shape)


def _torch_tensor(flat: np.ndarray, wire: dtypes.WireDType, shape: tuple[int, ...]) -> Any:
    """``flat`` (the elements through ``_CARRIERS``, aligned) as the wire's torch tensor."""
    tensor = dtypes.torch_module().from_numpy(flat.reshape(shape))
    if wire.numpy is None:
        tensor = tensor.view(dtypes.torch_dtype(wire))
    return tensor


def _revive_foreign(obj: Any, tensors: TensorType) -> Any:
    """Replace foreign tensor maps, anywhere in the tree, with tensors (in place)."""
    if isinstance(obj, dict):
        if _is_foreign(obj):
            return _from_foreign(obj, tensors)
        for key, value in obj.items():
            if isinstance(value, (dict, list)):
                obj[key] = _revive_foreign(value, tensors)
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            if isinstance(value, (dict, list)):
                obj[i] = _revive_foreign(value, tensors)
    return obj


def _is_foreign(d: dict) -> bool:
    return d.get(FOREIGN_TENSOR_KEY) is True or d.get(_FOREIGN_KEY_BYTES) is True


def _from_foreign(d: dict, tensors: TensorType) -> Any:
    """A tensor from a foreign map. Its bytes live in a ``bytes`` object msgspec made, so
    the result is copied once into memory of its own (writable, like native tensors)."""

    def field(name: str) -> Any:
        if name in d:
            return d[name]
        if name.encode() in d:
            return d[name.encode()]
        raise DecodeError(f"a {FOREIGN_TENSOR_KEY} map has no {name!r} field")

    dtype, shape, data = field("dtype"), field("shape"), field("data")
    if isinstance(dtype, bytes):
        dtype = dtype.decode(errors="replace")
    if not isinstance(dtype, str):
        raise DecodeError(f"a {FOREIGN_TENSOR_KEY} map has dtype {dtype!r}, not a string")
    wire = dtypes.by_name(dtype)
    if not isinstance(shape, list) or not all(type(n) is int and n >= 0 for n in shape):
        raise DecodeError(f"a {FOREIGN_TENSOR_KEY} map has a bad shape {shape!r}")
    if len(shape) > MAX_NDIM:
        raise DecodeError(f"a {FOREIGN_TENSOR_KEY} map declares {len(shape)} dimensions")
    shape_t = tuple(shape)
    count = math.prod(shape_t)
    as_torch = tensors != "numpy"
    if isinstance(data, list):  # the `.tolist()` variant: values, not bytes
        array = _from_values(data, wire, count, dtype)
    elif isinstance(data, (bytes, bytearray)):
        if len(data) != count * wire.itemsize:
            raise DecodeError(
                f"a {FOREIGN_TENSOR_KEY} map of {wire.name} {shape} needs "
                f"{count * wire.itemsize} bytes, holds {len(data)}"
            )
        stored = _stored_numpy_dtype(dtype, wire)
        array = np.frombuffer(data, dtype=stored, count=count).astype(
            stored.newbyteorder("<") if stored.kind in "biufc" else stored
        )  # astype copies: to memory of our own, and to little-endian if sent big-endian
    else:
        raise DecodeError(f"a {FOREIGN_TENSOR_KEY} map has data of type {type(data).__name__}")
    return _build(array, 0, wire, shape_t, count, as_torch)


def _stored_numpy_dtype(name: str, wire: dtypes.WireDType) -> np.dtype:
    """How the sender laid the bytes out: its numpy typestr, byte order included, when it
    named one ('>f4'); otherwise our little-endian carrier for the dtype."""
    if wire.numpy is not None:
        named = dtypes.parse_numpy_dtype(name)
        if named is not None and named.kind in "biufc" and named.itemsize == wire.itemsize:
            return named
        return np.dtype(wire.numpy)
    return np.dtype(wire.carrier)


def _from_values(data: list, wire: dtypes.WireDType, count: int, name: str) -> np.ndarray:
    """Little-endian bytes of ``wire`` holding exactly these values, or DecodeError."""
    try:
        values = np.asarray(data)
    except ValueError as exc:
        raise DecodeError(f"a {FOREIGN_TENSOR_KEY} map holds ragged values: {exc}") from None
    if values.size != count:
        raise DecodeError(
            f"a {FOREIGN_TENSOR_KEY} map holds {values.size} values for {count} elements"
        )
    if values.dtype.kind not in "biufc":
        raise DecodeError(f"a {FOREIGN_TENSOR_KEY} map holds non-numeric values for {name}")
    if wire.numpy is not None:
        target = np.dtype(wire.numpy)
    elif wire.ml_dtypes is not None:
        target = dtypes.numpy_dtype(wire)
    else:
        raise DecodeError(f"{wire.name} tensors cannot be rebuilt from a list of values")
    with np.errstate(all="ignore"):
        converted = values.astype(target)
    if target.kind in "fc" or wire.ml_dtypes is not None:
        # floats round to nearest, as torch.tensor(values, dtype=...) does; but a finite
        # value that overflows to infinity is data lost, not rounding
        overflow = np.isinf(converted.astype(np.complex128 if target.kind == "c" else np.float64))
        if np.any(overflow & np.isfinite(values)):
            raise DecodeError(f"a {FOREIGN_TENSOR_KEY} map holds values that overflow {name}")
    else:
        with np.errstate(all="ignore"):
            back = converted.astype(values.dtype) if values.dtype.kind != "c" else None
        if back is None or not np.array_equal(back, values, equal_nan=values.dtype.kind == "f"):
            raise DecodeError(
                f"a {FOREIGN_TENSOR_KEY} map holds values that {name} cannot represent"
            )
    return converted.view(wire.carrier) if wire.numpy is None else converted


def _ignore_readonly_warning() -> warnings.catch_warnings:
    """A context that silences torch's "buffer is not writable" warning, for tensors
    viewing read-only input; the ``Decoder`` docstring states the contract instead."""
    quiet = warnings.catch_warnings()
    quiet.__enter__()
    warnings.filterwarnings("ignore", message="The given (NumPy array|buffer) is not writable")
    return quiet
