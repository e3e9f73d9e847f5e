"""Stream files: many messages in one file or pipe, safe against a writer cut off mid-write.

A stream is a stream header and then one ``DATA`` frame per item, laid out as
``vf_mm/wire/_frames.py`` documents, and, where its writer says how it finished, an
``END`` frame (an *end marker*, ``StreamWriter.write_end``: its message is the writer's
account, e.g. the trainer hop's ``{"sent", "error"}``). The input ends where it ends;
an end marker is never an item: a reader keeps the decoded markers in ``ends``, and
``ended`` says whether the last frame it read was one, which tells a writer that
finished (or said why it stopped) from one cut off. A stream that ends inside a frame
head or payload is *torn*: the reader yields every whole frame before it, then raises
``TornFrameError`` with the torn frame's offset. Nothing is dropped silently and no
partial frame is ever decoded.

Each frame is read into its own freshly allocated, 64-byte-aligned buffer, so the
reader holds at most one frame in memory and decoded tensors are writable views of
it (no second copy).
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any, BinaryIO

import numpy as np

from vf_mm.errors import CorruptFrameError, DecodeError, FrameTooLargeError, TornFrameError
from vf_mm.wire._decode import Decoder, TensorType
from vf_mm.wire._encode import Encoder, _aligned_empty
from vf_mm.wire._frames import (
    DEFAULT_MAX_FRAME_BYTES,
    FRAME_HEADER_SIZE,
    STREAM_HEADER_SIZE,
    FrameKind,
    check_frame,
    frame_header,
    parse_frame_header,
    parse_stream_header,
    stream_header,
    torn_frame,
)

_CHUNK = 64 << 20  # reads from pipes grow a frame this much at a time
_KINDS = (FrameKind.DATA, FrameKind.END)  # what a stream file holds

Source = str | os.PathLike[str] | BinaryIO | IO[bytes]


class StreamWriter:
    """Writes items as ``DATA`` frames. Use as a context manager, or call ``close()``.

    Appending to a path checks the file first: a torn tail raises ``TornFrameError``
    (truncate it with ``repair_stream``) rather than hiding later frames behind it.

    Args:
        target: A path (created, or appended to with ``append=True``: the existing
            stream's checksum setting is kept) or a binary file object (we write a stream
            header first unless ``append=True``; then ``checksum`` must match the
            stream's).
        append: Append to an existing stream instead of starting one.
        checksum: Whether frames carry a crc32.
        max_frame_bytes: The largest frame written; a larger one raises
            ``FrameTooLargeError``.
        encoder: The default is an ``Encoder(reuse_buffer=True)``: each frame is encoded
            into the buffer of the frame before, which was written and dropped, so a long
            stream faults in its buffer's pages once, not once per frame.

    Raises:
        TornFrameError: Appending to a file whose tail is torn.
        StreamHeaderError: Appending to a file that is not a vf_mm stream.
    """

    def __init__(
        self,
        target: Source,
        *,
        append: bool = False,
        checksum: bool = True,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        encoder: Encoder | None = None,
    ) -> None:
        self.checksum = checksum
        self.max_frame_bytes = max_frame_bytes
        self.encoder = encoder or Encoder(reuse_buffer=True)
        self.frames_written = 0
        self._owns = isinstance(target, (str, os.PathLike))
        if isinstance(target, (str, os.PathLike)):
            path = Path(target)
            if append and path.exists() and path.stat().st_size > 0:
                end, self.checksum = _check_whole(path, max_frame_bytes)
                self._file: IO[bytes] = open(path, "r+b")  # noqa: SIM115 - closed in close()
                self._file.seek(end)
                return
            self._file = open(path, "wb")  # noqa: SIM115
        else:
            self._file = target
            if append:
                return
        self._file.write(stream_header(checksum=checksum))

    def write(self, item: Any) -> int:
        """Encode and write one item; returns the frame's size in bytes.

        Args:
            item: The object to encode.

        Raises:
            EncodeError: A value the encoder cannot put on the wire.
            FrameTooLargeError: A frame over ``max_frame_bytes``.
        """
        return self.write_message(self.encoder.encode(item))

    def write_message(self, message: Any, *, kind: FrameKind = FrameKind.DATA) -> int:
        """Write an already encoded message as one frame; returns the frame's size in bytes.

        Args:
            message: The encoded message's bytes.
            kind: The frame's kind (``DATA``; ``END`` for an end marker: ``write_end``).

        Raises:
            FrameTooLargeError: A frame over ``max_frame_bytes``.
        """
        n = memoryview(message).nbytes
        if n > self.max_frame_bytes:
            raise FrameTooLargeError(
                f"a frame of {n} bytes exceeds max_frame_bytes={self.max_frame_bytes}",
                offset=self._file.tell() if self._file.seekable() else -1,
                length=n,
                limit=self.max_frame_bytes,
            )
        self._file.write(frame_header(message, kind=kind, checksum=self.checksum))
        self._file.write(message)
        self.frames_written += 1
        return FRAME_HEADER_SIZE + n

    def write_end(self, marker: Any) -> int:
        """Encode ``marker`` and write it as the stream's end marker; returns its size.

        The marker is an ``END`` frame, flushed: how the writer finished, for readers to
        tell that from a writer cut off. Items written after it (an appended stream) are
        read as usual.

        Args:
            marker: What the writer says about its end (the transport's ``{"sent",
                "error"}``).
        """
        size = self.write_message(self.encoder.encode(marker), kind=FrameKind.END)
        self.flush()
        return size

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        if self._owns:
            self._file.close()
        else:
            self._file.flush()

    def __enter__(self) -> StreamWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def write_stream(
    target: Source,
    items: Iterable[Any],
    *,
    append: bool = False,
    checksum: bool = True,
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
) -> int:
    """Write ``items`` as a framed stream; returns the number of frames written.

    Args:
        target: A path or a binary file object (see ``StreamWriter``).
        items: The objects to write, one frame each.
        append: Append to an existing stream instead of starting one.
        checksum: Whether frames carry a crc32.
        max_frame_bytes: The largest frame written.
    """
    with StreamWriter(
        target, append=append, checksum=checksum, max_frame_bytes=max_frame_bytes
    ) as writer:
        for item in items:
            writer.write(item)
        return writer.frames_written


class StreamReader:
    """Iterates over a framed stream, one decoded item per frame.

    ``offset`` is the byte offset just past the last whole frame read, ``index`` the
    number of frames read, ``frame_offset`` where the last frame returned starts. On a
    torn tail the iterator raises ``TornFrameError`` after the last whole frame; a
    reader tailing a file that is still being written can keep ``offset`` and come back
    later.

    ``END`` frames (end markers) are not items: each one's decoded message is appended
    to ``ends``, and ``ended`` says whether the last frame read was one (a stream read to
    its end with ``ended`` False was cut off, or is still being written).

    Args:
        source: A path or a binary file object.
        tensors: What tensors come back as (see ``Decoder``).
        max_frame_bytes: The largest frame accepted.
        errors: ``"raise"`` (the default) raises at a frame that fails ``check_frame``
            (its crc32, or a kind other than ``DATA`` and ``END``) or whose message does not decode.
            ``"skip"`` records such a frame's error in ``skipped`` (as ``(index, offset,
            error)``) and goes on to the next frame: its length was intact, so nothing
            after it is lost. A torn tail and a frame over ``max_frame_bytes`` always
            raise, because the frames after them cannot be found.
        raw: Yield each frame's message bytes undecoded.

    Raises:
        StreamHeaderError: Not a vf_mm stream, or a version we do not read.
        TornFrameError: The stream ends inside a frame (after the last whole one).
        FrameTooLargeError: A frame over ``max_frame_bytes``.
        CorruptFrameError: A frame failing its checks (``errors="raise"``).
    """

    def __init__(
        self,
        source: Source,
        *,
        tensors: TensorType = "auto",
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        errors: str = "raise",
        raw: bool = False,
    ) -> None:
        if errors not in ("raise", "skip"):
            raise ValueError(f"errors must be 'raise' or 'skip', not {errors!r}")
        self._owns = isinstance(source, (str, os.PathLike))
        self._file: IO[bytes] = (
            open(source, "rb")  # noqa: SIM115 - closed in close()
            if isinstance(source, (str, os.PathLike))
            else source
        )
        self.decoder = Decoder(tensors=tensors)
        self.max_frame_bytes = max_frame_bytes
        self.errors = errors
        self.raw = raw
        self.index = 0
        self.frame_offset = -1
        self.skipped: list[tuple[int, int, Exception]] = []
        self.ends: list[Any] = []
        self.ended = False
        try:
            self.offset = self._read_header()
        except BaseException:
            self.close()
            raise

    def _read_header(self) -> int:
        self.checksum = parse_stream_header(_read_exactly(self._file, STREAM_HEADER_SIZE))
        return STREAM_HEADER_SIZE

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        while True:
            frame = self._next_frame()
            if frame is None:
                raise StopIteration
            start, message, kind = frame
            self.ended = kind == FrameKind.END
            try:
                if self.ended:
                    self.ends.append(self.decoder.decode(message))
                    continue
                self.frame_offset = start
                return message if self.raw else self.decoder.decode(message)
            except DecodeError as exc:
                exc.add_note(f"in frame {self.index - 1} at byte offset {start}")
                if self.errors == "raise":
                    raise
                self.skipped.append((self.index - 1, start, exc))

    def _next_frame(self) -> tuple[int, memoryview, FrameKind] | None:
        """The next whole frame's (offset, message, kind); None at a clean end."""
        while True:
            start, index = self.offset, self.index
            head = _read_exactly(self._file, FRAME_HEADER_SIZE)
            if not head:
                return None
            header = parse_frame_header(
                head, max_frame_bytes=self.max_frame_bytes, index=index, offset=start
            )
            length = header.length
            remaining = _remaining(self._file)
            if remaining is not None and remaining < length:
                raise torn_frame(index, start, length, remaining, "payload")
            message = _read_payload(self._file, length, known_size=remaining is not None)
            if len(message) < length:
                raise torn_frame(index, start, length, len(message), "payload")
            self.offset = start + FRAME_HEADER_SIZE + length
            self.index += 1
            try:
                kind = check_frame(
                    header, message, checksum=self.checksum, kinds=_KINDS, index=index, offset=start
                )
            except CorruptFrameError as error:
                if self.errors == "raise":
                    raise
                self.skipped.append((index, start, error))
                continue
            return start, message.data, kind

    def close(self) -> None:
        if self._owns:
            self._file.close()

    def __enter__(self) -> StreamReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_stream(
    source: Source,
    *,
    tensors: TensorType = "auto",
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
) -> Iterator[Any]:
    """Yield each item of a framed stream. See ``StreamReader`` for skipping bad frames.

    Args:
        source: A path or a binary file object.
        tensors: What tensors come back as (see ``Decoder``).
        max_frame_bytes: The largest frame accepted.

    Raises:
        TornFrameError: After the last whole frame of a torn stream.
        StreamHeaderError: Not a vf_mm stream, or a version we do not read.
    """
    with StreamReader(source, tensors=tensors, max_frame_bytes=max_frame_bytes) as reader:
        yield from reader


