"""Encoding: Python objects -> one msgpack message, tensor bytes copied exactly once.

How it stays at one copy: msgpack-python's C ``Packer`` walks the object tree (dicts,
strings, numbers) while each tensor is replaced by a 3-byte placeholder whose
position the packer tells us mid-pack (``getbuffer()``). We then size the final
message, get one output buffer, and fill it front to back: the skeleton pieces between
placeholders, each tensor's extension header (packed in place), and each tensor's
elements, copied straight from the tensor's own memory to an aligned offset (one
``memmove`` for a contiguous CPU tensor or array, one strided copy otherwise). No
tensor is ever turned into a temporary ``bytes``.

Token lists: msgpack's packer spends ~16 ns on each Python int, msgspec's encoder ~3.
Before packing, a short walk over the top of the object (``_lift``) finds long lists
of ints, checks them at C speed (``msgspec.convert``) and has msgspec encode them; a
placeholder stands in for each and its bytes are spliced in like a tensor's. The bytes
are the same either way (tests compare them with msgpack's own), so the wire does not
depend on which path wrote a list.

The output buffer: by default a fresh one per message (numpy's allocator, which leaves
it uninitialised and asks for huge pages from 4 MiB on, so faulting it in costs one
fault per 2 MiB). ``Encoder(reuse_buffer=True)`` keeps the last buffer and writes the
next message into it only if nothing outside the encoder still refers to it (the
returned view, a slice of it, a tensor decoded from it, a send that holds it): a
caller can never see a message it still holds overwritten, and a caller that drops
each message before encoding the next one (a stream writer, a sender) skips the
kernel's page faults and zero-filling of fresh memory, which for large messages cost
about as much as the copy itself.

Nothing here imports torch: a torch tensor can only reach the encoder if the
caller already imported torch, so we look it up in ``sys.modules``.
"""

from __future__ import annotations

import ctypes
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
import msgspec
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
    MAX_NDIM,
    TENSOR_HEAD,
    TENSOR_LAYOUT_VERSION,
)

TensorFormat = Literal["ext", "foreign"]

_SLOT_CODE = 127  # placeholder ext code; lives only inside the skeleton, never in output
_SLOT_SIZE = 3  # msgpack writes ExtType(code, b"") as ext8: c7 00 <code>
_SLOT = msgpack.ExtType(_SLOT_CODE, b"")
_EXT32 = struct.Struct(">BIb")  # 0xc9, u32 length, i8 type: the header we write ourselves
# the tensor head and its shape, one Struct per ndim: packed into the output in one call
_HEAD_SHAPE = [struct.Struct(TENSOR_HEAD.format + f"{n}Q") for n in range(MAX_NDIM + 1)]
_ZEROS = bytes(ALIGN)
_memmove = ctypes.memmove  # releases the GIL while it copies

# Lists of at least this many ints are encoded by msgspec (below it the checks cost more
# than they save); the walk that finds them looks this deep and at this many entries.
_LIFT_MIN_INTS = 32
_LIFT_DEPTH = 6
_LIFT_BUDGET = 4096
_INT_LIST = list[int]

# A kept buffer is not reused for a message under this fraction of its size (the memory
# goes back to the allocator instead of sitting idle).
_SHRINK = 4

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


