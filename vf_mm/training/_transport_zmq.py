"""The ZeroMQ transport of the trainer hop: a DEALER socket on each sender, a ROUTER
socket on the receiver, a credit window for back-pressure, and hellos, end markers and
answers so that every group with an id is trained on exactly once across restarts of
either side. The message layout and the protocol are specified in
``docs/formats/transport.md``; the control messages are encoded by ``_acks``.

``ZmqChannel`` is the sending end, ``ZmqSource`` the receiving one; ``GroupSender`` and
``GroupReceiver`` (``_transport``) hold one of them and do what both transports share.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from vf_mm.errors import (
    BackPressureTimeout,
    CorruptFrameError,
    MissingDependencyError,
    ReceiveTimeout,
    TransportError,
    WireError,
)
from vf_mm.training._acks import (
    END_MISSING,
    END_SENT,
    END_TAKEN,
    HEAD_BYTES,
    Hello,
    Reply,
    end_info,
    end_marker,
    pack_answer,
    pack_count,
    pack_hello,
    unpack_hello,
    unpack_reply,
)
from vf_mm.training._commits import Commits, Seen
from vf_mm.training._curve import (
    allow_list,
    check_plain_endpoint,
    read_public_key,
    read_secret_key,
    start_authenticator,
)
from vf_mm.training._groups import MAX_GROUP_ID_BYTES
from vf_mm.wire import (
    STREAM_HEADER_SIZE,
    Decoder,
    FrameKind,
    TensorType,
    check_frame,
    frame_header,
    packb,
    parse_frame_header,
    parse_stream_header,
    stream_header,
)

MESSAGE_KINDS = (FrameKind.DATA, FrameKind.END)  # the frame kinds a receiver accepts
# the monitor events of a failed CURVE handshake (libzmq's values, so no import of zmq here)
_HANDSHAKE_EVENTS = {
    0x0800: "the handshake failed (no detail: not a CURVE peer, or a wrong trainer key)",
    0x2000: "the handshake failed (protocol: a wrong trainer key, or no CURVE on one side)",
    0x4000: "a worker's key is not in the allow-list",
}
HANDSHAKE_FAILED = 0x0800 | 0x2000 | 0x4000
_HANDSHAKE_SUCCEEDED = 0x1000
_HANDSHAKE_FAILED_AUTH = 0x4000
#: failed handshakes in a row (none succeeding between) that prove a wrong trainer key:
#: zmq reconnects every 100 ms, so a wrong key fails again at once, while a trainer killed
#: in the middle of one handshake fails it once and then answers (or is simply down). The
#: trainer's explicit refusal of this worker's key (AUTH) is final the first time.
_FAILURES_THAT_REFUSE = 3
logger = logging.getLogger(__name__)


def zmq_module() -> Any:
    """pyzmq, or ``MissingDependencyError`` saying how to install it."""
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


def as_bytes_view(message: Any) -> memoryview:
    """``message`` as a flat byte view; ``TypeError`` for a buffer that is not contiguous."""
    view = memoryview(message)
    if not view.c_contiguous:
        raise TypeError("a message must be a contiguous buffer (bytes, bytearray, memoryview)")
    if view.ndim != 1 or view.itemsize != 1:
        view = view.cast("B")
    return view


def handshake_refuses(event: int, in_a_row: int) -> bool:
    """Whether a failed CURVE handshake (monitor ``event``, the ``in_a_row``-th with none
    succeeding between) means this trainer will never take this worker's groups."""
    return event == _HANDSHAKE_FAILED_AUTH or in_a_row >= _FAILURES_THAT_REFUSE


def _handshake_failure(event: int, endpoint: str | None) -> str:
    """Why a worker's CURVE handshake with the trainer at ``endpoint`` failed."""
    zmq = zmq_module()
    if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return (
            f"the trainer at {endpoint} refused this worker's CURVE key: its public key is not "
            "in the trainer's allow-list (copy NAME.key into the trainer's allow directory)"
        )
    return (
        f"the CURVE handshake with {endpoint} failed: the trainer there does not hold the "
        "secret key of the trainer_key this worker was given (or uses no keys)"
    )


