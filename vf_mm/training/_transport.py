"""The trainer hop: ``GroupSender`` and ``GroupReceiver``, scored groups from rollout
workers to a trainer, each group with an id trained on exactly once, across restarts of
the trainer and the workers.

A target or source is a **stream file** (a path, or ``file://PATH``: one ``vf_mm.wire``
stream frame per group; ``_transport_file``) or a **ZeroMQ endpoint** (``tcp://HOST:PORT``
or ``ipc://PATH``: by default the trainer binds and every worker connects;
``_transport_zmq``). The two classes here are what users hold: they check arguments and
group ids, count, serialise sends from several threads, run ``asend`` off the event loop,
and keep the book of committed ids (``_commits``) that both transports deduplicate
against; each holds one transport that does the I/O. The protocol (message layout,
acknowledgements, back-pressure, exactly-once delivery, limits) is specified in
``docs/formats/transport.md``.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from vf_mm.errors import FrameTooLargeError, TransportError
from vf_mm.training._commits import Commits
from vf_mm.training._groups import check_group_id
from vf_mm.training._transport_file import FileChannel, FileSource
from vf_mm.training._transport_zmq import ZmqChannel, ZmqSource, as_bytes_view
from vf_mm.wire import DEFAULT_MAX_FRAME_BYTES, TensorType, packb

ZMQ_SCHEMES = ("tcp://", "ipc://")
DEFAULT_DEDUP_WINDOW = 100_000


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


def _group_id_of(group: Any, group_id: str | None) -> str | None:
    """The id a group is sent under: ``group_id``, else the frame's ``group_id`` field."""
    inside = group.get("group_id") if isinstance(group, Mapping) else None
    if group_id is None:
        return check_group_id(inside) if inside is not None else None
    if inside is not None and inside != group_id:
        raise ValueError(f"group_id={group_id!r}, but the group's 'group_id' is {inside!r}")
    return check_group_id(group_id)


class _Channel(Protocol):
    """A sending transport: what ``GroupSender`` needs of a file or a ZeroMQ socket."""

    endpoint: str | None
    sent: int
    resent: int
    acked: int
    linger_s: float | None  # GroupSender's settings: it sets them here when they change
    timeout_s: float | None

    def wait_for_credit(self) -> None: ...
    def send(self, view: memoryview, group_id: str | None) -> None: ...
    def pending(self) -> int: ...
    def close(self, error: str | None) -> bool: ...


class _Source(Protocol):
    """A receiving transport: what ``GroupReceiver`` needs of a file or a ZeroMQ socket."""

    endpoint: str | None
    instance: str | None
    refused: int
    received: int
    ends: list[dict[str, Any]]

    @property
    def ended(self) -> bool: ...
    @property
    def index(self) -> int: ...
    @property
    def skipped(self) -> list[tuple[int, int, Exception]]: ...
    def next_group(self) -> tuple[Any, str | None]: ...
    def acknowledge(self, by_peer: dict[bytes, list[str]]) -> None: ...
    def close(self) -> None: ...


