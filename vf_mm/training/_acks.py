"""The control messages of the trainer hop: hellos, counts and answers, and the id lists
inside them (ZeroMQ), and the end marker's message, which a stream file ends with too.
Pure encoding and decoding, no sockets: the layout is specified in
``docs/formats/transport.md`` and both transport ends use only these functions, so the
two sides cannot drift apart.

A malformed control message decodes to ``None`` (a hello: "not a hello") or raises
``ValueError`` naming what is wrong (a reply), never a half-read value.
"""

from __future__ import annotations

import dataclasses
import struct
from collections.abc import Sequence
from typing import Any

from vf_mm.errors import CorruptFrameError
from vf_mm.training._groups import MAX_GROUP_ID_BYTES
from vf_mm.wire import FRAME_HEADER_SIZE, STREAM_HEADER_SIZE

HEAD_BYTES = STREAM_HEADER_SIZE + FRAME_HEADER_SIZE  # part 0 of a message: 32 bytes
ACK = struct.Struct("<8sQ")  # a count: magic, taken
ACK_MAGIC = b"\x93VFMMack"
# an answer: magic, instance, taken, flags, the request answered; then two id lists
ANSWER = struct.Struct("<8s16sQBI")
ANSWER_MAGIC = b"\x93VFMMak2"
HELLO = struct.Struct("<8sBI")  # magic, flags, its request number; then an id list
HELLO_MAGIC = b"\x93VFMMhlo"
END_TAKEN = 1  # answer flag: your end marker is counted
END_MISSING = 2  # answer flag: it is not; send it again after the missing groups
END_SENT = 1  # hello flag: my end marker has been sent
_COUNT = struct.Struct("<I")
_LENGTH = struct.Struct("<H")


def pack_ids(ids: Sequence[str]) -> bytes:
    """An id list: u32 count, then each id as u16 length | UTF-8 bytes."""
    out = [_COUNT.pack(len(ids))]
    for group_id in ids:
        data = group_id.encode("utf-8")
        out += [_LENGTH.pack(len(data)), data]
    return b"".join(out)


def unpack_ids(data: bytes, offset: int) -> tuple[list[str], int]:
    """The id list at ``offset`` and the offset after it; ``ValueError`` (or
    ``struct.error``) if it is not one."""
    (count,) = _COUNT.unpack_from(data, offset)
    offset += _COUNT.size
    ids = []
    for _ in range(count):
        (length,) = _LENGTH.unpack_from(data, offset)
        offset += _LENGTH.size
        if not 0 < length <= MAX_GROUP_ID_BYTES or offset + length > len(data):
            raise ValueError(f"a group id of {length} bytes at offset {offset}")
        ids.append(data[offset : offset + length].decode("utf-8"))
        offset += length
    return ids, offset


@dataclasses.dataclass(frozen=True, slots=True)
class Hello:
    """A sender's hello: its flags (``END_SENT``), its request number, the ids it holds."""

    flags: int
    request: int
    held: list[str]


def pack_hello(hello: Hello) -> bytes:
    return HELLO.pack(HELLO_MAGIC, hello.flags, hello.request) + pack_ids(hello.held)


def unpack_hello(data: bytes) -> Hello | None:
    """The hello ``data`` holds, or ``None`` when it is not exactly one."""
    if len(data) < HELLO.size or not data.startswith(HELLO_MAGIC):
        return None
    try:
        _, flags, request = HELLO.unpack_from(data)
        held, offset = unpack_ids(data, HELLO.size)
    except (ValueError, struct.error):
        return None
    return Hello(flags, request, held) if offset == len(data) else None


@dataclasses.dataclass(frozen=True, slots=True)
class Reply:
    """What a receiver tells a sender: ``taken`` messages without an id; and, in an
    answer (``instance`` set), the flags, the request answered and the ids committed and
    missing. A count (``instance`` None) carries only ``taken``."""

    taken: int
    instance: bytes | None = None
    flags: int = 0
    request: int = 0
    committed: list[str] = dataclasses.field(default_factory=list)
    missing: list[str] = dataclasses.field(default_factory=list)


def pack_count(taken: int) -> bytes:
    return ACK.pack(ACK_MAGIC, taken)


def pack_answer(reply: Reply) -> bytes:
    assert reply.instance is not None, "an answer names the receiver's instance"
    head = ANSWER.pack(ANSWER_MAGIC, reply.instance, reply.taken, reply.flags, reply.request)
    return head + pack_ids(reply.committed) + pack_ids(reply.missing)


def unpack_reply(data: bytes) -> Reply:
    """A count or an answer; ``ValueError`` saying what else ``data`` is."""
    if len(data) == ACK.size and data.startswith(ACK_MAGIC):
        return Reply(ACK.unpack(data)[1])
    if len(data) >= ANSWER.size and data.startswith(ANSWER_MAGIC):
        try:
            _, instance, taken, flags, request = ANSWER.unpack_from(data)
            committed, offset = unpack_ids(data, ANSWER.size)
            missing, offset = unpack_ids(data, offset)
        except struct.error as exc:
            raise ValueError(f"a malformed acknowledgement: {exc}") from None
        except ValueError as exc:
            raise ValueError(f"a malformed acknowledgement: {exc}") from None
        if offset != len(data):
            raise ValueError(
                f"a malformed acknowledgement: {len(data) - offset} bytes after the id lists"
            )
        return Reply(taken, instance, flags, request, committed, missing)
    raise ValueError(f"{bytes(data[:32])!r}: not a vf_mm receiver's acknowledgement")


def end_marker(sent: int, error: str | None) -> dict[str, Any]:
    """A sender's end marker: the groups it ``sent``, and ``error``, why it stopped early
    (None: it finished). ZeroMQ senders add ``held`` and ``request``."""
    return {"sent": sent, "error": error}


def end_info(info: Any, index: int) -> dict[str, Any]:
    """A decoded end marker, checked: a dict with an int ``sent`` and a str or None
    ``error``; else ``CorruptFrameError`` naming message ``index``."""
    if (
        not isinstance(info, dict)
        or not isinstance(info.get("sent"), int)
        or not isinstance(info.get("error"), (str, type(None)))
    ):
        raise CorruptFrameError(
            f"message {index} is an end marker without a 'sent' count and an 'error': "
            f"{info!r:.200}",
            offset=-1,
            index=index,
        )
    return info
