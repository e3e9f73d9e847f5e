"""The stream-file transport of the trainer hop: one ``vf_mm.wire`` stream frame per
group, written with ``StreamWriter`` and read with ``StreamReader``, and last the
sender's end marker (an ``END`` frame: ``{"sent", "error"}``, the message ZeroMQ's end
marker carries). A file has no acknowledgements. Its reader tells the three ways a file
ends apart: an end marker without an error (the run finished), one with an error (the
writer stopped early and said why: ``StreamEndedEarlyError`` after the last group), or
none (cut off, as by kill -9, or still being written: ``receiver.ended`` False; a torn
tail raises ``TornFrameError``). A group's id is its frame's ``group_id`` field.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from vf_mm.errors import StreamEndedEarlyError
from vf_mm.training._acks import end_info, end_marker
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
    linger_s: float | None = None  # a file neither waits for room nor lingers
    timeout_s: float | None = None

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
        """Write the end marker (``error``: why the sender stopped early, None when it
        finished) and close the file."""
        try:
            self._writer.write_end(end_marker(self.sent, error))
        finally:
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
        self._source = str(source)
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

    @property
    def ended(self) -> bool:
        """Whether the file's last frame is an end marker (False: cut off, or still
        being written)."""
        return self._reader.ended

    def next_group(self) -> tuple[Any, str | None]:
        while True:
            try:
                item = next(self._reader)
            except StopIteration:
                self._at_end()
                raise
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

    def _at_end(self) -> None:
        """Check the end markers read; raise ``StreamEndedEarlyError`` when the file's
        last one says its writer stopped early."""
        index = self._reader.index
        self.ends = [end_info(info, index) for info in self._reader.ends]
        last = self.ends[-1] if self._reader.ended else None
        if last is None or last["error"] is None:
            return
        raise StreamEndedEarlyError(
            f"{self._source}: the writer stopped early after {last['sent']} groups "
            f"({last['error']}); every group read before this is whole, and the run's other "
            "groups were never written: run the rollout again (the same command writes "
            "every group again, under the same ids), or catch StreamEndedEarlyError to "
            "train on these alone",
            source=self._source,
            sent=last["sent"],
            reason=last["error"],
        )

    def acknowledge(self, by_peer: dict[bytes, list[str]]) -> None:
        """A file has no senders to tell."""

    def close(self) -> None:
        self._reader.close()
