"""vLLM's wire format for one image's model inputs: ``features.kwargs_data`` entries.

``POST /inference/v1/generate`` (``--enable-scale-out``) takes, per image, the base64
text of vLLM's msgpack encoding of one ``MultiModalKwargsItem``
(``vllm/entrypoints/scale_out/token_in_token_out/mm_serde.py``: ``MsgpackEncoder``
from ``vllm/v1/serial_utils.py`` with every tensor inline). We write and read that
encoding here with msgpack and numpy, without importing vLLM.

The format, as vllm(-cpu) 0.32.0 writes and reads it (one msgpack map per item)::

    {
      "pixel_values": {
        "data": ["float32", [n_patches, dim], Ext(3, <raw little-endian C-order bytes>)],
        "field": ["flat", {"keep_on_cpu": false, "slices": [[[0, n_patches, nil]]], "dim": 0}]
      },
      "image_grid_thw": {
        "data": ["int64", [3], Ext(3, <24 bytes>)],
        "field": ["batched", {"keep_on_cpu": true}]
      }
    }

- A tensor is ``[dtype, shape, data]``: ``dtype`` is torch's name without ``torch.``
  (``float32``, ``bfloat16``, ``int64``), ``shape`` an array of ints, ``data`` the raw
  bytes in msgpack extension type 3 (vLLM's ``CUSTOM_TYPE_RAW_VIEW``).
- A field is ``[factory, kwargs]``: the ``MultiModalFieldConfig`` factory (``flat``,
  ``batched``, ``shared``) and its dataclass fields by name, in declaration order
  (``keep_on_cpu`` first). Qwen2-VL / 2.5-VL / 3-VL declare ``pixel_values`` with
  ``flat_from_sizes`` (slices: one 1-tuple of ``slice(start, stop, None)`` per item,
  a slice written as ``[start, stop, step]``) and ``image_grid_thw`` as ``batched`` with
  ``keep_on_cpu``. A batched element is one row of the batch: ``image_grid_thw`` is
  shape ``(3,)`` on the wire, ``(1, 3)`` in vf_mm's ``MultiModalData``.
- Kimi-K2.5 (``modality="vision_chunk"``, vLLM's one modality for its images and video
  chunks): ``pixel_values`` ``(patches, 3, 14, 14)`` flat, and the grid batched with
  ``keep_on_cpu`` under vLLM's name ``grid_thws`` (transformers' ``image_grid_thw``).
- vLLM's own render route writes one item of a multi-image prompt with the *batch's*
  slices (all images); the slices are informational on the generate side (the engine
  concatenates per-item tensors), so we write the single item's own ``[0, n)``.

Older vLLM releases (before the keyed item map) wrote a list of
``{"modality", "key", "data", "field": [factory, *positional args]}`` instead; that
layout is not accepted by 0.32 and is not produced here.
"""

from __future__ import annotations

import base64
import binascii
import struct
from collections.abc import Callable, Mapping
from typing import Any, Literal

import msgpack
import numpy as np

from vf_mm.errors import DecodeError, EncodeError
from vf_mm.wire import dtypes as _dtypes

__all__ = [
    "FIELD_SPECS",
    "LLAVA_FIELD_SPECS",
    "VISION_CHUNK_FIELD_SPECS",
    "VLLM_KEYS",
    "decode_kwargs_item",
    "encode_kwargs_item",
    "item_fingerprint",
    "sent_digest",
]

# vllm/v1/serial_utils.py: CUSTOM_TYPE_RAW_VIEW
RAW_VIEW_EXT = 3

