"""The stream-file transport of the trainer hop: one ``vf_mm.wire`` stream frame per
group, written with ``StreamWriter`` and read with ``StreamReader``. A file has no end
marker and no acknowledgements: its end is the end of its groups, and a torn tail raises
``TornFrameError`` after the whole groups before it. A group's id is its frame's
``group_id`` field.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vf_mm.training._commits import Commits, Seen
from vf_mm.wire import StreamReader, StreamWriter, TensorType


def file_path(target: Any) -> Any:
    """A ``file://PATH`` target as its path; any other target unchanged."""
    if isinstance(target, str) and target.startswith("file://"):
        return Path(target.removeprefix("file://"))
    return target


class FileChannel:
    """The sending end on a stream file: each group appended as one frame, at once."""

    endpoint: str | None = None
    resent = 0
    acked = 0

    def __init__(self, target: Any, *, append: bool, checksum: bool, max_frame_bytes: int) -> None:
        self._writer = StreamWriter(
            file_path(target), append=append, checksum=checksum, max_frame_bytes=max_frame_bytes
        )
        self.sent = 0

    def wait_for_credit(self) -> None:
        """A file never makes a sender wait."""

    def send(self, view: memoryview, group_id: str | None) -> None:
        self._writer.write_message(view)  # a file's frame carries its own id
        self.sent += 1

    def pending(self) -> int:
        return 0

    def close(self, error: str | None) -> bool:
        self._writer.close()
        return True


class FileSource:
    """The receiving end on a stream file: ``StreamReader``'s frames, each group with an
    id deduplicated through the receiver's book (a raw reader does not look inside
    frames, so it finds no ids)."""

    endpoint: str | None = None
    instance: str | None = None
    refused = 0

    def __init__(
        self,
        source: Any,
        *,
        commits: Commits,
        tensors: TensorType,
        max_frame_bytes: int,
        errors: str,
        raw: bool,
    ) -> None:
        self._reader = StreamReader(
            file_path(source),
            tensors=tensors,
            max_frame_bytes=max_frame_bytes,
            errors=errors,
            raw=raw,
        )
        self._commits = commits
        self._raw = raw
        self.received = 0
        self.ends: list[dict[str, Any]] = []

    @property
    def index(self) -> int:
        return self._reader.index

    @property
    def skipped(self) -> list[tuple[int, int, Exception]]:
        return self._reader.skipped

    def next_group(self) -> tuple[Any, str | None]:
        while True:
            item = next(self._reader)
            group_id = None
            if not self._raw and isinstance(item, Mapping):
                found = item.get("group_id")
                group_id = found if isinstance(found, str) else None
            if group_id is not None:
                if self._commits.arrive(group_id, None) is not Seen.NEW:
                    continue
                self._commits.hand_out(group_id, None)
            self.received += 1
            return item, group_id

    def acknowledge(self, by_peer: dict[bytes, list[str]]) -> None:
        """A file has no senders to tell."""

    def close(self) -> None:
        self._reader.close()