class Encoder:
    """Encodes objects into msgpack messages with tensors as extension types.

    Reusable and cheap to keep: hold one per thread (an ``Encoder`` is not
    thread-safe). Supported beyond msgpack's own types: torch tensors of every
    dtype torch has (quantized, sparse and nested tensors excepted) and numpy
    arrays, any shape and strides; dataclasses and pydantic models (as maps of
    *all* their fields: the wire never drops a field); ``datetime``/``date``/
    ``time``/``UUID`` (exact round trip); ``Path`` (as its string); ``Enum`` (as its
    value); sets (as arrays); numpy scalars (as Python numbers).

    Args:
        enc_hook: ``enc_hook(obj) -> supported object``, called for anything else, as
            in msgspec; without one, such objects raise ``EncodeError``.
        tensor_format: ``"ext"`` (extension types), or ``"foreign"``: tensors as the
            ``{"__torch_tensor__": True, "dtype", "shape", "data"}`` maps that verifiers
            and prime-rl read (slower: each tensor is copied into a ``bytes`` first).
        reuse_buffer: Write each message into the buffer of the previous one when
            nothing but the encoder refers to that buffer any more (checked by reference
            count, so any view, slice, decoded tensor or pending send that still holds it
            keeps it safe, and the encoder takes a fresh buffer instead). The encoder then
            keeps one buffer alive between calls, of a recent message's size (a message
            under a quarter of it gets a fresh, smaller one): worth it where messages are
            encoded, sent or written, and dropped, one after another.
    """

    def __init__(
        self,
        *,
        enc_hook: Callable[[Any], Any] | None = None,
        tensor_format: TensorFormat = "ext",
        reuse_buffer: bool = False,
    ) -> None:
        if tensor_format not in ("ext", "foreign"):
            raise ValueError(f"tensor_format must be 'ext' or 'foreign', not {tensor_format!r}")
        self._enc_hook = enc_hook
        self._foreign = tensor_format == "foreign"
        self._reuse = reuse_buffer
        self._kept: np.ndarray | None = None  # the buffer reuse_buffer keeps
        self._kept_refs = 0  # its reference count when nothing outside holds it
        # one entry per placeholder: (slot, wire dtype, shape, source, is_torch) for a
        # tensor, (slot, None, (), bytes, False) for a lifted list
        self._jobs: list[tuple[int, dtypes.WireDType | None, tuple[int, ...], Any, bool]] = []
        self._packer = msgpack.Packer(
            default=self._default, autoreset=False, use_bin_type=True, datetime=False
        )
        self._dataclass_fields: dict[type, tuple[str, ...]] = {}
        self._int_encoder = msgspec.msgpack.Encoder(enc_hook=_refuse)
        self._budget = 0

    # -- public -------------------------------------------------------------------

    def encode(self, obj: Any) -> bytes | memoryview:
        """Encode ``obj`` as one message.

        Args:
            obj: The object to encode.

        Returns:
            ``bytes`` when it holds no tensor, otherwise a writable ``memoryview`` over a
                64-byte-aligned buffer holding the message.

        Raises:
            EncodeError: A value the codec cannot put on the wire (and no ``enc_hook``
                turns it into one).
        """
        kind = type(obj)
        if kind is dict or kind is list or kind is tuple:
            self._budget = _LIFT_BUDGET
            obj = self._lift(obj, _LIFT_DEPTH)
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
        try:
            if not jobs:
                return packer.bytes()
            with packer.getbuffer() as skeleton:
                if any(job[1] is not None for job in jobs):
                    return self._assemble(skeleton, jobs)
                return _join(skeleton, jobs)
        finally:
            packer.reset()

    # -- long token lists: encoded by msgspec, ~5x faster per int than msgpack's packer ---

    def _lift(self, obj: Any, depth: int) -> Any:
        """``obj`` (a dict, list or tuple) with its long lists of ints replaced by their
        encoding (``_Raw``), or ``obj`` itself where none was found.

        Containers are rebuilt along the way, never changed. The walk looks at the first
        ``_LIFT_DEPTH`` levels and ``_LIFT_BUDGET`` entries only, and into no list of
        scalars, so on any shape of message it costs little next to packing it.
        """
        if type(obj) is dict:
            if len(obj) > self._budget:
                return obj
            self._budget -= len(obj)
            lifted = None
            for key, value in obj.items():
                kind = type(value)
                if depth and (kind is list or kind is dict or kind is tuple):
                    new = self._lift(value, depth - 1)
                    if new is not value:
                        if lifted is None:
                            lifted = dict(obj)
                        lifted[key] = new
            return obj if lifted is None else lifted
        n = len(obj)
        if n >= _LIFT_MIN_INTS:
            raw = self._int_list(obj)
            if raw is not None:
                return raw
        if not n or n > self._budget or not depth:
            return obj
        kind = type(obj[0])
        if not (kind is dict or kind is list or kind is tuple):
            return obj  # a list of scalars (not ints): nothing inside to lift
        self._budget -= n
        items: list[Any] | None = None
        for i, value in enumerate(obj):
            kind = type(value)
            if kind is list or kind is dict or kind is tuple:
                new = self._lift(value, depth - 1)
                if new is not value:
                    if items is None:
                        items = list(obj)  # msgpack writes a tuple as a list anyway
                    items[i] = new
        return obj if items is None else items

    def _int_list(self, values: list | tuple) -> _Raw | None:
        """msgspec's encoding of ``values`` if it is exactly what msgpack's packer would
        write, else None.

        It is when every element is an ``int`` (``msgspec.convert`` checks that at C
        speed; it refuses bools, floats and everything else) and msgspec encodes each
        one as a plain integer: exact ints, and int-based enums (by their int, as msgpack
        does). Any other int subclass reaches ``enc_hook``, which refuses it, and an
        integer out of msgpack's range fails here as it would there: msgpack's packer
        then handles (or refuses) the list itself.
        """
        if type(values[0]) is not int:  # a list of floats, strings... (rarely worth a try)
            return None
        try:
            msgspec.convert(values, _INT_LIST)
            return _Raw(self._int_encoder.encode(values))
        except (msgspec.ValidationError, _NotPlainInt, OverflowError):
            return None

    # -- the default hook: everything msgpack does not know ---------------------------

    def _default(self, obj: Any) -> Any:
        """What msgpack should pack instead of ``obj``. msgpack calls this hook once per
        object, so a value that is itself not packable (an Enum whose value is a date, an
        ``enc_hook`` that returns a tensor) is converted again here, until it is."""
        if type(obj) is _Raw:
            return self._raw_slot(obj.data)
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
            return self._tensor(obj, torch)
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

    def _tensor(self, tensor: Any, torch: Any) -> Any:
        if tensor.layout != torch.strided:
            raise EncodeError(f"cannot encode a {tensor.layout} tensor: call .to_dense() first")
        if tensor.is_quantized:
            raise EncodeError("cannot encode a quantized tensor: dequantize it or send .int_repr()")
        if tensor.is_nested:
            raise EncodeError("cannot encode a nested tensor: send its components")
        if not tensor.is_cpu:
            if tensor.is_meta:
                raise EncodeError("cannot encode a tensor on the meta device: it has no data")
            tensor = tensor.detach().cpu()
        elif tensor.requires_grad:
            tensor = tensor.detach()
        if tensor.is_conj():
            tensor = tensor.resolve_conj()
        if tensor.is_neg():
            tensor = tensor.resolve_neg()
        wire = dtypes.from_torch(tensor.dtype)
        if self._foreign:
            return _foreign_map(wire, tuple(tensor.shape), _torch_bytes(tensor, wire))
        return self._slot(wire, tuple(tensor.shape), tensor, True)

    def _array(self, array: np.ndarray) -> Any:
        found = _NUMPY_WIRE.get(array.dtype)
        if found is None:
            found = _numpy_wire(array.dtype)
        wire, swap = found
        if swap:
            array = array.astype(array.dtype.newbyteorder("<"))
        if self._foreign:
            return _foreign_map(wire, array.shape, np.ascontiguousarray(array).tobytes())
        return self._slot(wire, array.shape, array, False)

    def _slot(
        self, wire: dtypes.WireDType, shape: tuple[int, ...], source: Any, is_torch: bool
    ) -> msgpack.ExtType:
        view = self._packer.getbuffer()
        slot = len(view)
        view.release()
        self._jobs.append((slot, wire, shape, source, is_torch))
        return _SLOT

    def _raw_slot(self, data: bytes) -> msgpack.ExtType:
        view = self._packer.getbuffer()
        slot = len(view)
        view.release()
        self._jobs.append((slot, None, (), data, False))
        return _SLOT

    # -- assembly ------------------------------------------------------------------

    def _assemble(self, skeleton: memoryview, jobs: list) -> memoryview:
        # pass 1: where each piece goes (a tensor: its header, then its elements at an
        # aligned offset; a lifted list: its bytes), and the message's size
        heads = []
        out_pos = 0
        prev = 0
        for slot, wire, shape, source, _is_torch in jobs:
            out_pos += slot - prev
            prev = slot + _SLOT_SIZE
            if wire is None:
                heads.append((out_pos, 0, 0, 0))
                out_pos += len(source)
                continue
            head = TENSOR_HEAD.size + 8 * len(shape)
            data_start = out_pos + _EXT32.size + head
            pad = -data_start % ALIGN
            data_start += pad
            nbytes = math.prod(shape) * wire.itemsize
            if head + pad + nbytes > 0xFFFFFFFF:
                raise EncodeError(f"a tensor of {nbytes} bytes exceeds msgpack's 4 GiB limit")
            heads.append((out_pos, data_start, pad, nbytes))
            out_pos = data_start + nbytes
        total = out_pos + len(skeleton) - prev

        # pass 2: fill the buffer front to back
        array, address = self._buffer(total)
        out = array.data
        prev = 0
        for (slot, wire, shape, source, is_torch), (at, data_start, pad, nbytes) in zip(
            jobs, heads, strict=True
        ):
            out[at - (slot - prev) : at] = skeleton[prev:slot]
            prev = slot + _SLOT_SIZE
            if wire is None:
                out[at : at + len(source)] = source
                continue
            _EXT32.pack_into(out, at, 0xC9, data_start - at - _EXT32.size + nbytes, EXT_TENSOR)
            _HEAD_SHAPE[len(shape)].pack_into(
                out,
                at + _EXT32.size,
                TENSOR_LAYOUT_VERSION,
                FLAG_TORCH if is_torch else 0,
                wire.code,
                len(shape),
                pad,
                *shape,
            )
            if pad:
                out[data_start - pad : data_start] = _ZEROS[:pad]
            if nbytes:
                _copy_into(array, address, data_start, nbytes, wire, shape, source, is_torch)
        out[total - (len(skeleton) - prev) :] = skeleton[prev:]
        return out

    def _buffer(self, n: int) -> tuple[np.ndarray, int]:
        """``n`` bytes at an ``ALIGN``-ed address (and that address) for the next message.

        Without ``reuse_buffer``: fresh, uninitialised memory. With it: the kept buffer
        when nothing but this encoder refers to it, it is big enough and not oversized."""
        kept = self._kept
        if kept is not None:
            # the same references as when _kept_refs was counted: self._kept, a local, the
            # argument; any more means a view of the last message is still alive somewhere
            if (
                sys.getrefcount(kept) == self._kept_refs
                and n + ALIGN <= kept.nbytes <= (n + ALIGN) * _SHRINK
            ):
                return _aligned(kept, n)
            self._kept = kept = None
        raw = np.empty(n + ALIGN, dtype=np.uint8)
        if self._reuse:
            self._kept = raw
            self._kept_refs = sys.getrefcount(raw)
        return _aligned(raw, n)


