"""The trainer's ledger: the group ids it has committed, so that no group is trained on twice.

A ``GroupReceiver`` deduplicates by group id against this set. Without a file it lives in
memory for the receiver's lifetime and holds the newest ``window`` ids (FIFO: when full,
the oldest is forgotten), so memory stays bounded and a resent group is recognised as
long as fewer than ``window`` groups were committed after it. With a file
(``GroupReceiver(..., ledger=PATH)``) every committed id is on disk and, once the file is
opened, in memory (about 100 bytes an id: a million groups cost ~100 MB): a trainer that
restarts reads it back and still recognises every group it committed, however old, since
a restarted worker sends its groups again from its start.

File format (``vf_mm.ledger/1``): UTF-8 text, append-only, one JSON value a line::

    {"format": "vf_mm.ledger/1"}        line 1, written (and fsync'd) when the file is made
    "run-3f2a9c01d4e5/0"                 then each committed group id as a JSON string,
    "run-3f2a9c01d4e5/7"                 in commit order

Crash safety: ``commit`` appends its ids' lines in one write and fsyncs the file before it
returns, and the receiver acknowledges the ids to their senders only after that, so an id
a sender has forgotten is always on disk. A receiver killed mid-commit leaves at most a
torn last line (no newline at its end): opening drops it and cuts it off the file, so the
next commit starts on a line of its own. Its ids were never acknowledged, so their
senders still hold the groups and send them again. Any other unreadable line, or a first
line that is not the header, is a ``LedgerError``: that file is not (or no longer) a
ledger this code wrote, and guessing would train on groups twice or drop them.

One receiver per ledger: the file is ``flock``'ed while open and a second receiver (in
this process or another) is refused with ``LedgerError``. Two trainers committing into
one ledger would each skip the groups the other took, so neither would see them all.
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from vf_mm._files import fsync_dir, write_all
from vf_mm.errors import LedgerError

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no lock, the rest works
    fcntl = None  # type: ignore[assignment]

__all__ = ["LEDGER_FORMAT", "Ledger", "read_ledger"]

#: The header line's ``format``; a file with any other first line is not opened.
LEDGER_FORMAT = "vf_mm.ledger/1"
_HEADER = (json.dumps({"format": LEDGER_FORMAT}) + "\n").encode()


def read_ledger(path: str | os.PathLike[str]) -> list[str]:
    """The group ids committed to the ledger at ``path``, in commit order.

    A torn last line, an interrupted commit, is left out. Reads without locking: a receiver
    may be appending meanwhile.

    Args:
        path: The ledger file.

    Raises:
        LedgerError: The file is not a ledger.
    """
    data = Path(path).read_bytes()
    ids, _ = _parse(data, str(path))
    return ids


def _parse(data: bytes, where: str) -> tuple[list[str], int]:
    """(the ids, the size of the whole lines) of a ledger file's bytes."""
    end = data.rfind(b"\n") + 1  # what follows the last newline is a torn line (or nothing)
    lines = data[:end].split(b"\n")[:-1]
    if not lines:
        return [], 0
    if lines[0] + b"\n" != _HEADER:
        raise LedgerError(
            f"{where} is not a group ledger: its first line is {lines[0][:80]!r}, not the "
            f"{LEDGER_FORMAT} header",
            path=where,
            line=1,
        )
    ids = []
    for number, line in enumerate(lines[1:], start=2):
        try:
            value = json.loads(line)
        except ValueError:
            value = None
        if not isinstance(value, str) or not value:
            raise LedgerError(
                f"{where}, line {number}: {line[:80]!r} is not a group id (a JSON string); "
                "the ledger is corrupt before its last line, which an interrupted commit "
                "cannot cause",
                path=where,
                line=number,
            )
        ids.append(value)
    return ids, end


class Ledger:
    """The committed group ids: in memory (the newest ``window``; ``None``: all), or in
    the append-only, locked file ``path`` (all of them). See the module docstring.

    ``recovered`` is how many ids the file held when opened, ``truncated_bytes`` the torn
    tail cut off it (0 if none).
    """

    def __init__(self, path: str | os.PathLike[str] | None = None, *, window: int | None) -> None:
        if path is None and window is not None and window < 1:
            raise ValueError(f"dedup_window must be >= 1 or None, got {window}")
        self.path = None if path is None else str(path)
        self.window = None if path is not None else window
        self.recovered = 0
        self.truncated_bytes = 0
        self._ids: OrderedDict[str, None] = OrderedDict()  # insertion order: oldest first
        self._fd: int | None = None
        self._size = 0
        if self.path is not None:
            self._open(self.path)

    def _open(self, path: str) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            if fcntl is not None:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    raise LedgerError(
                        f"{path} is held by another GroupReceiver (the ledger is locked): one "
                        "receiver per ledger, or each would skip the groups the other took",
                        path=path,
                    ) from None
            data = _read_all(fd)
            ids, end = _parse(data, path)
            if end < len(data):  # a torn last line: an interrupted commit, never acknowledged
                os.ftruncate(fd, end)
                self.truncated_bytes = len(data) - end
            if end == 0:  # new (or torn before its header was whole)
                write_all(fd, _HEADER)
                end = len(_HEADER)
            if self.truncated_bytes or len(data) == 0:
                os.fsync(fd)
                fsync_dir(Path(path).parent)
        except BaseException:
            os.close(fd)  # also drops the lock
            raise
        self._fd = fd
        self._size = end
        self._ids = OrderedDict.fromkeys(ids)
        self.recovered = len(self._ids)

    def __contains__(self, group_id: object) -> bool:
        return group_id in self._ids

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self) -> Any:
        return iter(self._ids)

    def commit(self, group_ids: Sequence[str]) -> None:
        """Record ``group_ids`` as committed: with a file, durably (one write, one fsync)
        before this returns; an error leaves the file as it was and raises."""
        if not group_ids:
            return
        if self._fd is not None:
            lines = "".join(json.dumps(g, ensure_ascii=False) + "\n" for g in group_ids)
            data = lines.encode("utf-8")
            try:
                write_all(self._fd, data)
                os.fsync(self._fd)
            except OSError as exc:
                self._undo()
                raise LedgerError(
                    f"{self.path}: committing {len(group_ids)} group ids failed: {exc}",
                    path=self.path or "",
                ) from exc
            self._size += len(data)
        elif self.path is not None:
            raise LedgerError(f"{self.path}: the ledger is closed", path=self.path)
        self._remember(group_ids)

    def _remember(self, group_ids: Iterable[str]) -> None:
        for group_id in group_ids:
            self._ids[group_id] = None
        if self.window is not None:
            while len(self._ids) > self.window:
                self._ids.popitem(last=False)

    def _undo(self) -> None:
        """Cut a failed commit's partial lines off, so the file ends on a whole line."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, self._size)
            os.fsync(self._fd)
        except OSError:  # the next opening drops a torn last line anyway
            pass

    def close(self) -> None:
        """Close the file (and release its lock). Idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def _read_all(fd: int) -> bytes:
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)
