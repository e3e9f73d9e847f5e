"""Reading a local image file, bounded.

The file is opened non-blocking (a FIFO cannot hang the loader), must be a regular
file (not a device such as ``/dev/zero``, a socket or a directory), and at most
``max_bytes`` + 1 bytes are read whatever its size claims. When the policy confines
paths to roots, the path given here is already resolved and the final component is
opened with ``O_NOFOLLOW``, so a symlink swapped in after the check is not followed.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from vf_mm.errors import ImageFetchError, ImageTooLargeError, UnsafeImageSourceError

__all__ = ["read_local_file"]

_CHUNK = 1 << 20


def read_local_file(path: Path, *, max_bytes: int, confined: bool) -> bytes:
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    flags |= getattr(os, "O_BINARY", 0)
    if confined:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise ImageFetchError("no such file") from None
    except IsADirectoryError:
        raise ImageFetchError("is a directory, not a file") from None
    except PermissionError:
        raise ImageFetchError("permission denied") from None
    except OSError as exc:  # ELOOP from O_NOFOLLOW, ENXIO from a socket, ...
        if confined and exc.errno == errno.ELOOP:
            raise UnsafeImageSourceError(
                "the path became a symlink after it was checked; not followed"
            ) from None
        raise ImageFetchError(f"cannot open ({exc.strerror or exc.__class__.__name__})") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise ImageFetchError("is a directory, not a file")
        if not stat.S_ISREG(info.st_mode):
            raise UnsafeImageSourceError(
                "not a regular file (a device, FIFO or socket); only regular files are read"
            )
        if info.st_size > max_bytes:
            raise ImageTooLargeError(f"file of {info.st_size} bytes is over max_bytes={max_bytes}")
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        total = 0
        while True:
            chunk = os.read(fd, min(_CHUNK, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:  # the file grew after fstat
                raise ImageTooLargeError(f"file is over max_bytes={max_bytes}")
        return b"".join(chunks)
    except OSError as exc:
        raise ImageFetchError(f"read failed ({exc.strerror or exc.__class__.__name__})") from None
    finally:
        os.close(fd)
