"""Every error vf_mm raises on purpose, in one tree.

Catch ``VfMmError`` to handle anything vf_mm refuses; catch a leaf to handle one
kind of fault. Errors about bad *values* also subclass ``ValueError`` and errors
about a missing optional library subclass ``ImportError``, so code written
against the standard exceptions keeps working.

::

    VfMmError
    ├── MissingDependencyError (ImportError)   an optional library is needed for this input
    ├── MultiModalDataError (ValueError)       a multi-modal sidecar breaks the DESIGN.md rules
    ├── TrajectoryError (ValueError)           token lists of a step that disagree in length or values
    └── WireError                              the msgpack tensor codec and framed streams
        ├── EncodeError (TypeError)            a value the codec cannot put on the wire
        ├── DecodeError (ValueError)           bytes that are not a valid vf_mm message
        └── StreamError (ValueError)           a framed stream that cannot be read or appended to
            ├── StreamHeaderError              not a vf_mm stream, or a version we do not read
            ├── FrameTooLargeError             a frame over the configured maximum size
            ├── CorruptFrameError              a frame whose checksum does not match its bytes
            └── TornFrameError                 the stream ends inside a frame (writer cut off)

Each error says what was wrong and where (a byte offset, a frame index, a dtype),
so a failed item can be reported and skipped without losing the rest of a run.
"""

from __future__ import annotations

__all__ = [
    "CorruptFrameError",
    "DecodeError",
    "EncodeError",
    "FrameTooLargeError",
    "MissingDependencyError",
    "MultiModalDataError",
    "StreamError",
    "StreamHeaderError",
    "TornFrameError",
    "TrajectoryError",
    "VfMmError",
    "WireError",
]


class VfMmError(Exception):
    """Base of every error vf_mm raises on purpose."""


class MissingDependencyError(VfMmError, ImportError):
    """An optional library (torch, ml_dtypes, ...) is needed for this particular input."""


class MultiModalDataError(VfMmError, ValueError):
    """Multi-modal data whose hashes, placeholders and items disagree or overlap."""


class TrajectoryError(VfMmError, ValueError):
    """Token-level trajectory data whose parallel lists disagree or hold bad values."""


class WireError(VfMmError):
    """Base of the codec's and the stream's errors."""


class EncodeError(WireError, TypeError):
    """A value the codec cannot encode (unsupported type, sparse or quantized tensor, ...)."""


class DecodeError(WireError, ValueError):
    """Bytes that do not decode: truncated, corrupted, hostile, or from an unknown format."""


class StreamError(WireError, ValueError):
    """A framed stream that cannot be read or appended to."""


class StreamHeaderError(StreamError):
    """The file does not start with a vf_mm stream header, or its version is unknown."""


class FrameTooLargeError(StreamError):
    """A frame declares (or would need) more bytes than the configured maximum."""

    def __init__(self, message: str, *, offset: int, length: int, limit: int) -> None:
        super().__init__(message)
        self.offset = offset
        self.length = length
        self.limit = limit


class CorruptFrameError(StreamError):
    """A frame whose bytes do not match the checksum written with it."""

    def __init__(self, message: str, *, offset: int, index: int) -> None:
        super().__init__(message)
        self.offset = offset
        self.index = index


class TornFrameError(StreamError):
    """The stream ends part-way through a frame, as when a writer is killed mid-write.

    ``offset`` is where the torn frame starts: everything before it is whole, and a
    writer that resumes should truncate the file there (see ``repair_stream``).
    """

    def __init__(
        self, message: str, *, offset: int, index: int, expected: int, available: int
    ) -> None:
        super().__init__(message)
        self.offset = offset
        self.index = index
        self.expected = expected
        self.available = available
