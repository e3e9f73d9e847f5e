"""Durable writes, the one way every package makes them (results, the trainer's ledger).

A file that must survive a crash is written, ``fsync``'d, and its folder ``fsync``'d
after the file is created or renamed into place: without the folder's sync, a power cut
can lose the new name even though the bytes reached the disk.
"""

from __future__ import annotations

import os


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (``os.write`` may take only part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make a rename or a new file in ``path`` durable (best effort where a folder
    cannot be opened, as on Windows)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