class ZmqChannel:
    """The sending end on a ZeroMQ endpoint: a DEALER socket, at most ``hwm`` groups
    unacknowledged, groups with ids held until committed and sent again when a new
    receiver says it lacks them. Not thread-safe on its own: ``GroupSender`` serialises
    calls."""

    def __init__(
        self,
        target: str,
        *,
        hwm: int,
        linger_s: float | None,
        timeout_s: float | None,
        bind: bool,
        checksum: bool,
        secret_key: str | os.PathLike[str] | None,
        trainer_key: str | os.PathLike[str] | None,
        insecure: bool,
    ) -> None:
        self.hwm = hwm
        self.linger_s = linger_s
        self.timeout_s = timeout_s
        self._sndtimeo_s = timeout_s  # what the socket's SNDTIMEO is now
        self._closing = False
        self.checksum = checksum
        self.sent = 0
        self.resent = 0
        self.acked = 0
        self.endpoint: str | None = None
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
        self._refused: str | None = None  # why the trainer's handshakes keep failing
        self._failed_handshakes = 0  # in a row, since the last one that succeeded
        zmq = zmq_module()
        if secret_key is None:
            check_plain_endpoint(target, insecure=insecure)
            curve = None
        else:
            assert trainer_key is not None
            curve = (*read_secret_key(secret_key), read_public_key(trainer_key))
        self._context = zmq.Context(io_threads=1)
        self._socket = self._context.socket(zmq.DEALER)
        self._monitor: Any = None
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
                zmq.EVENT_CONNECTED | zmq.EVENT_ACCEPTED | HANDSHAKE_FAILED | _HANDSHAKE_SUCCEEDED
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

    def wait_for_credit(self) -> None:
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

    def send(self, view: memoryview, group_id: str | None) -> None:
        """Send one group once there is credit; a group with an id is held until the
        receiver commits it."""
        self.wait_for_credit()
        self._send_parts(view, FrameKind.DATA, group_id)
        if group_id is None:
            self._plain_sent += 1
        else:
            self._tracked = True
            self._held[group_id] = view
            self._held.move_to_end(group_id)
        self.sent += 1

    def pending(self) -> int:
        """Groups sent and not acknowledged yet (after reading what has come in)."""
        self._read_acks(0)
        return len(self._held) + max(0, self._plain_out() - self._end_out())

    def _plain_out(self) -> int:
        return max(0, self._plain_sent - self._plain_taken)

    def _end_out(self) -> int:
        return 1 if self._end_sent and not self._end_taken else 0

    def _read_acks(self, wait_s: float | None) -> None:
        """Take every acknowledgement waiting (after up to ``wait_s`` for the first one),
        and say hello if a connection was made again meanwhile."""
        zmq = zmq_module()
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
                    data = self._socket.recv(zmq.NOBLOCK)
                except zmq.Again:
                    return
                try:
                    reply = unpack_reply(data)
                except ValueError as exc:
                    raise TransportError(f"{self.endpoint} answered with {exc}") from None
                self._on_reply(reply)
        except zmq.ZMQError as exc:
            raise TransportError(f"reading acknowledgements from {self.endpoint}: {exc}") from None

    def _count_connections(self) -> None:
        from zmq.utils.monitor import parse_monitor_message

        zmq = zmq_module()
        while True:
            try:
                event = parse_monitor_message(self._monitor.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                break
            if event["event"] == _HANDSHAKE_SUCCEEDED:
                self._failed_handshakes = 0
                continue
            if event["event"] & HANDSHAKE_FAILED:
                self._failed_handshakes += 1
                if handshake_refuses(event["event"], self._failed_handshakes):
                    self._refused = _handshake_failure(event["event"], self.endpoint)
                continue
            self._connections += 1
            # the first connection is where the groups went; a later one may be a new trainer
            self._hello_due = self._hello_due or self._connections > 1

    def _say_hello(self) -> None:
        """Tell the (maybe new) receiver which ids this sender holds and whether its end
        marker was sent; its answer says what to send again."""
        zmq = zmq_module()
        request = self._requests + 1
        hello = Hello(END_SENT if self._end_sent else 0, request, list(self._held))
        try:
            self._socket.send(pack_hello(hello), zmq.NOBLOCK)
        except zmq.Again:  # the queue is full: try again at the next look
            return
        self._requests = request
        self._hello_due = False

    def _on_reply(self, reply: Reply) -> None:
        if reply.instance is None:  # a count
            self._take_count(reply.taken)
            if self._instance is None and self._end_sent and self._plain_out() == 0:
                self._end_taken = True  # a count: the end marker, sent last, is taken
            return
        if reply.instance != self._instance:
            if self._instance is not None:  # a new receiver: what the old one took is gone
                self._plain_sent = self._plain_taken = 0
            self._instance = reply.instance
        self._take_count(reply.taken)
        for group_id in reply.committed:
            if self._held.pop(group_id, None) is not None:
                self._resent_at.pop(group_id, None)
                self.acked += 1
        if reply.flags & END_TAKEN:
            self._end_taken = True
        # what a request sent before our last resend calls missing is on its way already
        wanted = {g for g in reply.missing if self._resent_at.get(g, 0) < reply.request}
        for group_id in [g for g in self._held if g in wanted]:  # in the order first sent
            self._send_parts(self._held[group_id], FrameKind.DATA, group_id)
            self._held.move_to_end(group_id)
            self._resent_at[group_id] = self._requests
            self.resent += 1
        end_lost = reply.flags & END_MISSING and self._end_sent and not self._end_taken
        if end_lost and self._end_resent_at < reply.request:
            self._send_end()
            self._end_resent_at = self._requests

    def _take_count(self, taken: int) -> None:
        if taken > self._plain_taken:
            self.acked += taken - self._plain_taken
            self._plain_taken = taken

    def _send_parts(self, view: memoryview, kind: FrameKind, group_id: str | None = None) -> None:
        zmq = zmq_module()
        # the socket's send timeout follows the settings (GroupSender may change them):
        # timeout_s while sending, linger_s once closing
        wanted = self.linger_s if self._closing else self.timeout_s
        if wanted != self._sndtimeo_s:
            self._socket.setsockopt(zmq.SNDTIMEO, _millis(wanted))
            self._sndtimeo_s = wanted
        # part 0 is small (ZeroMQ copies it anyway); part 1 goes out without a copy
        parts: list[Any] = [_head(view, kind, self.checksum), view]
        if group_id is not None:
            parts.append(group_id.encode("utf-8"))
        try:
            self._socket.send_multipart(parts, copy=False)
        except zmq.Again:
            raise BackPressureTimeout(
                f"{self.endpoint}: ZeroMQ could not queue a message in {wanted} s",
                sent=self.sent,
            ) from None
        except zmq.ZMQError as exc:
            raise TransportError(f"sending to {self.endpoint} failed: {exc}") from None

    def _send_end(self) -> None:
        """Send the end-of-stream marker (again: with the ids held now)."""
        info = end_marker(self.sent, self._end_error)
        request = self._requests + 1
        if self._tracked:
            info["held"] = list(self._held)
            info["request"] = request
        self._send_parts(as_bytes_view(packb(info)), FrameKind.END)
        self._requests = request
        self._hello_due = False  # the marker names what this sender holds, as a hello would
        self._plain_sent += 1
        self._end_sent = True

    # -- closing ----------------------------------------------------------------------

    def close(self, error: str | None) -> bool:
        """Send the end marker (``error`` in it), wait up to ``linger_s`` for the trainer to
        acknowledge everything (sending again what a restarted trainer lost), close.
        Returns whether everything was acknowledged."""
        delivered = False
        try:
            if self._refused is not None:  # the trainer refused this sender: none of it
                raise TransportError(self._refused)  # reaches it, nor does an end marker
            self._closing = True  # from now on the socket's send timeout is linger_s
            self._end_error = error
            self._send_end()
            deadline = None if self.linger_s is None else time.monotonic() + self.linger_s
            while self._held or not self._end_taken:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._read_acks(left)
            delivered = not self._held and self._end_taken
        except TransportError:  # the trainer is gone or stalled: nothing more to do
            pass
        finally:
            self._close_sockets()
        return delivered

    def _close_sockets(self) -> None:
        if self._monitor is not None:
            with contextlib.suppress(Exception):
                self._socket.disable_monitor()
            self._monitor.close(linger=0)
        self._socket.close(linger=0)
        self._context.term()


@dataclasses.dataclass(slots=True)
class _Peer:
    """What a receiver knows of one sender (one routing id) in its lifetime."""

    aware: bool = False  # it sent an id or a hello: it reads answers, not counts
    taken: int = 0  # its messages without an id taken (groups, end marker, bad ones)
    ended: bool = False  # its end marker is counted


class ZmqSource:
    """The receiving end on a ZeroMQ endpoint: a ROUTER socket; groups checked with the
    frame API, decoded, deduplicated through the receiver's book; hellos and end markers
    answered; iteration ends after end markers from ``senders`` senders."""

    def __init__(
        self,
        source: str,
        *,
        commits: Commits,
        bind: bool,
        senders: int | None,
        timeout_s: float | None,
        errors: str,
        tensors: TensorType,
        max_frame_bytes: int,
        raw: bool,
        secret_key: str | os.PathLike[str] | None,
        allow: str | os.PathLike[str] | None,
        insecure: bool,
    ) -> None:
        if secret_key is None:
            check_plain_endpoint(source, insecure=insecure)
        self._commits = commits
        self.senders = senders
        self.timeout_s = timeout_s
        self.errors = errors
        self.raw = raw
        self.max_frame_bytes = max_frame_bytes
        self.index = 0
        self.received = 0
        self.ends: list[dict[str, Any]] = []
        self.skipped: list[tuple[int, int, Exception]] = []
        self.refused = 0  # connections whose CURVE handshake failed (a wrong or unknown key)
        self._peers: dict[bytes, _Peer] = {}  # one per sender seen (routing id)
        self._decoder = Decoder(tensors=tensors)
        self._instance = os.urandom(16)
        self.instance: str | None = self._instance.hex()
        self.endpoint: str | None = None
        self._monitor: Any = None
        self._poller: Any = None
        self._authenticator: Any = None
        zmq = zmq_module()
        self._context = zmq.Context(io_threads=1)
        self._socket: Any = self._context.socket(zmq.ROUTER)
        try:
            if secret_key is not None:
                assert allow is not None
                public, secret = read_secret_key(secret_key)
                self._authenticator = start_authenticator(self._context, allow_list(allow))
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
            self.close()
            if isinstance(exc, TransportError):
                raise
            raise TransportError(
                f"cannot {'bind' if bind else 'connect'} to {source}: {exc}"
            ) from None

    @property
    def ended(self) -> bool:
        return self.senders is not None and len(self.ends) >= self.senders

    def next_group(self) -> tuple[Any, str | None]:
        """The next group not seen before and its id; ``StopIteration`` once every
        expected sender has ended."""
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
                    seen = self._commits.arrive(group_id, peer)
                    if seen is Seen.COMMITTED:
                        self._answer(peer, committed=[group_id])
                    if seen is not Seen.NEW:
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
                self.skipped.append((index, -1, exc))
                continue
            if group_id is None:
                self._take(peer, state, None)
            else:
                self._commits.hand_out(group_id, peer)
            self.received += 1
            return item, group_id
        raise StopIteration

    def acknowledge(self, by_peer: dict[bytes, list[str]]) -> None:
        """Tell each sender which of its groups were committed (it forgets them)."""
        if self._socket is None:
            return
        for peer, group_ids in by_peer.items():
            self._answer(peer, committed=group_ids)

    def _receive(self) -> tuple[bytes, list[Any]]:
        zmq = zmq_module()
        if self._socket is None:
            raise TransportError(f"receive on a closed GroupReceiver ({self.endpoint})")
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

        zmq = zmq_module()
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

    def _on_hello(self, peer: bytes, state: _Peer, parts: list[Any]) -> bool:
        """Answer a hello (True), or say it is none (False; a malformed one included)."""
        if len(parts) != 1:
            return False
        hello = unpack_hello(parts[0].bytes)
        if hello is None:
            return False
        state.aware = True
        committed, missing = self._commits.reconcile(peer, hello.held)
        end = END_MISSING if hello.flags & END_SENT and not state.ended else 0
        self._answer(peer, committed=committed, missing=missing, flags=end, request=hello.request)
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
            committed, missing = self._commits.reconcile(peer, held)
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
        zmq = zmq_module()
        state = self._peers.setdefault(peer, _Peer())
        if not state.aware:
            reply = pack_count(state.taken)
        else:
            if state.ended:
                flags |= END_TAKEN
            reply = pack_answer(
                Reply(state.taken, self._instance, flags, request, list(committed), list(missing))
            )
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
            return str(data.decode("utf-8"))
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
        return end_info(self._decoder.decode(payload), index)

    def close(self) -> None:
        if self._socket is None:
            return
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