# How Qwen2-VL / Qwen2.5-VL / Qwen3-VL declare their multi-modal kwargs
# (vllm/model_executor/models/qwen2_vl.py: _create_qwen2vl_field_factory, and
# qwen2_5_vl.py's second_per_grid_ts): key -> (modality, factory, keep_on_cpu).
FIELD_SPECS: dict[str, tuple[str, Literal["flat", "batched"], bool]] = {
    "pixel_values": ("image", "flat", False),
    "image_embeds": ("image", "flat", False),
    "image_grid_thw": ("image", "batched", True),
    "pixel_values_videos": ("video", "flat", False),
    "video_embeds": ("video", "flat", False),
    "video_grid_thw": ("video", "batched", True),
    "second_per_grid_ts": ("video", "batched", True),
    "timestamps": ("video", "batched", True),
    # SmolVLM's per-tile masks and Gemma 4's patch positions, as transformers' processors
    # make them and vf_mm's renderer keeps them (one item's arrays whole, leading axis
    # included): what ``vf-mm serve`` reads in features mode
    "pixel_attention_mask": ("image", "flat", False),
    "image_position_ids": ("image", "flat", False),
}

# How LLaVA-OneVision declares them (vllm/model_executor/models/llava_onevision.py):
# one image's tiles are one batched element.
LLAVA_FIELD_SPECS: dict[str, tuple[str, Literal["flat", "batched"], bool]] = {
    "pixel_values": ("image", "batched", False),
    "image_embeds": ("image", "batched", False),
    "image_sizes": ("image", "batched", True),
    "pixel_values_videos": ("video", "batched", False),
}

# How Kimi-K2.5 declares them (vllm/model_executor/models/kimi_k25.py: its images and
# video chunks are one modality, "vision_chunk"; ``pixel_values`` ``(patches, 3, 14, 14)``
# flat over the grid's patches, the grid batched under vLLM's name ``grid_thws``).
VISION_CHUNK_FIELD_SPECS: dict[str, tuple[str, Literal["flat", "batched"], bool]] = {
    "pixel_values": ("vision_chunk", "flat", False),
    "grid_thws": ("vision_chunk", "batched", True),
}
#: per vLLM modality, transformers' (and vf_mm's) name of a model input -> vLLM's
VLLM_KEYS: dict[str, dict[str, str]] = {"vision_chunk": {"image_grid_thw": "grid_thws"}}

# transformers' inputs that vLLM computes for itself (LLaVA-OneVision's per-sample image
# count): not sent
LOCAL_ONLY = frozenset({"batch_num_images"})

_fast_b64decode: Callable[..., bytes] | None
try:  # SIMD base64 (a declared dependency): ~0.1 ms a megabyte where base64's takes ~4
    from pybase64 import b64decode as _fast_b64decode
except ImportError:  # pragma: no cover
    _fast_b64decode = None


def _b64decode(data: str | bytes) -> bytes:
    """``base64.b64decode(data, validate=True)`` of bytes or an ASCII string, by pybase64
    where it accepts ``data`` (never laxer: what it decodes, base64 decodes to the same
    bytes; it reads a string without copying it to bytes first); what it refuses is
    decoded again by base64, which accepts it or names the problem as it always did. A
    string that is not ASCII raises ``UnicodeEncodeError``."""
    if _fast_b64decode is not None:
        try:
            return _fast_b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            pass
    if isinstance(data, str):
        data = data.encode("ascii")
    return base64.b64decode(data, validate=True)


_PACKER = msgpack.Packer(use_bin_type=True, autoreset=True)


def _specs_for(
    item: Mapping[str, Any], modality: str
) -> dict[str, tuple[str, Literal["flat", "batched"], bool]]:
    """The family layout an item's keys (or vLLM's modality) name: ``image_sizes`` is
    LLaVA-OneVision's, ``"vision_chunk"`` Kimi-K2.5's."""
    if modality == "vision_chunk":
        return VISION_CHUNK_FIELD_SPECS
    return LLAVA_FIELD_SPECS if "image_sizes" in item else FIELD_SPECS


