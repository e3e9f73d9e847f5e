"""Constants of the wire format, shared by the encoder and the decoder.

A message is one msgpack object. Values msgpack has no type for travel as msgpack
extension types with these codes:

=====  ==========  ==============================================================
code   value       payload
=====  ==========  ==============================================================
1      tensor      u8 layout version (1), u8 flags (bit 0: a torch tensor, else a
                   numpy array), u8 dtype code (``dtypes``), u8 ndim (<= 64),
                   u8 pad (< 64), ndim x u64 shape (little-endian), pad zero bytes,
                   then the elements: little-endian, C order, exactly
                   prod(shape) * itemsize bytes
2      datetime    ISO 8601 text (``datetime.isoformat()``), naive or aware
3      date        ISO 8601 text
4      time        ISO 8601 text
5      UUID        the 16 bytes
=====  ==========  ==============================================================

The encoder picks ``pad`` so that a tensor's elements start at a multiple of
``ALIGN`` bytes from the start of the message. A decoder can then view them in
place, whatever their dtype, as long as the message itself sits at an aligned
address (``packb`` output and stream frames always do).
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
