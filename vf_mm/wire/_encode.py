"""Encoding: Python objects -> one msgpack message, tensor bytes copied exactly once.

How it stays at one copy: msgpack-python's C ``Packer`` walks the object tree (token
lists, dicts, strings: fast) while each tensor is replaced by a 3-byte placeholder
whose position the packer tells us mid-pack (``getbuffer()``). We then size the
final message, allocate it once (numpy's allocator: large blocks come from huge
pages, not 4 KB page faults), copy the skeleton pieces and each tensor's bytes
straight from the tensor's own memory (strided sources included) to an aligned
offset, and write the extension headers ourselves. No tensor is ever turned into a
temporary ``bytes``.

Nothing here imports torch: a torch tensor can only reach the encoder if the
caller already imported torch, so we look it up in ``sys.modules``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import math
import os
import struct
import sys
import uuid
from collections.abc import Callable
from typing import Any, Literal

import msgpack
import numpy as np

from vf_mm.errors import EncodeError, VfMmError
from vf_mm.wire import dtypes
from vf_mm.wire._format import (
    ALIGN,
    EXT_DATE,
    EXT_DATETIME,
    EXT_TENSOR,
    EXT_TIME,
    EXT_UUID,
    FLAG_TORCH,
    FOREIGN_TENSOR_KEY,
    TENSOR_HEAD,
    TENSOR_LAYOUT_VERSION,
)

TensorFormat = Literal["ext", "foreign"]

_SLOT_CODE = 127  # placeholder ext code; lives only inside the skeleton, never in output
_SLOT_SIZE = 3  # msgpack writes ExtType(code, b"") as ext8: c7 00 <code>
_EXT32 = struct.Struct(">BIb")  # 0xc9, u32 length, i8 type: the header we write ourselves

# Types msgpack packs itself (subclasses such as IntEnum are packed as their base too).
_NATIVE = (
    dict,
    list,
    tuple,
    str,
    int,
    float,
    type(None),
    bytes,
    bytearray,
    memoryview,
    msgpack.ExtType,
)

_TORCH_CARRIER = {1: "uint8", 2: "int16", 4: "int32", 8: "int64", 16: "complex128"}


@dataclasses.dataclass(slots=True)
class _Job:
    """One tensor to place: where its placeholder sits in the skeleton and what to copy."""

    slot: int
    wire: dtypes.WireDType
    shape: tuple[int, ...]
    source: Any  # a torch tensor (detached, on CPU) or a numpy array (little-endian)
    is_torch: bool

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.wire.itemsize


@dataclasses.dataclass(slots=True)
class _Placed:
    job: _Job
    skeleton_end: int  # where the skeleton piece before this tensor ends
    header: bytes  # ext32 header + tensor head + shape + padding
    data_start: int  # offset of the first element in the output


class Encoder:
    """Encodes objects into msgpack messages with tensors as extension types.

    Reusable and cheap to keep: hold one per thread (an ``Encoder`` is not
    thread-safe). Supported beyond msgpack's own types: torch tensors of every
    dtype torch has (quantized, sparse and nested tensors excepted) and numpy
    arrays, any shape and strides; dataclasses and pydantic models (as maps of
    *all* their fields: the wire never drops a field); ``datetime``/``date``/
    ``time``/``UUID`` (exact round trip); ``Path`` (as its string); ``Enum`` (as its
    value); sets (as arrays); numpy scalars (as Python numbers).

    ``enc_hook(obj) -> supported object`` is called for anything else, as in
    msgspec; without one, such objects raise ``EncodeError``.

    ``tensor_format="foreign"`` writes tensors as the ``{"__torch_tensor__": True,
    "dtype", "shape", "data"}`` maps that verifiers and prime-rl read, instead of
    extension types (slower: each tensor is copied into a ``bytes`` first).
    """

    def __init__(
        self,
        *,
        enc_hook: Callable[[Any], Any] | None = None,
        tensor_format: TensorFormat = "ext",
    ) -> None:
        if tensor_format not in ("ext", "foreign"):
            raise ValueError(f"tensor_format must be 'ext' or 'foreign', not {tensor_format!r}")
        self._enc_hook = enc_hook
        self._foreign = tensor_format == "foreign"
        self._jobs: list[_Job] = []
        self._packer = msgpack.Packer(
            default=self._default, autoreset=False, use_bin_type=True, datetime=False
        )
        self._dataclass_fields: dict[type, tuple[str, ...]] = {}

    # -- public -------------------------------------------------------------------

    def encode(self, obj: Any) -> bytes | memoryview:
        """Encode ``obj``. Returns ``bytes`` when it holds no tensor, otherwise a
        writable ``memoryview`` over a 64-byte-aligned buffer holding the message."""
        packer = self._packer
        packer.reset()
        self._jobs.clear()
        try:
            packer.pack(obj)
        except VfMmError:
            raise
        except (TypeError, ValueError, OverflowError) as exc:
            raise EncodeError(f"cannot encode: {exc}") from exc
        finally:
            jobs, self._jobs = self._jobs, []
        if not jobs:
            out = packer.bytes()
            packer.reset()
            return out
        try:
            with packer.getbuffer() as skeleton:
                return self._assemble(skeleton, jobs)
        finally:
            packer.reset()

    # -- the default hook: everything msgpack does not know ---------------------------

    def _default(self, obj: Any) -> Any:
        """What msgpack should pack instead of ``obj``. msgpack calls this hook once per
        object, so a value that is itself not packable (an Enum whose value is a date, an
        ``enc_hook`` that returns a tensor) is converted again here, until it is."""
        value = self._convert(obj)
        for _ in range(8):
            if isinstance(value, _NATIVE):
                return value
            converted = self._convert(value)
            if converted is value:
                return value
            value = converted
        raise EncodeError(f"cannot encode {type(obj).__qualname__}: its conversion does not settle")

    def _convert(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor):
            return self._tensor(obj)
        if isinstance(obj, np.ndarray):
            return self._array(obj)
        if isinstance(obj, dt.datetime):  # before date: datetime is a date
            return msgpack.ExtType(EXT_DATETIME, obj.isoformat().encode())
        if isinstance(obj, dt.date):
            return msgpack.ExtType(EXT_DATE, obj.isoformat().encode())
        if isinstance(obj, dt.time):
            return msgpack.ExtType(EXT_TIME, obj.isoformat().encode())
        if isinstance(obj, uuid.UUID):
            return msgpack.ExtType(EXT_UUID, obj.bytes)
        if isinstance(obj, enum.Enum):
            return obj.value
        if isinstance(obj, os.PathLike):
            return os.fspath(obj)
        if isinstance(obj, np.generic):
            return obj.item()
        if isinstance(obj, (set, frozenset)):
            return list(obj)
        if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
            return self._dataclass(obj)
        pydantic = sys.modules.get("pydantic")
        if pydantic is not None and isinstance(obj, pydantic.BaseModel):
            fields = {name: getattr(obj, name) for name in type(obj).model_fields}
            if obj.model_extra:
                fields.update(obj.model_extra)
            return fields
        ext = _msgspec_ext(obj)
        if ext is not None:
            return ext
        if self._enc_hook is not None:
            return self._enc_hook(obj)
        raise EncodeError(f"cannot encode an object of type {type(obj).__qualname__}")

    def _dataclass(self, obj: Any) -> dict[str, Any]:
        names = self._dataclass_fields.get(type(obj))
        if names is None:
            names = tuple(f.name for f in dataclasses.fields(obj))
            self._dataclass_fields[type(obj)] = names
        return {name: getattr(obj, name) for name in names}

    def _tensor(self, tensor: Any) -> Any:
        torch = sys.modules["torch"]
        if tensor.layout != torch.strided:
            raise EncodeError(f"cannot encode a {tensor.layout} tensor: call .to_dense() first")
        if tensor.is_quantized:
            raise EncodeError("cannot encode a quantized tensor: dequantize it or send .int_repr()")
        if getattr(tensor, "is_nested", False):
            raise EncodeError("cannot encode a nested tensor: send its components")
        if tensor.device.type == "meta":
            raise EncodeError("cannot encode a tensor on the meta device: it has no data")
        tensor = tensor.detach()
        if tensor.device.type != "cpu":
            tensor = tensor.cpu()
        tensor = tensor.resolve_conj().resolve_neg()
        wire = dtypes.from_torch(tensor.dtype)
        if self._foreign:
            return _foreign_map(wire, tuple(tensor.shape), _torch_bytes(tensor, wire))
        return self._slot(_Job(0, wire, tuple(tensor.shape), tensor, True))

    def _array(self, array: np.ndarray) -> Any:
        if array.dtype.hasobject or array.dtype.fields is not None:
            raise EncodeError(f"cannot encode a numpy array of dtype {array.dtype!r}")
        wire = dtypes.from_numpy(array.dtype)
        if array.dtype.byteorder == ">":
            array = array.astype(array.dtype.newbyteorder("<"))
        if self._foreign:
            return _foreign_map(wire, array.shape, np.ascontiguousarray(array).tobytes())
        return self._slot(_Job(0, wire, array.shape, array, False))

    def _slot(self, job: _Job) -> msgpack.ExtType:
        with self._packer.getbuffer() as view:
            job.slot = len(view)
        self._jobs.append(job)
        return msgpack.ExtType(_SLOT_CODE, b"")

    # -- assembly ------------------------------------------------------------------

    def _assemble(self, skeleton: memoryview, jobs: list[_Job]) -> memoryview:
        placed: list[_Placed] = []
        out_pos = 0
        prev = 0
        for job in jobs:
            out_pos += job.slot - prev
            head = TENSOR_HEAD.size + 8 * len(job.shape)
            data_start = out_pos + _EXT32.size + head
            pad = -data_start % ALIGN
            data_start += pad
            nbytes = job.nbytes
            if head + pad + nbytes > 0xFFFFFFFF:
                raise EncodeError(f"a tensor of {nbytes} bytes exceeds msgpack's 4 GiB limit")
            flags = FLAG_TORCH if job.is_torch else 0
            header = b"".join(
                (
                    _EXT32.pack(0xC9, head + pad + nbytes, EXT_TENSOR),
                    TENSOR_HEAD.pack(
                        TENSOR_LAYOUT_VERSION, flags, job.wire.code, len(job.shape), pad
                    ),
                    struct.pack(f"<{len(job.shape)}Q", *job.shape),
                    bytes(pad),
                )
            )
            placed.append(_Placed(job, job.slot, header, data_start))
            out_pos = data_start + nbytes
            prev = job.slot + _SLOT_SIZE
        total = out_pos + len(skeleton) - prev

        out = _aligned_empty(total)
        src = np.frombuffer(skeleton, dtype=np.uint8)
        out_pos = 0
        prev = 0
        for p in placed:
            piece = p.skeleton_end - prev
            out[out_pos : out_pos + piece] = src[prev : p.skeleton_end]
            out_pos += piece
            hdr = np.frombuffer(p.header, dtype=np.uint8)
            out[out_pos : out_pos + len(hdr)] = hdr
            nbytes = p.job.nbytes
            if nbytes:
                _copy_into(out[p.data_start : p.data_start + nbytes], p.job)
            out_pos = p.data_start + nbytes
            prev = p.skeleton_end + _SLOT_SIZE
        out[out_pos:] = src[prev:]
        return memoryview(out)


def _aligned_empty(n: int) -> np.ndarray:
    """``n`` uninitialised bytes whose first byte sits on an ``ALIGN`` boundary."""
    raw = np.empty(n + ALIGN, dtype=np.uint8)
    shift = -raw.ctypes.data % ALIGN
    return raw[shift : shift + n]


def _copy_into(dst: np.ndarray, job: _Job) -> None:
    """Copy a tensor's elements, in C order, into the byte range ``dst``.

    The source is reinterpreted as a same-width plain dtype first, so exotic dtypes
    (float8, sub-byte ints) and strided views all go through one ordinary strided copy.
    """
    if job.is_torch:
        torch = sys.modules["torch"]
        carrier = getattr(torch, _TORCH_CARRIER[job.wire.itemsize])
        source = job.source.view(carrier)
        if source.is_contiguous():  # one plain memcpy, as fast as copying gets
            dst[:] = source.reshape(-1).numpy().view(np.uint8)
        else:
            torch.from_numpy(dst).view(carrier).view(job.shape).copy_(source)
    else:
        carrier = np.dtype(job.wire.carrier)
        target = dst.view(carrier).reshape(job.shape)
        np.copyto(target, job.source.view(carrier), casting="no")


def _torch_bytes(tensor: Any, wire: dtypes.WireDType) -> bytes:
    out = np.empty(tensor.numel() * wire.itemsize, dtype=np.uint8)
    if out.size:
        _copy_into(out, _Job(0, wire, tuple(tensor.shape), tensor, True))
    return out.tobytes()


def _foreign_map(wire: dtypes.WireDType, shape: tuple[int, ...], data: bytes) -> dict[str, Any]:
    name = np.dtype(wire.numpy).name if wire.numpy is not None else wire.name
    return {FOREIGN_TENSOR_KEY: True, "dtype": name, "shape": list(shape), "data": data}


def _msgspec_ext(obj: Any) -> msgpack.ExtType | None:
    """Pass through extension values the decoder could not interpret (``wire.Ext``)."""
    msgspec = sys.modules.get("msgspec")
    if msgspec is not None and isinstance(obj, msgspec.msgpack.Ext):
        return msgpack.ExtType(obj.code, bytes(obj.data))
    return None