def encode_kwargs_item(item: Mapping[str, Any], *, modality: str = "image") -> str:
    """One image's (or video's) model inputs as a vLLM ``kwargs_data`` entry (base64 text).

    ``item`` maps kwarg names to numpy arrays or torch tensors, as in
    ``MultiModalData.mm_items["image"][i]``: Qwen-VL's ``pixel_values``
    ``(n_patches, dim)`` of any float dtype (bfloat16 included) and ``image_grid_thw``
    ``(1, 3)`` (or ``(3,)``) (``FIELD_SPECS``), or LLaVA-OneVision's ``pixel_values``
    ``(1, tiles, 3, S, S)`` and ``image_sizes`` ``(1, 2)`` (``LLAVA_FIELD_SPECS``; its
    ``batch_num_images`` is transformers-only and not sent), or under ``modality=
    "vision_chunk"`` Kimi-K2.5's ``pixel_values`` ``(patches, 3, 14, 14)`` and
    ``image_grid_thw`` ``(1, 3)``, sent under vLLM's name ``grid_thws``
    (``VISION_CHUNK_FIELD_SPECS``, ``VLLM_KEYS``). The bytes are written exactly as
    vLLM's ``MsgpackEncoder`` writes them (all inline).
    """
    names = VLLM_KEYS.get(modality, {})
    item = {names.get(k, k): v for k, v in item.items() if k not in LOCAL_ONLY}
    if not item:
        raise EncodeError("a kwargs item needs at least one tensor (got an empty mapping)")
    specs = _specs_for(item, modality)
    out = bytearray(_PACKER.pack_map_header(len(item)))
    for key, value in item.items():
        spec = specs.get(key)
        if spec is None:
            raise EncodeError(
                f"unknown multi-modal kwarg {key!r}; known: {', '.join(sorted(specs))}"
            )
        if spec[0] != modality:
            raise EncodeError(f"kwarg {key!r} belongs to modality {spec[0]!r}, not {modality!r}")
        _, factory, keep_on_cpu = spec
        dtype, shape, raw = _raw(key, value)
        if factory == "batched":
            # one element of a batched field is one row: drop the item's batch axis of 1
            if shape and shape[0] == 1:
                shape = shape[1:]
            elif not (key.endswith(("_grid_thw", "grid_thws")) and shape == (3,)):
                raise EncodeError(
                    f"{key} of one item must have a leading axis of 1, got shape {shape}"
                )
            field: list[Any] = ["batched", {"keep_on_cpu": keep_on_cpu}]
        else:
            if not shape:
                raise EncodeError(f"{key} must have at least one dimension, got a scalar")
            field = [
                "flat",
                {"keep_on_cpu": keep_on_cpu, "slices": [[[0, shape[0], None]]], "dim": 0},
            ]
        out += _PACKER.pack(key)
        out += _PACKER.pack_map_header(2)
        out += _PACKER.pack("data")
        out += _PACKER.pack_array_header(3)
        out += _PACKER.pack(dtype)
        out += _PACKER.pack(list(shape))
        out += _ext_header(len(raw))
        out += raw
        out += _PACKER.pack("field")
        out += _PACKER.pack(field)
    return base64.b64encode(out).decode("ascii")


