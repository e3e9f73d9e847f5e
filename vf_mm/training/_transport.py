"""The trainer hop: scored groups of rollouts from rollout workers to a trainer.

``GroupSender(target)`` sends one message per group; ``GroupReceiver(source)`` (or
``read_groups(source)``) yields them decoded. ``target`` / ``source`` is either

- a **stream file** path: one ``vf_mm.wire`` stream frame per group, written with
  ``StreamWriter`` and read with ``StreamReader`` (so a torn tail raises
  ``TornFrameError`` after the whole groups before it). The file holds nothing but the
  groups: ``vf_mm.wire.read_stream`` reads it too. A file has no end marker: its end is
  the end of the groups.
- a **ZeroMQ endpoint**, ``tcp://HOST:PORT`` or ``ipc://PATH``: a DEALER socket on the
  sender, a ROUTER socket on the receiver. By default **the trainer binds** and every
  rollout worker **connects**, so any number of workers feed one trainer (ZeroMQ takes
  from them fairly) and workers may come and go. ``GroupSender(..., bind=True)`` with
  ``GroupReceiver(..., bind=False)`` turns it round (one worker, one trainer that
  connects to it). A receiver that binds may ask for ``tcp://127.0.0.1:*`` and read the
  port it got from ``receiver.endpoint``.

ZeroMQ messages, sender to receiver, are each one ``vf_mm.wire`` frame, in the frame
format of ``vf_mm/wire/_frames.py``, in two parts::

    part 0, 32 bytes:  a stream header (``stream_header``) | the frame head of part 1
                       (``frame_header``)
    part 1, n bytes:   the frame's payload, sent zero-copy

Every message thus carries its own stream header (and with it whether it is
checksummed), and the receiver checks it with the frame API as a stream file's reader
does (``parse_stream_header``, ``parse_frame_header``, ``check_frame``), so a corrupt or
truncated message is caught, never misread. The receiver accepts two frame kinds:

- ``FrameKind.DATA``: a group, the payload ``vf_mm.wire.packb`` of it. Part 0 + part 1
  are then byte for byte a one-frame stream file.
- ``FrameKind.END``: the **end-of-stream marker** a sender sends on ``close()``, the
  payload ``packb({"sent": N, "error": None | str})`` (``error`` says why the sender
  stopped early, e.g. the exception that ended its ``with`` block); a payload without
  a ``sent`` count is refused as corrupt. A receiver ends its iteration cleanly after
  ``senders`` end markers (one per sender, default 1); ``receiver.ends`` holds them.

Receiver to sender, one part of 16 bytes: ``b"\\x93VFMMack"`` | u64 how many of this
sender's messages the receiver has *taken* (handed to the trainer, skipped as bad, or
read as its end marker). Counts are absolute, so a lost or repeated one is harmless.

**Back-pressure** is a credit window: a sender may have at most ``hwm`` groups that the
trainer has not taken yet; the next ``send`` **blocks** until the trainer takes one
(``timeout_s``: give up with ``BackPressureTimeout``). Memory stays bounded on both
sides: at most ``hwm`` groups per sender wait in the trainer's process. ``asend`` does
the wait, the encoding and the send on the sender's own thread, so the event loop runs
on while it waits. ``close()`` sends the end marker and waits up to ``linger_s`` until
the trainer has taken everything, the end marker included (``sender.delivered``):
closing a socket with messages still queued at a busy receiver loses them in ZeroMQ,
so a sender never does that while the trainer is there to take them.

A message that fails its checks or does not decode fails that group only: with
``errors="raise"`` (the default) ``next(receiver)`` raises a ``StreamError`` (or
``DecodeError``) naming the reason and the message's index, and the receiver stays
usable: call ``next`` again to go on. ``errors="skip"`` records ``(index, -1, error)``
in ``receiver.skipped`` (the triples ``StreamReader`` records, with no byte offset on a
socket) and goes on. Received tensors are writable views of the ZeroMQ message (no
copy), aligned to 8 bytes (the decoder copies any element type that needs more).

A receiver that dies (or restarts) mid-run takes the groups it held with it; its
senders then wait for credit that does not come: give them a ``timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
import threading
import time
from collections.abc import Iterator
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
ACK = struct.Struct("<8sQ")
ACK_MAGIC = b"\x93VFMMack"


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


class GroupSender:
    """Sends groups to a stream file or a ZeroMQ endpoint (see the module docstring).

    ``send(group)`` encodes with ``vf_mm.wire.packb`` and sends; ``send_message(buf)``
    sends an already encoded message (do not modify ``buf`` afterwards: ZeroMQ sends it
    without copying). Both return the message's size and block while ``hwm`` groups
    are waiting at the trainer; ``timeout_s`` bounds the wait (``BackPressureTimeout``).
    ``asend`` / ``aclose`` are the same for an event loop. ``close()`` (or the end of a
    ``with`` block) sends the end-of-stream marker and waits up to ``linger_s``
    (``None``: as long as it takes) for the trainer to take everything; ``delivered``
    says whether it did.

    ``bind=True`` binds the socket instead of connecting it. ``checksum``,
    ``max_frame_bytes`` and ``append`` (files only) are as for ``StreamWriter``; a message
    over ``max_frame_bytes`` is refused here with ``FrameTooLargeError``. Thread-safe:
    sends from several threads go out one at a time. ``sent`` counts groups sent,
    ``acked`` the messages the trainer has taken.
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
    ) -> None:
        if hwm < 1:
            raise ValueError(f"hwm must be >= 1, got {hwm}")
        self.target = target
        self.hwm = hwm
        self.linger_s = linger_s
        self.timeout_s = timeout_s
        self.checksum = checksum
        self.max_frame_bytes = max_frame_bytes
        self.sent = 0
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
        if not is_endpoint(target):
            self._writer = StreamWriter(
                _file_path(target),
                append=append,
                checksum=checksum,
                max_frame_bytes=max_frame_bytes,
            )
            return
        zmq = _zmq()
        self._context = zmq.Context(io_threads=1)
        self._socket = self._context.socket(zmq.DEALER)
        try:
            # a fixed id: the receiver keeps counting this sender's messages across reconnects
            self._socket.setsockopt(zmq.ROUTING_ID, b"vfmm-" + os.urandom(12))
            self._socket.setsockopt(zmq.SNDHWM, hwm + 2)  # the credit window bounds it first
            self._socket.setsockopt(zmq.LINGER, 0)
            self._socket.setsockopt(zmq.SNDTIMEO, _millis(timeout_s))
            if bind:
                self._socket.bind(target)
                self.endpoint = self._socket.getsockopt(zmq.LAST_ENDPOINT).decode()
            else:
                self._socket.connect(target)
                self.endpoint = target
        except zmq.ZMQError as exc:
            self._socket.close(linger=0)
            self._context.term()
            raise TransportError(
                f"cannot {'bind' if bind else 'connect'} to {target}: {exc}"
            ) from None

    # -- sending ----------------------------------------------------------------------

    def send(self, group: Any) -> int:
        """Encode ``group`` and send it; returns the message's size in bytes. Waits for
        room in the window before encoding, so a blocked sender holds no encoded copy."""
        if self._writer is None:
            with self._lock:
                self._check_open()
                self._wait_for_credit()
        return self.send_message(packb(group))

    def send_message(self, message: Any) -> int:
        """Send an encoded message as one group; returns its size in bytes."""
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
                self._writer.write_message(view)
            else:
                self._wait_for_credit()
                self._send_parts(view, FrameKind.DATA)
            self.sent += 1
            self.bytes_sent += n
        return n

    @property
    def pending(self) -> int:
        """Groups sent that the trainer has not taken yet (0 for a file)."""
        if self._writer is not None:
            return 0
        with self._lock:
            if not self.closed:
                self._read_acks(0)
            return max(0, self.sent - self.acked)

    def _check_open(self) -> None:
        if self.closed:
            raise TransportError(f"send on a closed GroupSender ({self.target})")

    def _wait_for_credit(self) -> None:
        """Block until fewer than ``hwm`` groups wait at the trainer (or ``timeout_s``)."""
        self._read_acks(0)
        if self.sent - self.acked < self.hwm:
            return
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        while self.sent - self.acked >= self.hwm:
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
        """Take every ack waiting (after up to ``wait_s`` for the first one)."""
        zmq = _zmq()
        timeout = None if wait_s is None else max(0, round(wait_s * 1000))
        try:
            if not self._socket.poll(timeout, zmq.POLLIN):
                return
            while True:
                try:
                    reply = self._socket.recv(zmq.NOBLOCK)
                except zmq.Again:
                    return
                if len(reply) != ACK.size or not reply.startswith(ACK_MAGIC):
                    raise TransportError(
                        f"{self.endpoint} answered {bytes(reply[:32])!r}: not a vf_mm "
                        "receiver's acknowledgement"
                    )
                self.acked = max(self.acked, ACK.unpack(reply)[1])
        except zmq.ZMQError as exc:
            raise TransportError(f"reading acknowledgements from {self.endpoint}: {exc}") from None

    def _send_parts(self, view: memoryview, kind: FrameKind) -> None:
        zmq = _zmq()
        try:
            # part 0 is small (ZeroMQ copies it anyway); part 1 goes out without a copy
            self._socket.send_multipart([_head(view, kind, self.checksum), view], copy=False)
        except zmq.Again:
            raise BackPressureTimeout(
                f"{self.endpoint}: ZeroMQ could not queue a message in {self.timeout_s} s",
                sent=self.sent,
            ) from None
        except zmq.ZMQError as exc:
            raise TransportError(f"sending to {self.endpoint} failed: {exc}") from None

    async def asend(self, group: Any) -> int:
        """``send`` from an event loop: waits, encodes and sends on the sender's own thread
        (one for all its ``asend`` calls, so groups go out in call order). Do not modify
        ``group`` until it returns."""
        loop = asyncio.get_running_loop()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="vf-mm-send")
        return await loop.run_in_executor(self._executor, self.send, group)

    # -- closing ----------------------------------------------------------------------

    def close(self, error: str | None = None) -> None:
        """Finish pending ``asend`` calls, send the end-of-stream marker (ZeroMQ; ``error``
        goes in it), wait up to ``linger_s`` for the trainer to take everything, close."""
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
                marker = _as_bytes_view(packb({"sent": self.sent, "error": error}))
                self._socket.setsockopt(_zmq().SNDTIMEO, _millis(self.linger_s))
                self._send_parts(marker, FrameKind.END)
                deadline = None if self.linger_s is None else time.monotonic() + self.linger_s
                while self.acked < self.sent + 1:
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        break
                    self._read_acks(left)
                self.delivered = self.acked >= self.sent + 1
            except TransportError:  # the trainer is gone or stalled: nothing more to do
                pass
            finally:
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


