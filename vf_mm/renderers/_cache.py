"""``ImageCache``: processed images and videos, shared by renderers, bounded in bytes.

Entries are keyed by content (for an image ``image_hash``, for a video ``video_mm_hash``,
each behind the processing namespace of the renderer that computed it: processor, its
configuration and call options, backend, tokenizer). *Aliases* lead to an entry from a
source key (``vf_mm.images.source_key``: a data URL's string, a file's identity), so a
repeated source skips decoding and hashing as well as processing; an alias dies with its
entry. Equal pixels from two sources share one entry; unequal pixels never do.

The bound is in bytes, not entries: a 448x448 image costs ~5 MB of ``pixel_values`` and
a large one ~80 MB, so a count bounds nothing. Each entry costs what its caller says
(the arrays' ``nbytes`` and the tokens), plus what its aliases keep alive (a data URL's
string); least recently used entries go first. An entry larger than the whole bound is
returned but not kept.

Thread-safe, and computing once: concurrent misses of one key (a group of rollouts
starting on the same prompt image) wait for the first caller's result instead of each
computing it (``compute``); a failed computation leaves the key free for the next caller.
Values are shared by every caller, so they must be immutable (the renderer makes every
array read-only before it is stored).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["DEFAULT_CACHE_BYTES", "ImageCache"]

#: 2 GiB: ~400 448x448 images of Qwen2.5-VL (pixel_values are float32, 4.8 MB each).
DEFAULT_CACHE_BYTES = 2 << 30
_ENTRY_OVERHEAD = 256  # bytes of bookkeeping counted for each entry and alias


class _Entry:
    __slots__ = ("aliases", "nbytes", "value")

    def __init__(self, value: Any, nbytes: int) -> None:
        self.value = value
        self.nbytes = nbytes
        self.aliases: list[Hashable] = []


class _Flight:
    __slots__ = ("lock", "users")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.users = 0


class ImageCache:
    """A byte-bounded LRU of processed images and videos, with source aliases.

    See the module doc.

    Args:
        max_bytes: The bound (``DEFAULT_CACHE_BYTES``); 0 keeps nothing.
    """

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 0:
            raise ValueError(f"ImageCache max_bytes must be an int >= 0, got {max_bytes!r}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        self._aliases: dict[Hashable, Hashable] = {}
        self._flights: dict[Hashable, _Flight] = {}
        self._lock = threading.Lock()
        self._nbytes = 0

    @property
    def nbytes(self) -> int:
        """Bytes held now (entries and their aliases), at most ``max_bytes``."""
        return self._nbytes

    def __len__(self) -> int:
        """Entries held (aliases not counted)."""
        return len(self._entries)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._entries or key in self._aliases

    def get(self, key: Hashable) -> Any | None:
        """The value under ``key``, marked recently used; None when absent.

        Args:
            key: An entry's key or an alias.
        """
        with self._lock:
            entry = self._entries.get(self._aliases.get(key, key))
            if entry is None:
                return None
            self._entries.move_to_end(self._aliases.get(key, key))
            return entry.value

    def put(self, key: Hashable, value: Any, nbytes: int) -> Any:
        """Store ``value`` under ``key`` and return the value now held there.

        An entry already present is kept and returned (first writer wins, so every caller
        shares one object).

        Args:
            key: The entry's key.
            value: The value.
            nbytes: What it costs against the bound.
        """
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                return entry.value
            cost = nbytes + _ENTRY_OVERHEAD
            if cost > self.max_bytes:
                return value
            self._entries[key] = _Entry(value, cost)
            self._nbytes += cost
            self._evict()
            return value

    def alias(self, alias: Hashable, key: Hashable, nbytes: int = 0) -> bool:
        """Lead ``alias`` to the entry under ``key``; False when that entry is gone (evicted).

        Args:
            alias: The alias (a source key).
            key: The entry's key.
            nbytes: What the alias keeps alive, counted with the entry.
        """
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return False
            if alias in self._aliases:
                return self._aliases[alias] == key
            cost = nbytes + _ENTRY_OVERHEAD
            self._aliases[alias] = key
            entry.aliases.append(alias)
            entry.nbytes += cost
            self._nbytes += cost
            self._evict()
            return True

    def compute(self, key: Hashable, compute: Callable[[], tuple[Any, int]]) -> tuple[Any, bool]:
        """The value under ``key``, or ``compute()``'s, stored; and whether it was computed here.

        One caller computes a key at a time: the others wait, then find its result (or, when it
        failed, compute it themselves).

        Args:
            key: The entry's key.
            compute: Makes the value: returns a ``(value, nbytes)`` pair.
        """
        hit = self.get(key)
        if hit is not None:
            return hit, False
        with self.computing(key):
            hit = self.get(key)
            if hit is not None:
                return hit, False
            value, nbytes = compute()
            return self.put(key, value, nbytes), True

    @contextmanager
    def computing(self, key: Hashable) -> Iterator[None]:
        """Hold ``key``'s computing lock: one holder per key at a time, the others wait.

        Args:
            key: The entry's key.
        """
        with self._lock:
            flight = self._flights.get(key)
            if flight is None:
                flight = self._flights[key] = _Flight()
            flight.users += 1
        try:
            with flight.lock:
                yield
        finally:
            with self._lock:
                flight.users -= 1
                if not flight.users:
                    del self._flights[key]

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._aliases.clear()
            self._nbytes = 0

    def _evict(self) -> None:
        while self._nbytes > self.max_bytes and self._entries:
            _, entry = self._entries.popitem(last=False)
            self._nbytes -= entry.nbytes
            for alias in entry.aliases:
                self._aliases.pop(alias, None)

    def __repr__(self) -> str:
        return (
            f"ImageCache({len(self._entries)} entries, {len(self._aliases)} aliases, "
            f"{self._nbytes} of {self.max_bytes} bytes)"
        )
