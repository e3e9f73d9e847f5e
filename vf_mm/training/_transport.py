"""The trainer hop: scored groups of rollouts from rollout workers to a trainer, each
group with an id trained on exactly once, across restarts of the trainer and the workers.

``GroupSender(target)`` sends one message per group; ``GroupReceiver(source)`` (or
``read_groups(source)``) yields them decoded. ``target`` / ``source`` is either

- a **stream file** path: one ``vf_mm.wire`` stream frame per group, written with
  ``StreamWriter`` and read with ``StreamReader`` (so a torn tail raises
  ``TornFrameError`` after the whole groups before it). The file holds nothing but the
  groups: ``vf_mm.wire.read_stream`` reads it too. A file has no end marker: its end is
  the end of the groups. A group's id is its frame's ``group_id`` field.
- a **ZeroMQ endpoint**, ``tcp://HOST:PORT`` or ``ipc://PATH``: a DEALER socket on the
  sender, a ROUTER socket on the receiver. By default **the trainer binds** and every
  rollout worker **connects**, so any number of workers feed one trainer (ZeroMQ takes
  from them fairly) and workers may come and go. ``GroupSender(..., bind=True)`` with
  ``GroupReceiver(..., bind=False)`` turns it round (one worker, one trainer that
  connects to it). A receiver that binds may ask for ``tcp://127.0.0.1:*`` and read the
  port it got from ``receiver.endpoint``.

ZeroMQ messages, sender to receiver: each group or end marker is one ``vf_mm.wire``
frame, in the frame format of ``vf_mm/wire/_frames.py``, in two parts, or three for a
group with an id::

    part 0, 32 bytes:  a stream header (``stream_header``) | the frame head of part 1
                       (``frame_header``)
    part 1, n bytes:   the frame's payload, sent zero-copy
    part 2, 1 to 1024 bytes, a group with an id only: the group id, UTF-8

Every message thus carries its own stream header (and with it whether it is
checksummed), and the receiver checks it with the frame API as a stream file's reader
does (``parse_stream_header``, ``parse_frame_header``, ``check_frame``), so a corrupt or
truncated message is caught, never misread. The receiver accepts two frame kinds:

- ``FrameKind.DATA``: a group, the payload ``vf_mm.wire.packb`` of it. Part 0 + part 1
  are then byte for byte a one-frame stream file.
- ``FrameKind.END``: the **end-of-stream marker** a sender sends on ``close()``, the
  payload ``packb({"sent": N, "error": None | str})`` (``error`` says why the sender
  stopped early, e.g. the exception that ended its ``with`` block), plus, from a sender
  that has sent groups with ids, ``"held": [id, ...]`` (those it has not seen
  acknowledged yet) and ``"request": n`` (numbered as a hello is). A payload without a
  ``sent`` count is refused as corrupt. A receiver ends its iteration cleanly after end
  markers from ``senders`` senders (default 1; a sender's repeated marker counts once);
  ``receiver.ends`` holds them (``sent`` and ``error``).

and one control message, a **hello**, one part::

    b"\\x93VFMMhlo" | u8 flags (1: my end marker has been sent) | u32 request (this
    sender's hellos and end markers are numbered 1, 2, ...) | an id list: the group ids
    I hold (sent, not acknowledged), in the order I sent them

An **id list** is a u32 count, then for each id a u16 length and its UTF-8 bytes.

Receiver to sender, one part, in one of two forms::

    a count, 16 bytes:    b"\\x93VFMMack" | u64 taken
    an answer, 37 bytes + two id lists:
                          b"\\x93VFMMak2" | 16 bytes: the receiver's instance (random, new
                          each time a receiver is made) | u64 taken | u8 flags
                          | u32 request (the hello's or end marker's it answers; 0: none)
                          | an id list: ids committed | an id list: ids missing

``taken`` is how many of this sender's messages without an id (groups, its end marker,
bad messages) the receiver has *taken* (handed to the trainer, skipped as bad, or read as
an end marker). Counts are absolute within one receiver, so a lost or repeated one is
harmless. ``ids committed``: groups of this sender's that the trainer has committed, that
are duplicates of committed ones, or that it took as bad: forget them. ``ids missing``: ids a hello or an end marker
named that this receiver has neither committed nor handed out: send them again. Flags:
1, the sender's end marker has been counted; 2, it has not (it named missing ids, or a
hello said it was sent and it never came): send it again, after the missing groups. A
sender does not send a group (or its end marker) again for an answer to a request it
made before it last sent that group again: that answer could not have seen it. A
receiver answers in the first form until the sender has sent an id or a hello (senders
written before group ids read only that form), in the second after.

**Exactly once.** A group with an id (``send(group)`` takes ``group["group_id"]``, which
``pack_group(..., group_id=...)`` and ``stream_rollouts`` set; or pass ``group_id=``) is
*held* by its sender, encoded, until the receiver acknowledges that id, and the receiver
does that only once the trainer has **committed** the group, i.e. is done with it: by
default when the trainer asks for the next group (``next(receiver)``, the next turn of a
``for`` loop), and at ``receiver.commit()`` (with ``autocommit=False``, only then).
Committing records the ids in the receiver's ledger first (``ledger=PATH``: an
append-only, fsync'd file; ``vf_mm/training/_ledger.py``), so an id a sender has
forgotten is always on record. The receiver **deduplicates**: a group whose id it has
committed, or has handed out and not committed yet, is skipped (``receiver.duplicates``
counts it) and acknowledged (at once, or when the one handed out is committed), never
handed to the trainer again. With a ledger that holds across the trainer's restarts;
without one, for the receiver's lifetime and its newest ``dedup_window`` committed ids.
A group without an id is acknowledged when taken, and is delivered at most once.

- **The trainer restarts** (a new receiver on the same endpoint, the same ledger): each
  sender's connection is made again, and a sender whose connection is made a second
  time says hello with the ids it holds. The new receiver answers which it has
  committed (the sender forgets them) and which it has never seen (the sender sends them
  again, in the order it first sent them). Messages still queued in the sender when the
  trainer died reach the new one before the hello, so only what the dead receiver had
  taken in is sent again. The groups without ids it had taken in are lost: the answer's
  new instance tells the sender to stop waiting for them.
- **A worker restarts** (a new sender that sends its groups again from the start, with
  the same ids): the receiver skips every one it has committed or holds.
- An end marker names the ids its sender still holds; a receiver that has lost some of
  them (it restarted) does not count the marker until the sender has sent them again,
  so ``senders=N`` never ends the iteration before every group it will get is in.

**Back-pressure** is a credit window: a sender may have at most ``hwm`` groups not yet
acknowledged (with an id: not committed; without: not taken); the next ``send``
**blocks** until one is (``timeout_s``: give up with ``BackPressureTimeout``). Memory
stays bounded on both sides: a sender holds at most ``hwm`` encoded groups (what it may
have to send again), and at most ``hwm`` groups per sender wait in the trainer's
process. A trainer that takes several groups before it commits them (``autocommit=False``)
needs ``hwm`` times the number of senders to be at least that many (with one sender,
``hwm`` at least the batch), or the senders stall before its batch is full.
``asend`` does the wait, the encoding and the send on the sender's own thread, so the
event loop runs on while it waits. ``close()`` sends the end marker and waits up to
``linger_s`` until the trainer has acknowledged everything, the end marker included
(``sender.delivered``): closing a socket with messages still queued at a busy receiver
loses them in ZeroMQ, so a sender never does that while the trainer is there to take
them.

A message that fails its checks or does not decode fails that group only: with
``errors="raise"`` (the default) ``next(receiver)`` raises a ``StreamError`` (or
``DecodeError``) naming the reason and the message's index, and the receiver stays
usable: call ``next`` again to go on. ``errors="skip"`` records ``(index, -1, error)``
in ``receiver.skipped`` (the triples ``StreamReader`` records, with no byte offset on a
socket) and goes on. A bad group with an id is acknowledged as taken (sending the same
bytes again would fail the same way). Received tensors are writable views of the ZeroMQ
message (no copy), aligned to 8 bytes (the decoder copies any element type that needs
more).

Limits: ``senders=N`` counts the end markers one receiver gets, so a trainer restarted
after some workers finished waits for markers that will not come again: restart it with
``senders=None`` (stop on your own count) or the number still running. A connection
that breaks between the same two live processes (a network fault, not a restart) loses
what was in flight, as ZeroMQ does: groups with ids come back through the hello when it
reconnects; those without are lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from vf_mm.errors import (
    BackPressureTimeout,
    CorruptFrameError,
    FrameTooLargeError,
    MissingDependencyError,
    ReceiveTimeout,
    TransportError,
    WireError,
)
from vf_mm.training._curve import (
    allow_list,
    check_plain_endpoint,
    read_public_key,
    read_secret_key,
    start_authenticator,
)
from vf_mm.training._groups import MAX_GROUP_ID_BYTES, check_group_id
from vf_mm.training._ledger import Ledger
from vf_mm.wire import (
    DEFAULT_MAX_FRAME_BYTES,
    FRAME_HEADER_SIZE,
    STREAM_HEADER_SIZE,
    Decoder,
    FrameKind,
    StreamReader,
    StreamWriter,
    TensorType,
    check_frame,
    frame_header,
    packb,
    parse_frame_header,
    parse_stream_header,
    stream_header,
)

ZMQ_SCHEMES = ("tcp://", "ipc://")
MESSAGE_KINDS = (FrameKind.DATA, FrameKind.END)  # the frame kinds a receiver accepts
HEAD_BYTES = STREAM_HEADER_SIZE + FRAME_HEADER_SIZE  # part 0: 32 bytes
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
DEFAULT_DEDUP_WINDOW = 100_000
_COUNT = struct.Struct("<I")
_LENGTH = struct.Struct("<H")
# the monitor events of a failed CURVE handshake (libzmq's values, so no import of zmq here)
_HANDSHAKE_EVENTS = {
    0x0800: "the handshake failed (no detail: not a CURVE peer, or a wrong trainer key)",
    0x2000: "the handshake failed (protocol: a wrong trainer key, or no CURVE on one side)",
    0x4000: "a worker's key is not in the allow-list",
}
HANDSHAKE_FAILED = 0x0800 | 0x2000 | 0x4000
logger = logging.getLogger(__name__)


def is_endpoint(target: Any) -> bool:
    """Whether ``target`` names a ZeroMQ endpoint (``tcp://`` or ``ipc://``), not a file.

    Any other ``scheme://`` string is refused with ``TransportError`` rather than taken
    for a file name (``file://PATH`` is a file).
    """
    if not isinstance(target, str) or "://" not in target:
        return False
    if target.startswith(ZMQ_SCHEMES):
        return True
    if target.startswith("file://"):
        return False
    raise TransportError(
        f"{target!r}: unsupported transport; use a file path, tcp://HOST:PORT or ipc://PATH"
    )


def _file_path(target: Any) -> Any:
    if isinstance(target, str) and target.startswith("file://"):
        return Path(target.removeprefix("file://"))
    return target


def _zmq() -> Any:
    try:
        import zmq
    except ImportError as exc:
        raise MissingDependencyError(
            "streaming to a ZeroMQ endpoint needs pyzmq: pip install pyzmq"
        ) from exc
    return zmq


def _millis(seconds: float | None) -> int:
    return -1 if seconds is None else max(0, round(seconds * 1000))


def _head(message: memoryview, kind: FrameKind, checksum: bool) -> bytes:
    """Part 0 of a message: a stream header, then the frame head of ``message``."""
    return stream_header(checksum=checksum) + frame_header(message, kind=kind, checksum=checksum)


def _as_bytes_view(message: Any) -> memoryview:
    view = memoryview(message)
    if not view.c_contiguous:
        raise TypeError("a message must be a contiguous buffer (bytes, bytearray, memoryview)")
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    return view


def _pack_ids(ids: Sequence[str]) -> bytes:
    """An id list: u32 count, then each id as u16 length | UTF-8 bytes."""
    out = [_COUNT.pack(len(ids))]
    for group_id in ids:
        data = group_id.encode("utf-8")
        out += [_LENGTH.pack(len(data)), data]
    return b"".join(out)


def _unpack_ids(data: bytes, offset: int) -> tuple[list[str], int]:
    """The id list at ``offset`` and the offset after it; ``ValueError`` if it is not one."""
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


def _group_id_of(group: Any, group_id: str | None) -> str | None:
    """The id a group is sent under: ``group_id``, else the frame's ``group_id`` field."""
    inside = group.get("group_id") if isinstance(group, Mapping) else None
    if group_id is None:
        return check_group_id(inside) if inside is not None else None
    if inside is not None and inside != group_id:
        raise ValueError(f"group_id={group_id!r}, but the group's 'group_id' is {inside!r}")
    return check_group_id(group_id)


class GroupSender:
    """Sends groups to a stream file or a ZeroMQ endpoint (see the module docstring).

    ``send(group)`` encodes with ``vf_mm.wire.packb`` and sends; ``send_message(buf)``
    sends an already encoded message (do not modify ``buf`` afterwards: ZeroMQ sends it
    without copying, and a group with an id is kept to be sent again). A group's id is
    ``group_id=``, else (``send``) the group's ``group_id`` field; with one, the group is
    held until the trainer commits it, sent again if the trainer restarts before that,
    and deduplicated by the trainer. Both return the message's size and block while
    ``hwm`` groups are unacknowledged; ``timeout_s`` bounds the wait
    (``BackPressureTimeout``). ``asend`` / ``aclose`` are the same for an event loop.
    ``close()`` (or the end of a ``with`` block) sends the end-of-stream marker and waits
    up to ``linger_s`` (``None``: as long as it takes) for the trainer to acknowledge
    everything; ``delivered`` says whether it did.

    ``bind=True`` binds the socket instead of connecting it. ``checksum``,
    ``max_frame_bytes`` and ``append`` (files only) are as for ``StreamWriter``; a message
    over ``max_frame_bytes`` is refused here with ``FrameTooLargeError``. Thread-safe:
    sends from several threads go out one at a time. ``sent`` counts groups sent (once
    each), ``resent`` the groups sent again to a trainer that had lost them, ``acked``
    the messages the trainer has acknowledged (taken, or committed), ``pending`` the
    groups not acknowledged yet.
    """

    def __init__(
        self,
        target: Any,
        *,
        hwm: int = 8,
        linger_s: float | None = 5.0,
        timeout_s: float | None = None,
        bind: bool = False,
        checksum: bool = True,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        append: bool = False,
        secret_key: str | os.PathLike[str] | None = None,
        trainer_key: str | os.PathLike[str] | None = None,
        insecure: bool = False,
    ) -> None:
        if hwm < 1:
            raise ValueError(f"hwm must be >= 1, got {hwm}")
        if (secret_key is None) != (trainer_key is None):
            raise ValueError("CURVE needs both secret_key (this worker's) and trainer_key")
        self.target = target
        self.hwm = hwm
        self.linger_s = linger_s
        self.timeout_s = timeout_s
        self.checksum = checksum
        self.max_frame_bytes = max_frame_bytes
        self.sent = 0
        self.resent = 0
        self.acked = 0
        self.bytes_sent = 0
        self.closed = False
        self.delivered = False
        self.endpoint: str | None = None
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._writer: StreamWriter | None = None
        self._socket: Any = None
        self._context: Any = None
        self._monitor: Any = None
        self._poller: Any = None
        # group id -> its message: sent, not acknowledged yet (at most hwm; in send order)
        self._held: OrderedDict[str, memoryview] = OrderedDict()
        self._plain_sent = 0  # messages without an id (groups, end marker) sent to this receiver
        self._plain_taken = 0  # of those, how many the receiver says it took
        self._instance: bytes | None = None  # the receiver's, from its first answer
        self._tracked = False  # it has sent a group with an id: its end marker names the held
        self._connections = 0  # connections made so far (a second one: say hello)
        self._hello_due = False
        self._end_error: str | None = None
        self._end_sent = False
        self._end_taken = False
        # hellos and end markers are numbered requests; an answer names the one it answers,
        # so a group sent again after a request is not sent a second time for an answer
        # to an earlier one (which could not have seen it)
        self._requests = 0
        self._resent_at: dict[str, int] = {}  # group id -> requests sent before its last resend
        self._end_resent_at = 0
        self._refused: str | None = None  # why the trainer's handshake failed, if it did
        if not is_endpoint(target):
            if secret_key is not None:
                raise ValueError("CURVE keys are for a ZeroMQ endpoint, not a stream file")
            self._writer = StreamWriter(
                _file_path(target),
                append=append,
                checksum=checksum,
                max_frame_bytes=max_frame_bytes,
            )
            return
        zmq = _zmq()
        if secret_key is None:
            check_plain_endpoint(target, insecure=insecure)
            curve = None
        else:
            curve = (*read_secret_key(secret_key), read_public_key(trainer_key))  # type: ignore[arg-type]
        self._context = zmq.Context(io_threads=1)
        self._socket = self._context.socket(zmq.DEALER)
        try:
            if curve is not None:
                self._socket.curve_publickey, self._socket.curve_secretkey = curve[0], curve[1]
                self._socket.curve_serverkey = curve[2]
            # a fixed id: the receiver keeps counting this sender's messages across reconnects
            self._socket.setsockopt(zmq.ROUTING_ID, b"vfmm-" + os.urandom(12))
            # the credit window bounds it first; room for the groups sent again and a hello
            self._socket.setsockopt(zmq.SNDHWM, 2 * hwm + 4)
            self._socket.setsockopt(zmq.LINGER, 0)
            self._socket.setsockopt(zmq.SNDTIMEO, _millis(timeout_s))
            # each connection made (a trainer that restarted is a new one): say hello
            self._monitor = self._socket.get_monitor_socket(
                zmq.EVENT_CONNECTED | zmq.EVENT_ACCEPTED | HANDSHAKE_FAILED
            )
            self._poller = zmq.Poller()
            self._poller.register(self._socket, zmq.POLLIN)
            self._poller.register(self._monitor, zmq.POLLIN)
            if bind:
                self._socket.bind(target)
                self.endpoint = self._socket.getsockopt(zmq.LAST_ENDPOINT).decode()
            else:
                self._socket.connect(target)
                self.endpoint = target
        except zmq.ZMQError as exc:
            self._close_sockets()
            raise TransportError(
                f"cannot {'bind' if bind else 'connect'} to {target}: {exc}"
            ) from None

    # -- sending ----------------------------------------------------------------------

    def send(self, group: Any, *, group_id: str | None = None) -> int:
        """Encode ``group`` and send it; returns the message's size in bytes. Waits for
        room in the window before encoding, so a blocked sender holds no encoded copy.
        ``group_id`` (default: ``group["group_id"]`` when the group is a mapping that has
        one) makes it a group delivered exactly once (module docstring)."""
        group_id = _group_id_of(group, group_id)
        if self._writer is None:
            with self._lock:
                self._check_open()
                self._wait_for_credit()
        return self.send_message(packb(group), group_id=group_id)

    def send_message(self, message: Any, *, group_id: str | None = None) -> int:
        """Send an encoded message as one group (with ``group_id``: delivered exactly
        once; the message's bytes are not read for it); returns its size in bytes."""
        if group_id is not None:
            group_id = check_group_id(group_id)
        view = _as_bytes_view(message)
        n = view.nbytes
        if n > self.max_frame_bytes:
            raise FrameTooLargeError(
                f"a message of {n} bytes exceeds max_frame_bytes={self.max_frame_bytes}",
                offset=-1,
                length=n,
                limit=self.max_frame_bytes,
            )
        with self._lock:
            self._check_open()
            if self._writer is not None:
                self._writer.write_message(view)  # a file's frame carries its own id
            else:
                self._wait_for_credit()
                self._send_parts(view, FrameKind.DATA, group_id)
                if group_id is None:
                    self._plain_sent += 1
                else:
                    self._tracked = True
                    self._held[group_id] = view
                    self._held.move_to_end(group_id)
            self.sent += 1
            self.bytes_sent += n
        return n

    @property
    def pending(self) -> int:
        """Groups sent that the trainer has not acknowledged yet (0 for a file)."""
        if self._writer is not None:
            return 0
        with self._lock:
            if not self.closed:
                self._read_acks(0)
            return len(self._held) + max(0, self._plain_out() - self._end_out())

    def _plain_out(self) -> int:
        return max(0, self._plain_sent - self._plain_taken)

    def _end_out(self) -> int:
        return 1 if self._end_sent and not self._end_taken else 0

    def _check_open(self) -> None:
        if self.closed:
            raise TransportError(f"send on a closed GroupSender ({self.target})")

    def _wait_for_credit(self) -> None:
        """Block until fewer than ``hwm`` groups are unacknowledged (or ``timeout_s``)."""
        self._read_acks(0)
        if len(self._held) + self._plain_out() < self.hwm:
            return
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        while len(self._held) + self._plain_out() >= self.hwm:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise BackPressureTimeout(
                    f"{self.endpoint}: no room for another group in {self.timeout_s} s: "
                    f"{self.hwm} (hwm) groups wait at the trainer, which is not taking them "
                    f"(or is not there); {self.sent} groups were sent before",
                    sent=self.sent,
                )
            self._read_acks(left)

    def _read_acks(self, wait_s: float | None) -> None:
        """Take every acknowledgement waiting (after up to ``wait_s`` for the first one),
        and say hello if a connection was made again meanwhile."""
        zmq = _zmq()
        timeout = None if wait_s is None else max(0, round(wait_s * 1000))
        try:
            ready = dict(self._poller.poll(timeout))
            if self._monitor in ready:
                self._count_connections()
            if self._refused is not None:  # no group can reach this trainer: say why
                raise TransportError(self._refused)
            if self._hello_due:
                self._say_hello()
            if self._socket not in ready:
                return
            while True:
                try:
                    reply = self._socket.recv(zmq.NOBLOCK)
                except zmq.Again:
                    return
                self._on_reply(reply)
        except zmq.ZMQError as exc:
            raise TransportError(f"reading acknowledgements from {self.endpoint}: {exc}") from None

    def _count_connections(self) -> None:
        from zmq.utils.monitor import parse_monitor_message

        zmq = _zmq()
        while True:
            try:
                event = parse_monitor_message(self._monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                break
            if event["event"] & HANDSHAKE_FAILED:
                self._refused = _handshake_failure(event["event"], self.endpoint)
                continue
            self._connections += 1
            # the first connection is where the groups went; a later one may be a new trainer
            self._hello_due = self._hello_due or self._connections > 1

    def _say_hello(self) -> None:
        """Tell the (maybe new) receiver which ids this sender holds and whether its end
        marker was sent; its answer says what to send again."""
        zmq = _zmq()
        flags = END_SENT if self._end_sent else 0
        request = self._requests + 1
        hello = HELLO.pack(HELLO_MAGIC, flags, request) + _pack_ids(list(self._held))
        try:
            self._socket.send(hello, zmq.NOBLOCK)
        except zmq.Again:  # the queue is full: try again at the next look
            return
        self._requests = request
        self._hello_due = False

    def _on_reply(self, reply: bytes) -> None:
        if len(reply) == ACK.size and reply.startswith(ACK_MAGIC):
            self._take_count(ACK.unpack(reply)[1])
            if self._instance is None and self._end_sent and self._plain_out() == 0:
                self._end_taken = True  # a count: the end marker, sent last, is taken
            return
        if len(reply) >= ANSWER.size and reply.startswith(ANSWER_MAGIC):
            try:
                _, instance, taken, flags, request = ANSWER.unpack_from(reply)
                committed, offset = _unpack_ids(reply, ANSWER.size)
                missing, offset = _unpack_ids(reply, offset)
                if offset != len(reply):
                    raise ValueError(f"{len(reply) - offset} bytes after the id lists")
            except (ValueError, struct.error) as exc:
                raise TransportError(
                    f"{self.endpoint} answered with a malformed acknowledgement: {exc}"
                ) from None
            self._on_answer(instance, taken, flags, request, committed, missing)
            return
        raise TransportError(
            f"{self.endpoint} answered {bytes(reply[:32])!r}: not a vf_mm receiver's "
            "acknowledgement"
        )

    def _take_count(self, taken: int) -> None:
        if taken > self._plain_taken:
            self.acked += taken - self._plain_taken
            self._plain_taken = taken

    def _on_answer(
        self,
        instance: bytes,
        taken: int,
        flags: int,
        request: int,
        committed: list[str],
        missing: list[str],
    ) -> None:
        if instance != self._instance:
            if self._instance is not None:  # a new receiver: what the old one took is gone
                self._plain_sent = self._plain_taken = 0
            self._instance = instance
        self._take_count(taken)
        for group_id in committed:
            if self._held.pop(group_id, None) is not None:
                self._resent_at.pop(group_id, None)
                self.acked += 1
        if flags & END_TAKEN:
            self._end_taken = True
        # what a request sent before our last resend calls missing is on its way already
        wanted = {g for g in missing if self._resent_at.get(g, 0) < request}
        for group_id in [g for g in self._held if g in wanted]:  # in the order first sent
            self._send_parts(self._held[group_id], FrameKind.DATA, group_id)
            self._held.move_to_end(group_id)
            self._resent_at[group_id] = self._requests
            self.resent += 1
        end_lost = flags & END_MISSING and self._end_sent and not self._end_taken
        if end_lost and self._end_resent_at < request:
            self._send_end()
            self._end_resent_at = self._requests

    def _send_parts(self, view: memoryview, kind: FrameKind, group_id: str | None = None) -> None:
        zmq = _zmq()
        # part 0 is small (ZeroMQ copies it anyway); part 1 goes out without a copy
        parts: list[Any] = [_head(view, kind, self.checksum), view]
        if group_id is not None:
            parts.append(group_id.encode("utf-8"))
        try:
            self._socket.send_multipart(parts, copy=False)
        except zmq.Again:
            raise BackPressureTimeout(
                f"{self.endpoint}: ZeroMQ could not queue a message in {self.timeout_s} s",
                sent=self.sent,
            ) from None
        except zmq.ZMQError as exc:
            raise TransportError(f"sending to {self.endpoint} failed: {exc}") from None

    def _send_end(self) -> None:
        """Send the end-of-stream marker (again: with the ids held now)."""
        info: dict[str, Any] = {"sent": self.sent, "error": self._end_error}
        request = self._requests + 1
        if self._tracked:
            info["held"] = list(self._held)
            info["request"] = request
        self._send_parts(_as_bytes_view(packb(info)), FrameKind.END)
        self._requests = request
        self._hello_due = False  # the marker names what this sender holds, as a hello would
        self._plain_sent += 1
        self._end_sent = True

    async def asend(self, group: Any, *, group_id: str | None = None) -> int:
        """``send`` from an event loop: waits, encodes and sends on the sender's own thread
        (one for all its ``asend`` calls, so groups go out in call order). Do not modify
        ``group`` until it returns."""
        loop = asyncio.get_running_loop()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="vf-mm-send")
        call = functools.partial(self.send, group, group_id=group_id)
        return await loop.run_in_executor(self._executor, call)

    # -- closing ----------------------------------------------------------------------

    def close(self, error: str | None = None) -> None:
        """Finish pending ``asend`` calls, send the end-of-stream marker (ZeroMQ; ``error``
        goes in it), wait up to ``linger_s`` for the trainer to acknowledge everything
        (sending again what a restarted trainer lost), close."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        with self._lock:
            if self.closed:
                return
            self.closed = True
            if self._writer is not None:
                self._writer.close()
                self.delivered = True
                return
            try:
                self._socket.setsockopt(_zmq().SNDTIMEO, _millis(self.linger_s))
                self._end_error = error
                self._send_end()
                deadline = None if self.linger_s is None else time.monotonic() + self.linger_s
                while self._held or not self._end_taken:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        break
                    self._read_acks(left)
                self.delivered = not self._held and self._end_taken
            except TransportError:  # the trainer is gone or stalled: nothing more to do
                pass
            finally:
                self._close_sockets()

    def _close_sockets(self) -> None:
        if self._monitor is not None:
            with contextlib.suppress(Exception):
                self._socket.disable_monitor()
            self._monitor.close(linger=0)
        self._socket.close(linger=0)
        self._context.term()

    async def aclose(self, error: str | None = None) -> None:
        """``close`` without blocking the event loop."""
        await asyncio.get_running_loop().run_in_executor(None, self.close, error)

    def __enter__(self) -> GroupSender:
        return self

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.close(None if exc is None else f"{type(exc).__name__}: {exc}")

    async def __aenter__(self) -> GroupSender:
        return self

    async def __aexit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        await self.aclose(None if exc is None else f"{type(exc).__name__}: {exc}")


@dataclasses.dataclass(slots=True)
class _Peer:
    """What a receiver knows of one sender (one routing id) in its lifetime."""

    aware: bool = False  # it sent an id or a hello: it reads answers, not counts
    taken: int = 0  # its messages without an id taken (groups, end marker, bad ones)
    ended: bool = False  # its end marker is counted


class GroupReceiver:
    """Iterates over the groups from a stream file or a ZeroMQ endpoint, decoded, each
    group with an id at most once (see the module docstring).

    Files: as ``StreamReader`` (``tensors``, ``max_frame_bytes``, ``errors``, ``raw``).
    ZeroMQ: binds to ``source`` (``bind=False`` connects instead); iteration ends after
    end-of-stream markers from ``senders`` senders (``None``: never; stop with
    ``timeout_s`` or ``close``). ``timeout_s`` bounds each wait for a message
    (``ReceiveTimeout``). A peer that sends a part over ``max_frame_bytes`` is
    disconnected by ZeroMQ before it is read. Each group acknowledged frees a place in
    its sender's window: the trainer's pace is the senders' pace.

    Groups with ids are **committed** when the trainer is done with them: with
    ``autocommit=True`` (the default) each ``next(receiver)`` first commits the groups
    handed out before, so a ``for`` loop commits a group when it comes back for the next
    one (a loop left by an exception or ``break`` commits nothing: call ``commit()`` for
    a group it did finish). ``commit()`` commits every group handed out and not committed
    yet and returns how many; with ``autocommit=False`` it is the only way (commit after
    the training step that used them). Committed ids go to the ``ledger`` file first
    (append-only, fsync'd, locked: ``LedgerError`` if another receiver holds it; its ids
    are read back when the trainer restarts), then their senders are told. A group whose
    id is committed, or handed out and not committed, is skipped and counted in
    ``duplicates``. Without a ledger the receiver remembers its newest ``dedup_window``
    committed ids (``None``: all of them; about 100 bytes each). ``close()`` commits
    nothing: groups handed out and not committed come again to the next receiver.

    ``index`` counts messages received (end markers and bad ones included), ``received``
    the groups returned; ``group_id`` is the id of the group last returned (None: it has
    none); ``committed`` counts ids committed by this receiver, ``recovered`` the ids its
    ledger held when it opened; ``instance`` (ZeroMQ) is this receiver's id in its
    answers, new each time; ``ends`` holds each sender's end marker's ``{"sent",
    "error"}``; ``skipped`` the ``(index, offset, error)`` of each message skipped with
    ``errors="skip"``. ``raw=True`` yields each group's message undecoded (a
    ``memoryview``, e.g. to append it to a stream file with ``write_message``); a raw
    file receiver does not look inside messages, so it neither deduplicates nor takes a
    ``ledger``.
    """

    def __init__(
        self,
        source: Any,
        *,
        bind: bool = True,
        senders: int | None = 1,
        timeout_s: float | None = None,
        errors: str = "raise",
        tensors: TensorType = "auto",
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        raw: bool = False,
        ledger: str | os.PathLike[str] | None = None,
        autocommit: bool = True,
        dedup_window: int | None = DEFAULT_DEDUP_WINDOW,
        secret_key: str | os.PathLike[str] | None = None,
        allow: str | os.PathLike[str] | None = None,
        insecure: bool = False,
    ) -> None:
        if (secret_key is None) != (allow is None):
            raise ValueError(
                "CURVE needs both secret_key (the trainer's) and allow (a directory of the "
                "workers' public keys)"
            )
        if errors not in ("raise", "skip"):
            raise ValueError(f"errors must be 'raise' or 'skip', not {errors!r}")
        if senders is not None and senders < 1:
            raise ValueError(f"senders must be >= 1 or None, got {senders}")
        endpoint = is_endpoint(source)
        if raw and ledger is not None and not endpoint:
            raise ValueError(
                "a raw file receiver does not decode groups, so it cannot find their ids: "
                "drop raw=True or ledger="
            )
        self.source = source
        self.senders = senders
        self.timeout_s = timeout_s
        self.errors = errors
        self.raw = raw
        self.autocommit = autocommit
        self.max_frame_bytes = max_frame_bytes
        self.index = 0
        self.received = 0
        self.duplicates = 0
        self.committed = 0
        self.group_id: str | None = None
        self.ends: list[dict[str, Any]] = []
        self.instance: str | None = None
        self._peers: dict[bytes, _Peer] = {}  # one per sender seen (routing id)
        # handed out, not committed: group id -> the senders to acknowledge it to
        self._in_use: dict[str, list[bytes]] = {}
        self._skipped: list[tuple[int, int, Exception]] = []
        self._decoder = Decoder(tensors=tensors)
        self._reader: StreamReader | None = None
        self._socket: Any = None
        self._context: Any = None
        self._instance = os.urandom(16)
        self.endpoint: str | None = None
        self.refused = 0  # connections whose CURVE handshake failed (a wrong or unknown key)
        self._monitor: Any = None
        self._poller: Any = None
        self._authenticator: Any = None
        if not endpoint and secret_key is not None:
            raise ValueError("CURVE keys are for a ZeroMQ endpoint, not a stream file")
        if endpoint and secret_key is None:
            check_plain_endpoint(source, insecure=insecure)
        self._ledger = Ledger(ledger, window=dedup_window)
        if not endpoint:
            try:
                self._reader = StreamReader(
                    _file_path(source),
                    tensors=tensors,
                    max_frame_bytes=max_frame_bytes,
                    errors=errors,
                    raw=raw,
                )
            except BaseException:
                self._ledger.close()
                raise
            return
        self.instance = self._instance.hex()
        zmq = _zmq()
        self._context = zmq.Context(io_threads=1)
        self._socket = self._context.socket(zmq.ROUTER)
        try:
            if secret_key is not None:
                public, secret = read_secret_key(secret_key)
                self._authenticator = start_authenticator(self._context, allow_list(allow))  # type: ignore[arg-type]
                self._socket.curve_server = True
                self._socket.curve_publickey, self._socket.curve_secretkey = public, secret
                self._monitor = self._socket.get_monitor_socket(HANDSHAKE_FAILED)
                self._poller = zmq.Poller()
                self._poller.register(self._socket, zmq.POLLIN)
                self._poller.register(self._monitor, zmq.POLLIN)
            self._socket.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a sender that reconnects
            self._socket.setsockopt(zmq.RCVTIMEO, _millis(timeout_s))
            self._socket.setsockopt(zmq.LINGER, 0)
            self._socket.setsockopt(zmq.MAXMSGSIZE, max(max_frame_bytes, HEAD_BYTES))
            if bind:
                self._socket.bind(source)
                self.endpoint = self._socket.getsockopt(zmq.LAST_ENDPOINT).decode()
            else:
                self._socket.connect(source)
                self.endpoint = source
        except (zmq.ZMQError, TransportError) as exc:
            self._close_socket()
            self._ledger.close()
            if isinstance(exc, TransportError):
                raise
            raise TransportError(
                f"cannot {'bind' if bind else 'connect'} to {source}: {exc}"
            ) from None

    @property
    def skipped(self) -> list[tuple[int, int, Exception]]:
        return self._reader.skipped if self._reader is not None else self._skipped

    @property
    def ended(self) -> bool:
        """Whether every expected sender has sent its end marker."""
        return self.senders is not None and len(self.ends) >= self.senders

    @property
    def recovered(self) -> int:
        """How many committed ids the ledger held when this receiver opened it."""
        return self._ledger.recovered

    def __iter__(self) -> Iterator[Any]:
        return self

    # -- committing -------------------------------------------------------------------

    def commit(self) -> int:
        """Commit every group handed out and not committed yet: record their ids (in the
        ledger: durably, before anything else), then acknowledge them to their senders,
        which forget them. Returns how many were committed."""
        if not self._in_use:
            return 0
        ids = list(self._in_use)
        self._ledger.commit(ids)
        by_peer: dict[bytes, list[str]] = {}
        for group_id, peers in self._in_use.items():
            for peer in peers:
                by_peer.setdefault(peer, []).append(group_id)
        self._in_use.clear()
        self.committed += len(ids)
        if self._socket is not None:
            for peer, group_ids in by_peer.items():
                self._answer(peer, committed=group_ids)
        return len(ids)

    def _is_duplicate(self, group_id: str, peer: bytes | None) -> bool:
        """Skip a group committed or handed out already; acknowledge it once it is committed."""
        if group_id in self._ledger:
            self.duplicates += 1
            if peer is not None:
                self._answer(peer, committed=[group_id])
            return True
        waiting = self._in_use.get(group_id)
        if waiting is None:
            return False
        self.duplicates += 1
        if peer is not None and peer not in waiting:
            waiting.append(peer)
        return True

    def _reconcile(self, peer: bytes, ids: list[str]) -> tuple[list[str], list[str]]:
        """(committed, missing) of the ids a sender holds; ids handed out will be
        acknowledged to it when committed."""
        committed, missing = [], []
        for group_id in ids:
            if group_id in self._ledger:
                committed.append(group_id)
            elif group_id in self._in_use:
                if peer not in self._in_use[group_id]:
                    self._in_use[group_id].append(peer)
            else:
                missing.append(group_id)
        return committed, missing

    # -- receiving --------------------------------------------------------------------

    def __next__(self) -> Any:
        if self.autocommit:
            self.commit()
        self.group_id = None
        if self._reader is not None:
            return self._next_from_file()
        while not self.ended:
            peer, parts = self._receive()
            state = self._peers.setdefault(peer, _Peer())
            if self._on_hello(peer, state, parts):
                continue
            index = self.index
            self.index += 1
            group_id = None
            try:
                group_id = self._group_id_part(parts, index)
                if group_id is not None:
                    state.aware = True
                    if self._is_duplicate(group_id, peer):
                        continue
                kind, payload = self._check(parts, index)
                if kind == FrameKind.END:
                    if group_id is not None:
                        raise CorruptFrameError(
                            f"message {index} is an end marker with a group id",
                            offset=-1,
                            index=index,
                        )
                    self._on_end(peer, state, payload, index)
                    continue
                item = payload if self.raw else self._decoder.decode(payload)
            except WireError as exc:
                exc.add_note(f"in message {index} received on {self.endpoint}")
                self._take(peer, state, group_id)  # taken as bad: sending it again fails again
                if self.errors == "raise":
                    raise
                self._skipped.append((index, -1, exc))
                continue
            if group_id is None:
                self._take(peer, state, None)
            else:
                self._in_use[group_id] = [peer]
            self.group_id = group_id
            self.received += 1
            return item
        raise StopIteration

    def _next_from_file(self) -> Any:
        assert self._reader is not None
        while True:
            item = next(self._reader)
            self.index = self._reader.index
            group_id = None
            if not self.raw and isinstance(item, Mapping):
                found = item.get("group_id")
                group_id = found if isinstance(found, str) else None
            if group_id is not None:
                if self._is_duplicate(group_id, None):
                    continue
                self._in_use[group_id] = []
            self.group_id = group_id
            self.received += 1
            return item

    def _receive(self) -> tuple[bytes, list[Any]]:
        zmq = _zmq()
        if self._socket is None:
            raise TransportError(f"receive on a closed GroupReceiver ({self.source})")
        if self._monitor is not None:
            self._wait_for_message()
        try:
            frames = self._socket.recv_multipart(copy=False)
        except zmq.Again:
            expected = "?" if self.senders is None else self.senders
            raise ReceiveTimeout(
                f"no message on {self.endpoint} for {self.timeout_s} s ({self.received} groups "
                f"and {len(self.ends)} of {expected} end markers received so far)"
            ) from None
        except zmq.ZMQError as exc:
            raise TransportError(f"receiving on {self.endpoint} failed: {exc}") from None
        return frames[0].bytes, frames[1:]

    def _wait_for_message(self) -> None:
        """Wait (up to ``timeout_s``) for a message, counting and reporting each failed
        CURVE handshake meanwhile: a worker with a wrong key is told nothing and delivers
        nothing, so the trainer's log is where an operator learns of it."""
        from zmq.utils.monitor import parse_monitor_message

        zmq = _zmq()
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        while True:
            left = None if deadline is None else max(0, round((deadline - time.monotonic()) * 1000))
            ready = dict(self._poller.poll(left))
            if self._monitor in ready:
                while True:
                    try:
                        event = parse_monitor_message(self._monitor.recv_multipart(zmq.NOBLOCK))
                    except zmq.Again:
                        break
                    self.refused += 1
                    logger.warning(
                        "%s: refused a connection: %s (%d refused so far)",
                        self.endpoint,
                        _HANDSHAKE_EVENTS.get(event["event"], "the CURVE handshake failed"),
                        self.refused,
                    )
            if self._socket in ready or (left == 0 and deadline is not None):
                return  # recv takes it, or times out with the usual ReceiveTimeout

    def _close_socket(self) -> None:
        if self._monitor is not None:
            with contextlib.suppress(Exception):
                self._socket.disable_monitor()
            self._monitor.close(linger=0)
            self._monitor = None
        if self._authenticator is not None:
            self._authenticator.stop()
            self._authenticator = None
        self._socket.close(linger=0)
        self._context.term()
        self._socket = None

    def _on_hello(self, peer: bytes, state: _Peer, parts: list[Any]) -> bool:
        """Answer a hello (True), or say it is none (False; a malformed one included)."""
        if len(parts) != 1:
            return False
        data = parts[0].bytes
        if len(data) < HELLO.size or not data.startswith(HELLO_MAGIC):
            return False
        try:
            _, flags, request = HELLO.unpack_from(data)
            held, offset = _unpack_ids(data, HELLO.size)
            if offset != len(data):
                return False
        except (ValueError, struct.error):
            return False
        state.aware = True
        committed, missing = self._reconcile(peer, held)
        end = END_MISSING if flags & END_SENT and not state.ended else 0
        self._answer(peer, committed=committed, missing=missing, flags=end, request=request)
        return True

    def _on_end(self, peer: bytes, state: _Peer, payload: memoryview, index: int) -> None:
        info = self._end_info(payload, index)
        held = info.pop("held", None)
        request = info.pop("request", 0)
        if held is not None and (
            not isinstance(held, list) or not all(isinstance(h, str) for h in held)
        ):
            raise CorruptFrameError(
                f"message {index} is an end marker whose 'held' is not a list of ids",
                offset=-1,
                index=index,
            )
        if not isinstance(request, int) or not 0 <= request < 1 << 32:
            raise CorruptFrameError(
                f"message {index} is an end marker whose 'request' is not a u32: {request!r}",
                offset=-1,
                index=index,
            )
        self._take(peer, state, None, answer=False)
        committed: list[str] = []
        missing: list[str] = []
        if held is not None:
            state.aware = True
            committed, missing = self._reconcile(peer, held)
        if missing:  # this receiver lost groups the sender still holds: not the end yet
            self._answer(
                peer, committed=committed, missing=missing, flags=END_MISSING, request=request
            )
            return
        if not state.ended:
            state.ended = True
            self.ends.append(info)
        self._answer(peer, committed=committed, request=request)

    def _take(
        self, peer: bytes, state: _Peer, group_id: str | None, *, answer: bool = True
    ) -> None:
        """A message taken: counted (no id) or acknowledged by its id (a bad one)."""
        if group_id is None:
            state.taken += 1
            if answer:
                self._answer(peer)
        elif answer:
            self._answer(peer, committed=[group_id])

    def _answer(
        self,
        peer: bytes,
        *,
        committed: Sequence[str] = (),
        missing: Sequence[str] = (),
        flags: int = 0,
        request: int = 0,
    ) -> None:
        """Tell ``peer`` where it stands: a count for a sender that knows no ids, else an
        answer (frees its window, names what to send again)."""
        zmq = _zmq()
        state = self._peers.setdefault(peer, _Peer())
        if not state.aware:
            reply = ACK.pack(ACK_MAGIC, state.taken)
        else:
            if state.ended:
                flags |= END_TAKEN
            head = ANSWER.pack(ANSWER_MAGIC, self._instance, state.taken, flags, request)
            reply = head + _pack_ids(committed) + _pack_ids(missing)
        with contextlib.suppress(zmq.ZMQError):  # the peer is gone: nothing waits for it
            self._socket.send_multipart([peer, reply], zmq.NOBLOCK)

    def _group_id_part(self, parts: list[Any], index: int) -> str | None:
        """The group id a message carries (part 2), None if it has two parts; else the
        error that says what is wrong."""
        if len(parts) == 2:
            return None
        if len(parts) != 3:
            raise CorruptFrameError(
                f"message {index} has {len(parts)} parts; a vf_mm transport message has 2 "
                f"(a {HEAD_BYTES}-byte head and the payload) or 3 (and a group id)",
                offset=-1,
                index=index,
            )
        data = parts[2].bytes
        try:
            if not 0 < len(data) <= MAX_GROUP_ID_BYTES:
                raise ValueError(f"{len(data)} bytes")
            return data.decode("utf-8")
        except ValueError as exc:
            raise CorruptFrameError(
                f"message {index} has a group id part that is not 1 to {MAX_GROUP_ID_BYTES} "
                f"bytes of UTF-8 ({exc})",
                offset=-1,
                index=index,
            ) from None

    def _check(self, parts: list[Any], index: int) -> tuple[FrameKind, memoryview]:
        """(kind, payload) of a well-formed message, else the error that says what is wrong."""
        head = parts[0].bytes
        if len(head) != HEAD_BYTES:
            raise CorruptFrameError(
                f"message {index} has a {len(head)}-byte head, not {HEAD_BYTES}",
                offset=-1,
                index=index,
            )
        checksum = parse_stream_header(head[:STREAM_HEADER_SIZE])
        header = parse_frame_header(
            head[STREAM_HEADER_SIZE:], max_frame_bytes=self.max_frame_bytes, index=index
        )
        payload = parts[1].buffer
        kind = check_frame(header, payload, checksum=checksum, kinds=MESSAGE_KINDS, index=index)
        return kind, payload

    def _end_info(self, payload: memoryview, index: int) -> dict[str, Any]:
        info = self._decoder.decode(payload)
        if not isinstance(info, dict) or not isinstance(info.get("sent"), int):
            raise CorruptFrameError(
                f"message {index} is an end marker without a 'sent' count: {info!r:.200}",
                offset=-1,
                index=index,
            )
        return info

    def close(self) -> None:
        """Close the source and the ledger. Commits nothing (see the class docstring)."""
        if self._reader is not None:
            self._reader.close()
        elif self._socket is not None:
            self._close_socket()
        self._ledger.close()

    def __enter__(self) -> GroupReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _handshake_failure(event: int, endpoint: str | None) -> str:
    """Why a worker's CURVE handshake with the trainer at ``endpoint`` failed."""
    zmq = _zmq()
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return (
            f"the trainer at {endpoint} refused this worker's CURVE key: its public key is not "
            "in the trainer's allow-list (copy NAME.key into the trainer's allow directory)"
        )
    return (
        f"the CURVE handshake with {endpoint} failed: the trainer there does not hold the "
        "secret key of the trainer_key this worker was given (or uses no keys)"
    )


def read_groups(source: Any, **kwargs: Any) -> Iterator[Any]:
    """Yield each group from a stream file or a ZeroMQ endpoint (``GroupReceiver``'s
    keywords), closing the source at the end. An error ends the iteration (as with
    ``read_stream``); to go on past a bad message, iterate a ``GroupReceiver`` or pass
    ``errors="skip"``."""
    with GroupReceiver(source, **kwargs) as receiver:
        yield from receiver