def decode_kwargs_item(
    data: str | bytes, *, tensors: Literal["numpy", "torch"] = "numpy"
) -> dict[str, Any]:
    """Read a ``kwargs_data`` entry back into ``{kwarg: array}``.

    Inverse of ``encode_kwargs_item``, and reads what vLLM's render route writes.
    Arrays are read-only numpy views of the decoded message (``tensors="torch"``:
    torch tensors, for dtypes numpy lacks when ``ml_dtypes`` is not installed).
    Batched fields get their batch axis back (``image_grid_thw``: ``(1, 3)``).
    Anything malformed raises ``vf_mm.errors.DecodeError`` (a ``ValueError``).
    """
    try:
        raw = _b64decode(data)
    except UnicodeEncodeError:
        raise DecodeError("kwargs_data entry is not base64 text (non-ASCII)") from None
    except (binascii.Error, ValueError) as exc:
        raise DecodeError(f"kwargs_data entry is not valid base64: {exc}") from None
    try:
        obj = msgpack.unpackb(raw, raw=False, ext_hook=_ext_hook, strict_map_key=True)
    except DecodeError:
        raise
    except Exception as exc:  # msgpack raises several unrelated types
        raise DecodeError(
            f"kwargs_data entry is not a msgpack-encoded MultiModalKwargsItem: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    if not isinstance(obj, dict) or not obj:
        raise DecodeError(
            f"kwargs_data entry must decode to a non-empty map of kwargs, got {type(obj).__name__}"
        )
    out: dict[str, Any] = {}
    for key, elem in obj.items():
        if not isinstance(elem, dict) or set(elem) != {"data", "field"}:
            raise DecodeError(f"kwarg {key!r}: expected a map with 'data' and 'field'")
        field = elem["field"]
        if (
            not isinstance(field, list)
            or len(field) != 2
            or field[0] not in ("flat", "batched", "shared")
            or not isinstance(field[1], dict)
        ):
            raise DecodeError(f"kwarg {key!r}: bad field spec {field!r}")
        if elem["data"] is None:
            raise DecodeError(f"kwarg {key!r} holds no data (a cache reference)")
        data = elem["data"]
        if _is_number_list(data):  # a plain value, not a tensor (Qwen3-VL's timestamps)
            value = np.asarray(data, dtype=np.float64 if any(isinstance(x, float) for x in data)
                               else np.int64)  # fmt: skip
        else:
            value = _tensor(key, data, tensors)
        if field[0] == "batched":
            value = value.reshape((1, *value.shape))
        out[key] = value
    return out


def sent_digest(b64: str) -> str:
    """A digest of one ``kwargs_data`` string (xxh3-128 of its UTF-8: a few ms for a
    turn's 7 MB, where decoding it takes ~100). The server keys what it decoded by it,
    and a client names by it the item it asks the server to take from its cache."""
    import xxhash

    return xxhash.xxh3_128_hexdigest(b64.encode("utf-8", "surrogatepass"))


def item_fingerprint(item: Mapping[str, Any]) -> str:
    """A digest of one item's tensors as ``encode_kwargs_item`` would send them (each
    kwarg's name, dtype, shape and bytes; xxh3-128): equal for items that encode to
    the same entry, so a client can tell an item it has sent before without encoding
    it again (~0.1 ms a megabyte, where encoding costs several)."""
    import xxhash

    h = xxhash.xxh3_128()
    for key in sorted(k for k in item if k not in LOCAL_ONLY):
        value = item[key]
        h.update(key.encode() + b"\0")
        if isinstance(value, (list, tuple, int, float)):  # a plain value (timestamps)
            h.update(repr(value).encode() + b"\0")
            continue
        dtype, shape, raw = _raw(key, value)
        h.update(f"{dtype}{list(shape)}".encode() + b"\0")
        h.update(raw)
    return h.hexdigest()


def _raw(key: str, value: Any) -> tuple[str, tuple[int, ...], Any]:
    """(torch dtype name, shape, contiguous little-endian bytes as a buffer)."""
    if isinstance(value, np.ndarray):
        try:
            wire = _dtypes.from_numpy(value.dtype)
        except EncodeError as exc:
            raise EncodeError(f"{key}: {exc}") from None
        arr = value
        if arr.dtype.byteorder == ">":
            arr = arr.astype(arr.dtype.newbyteorder("<"))
        arr = np.ascontiguousarray(arr)
        return wire.name, tuple(int(s) for s in value.shape), arr.reshape(-1).view(np.uint8).data
    torch = _dtypes.torch_module() if type(value).__module__.startswith("torch") else None
    if torch is not None and isinstance(value, torch.Tensor):
        if value.is_sparse or value.is_quantized:
            raise EncodeError(f"{key}: sparse or quantized tensors cannot be encoded")
        t = value.detach().cpu().contiguous().reshape(-1)
        shape = tuple(int(s) for s in value.shape)
        dtype = str(value.dtype).removeprefix("torch.")
        if t.numel() == 0:
            return dtype, shape, b""
        return dtype, shape, t.view(torch.uint8).numpy().data
    raise EncodeError(
        f"{key}: expected a numpy array or a torch tensor, got {type(value).__name__}"
    )


def _ext_header(n: int) -> bytes:
    """msgpack ext header for ``n`` bytes of type 3, in the smallest form (as msgspec)."""
    fixext = {1: 0xD4, 2: 0xD5, 4: 0xD6, 8: 0xD7, 16: 0xD8}.get(n)
    if fixext is not None:
        return bytes((fixext, RAW_VIEW_EXT))
    if n < 1 << 8:
        return struct.pack(">BBb", 0xC7, n, RAW_VIEW_EXT)
    if n < 1 << 16:
        return struct.pack(">BHb", 0xC8, n, RAW_VIEW_EXT)
    if n < 1 << 32:
        return struct.pack(">BIb", 0xC9, n, RAW_VIEW_EXT)
    raise EncodeError(f"a tensor of {n} bytes is over msgpack's 4 GiB limit")


class _Raw:
    """The payload of an ext-3 object (a distinct type, so it is never mistaken for bin),
    held as msgpack hands it over: a tensor's bytes are not copied again."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data


def _ext_hook(code: int, data: bytes) -> Any:
    if code != RAW_VIEW_EXT:
        raise DecodeError(f"unsupported msgpack extension type {code} (only raw tensor data, 3)")
    return _Raw(data)


def _is_number_list(data: Any) -> bool:
    """A list of plain numbers, as vLLM's encoder writes a Python list (never a tensor's
    ``[dtype, shape, data]``, whose first entry is a string)."""
    return (
        isinstance(data, list)
        and bool(data)
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in data)
    )


def _tensor(key: str, enc: Any, tensors: str) -> Any:
    if not isinstance(enc, list) or len(enc) != 3:
        raise DecodeError(f"kwarg {key!r}: a tensor must be [dtype, shape, data], got {enc!r:.80}")
    dtype_name, shape, payload = enc
    if not isinstance(dtype_name, str):
        raise DecodeError(f"kwarg {key!r}: dtype must be a string, got {dtype_name!r}")
    if not isinstance(shape, list) or not all(
        isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in shape
    ):
        raise DecodeError(f"kwarg {key!r}: bad shape {shape!r}")
    if isinstance(payload, int) and not isinstance(payload, bool):
        raise DecodeError(
            f"kwarg {key!r}: tensor data refers to out-of-band buffer {payload}; "
            "kwargs_data must hold every tensor inline"
        )
    if not isinstance(payload, _Raw):
        raise DecodeError(f"kwarg {key!r}: tensor data must be ext type 3 bytes")
    payload = payload.data
    try:
        wire = _dtypes.by_name(dtype_name)
    except DecodeError as exc:
        raise DecodeError(f"kwarg {key!r}: {exc}") from None
    count = 1
    for s in shape:
        count *= s
    if count * wire.itemsize != len(payload):
        raise DecodeError(
            f"kwarg {key!r}: {len(payload)} bytes do not hold a {dtype_name} tensor of "
            f"shape {tuple(shape)} ({count * wire.itemsize} bytes)"
        )
    carrier = np.frombuffer(payload, dtype=wire.carrier) if count else None
    if tensors == "torch":
        torch = _dtypes.torch_module()
        tdtype = _dtypes.torch_dtype(wire)
        if carrier is None:
            return torch.empty(tuple(shape), dtype=tdtype)
        buf = bytearray(payload)
        return torch.frombuffer(buf, dtype=torch.uint8).view(tdtype).reshape(tuple(shape))
    np_dtype = _dtypes.numpy_dtype(wire)
    if carrier is None:
        arr = np.empty(tuple(shape), dtype=np_dtype)
        arr.flags.writeable = False
        return arr
    return carrier.view(np_dtype).reshape(tuple(shape))