class GroupSender:
    """Sends groups to a stream file or a ZeroMQ endpoint (``docs/formats/transport.md``).

    ``send(group)`` encodes with ``vf_mm.wire.packb`` and sends; ``send_message(buf)``
    sends an already encoded message (do not modify ``buf`` afterwards: ZeroMQ sends it
    without copying, and a group with an id is kept to be sent again). A group's id is
    ``group_id=``, else (``send``) the group's ``group_id`` field; with one, the group is
    held until the trainer commits it, sent again if the trainer restarts before that, and
    deduplicated by the trainer. Both return the message's size and block while ``hwm``
    groups are unacknowledged. ``asend`` / ``aclose`` are the same for an event loop.
    ``close()`` (or the end of a ``with`` block) sends the end-of-stream marker (a file
    ends with it too: ``close(error)`` says why the sender stopped early) and waits for the
    trainer to acknowledge everything; ``delivered`` says whether it did.

    Thread-safe: sends from several threads go out one at a time. ``sent`` counts groups
    sent (once each), ``resent`` the groups sent again to a trainer that had lost them,
    ``acked`` the messages the trainer has acknowledged (taken, or committed), ``pending``
    the groups not acknowledged yet.

    Args:
        target: A stream file, or a ZeroMQ endpoint to connect to.
        hwm: The window: groups sent and not yet acknowledged.
        linger_s: How long ``close`` waits for acknowledgements (``None``: as long as it
            takes).
        timeout_s: Bounds the wait for room in the window (``BackPressureTimeout``).
        bind: Bind the socket instead of connecting it.
        checksum: As for ``StreamWriter``.
        max_frame_bytes: As for ``StreamWriter``; a message over it is refused here with
            ``FrameTooLargeError``.
        append: Files only: as for ``StreamWriter``.
        secret_key: CURVE: this worker's secret key.
        trainer_key: CURVE: the trainer's public key.
        insecure: Allow plain TCP beyond loopback.
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
        self._linger_s = linger_s
        self._timeout_s = timeout_s
        self.checksum = checksum
        self.max_frame_bytes = max_frame_bytes
        self.bytes_sent = 0
        self.closed = False
        self.delivered = False
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._channel: _Channel
        if is_endpoint(target):
            self._channel = ZmqChannel(
                target,
                hwm=hwm,
                linger_s=linger_s,
                timeout_s=timeout_s,
                bind=bind,
                checksum=checksum,
                secret_key=secret_key,
                trainer_key=trainer_key,
                insecure=insecure,
            )
        elif secret_key is not None:
            raise ValueError("CURVE keys are for a ZeroMQ endpoint, not a stream file")
        else:
            self._channel = FileChannel(
                target, append=append, checksum=checksum, max_frame_bytes=max_frame_bytes
            )

    @property
    def linger_s(self) -> float | None:
        """How long ``close`` waits for acknowledgements. Settable until then: the channel
        reads the new value (``vf-mm rollout`` shortens it when a run stops early)."""
        return self._linger_s

    @linger_s.setter
    def linger_s(self, value: float | None) -> None:
        self._linger_s = value
        self._channel.linger_s = value

    @property
    def timeout_s(self) -> float | None:
        """Bounds the wait for room in the window; settable: the next wait uses it."""
        return self._timeout_s

    @timeout_s.setter
    def timeout_s(self, value: float | None) -> None:
        self._timeout_s = value
        self._channel.timeout_s = value

    @property
    def endpoint(self) -> str | None:
        """The ZeroMQ endpoint (the address a ``bind`` got); ``None`` for a file."""
        return self._channel.endpoint

    @property
    def sent(self) -> int:
        return self._channel.sent

    @property
    def resent(self) -> int:
        return self._channel.resent

    @property
    def acked(self) -> int:
        return self._channel.acked

    @property
    def pending(self) -> int:
        """Groups sent that the trainer has not acknowledged yet (0 for a file)."""
        with self._lock:
            return 0 if self.closed else self._channel.pending()

    def send(self, group: Any, *, group_id: str | None = None) -> int:
        """Encode ``group`` and send it; returns the message's size in bytes.

        Waits for room in the window before encoding, so a blocked sender holds no encoded
        copy.

        Args:
            group: The group frame (``pack_group``).
            group_id: Makes it a group delivered exactly once (default: ``group["group_id"]``
                when the group is a mapping that has one).

        Raises:
            BackPressureTimeout: No room in the window within ``timeout_s``.
            FrameTooLargeError: The message is over ``max_frame_bytes``.
        """
        group_id = _group_id_of(group, group_id)
        with self._lock:
            self._check_open()
            self._channel.wait_for_credit()
        return self.send_message(packb(group), group_id=group_id)

    def send_message(self, message: Any, *, group_id: str | None = None) -> int:
        """Send an encoded message as one group; returns its size in bytes.

        Do not modify ``message`` afterwards: ZeroMQ sends it without copying, and a group with
        an id is kept to be sent again.

        Args:
            message: The encoded group.
            group_id: Makes it delivered exactly once (the message's bytes are not read for
                it).

        Raises:
            BackPressureTimeout: No room in the window within ``timeout_s``.
            FrameTooLargeError: The message is over ``max_frame_bytes``.
        """
        if group_id is not None:
            group_id = check_group_id(group_id)
        view = as_bytes_view(message)
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
            self._channel.send(view, group_id)
            self.bytes_sent += n
        return n

    def _check_open(self) -> None:
        if self.closed:
            raise TransportError(f"send on a closed GroupSender ({self.target})")

    async def asend(self, group: Any, *, group_id: str | None = None) -> int:
        """``send`` from an event loop; returns the message's size in bytes.

        Waits, encodes and sends on the sender's own thread (one for all its ``asend`` calls, so
        groups go out in call order). Do not modify ``group`` until it returns.

        Args:
            group: See ``send``.
            group_id: See ``send``.
        """
        loop = asyncio.get_running_loop()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="vf-mm-send")
        call = functools.partial(self.send, group, group_id=group_id)
        return await loop.run_in_executor(self._executor, call)

    def close(self, error: str | None = None) -> None:
        """Finish pending ``asend`` calls, send the end-of-stream marker, wait, close.

        Waits up to ``linger_s`` for the trainer to acknowledge everything (sending again what a
        restarted trainer lost).

        Args:
            error: Why the sender stops early (None: it finished); goes in the end-of-stream
                marker, which a file writes as its last frame.
        """
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self.delivered = self._channel.close(error)

    async def aclose(self, error: str | None = None) -> None:
        """``close`` without blocking the event loop.

        Args:
            error: Goes in the end-of-stream marker.
        """
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
    """Iterates over the groups from a stream file or a ZeroMQ endpoint, each id once.

    Decoded (unless ``raw``).

    See ``docs/formats/transport.md``. Each group acknowledged frees a place in its sender's
    window: the trainer's pace is the senders' pace.

    Groups with ids are **committed** when the trainer is done with them: with
    ``autocommit=True`` (the default) each ``next(receiver)`` first commits the groups
    handed out before, so a ``for`` loop commits a group when it comes back for the next
    one (a loop left by an exception or ``break`` commits nothing: call ``commit()`` for a
    group it did finish). ``commit()`` commits every group handed out and not committed yet
    and returns how many; with ``autocommit=False`` it is the only way (commit after the
    training step that used them). Committed ids go to the ``ledger`` file first, then
    their senders are told. A group whose id is committed, or handed out and not committed,
    is skipped and counted in ``duplicates``. ``close()`` commits nothing: groups handed
    out and not committed come again to the next receiver.

    ``index`` counts messages received (end markers and bad ones included), ``received`` the
    groups returned; ``group_id`` is the id of the group last returned (None: it has none);
    ``committed`` counts ids committed by this receiver, ``recovered`` the ids its ledger
    held when it opened; ``instance`` (ZeroMQ) is this receiver's id in its answers, new
    each time; ``ends`` holds each sender's end marker's ``{"sent", "error"}`` (a file's, once it is
    read to its end: a file whose writer stopped early, its marker's ``error`` set, raises
    ``StreamEndedEarlyError`` after its last group); ``skipped`` the ``(index, offset,
    error)`` of each message skipped with ``errors="skip"``.

    Args:
        source: A stream file, or a ZeroMQ endpoint to bind to.
        bind: False connects to the endpoint instead.
        senders: ZeroMQ: iteration ends after end-of-stream markers from this many senders
            (``None``: never; stop with ``timeout_s`` or ``close``).
        timeout_s: Bounds each wait for a message (``ReceiveTimeout``).
        errors: As for ``StreamReader``.
        tensors: As for ``StreamReader``.
        max_frame_bytes: As for ``StreamReader``; a ZeroMQ peer that sends a part over it is
            disconnected by ZeroMQ before it is read.
        raw: Yield each group's message undecoded (a ``memoryview``, e.g. to append it to a
            stream file with ``write_message``); a raw file receiver does not look inside
            messages, so it neither deduplicates nor takes a ``ledger``.
        ledger: The file committed ids go to (append-only, fsync'd, locked; its ids are read
            back when the trainer restarts).
        autocommit: See above.
        dedup_window: Without a ledger the receiver remembers its newest this many
            committed ids (``None``: all of them; about 100 bytes each).
        secret_key: CURVE: the trainer's secret key.
        allow: CURVE: a directory of the workers' public keys.
        insecure: Allow plain TCP beyond loopback.

    Raises:
        LedgerError: Another receiver holds the ledger, or it is not a ledger.
        StreamEndedEarlyError: Iterating a file whose writer stopped early (after its last
            group).
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
        if not endpoint and secret_key is not None:
            raise ValueError("CURVE keys are for a ZeroMQ endpoint, not a stream file")
        self.source = source
        self.senders = senders
        self.timeout_s = timeout_s
        self.errors = errors
        self.raw = raw
        self.autocommit = autocommit
        self.max_frame_bytes = max_frame_bytes
        self.group_id: str | None = None
        self._commits = Commits(ledger, window=dedup_window)
        self._source: _Source
        try:
            if endpoint:
                self._source = ZmqSource(
                    source,
                    commits=self._commits,
                    bind=bind,
                    senders=senders,
                    timeout_s=timeout_s,
                    errors=errors,
                    tensors=tensors,
                    max_frame_bytes=max_frame_bytes,
                    raw=raw,
                    secret_key=secret_key,
                    allow=allow,
                    insecure=insecure,
                )
            else:
                self._source = FileSource(
                    source,
                    commits=self._commits,
                    tensors=tensors,
                    max_frame_bytes=max_frame_bytes,
                    errors=errors,
                    raw=raw,
                )
        except BaseException:
            self._commits.close()
            raise

    @property
    def endpoint(self) -> str | None:
        return self._source.endpoint

    @property
    def instance(self) -> str | None:
        return self._source.instance

    @property
    def refused(self) -> int:
        """Connections whose CURVE handshake failed (a wrong or unknown key)."""
        return self._source.refused

    @property
    def index(self) -> int:
        return self._source.index

    @property
    def received(self) -> int:
        return self._source.received

    @property
    def ends(self) -> list[dict[str, Any]]:
        return self._source.ends

    @property
    def skipped(self) -> list[tuple[int, int, Exception]]:
        return self._source.skipped

    @property
    def ended(self) -> bool:
        """ZeroMQ: whether every expected sender has sent its end marker. A file: whether
        its last frame read is its writer's end marker (read to its end and still False:
        the writer was cut off, or is still writing)."""
        return self._source.ended

    @property
    def duplicates(self) -> int:
        return self._commits.duplicates

    @property
    def committed(self) -> int:
        return self._commits.committed

    @property
    def recovered(self) -> int:
        """How many committed ids the ledger held when this receiver opened it."""
        return self._commits.recovered

    def __iter__(self) -> Iterator[Any]:
        return self

    def commit(self) -> int:
        """Commit every group handed out and not committed yet: record their ids (in the
        ledger: durably, before anything else), then acknowledge them to their senders,
        which forget them. Returns how many were committed."""
        count, by_peer = self._commits.commit()
        if by_peer:
            self._source.acknowledge(by_peer)
        return count

    def __next__(self) -> Any:
        if self.autocommit:
            self.commit()
        self.group_id = None
        item, self.group_id = self._source.next_group()
        return item

    def close(self) -> None:
        """Close the source and the ledger. Commits nothing (see the class docstring)."""
        self._source.close()
        self._commits.close()

    def __enter__(self) -> GroupReceiver:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_groups(source: Any, **kwargs: Any) -> Iterator[Any]:
    """Yield each group from a stream file or a ZeroMQ endpoint, then close the source.

    An error ends the iteration (as with ``read_stream``); to go on past a bad message,
    iterate a ``GroupReceiver`` or pass ``errors="skip"``.

    Args:
        source: A stream file or a ZeroMQ endpoint.
        **kwargs: ``GroupReceiver``'s keywords.
    """
    with GroupReceiver(source, **kwargs) as receiver:
        yield from receiver