class GroupReceiver:
    """Iterates over the groups from a stream file or a ZeroMQ endpoint, decoded.

    Files: as ``StreamReader`` (``tensors``, ``max_frame_bytes``, ``errors``, ``raw``).
    ZeroMQ: binds to ``source`` (``bind=False`` connects instead); iteration ends after
    ``senders`` end-of-stream markers (``None``: never; stop with ``timeout_s`` or
    ``close``). ``timeout_s`` bounds each wait for a message (``ReceiveTimeout``). A peer
    that sends a part over ``max_frame_bytes`` is disconnected by ZeroMQ before it is
    read. Each group taken (returned, or skipped as bad) frees a place in its sender's
    window: the trainer's pace is the senders' pace.

    ``index`` counts messages received (end markers and bad ones included), ``received``
    the groups returned; ``ends`` holds each end marker's ``{"sent", "error"}``;
    ``skipped`` the ``(index, offset, error)`` of each message skipped with
    ``errors="skip"``. ``raw=True`` yields each group's message undecoded (a
    ``memoryview``, e.g. to append it to a stream file with ``write_message``).
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
    ) -> None:
        if errors not in ("raise", "skip"):
            raise ValueError(f"errors must be 'raise' or 'skip', not {errors!r}")
        if senders is not None and senders < 1:
            raise ValueError(f"senders must be >= 1 or None, got {senders}")
        self.source = source
        self.senders = senders
        self.timeout_s = timeout_s
        self.errors = errors
        self.raw = raw
        self.max_frame_bytes = max_frame_bytes
        self.index = 0
        self.received = 0
        self.ends: list[dict[str, Any]] = []
        self._taken: dict[bytes, int] = {}  # per sender: messages taken (what acks say)
        self._skipped: list[tuple[int, int, Exception]] = []
        self._decoder = Decoder(tensors=tensors)
        self._reader: StreamReader | None = None
        self._socket: Any = None
        self._context: Any = None
        self.endpoint: str | None = None
        if not is_endpoint(source):
            self._reader = StreamReader(
                _file_path(source),
                tensors=tensors,
                max_frame_bytes=max_frame_bytes,
                errors=errors,
                raw=raw,
            )
            return
        zmq = _zmq()
        self._context = zmq.Context(io_threads=1)
        self._socket = self._context.socket(zmq.ROUTER)
        try:
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
        except zmq.ZMQError as exc:
            self._socket.close(linger=0)
            self._context.term()
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

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        if self._reader is not None:
            item = next(self._reader)
            self.index = self._reader.index
            self.received += 1
            return item
        while not self.ended:
            peer, parts = self._receive()
            index = self.index
            self.index += 1
            try:
                kind, payload = self._check(parts, index)
                if kind == FrameKind.END:
                    self.ends.append(self._end_info(payload, index))
                    continue
                item = payload if self.raw else self._decoder.decode(payload)
            except WireError as exc:
                exc.add_note(f"in message {index} received on {self.endpoint}")
                if self.errors == "raise":
                    raise
                self._skipped.append((index, -1, exc))
                continue
            finally:
                self._ack(peer)
            self.received += 1
            return item
        raise StopIteration

    def _receive(self) -> tuple[bytes, list[Any]]:
        zmq = _zmq()
        if self._socket is None:
            raise TransportError(f"receive on a closed GroupReceiver ({self.source})")
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

    def _ack(self, peer: bytes) -> None:
        """Tell ``peer`` how many of its messages have been taken (frees its window)."""
        zmq = _zmq()
        taken = self._taken.get(peer, 0) + 1
        self._taken[peer] = taken
        with contextlib.suppress(zmq.ZMQError):  # the peer is gone: nothing waits for it
            self._socket.send_multipart([peer, ACK.pack(ACK_MAGIC, taken)], zmq.NOBLOCK)

    def _check(self, parts: list[Any], index: int) -> tuple[FrameKind, memoryview]:
        """(kind, payload) of a well-formed message, else the error that says what is wrong."""
        if len(parts) != 2:
            raise CorruptFrameError(
                f"message {index} has {len(parts)} parts; a vf_mm transport message has 2 "
                f"(a {HEAD_BYTES}-byte head and the payload)",
                offset=-1,
                index=index,
            )
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
        if self._reader is not None:
            self._reader.close()
        elif self._socket is not None:
            self._socket.close(linger=0)
            self._context.term()
            self._socket = None

    def __enter__(self) -> GroupReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_groups(source: Any, **kwargs: Any) -> Iterator[Any]:
    """Yield each group from a stream file or a ZeroMQ endpoint (``GroupReceiver``'s
    keywords), closing the source at the end. An error ends the iteration (as with
    ``read_stream``); to go on past a bad message, iterate a ``GroupReceiver`` or pass
    ``errors="skip"``."""
    with GroupReceiver(source, **kwargs) as receiver:
        yield from receiver
