"""Constants of the wire format, shared by the encoder and the decoder: the extension
codes msgpack carries vf_mm's other values in (tensors, datetimes, UUIDs), the tensor
header and the alignment that lets a decoder view tensor elements in place. The format
is specified in ``docs/formats/wire.md`` ("Messages").
"""

from __future__ import annotations

import struct

EXT_TENSOR = 1
EXT_DATETIME = 2
EXT_DATE = 3
EXT_TIME = 4
EXT_UUID = 5

TENSOR_LAYOUT_VERSION = 1
FLAG_TORCH = 0x01
MAX_NDIM = 64
ALIGN = 64

# u8 version, u8 flags, u8 dtype, u8 ndim, u8 pad
TENSOR_HEAD = struct.Struct("<BBBBB")

# Key of the tensor maps verifiers and prime-rl put on the wire:
# {"__torch_tensor__": True, "dtype": str, "shape": [int], "data": bytes}
FOREIGN_TENSOR_KEY = "__torch_tensor__"
