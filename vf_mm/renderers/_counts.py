"""``CountedLists``: the embedding-token counts of the token lists a renderer returned.

A bridge must know how many embedding tokens (image pads, video pads, ...) the previous
prompt holds, to check them against its multi-modal data. Scanning the whole prompt
each turn makes turn 200 cost a hundred times turn 2; but the previous prompt is almost
always a list this renderer returned (a render's or bridge's ``token_ids``), whose
counts were known when it was made. So those lists are remembered with their counts,
and found again by identity: the very same list object, still of the length it had,
never an equal list or a list that happens to reuse a freed object's address (each
entry holds its list, and keys compare by ``is``). Entries are dropped least recently
used past ``COUNTED_TOKENS`` tokens in all; a dropped list is scanned again when bridged
onto, nothing else changes.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence

#: the total length of the lists remembered at once
COUNTED_TOKENS = 1 << 20

#: embedding tokens per token group (the ids that share one count)
Counts = dict[tuple[int, ...], int]


class _Same:
    """A key equal only to a key of the very same object; it holds that object, so the
    object cannot be freed (and its address reused) while the key lives."""

    __slots__ = ("obj",)

    def __init__(self, obj: list[int]) -> None:
        self.obj = obj

    def __hash__(self) -> int:
        return id(self.obj)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.obj is self.obj


class CountedLists:
    """Token lists and their counts, by identity, bounded in tokens. Thread-safe."""

    def __init__(self, *, max_tokens: int = COUNTED_TOKENS) -> None:
        self._entries: OrderedDict[_Same, tuple[int, Counts]] = OrderedDict()
        self._tokens = 0
        self._max_tokens = max_tokens
        self._lock = threading.Lock()

    def get(self, ids: Sequence[int]) -> Counts | None:
        """The counts remembered for this very list, if it still has the length it had
        then; None for any other sequence (it must be scanned)."""
        if not isinstance(ids, list):
            return None
        key = _Same(ids)
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry[0] != len(ids):
                return None
            self._entries.move_to_end(key)
            return entry[1]

    def remember(self, ids: list[int], counts: Counts) -> None:
        """Keep ``ids``'s counts (a list longer than the bound is not kept)."""
        if len(ids) > self._max_tokens:
            return
        key = _Same(ids)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._tokens -= old[0]
            self._entries[key] = (len(ids), counts)
            self._tokens += len(ids)
            while self._tokens > self._max_tokens:
                _, (length, _) = self._entries.popitem(last=False)
                self._tokens -= length
