"""``source_key``: what identifies the image a source holds, found without decoding it.

A cache of processed images keyed only by ``image_hash`` (the pixels) must decode and
hash every image to look it up, which costs as much as most of the processing it saves.
A source key identifies the *source* instead, so a repeated source is recognised before
anything is read; the cache keeps ``image_hash`` as the content identity behind it (two
sources of the same pixels still share one processed entry).

What identifies each form of source (and why it is safe):

    ============================ ===============================================================
    source                       key
    ============================ ===============================================================
    ``data:`` URL                the whole URL string: the same characters decode to the same
                                 bytes (and a header change, e.g. the media type, is another
                                 key). Compared in full on a match, never by a digest alone.
    ``bytes``                    the bytes themselves, likewise (immutable)
    local path, ``file://``      the file, after the guard's path check: device, inode, size,
                                 mtime and ctime (ns). A rewrite changes mtime and ctime (ctime
                                 cannot be set back, unlike mtime), a replacement changes the
                                 inode. A file changed less than ``RACY_S`` seconds before it
                                 is looked at gets no key (as git treats a "racily clean"
                                 file): on a file system with coarse timestamps two versions
                                 written within one tick would otherwise look alike.
    ``http(s)://`` URL           none: what a URL serves can change at any time, so it is
                                 fetched again (the content cache still spares processing)
    PIL image, array             none: both are mutable in place (``putpixel``, ``ImageDraw``,
                                 numpy writes) and carry no version counter, and an ``id()`` is
                                 reused once the object is freed; identity could serve stale
                                 pixels, so they are found by their pixels every time
                                 (``image_hash``: ~0.45 ms for a 448x448 image, no decoding)
    bytearray, memoryview        none: mutable buffers, found by their pixels
    ============================ ===============================================================

A key is cheap whatever the payload's size: it hashes a fixed sample of the string or
bytes (its length, both ends and 256 evenly spaced characters), and equality compares
them in full (``memcmp``, ~20 us for 1 MB; the same object compares by identity). A
sample collision therefore costs a comparison, never a wrong image. Keys of strings and
bytes hold a reference to the source, not a copy; ``nbytes`` says what that keeps alive.

The guard's path check runs first, as ``load_image`` runs it: a path outside
``local_roots`` gets no key, so a cached entry is never a way around the policy. The
policy's other limits (bytes, pixels, formats) are checked when a source is loaded, so a
cache keys on the policy too (``vf_mm.renderers.ImageCache``'s users do): an entry filled
under a looser policy is never served under a stricter one.
"""

from __future__ import annotations

import os
import stat
import sys
import time
from typing import Any

from vf_mm.errors import ImageError
from vf_mm.images._guard import check_local_path, file_url_to_path
from vf_mm.images._policy import ImagePolicy
from vf_mm.images._source import Kind, classify

__all__ = ["RACY_S", "SourceKey", "source_key"]

#: A file changed this recently (mtime or ctime, seconds before the look-up) gets no key.
RACY_S = 2.0
_SAMPLES = 256
_ENDS = 1024
_SMALL = 4 * _ENDS
_DEFAULT_POLICY = ImagePolicy()


class SourceKey:
    """A hashable identity of one image source (see the module doc). ``kind``:
    ``"data_url"``, ``"bytes"`` or ``"file"``."""

    __slots__ = ("_hash", "kind", "value")

    def __init__(self, kind: str, value: Any) -> None:
        self.kind = kind
        self.value = value
        if isinstance(value, (str, bytes)) and len(value) > _SMALL:
            step = len(value) // _SAMPLES
            self._hash = hash((kind, len(value), value[:_ENDS], value[-_ENDS:], value[::step]))
        else:
            self._hash = hash((kind, value))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SourceKey):
            return NotImplemented
        return (
            self._hash == other._hash
            and self.kind == other.kind
            and (self.value is other.value or self.value == other.value)
        )

    @property
    def nbytes(self) -> int:
        """Memory the key keeps alive (its string or bytes; a file's key is small)."""
        return sys.getsizeof(self.value) if isinstance(self.value, (str, bytes)) else 64

    def __repr__(self) -> str:
        if isinstance(self.value, (str, bytes)):
            return f"SourceKey({self.kind}, {len(self.value)} {type(self.value).__name__})"
        return f"SourceKey({self.kind}, {self.value!r})"


def source_key(source: Any, *, policy: ImagePolicy | None = None) -> SourceKey | None:
    """The key of ``source``, or None when it has no identity cheaper than its pixels.

    None as well when ``load_image`` would refuse it: the guard runs first (a path outside
    ``policy.local_roots`` gets no key), and whatever is wrong with a source is
    ``load_image``'s to report, so this never raises for a source.

    Args:
        source: Any form ``load_image`` takes.
        policy: The policy ``load_image`` would apply (``ImagePolicy()`` when None).
    """
    try:
        return _key(source, _DEFAULT_POLICY if policy is None else policy)
    except (ImageError, OSError, ValueError):
        return None


def _key(source: Any, policy: ImagePolicy) -> SourceKey | None:
    found = classify(source)
    if found.kind is Kind.DATA_URL:
        return SourceKey("data_url", found.value)
    if found.kind is Kind.BYTES:
        return SourceKey("bytes", found.value) if type(found.value) is bytes else None
    if found.kind in (Kind.PATH, Kind.FILE_URL):
        path = file_url_to_path(found.value) if found.kind is Kind.FILE_URL else found.value
        info = os.stat(check_local_path(path, policy))  # the guard first: it may refuse
        if not stat.S_ISREG(info.st_mode):
            return None
        newest = max(info.st_mtime_ns, info.st_ctime_ns)
        if newest > time.time_ns() - int(RACY_S * 1e9):
            return None
        return SourceKey(
            "file",
            (info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns),
        )
    return None  # PIL, arrays, mutable buffers, http(s)