def repair_stream(
    path: str | os.PathLike[str], *, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
) -> int:
    """Truncate a torn tail off a stream file; returns the number of bytes removed.

    Args:
        path: The stream file.
        max_frame_bytes: The largest frame accepted while finding the last whole frame.
    """
    path = Path(path)
    size = path.stat().st_size
    try:
        end, _ = _check_whole(path, max_frame_bytes)
    except TornFrameError as torn:
        end = torn.offset
    if end < size:
        os.truncate(path, end)
    return size - end


def _check_whole(path: Path, max_frame_bytes: int) -> tuple[int, bool]:
    """Walk a stream's frame headers (no payload reads); return the end of the last frame
    and whether the stream's frames carry checksums."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        header = StreamReader(f, raw=True)  # validates the stream header
        offset = header.offset
        index = 0
        while offset < size:
            f.seek(offset)
            head = f.read(FRAME_HEADER_SIZE)
            length = parse_frame_header(
                head, max_frame_bytes=max_frame_bytes, index=index, offset=offset
            ).length
            available = size - offset - FRAME_HEADER_SIZE
            if available < length:
                raise torn_frame(index, offset, length, available, "payload")
            offset += FRAME_HEADER_SIZE + length
            index += 1
        return offset, header.checksum


def _read_exactly(f: IO[bytes], n: int) -> bytes:
    chunks = []
    while n:
        chunk = f.read(n)
        if not chunk:
            break
        chunks.append(chunk)
        n -= len(chunk)
    return b"".join(chunks)


def _read_payload(f: IO[bytes], length: int, *, known_size: bool) -> np.ndarray:
    """Read up to ``length`` bytes into a fresh aligned buffer (shorter at end of input).

    When the source's size is known the buffer is allocated at once; from a pipe it
    grows a chunk at a time, so a torn frame declaring gigabytes costs only what arrived.
    """
    if known_size or length <= _CHUNK:
        buffer = _aligned_empty(length)
        return buffer[: _readinto(f, buffer)]
    chunks = []
    got = 0
    while got < length:
        chunk = _aligned_empty(min(_CHUNK, length - got))
        n = _readinto(f, chunk)
        chunks.append(chunk[:n])
        got += n
        if n < len(chunk):
            break
    buffer = _aligned_empty(got)
    pos = 0
    for chunk in chunks:
        buffer[pos : pos + len(chunk)] = chunk
        pos += len(chunk)
    return buffer


def _readinto(f: IO[bytes], buffer: np.ndarray) -> int:
    view = buffer.data
    got = 0
    while got < len(view):
        n = f.readinto(view[got:])  # type: ignore[attr-defined]
        if not n:
            break
        got += n
    return got


def _remaining(f: IO[bytes]) -> int | None:
    """Bytes left in a regular file or BytesIO (lets us refuse a torn frame before allocating)."""
    if isinstance(f, io.BytesIO):
        return f.getbuffer().nbytes - f.tell()
    try:
        if not f.seekable():
            return None
        fileno = f.fileno()
    except (AttributeError, OSError, io.UnsupportedOperation):
        return None
    try:
        return os.fstat(fileno).st_size - f.tell()
    except OSError:
        return None
