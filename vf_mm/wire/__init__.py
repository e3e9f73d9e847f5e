"""The msgpack tensor codec and framed streams.

``packb(obj)`` turns a tree of dicts, lists, scalars, strings, bytes, tensors,
dataclasses, pydantic models and a few standard types into one msgpack message;
``unpackb(data)`` turns it back, with tensors that view the message's memory
instead of copying it. ``write_stream`` / ``read_stream`` put many messages in one
file, framed so that a writer cut off mid-write is detected, never misread.

The frame API carries those frames anywhere else (a socket, a pipe of one's own):
``stream_header`` / ``parse_stream_header`` build and check the 16-byte stream header,
``frame_header`` builds a message's 16-byte frame head with its ``FrameKind`` (``DATA``,
or a sender's ``END`` marker), ``parse_frame_header`` reads one into a ``FrameHeader``
and ``check_frame`` checks a payload against it (length, crc32, accepted kinds).
``vf_mm.wire.dtypes`` is the table of element types tensors travel as.

The wire format is documented in ``vf_mm/wire/_format.py`` (messages) and
``vf_mm/wire/_frames.py`` (stream headers and frames). Importing this package does not
import torch.

Errors are ``vf_mm.errors.EncodeError``, ``DecodeError`` and ``StreamError`` (with
``TornFrameError``, ``CorruptFrameError``, ``FrameTooLargeError``,
``StreamHeaderError``); a message that needs torch when torch is absent raises
``MissingDependencyError``.
"""

from __future__ import annotations

import threading
from typing import Any

from vf_mm.wire._decode import Decoder, Ext, TensorType
from vf_mm.wire._encode import Encoder, TensorFormat
from vf_mm.wire._frames import (
    DEFAULT_MAX_FRAME_BYTES,
    FRAME_HEADER_SIZE,
    STREAM_HEADER_SIZE,
    FrameHeader,
    FrameKind,
    check_frame,
    frame_header,
    parse_frame_header,
    parse_stream_header,
    stream_header,
)
from vf_mm.wire._stream import (
    StreamReader,
    StreamWriter,
    read_stream,
    repair_stream,
    write_stream,
)

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "FRAME_HEADER_SIZE",
    "STREAM_HEADER_SIZE",
    "Decoder",
    "Encoder",
    "Ext",
    "FrameHeader",
    "FrameKind",
    "StreamReader",
    "StreamWriter",
    "TensorFormat",
    "TensorType",
    "check_frame",
    "frame_header",
    "packb",
    "parse_frame_header",
    "parse_stream_header",
    "read_stream",
    "repair_stream",
    "stream_header",
    "unpackb",
    "write_stream",
]

_local = threading.local()  # an Encoder holds per-call state: one per thread and format
_DECODERS = {t: Decoder(tensors=t) for t in ("auto", "torch", "numpy")}


def packb(obj: Any, *, tensor_format: TensorFormat = "ext") -> bytes | memoryview:
    """Encode ``obj`` as one msgpack message.

    Thread-safe (one encoder per thread); hold your own ``Encoder`` to pass an
    ``enc_hook``, or ``Encoder(reuse_buffer=True)`` in a loop that encodes, sends and drops
    messages (each message then reuses the last one's memory instead of faulting in fresh
    pages).

    Args:
        obj: The object to encode.
        tensor_format: ``"foreign"`` writes tensors as verifiers / prime-rl
            ``{"__torch_tensor__": True, ...}`` maps instead of extension types.

    Returns:
        ``bytes`` when ``obj`` holds no tensor, else a ``memoryview`` of an aligned
            buffer (it saves copying the tensors a second time; ``bytes(...)`` it if you need
            ``bytes``).

    Raises:
        EncodeError: A value the codec cannot put on the wire.
    """
    encoder = getattr(_local, tensor_format, None)
    if encoder is None:
        encoder = Encoder(tensor_format=tensor_format)
        setattr(_local, tensor_format, encoder)
    return encoder.encode(obj)


def unpackb(data: Any, *, tensors: TensorType = "auto") -> Any:
    """Decode one message; see ``Decoder`` for memory sharing.

    Args:
        data: The message's bytes.
        tensors: What tensors come back as (see ``Decoder``).

    Raises:
        DecodeError: Bytes that are not a valid vf_mm message.
    """
    try:
        decoder = _DECODERS[tensors]
    except KeyError:
        raise ValueError(f"tensors must be 'auto', 'torch' or 'numpy', not {tensors!r}") from None
    return decoder.decode(data)