class _Raw:
    """Bytes already encoded, standing in for the value they encode (a lifted list)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


class _NotPlainInt(Exception):
    pass


def _refuse(obj: Any) -> Any:
    raise _NotPlainInt


def _join(skeleton: memoryview, jobs: list) -> bytes:
    """The message when its only placeholders stand for lifted lists."""
    pieces = []
    prev = 0
    for slot, _wire, _shape, data, _is_torch in jobs:
        pieces.append(skeleton[prev:slot])
        pieces.append(data)
        prev = slot + _SLOT_SIZE
    pieces.append(skeleton[prev:])
    return b"".join(pieces)


# numpy dtype -> (wire dtype, whether the elements need swapping to little-endian)
_NUMPY_WIRE: dict[np.dtype, tuple[dtypes.WireDType, bool]] = {}


def _numpy_wire(dtype: np.dtype) -> tuple[dtypes.WireDType, bool]:
    if dtype.hasobject or dtype.fields is not None:
        raise EncodeError(f"cannot encode a numpy array of dtype {dtype!r}")
    found = (dtypes.from_numpy(dtype), dtype.byteorder == ">")
    _NUMPY_WIRE[dtype] = found
    return found


def _aligned(raw: np.ndarray, n: int) -> tuple[np.ndarray, int]:
    """The first ``n`` bytes of ``raw`` from its first ``ALIGN``-ed address on."""
    address = raw.ctypes.data
    shift = -address % ALIGN
    return raw[shift : shift + n], address + shift


def _aligned_empty(n: int) -> np.ndarray:
    """``n`` uninitialised bytes whose first byte sits on an ``ALIGN`` boundary."""
    return _aligned(np.empty(n + ALIGN, dtype=np.uint8), n)[0]


def _copy_into(
    out: np.ndarray,
    address: int,
    start: int,
    nbytes: int,
    wire: dtypes.WireDType,
    shape: tuple[int, ...],
    source: Any,
    is_torch: bool,
) -> None:
    """Copy a tensor's elements, in C order, into ``out[start : start + nbytes]``
    (``address`` is where ``out`` starts in memory).

    A contiguous source is one ``memmove`` from its own memory. Any other is
    reinterpreted as a same-width plain dtype first, so exotic dtypes (float8, sub-byte
    ints) and strided views all go through one ordinary strided copy.
    """
    if is_torch:
        if source.is_contiguous():
            _memmove(address + start, source.data_ptr(), nbytes)
            return
        torch = sys.modules["torch"]
        carrier = getattr(torch, _TORCH_CARRIER[wire.itemsize])
        target = torch.from_numpy(out[start : start + nbytes]).view(carrier).view(shape)
        target.copy_(source.view(carrier))
    elif source.flags.c_contiguous:
        out[start : start + nbytes] = source.reshape(-1).view(np.uint8)
    else:
        carrier = np.dtype(wire.carrier)
        target = out[start : start + nbytes].view(carrier).reshape(shape)
        np.copyto(target, source.view(carrier), casting="no")


def _torch_bytes(tensor: Any, wire: dtypes.WireDType) -> bytes:
    nbytes = tensor.numel() * wire.itemsize
    out, address = _aligned(np.empty(nbytes + ALIGN, dtype=np.uint8), nbytes)
    if nbytes:
        _copy_into(out, address, 0, nbytes, wire, tuple(tensor.shape), tensor, True)
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
