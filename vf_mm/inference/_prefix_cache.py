"""The local backend's prefix cache: model state by token prefix (``PrefixCache``), and
``ByteLRU``, the map bounded in bytes under it and under the vision cache.

``PrefixCache`` keeps what a finished request left behind (its KV tensors over its
prompt and completion) under the token ids it covers, and finds, for a new prompt, the
entry that shares the longest prefix with it, as vLLM's automatic prefix caching does:
the backend never learns which rollout a request belongs to, so the token prefix is
the only key. Images are part of the key: a prompt's token ids hold only pad tokens
where an image sits, so every 16-token block's key chains the previous block's key,
the block's token ids and the key of every image whose placeholder overlaps the block
(vLLM puts ``mm_hashes`` into its block hashes the same way). Two prompts with equal
ids but different images share no block past the first image.

A lookup walks the prompt's block keys through an index (key -> entries holding that
block), then extends the match token by token into the next, partial block, and
checks the result against the entry itself (its ids and its images), so a hash
collision costs a miss, never a wrong answer. A match never ends inside an image: the
new part of a prompt always holds whole images, which the vision tower encodes whole.

``ByteLRU`` bounds each cache in bytes: the least recently used entries go first. One
``ByteLRU`` under the prefix index holds the entries; another (``VisionCache``) keeps the
vision tower's output per image (keyed by modality, content hash and input shapes), so a
turn runs the tower on its new images only, even after its KV entry was evicted.

Entries are immutable: a request copies what it reuses, and a new entry that extends
the one it started from replaces it (the old one is a prefix of the new, and every
lookup that would reach it reaches the new one as far). ``on_drop`` hears of every
entry that leaves the cache (evicted, replaced, dropped, cleared): the pool engine's
entries hold ranges of its KV arena, which must be given back.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

BLOCK = 16  # tokens per block key (vLLM's default block size)


@dataclass(frozen=True, slots=True)
class MediaSpan:
    """One image's (or clip's) placeholder in a prompt: ``token_ids[offset:end]``, and the
    key that names its content (modality, content hash, input shapes)."""

    offset: int
    end: int
    key: str


class ByteLRU:
    """A mapping bounded in bytes: ``put`` evicts the least recently used entries until
    the new one fits; one larger than the whole budget is not kept. ``get`` refreshes."""

    def __init__(
        self, max_bytes: int, *, on_evict: Callable[[Hashable, Any], None] | None = None
    ) -> None:
        if max_bytes < 0:
            raise ValueError(f"a cache budget must be >= 0 bytes, got {max_bytes}")
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._items: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._on_evict = on_evict  # told of each entry ``put`` evicts to make room

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._items

    def get(self, key: Hashable) -> Any:
        found = self._items.get(key)
        if found is None:
            return None
        self._items.move_to_end(key)
        return found[0]

    def peek(self, key: Hashable) -> Any:
        """The value, without making it recently used."""
        found = self._items.get(key)
        return None if found is None else found[0]

    def put(self, key: Hashable, value: Any, nbytes: int) -> list[Hashable]:
        """Keep ``value`` under ``key``; returns the keys evicted to make room (``key``
        itself when the value alone is over the budget)."""
        self.pop(key)
        if nbytes > self.max_bytes:
            return [key]
        evicted = []
        while self.nbytes + nbytes > self.max_bytes and self._items:
            old, (old_value, size) = self._items.popitem(last=False)
            self.nbytes -= size
            evicted.append(old)
            if self._on_evict is not None:
                self._on_evict(old, old_value)
        self._items[key] = (value, nbytes)
        self.nbytes += nbytes
        return evicted

    def pop(self, key: Hashable) -> Any:
        found = self._items.pop(key, None)
        if found is None:
            return None
        self.nbytes -= found[1]
        return found[0]

    def __iter__(self) -> Iterator[Hashable]:
        """The keys, least recently used first."""
        return iter(self._items)

    def oldest(self, *, but: Hashable = None) -> Hashable:
        """The least recently used key other than ``but`` (None when there is none)."""
        for key in self._items:
            if key != but:
                return key
        return None

    def clear(self) -> None:
        self._items.clear()
        self.nbytes = 0


@dataclass(slots=True)
class Entry:
    """What one finished request left: ``state`` over ``token_ids`` (with the images of
    ``spans``). ``exact``: the state holds exactly ``len(token_ids)`` tokens and cannot
    be cut back to a shorter prefix (a recurrent state); otherwise any prefix of it is
    usable."""

    id: int
    token_ids: list[int]
    spans: tuple[MediaSpan, ...]
    state: Any
    exact: bool = False
    reach: Any = None  # M-RoPE: the highest position of its first t + 1 tokens, per t


@dataclass(frozen=True, slots=True)
class Match:
    """A lookup's answer: ``entry``'s state reused over the prompt's first ``length``
    tokens (``entry`` None and ``length`` 0 on a miss)."""

    entry: Entry | None
    length: int


class PrefixCache:
    """Entries by token prefix, bounded in bytes; see the module docstring."""

    def __init__(self, max_bytes: int, *, on_drop: Callable[[Entry], None] | None = None) -> None:
        self._on_drop = on_drop
        self._lru = ByteLRU(max_bytes, on_evict=self._evicted)
        self._index: dict[int, dict[int, None]] = {}  # block key -> entry ids, oldest first
        self._blocks: dict[int, list[int]] = {}  # entry id -> its block keys
        self._next_id = 0

    @property
    def nbytes(self) -> int:
        return self._lru.nbytes

    @property
    def max_bytes(self) -> int:
        return self._lru.max_bytes

    def __len__(self) -> int:
        return len(self._lru)

    def lookup(self, token_ids: Sequence[int], spans: Sequence[MediaSpan], *, limit: int) -> Match:
        """The entry sharing the longest usable prefix with ``token_ids`` (whose images are
        ``spans``), reusing at most ``limit`` tokens (a prompt's last token is always
        computed: its logits start the completion)."""
        candidates: list[int] = []
        matched_blocks = 0
        for key in block_keys(token_ids, spans):
            ids = self._index.get(key)
            if not ids:
                break
            candidates = list(ids)
            matched_blocks += 1
        best = Match(None, 0)
        for entry_id in reversed(candidates):  # the most recently stored first
            entry = self._lru.peek(entry_id)
            length = _usable(entry, token_ids, spans, matched_blocks * BLOCK, limit)
            if length > best.length:
                best = Match(entry, length)
        if best.entry is not None:
            self._lru.get(best.entry.id)  # recently used
        return best

    def insert(
        self,
        token_ids: list[int],
        spans: Sequence[MediaSpan],
        state: Any,
        nbytes: int,
        *,
        exact: bool = False,
        replaces: Entry | None = None,
        reach: Any = None,
    ) -> None:
        """Keep ``state`` (``nbytes`` big) over ``token_ids``. ``replaces``: the entry this
        request started from, dropped when the new entry covers all of it (it is then
        redundant). ``reach``: kept with the entry for the requests that reuse it."""
        if replaces is not None and _covers(token_ids, spans, replaces):
            self._drop(replaces.id)
        entry = Entry(self._next_id, list(token_ids), tuple(spans), state, exact, reach)
        self._next_id += 1
        self._lru.put(entry.id, entry, nbytes)  # evictions: _evicted
        if entry.id not in self._lru:  # larger than the whole budget
            if self._on_drop is not None:
                self._on_drop(entry)
            return
        keys = block_keys(entry.token_ids, entry.spans)
        self._blocks[entry.id] = keys
        for key in keys:
            self._index.setdefault(key, {})[entry.id] = None

    def clear(self) -> None:
        if self._on_drop is not None:
            for key in list(self._lru):
                self._on_drop(self._lru.peek(key))
        self._lru.clear()
        self._index.clear()
        self._blocks.clear()

    def drop(self, entry: Entry) -> None:
        """Forget ``entry`` (a request took what it needed of it)."""
        self._drop(entry.id)

    def evict_one(self, *, keep: Entry | None = None) -> bool:
        """Drop the least recently used entry other than ``keep``; False when none is
        left to drop."""
        key = self._lru.oldest(but=None if keep is None else keep.id)
        if key is None:
            return False
        self._drop(key)  # type: ignore[arg-type]
        return True

    def _drop(self, entry_id: int) -> None:
        entry = self._lru.pop(entry_id)
        if entry is not None:
            self._unindex(entry_id)
            if self._on_drop is not None:
                self._on_drop(entry)

    def _evicted(self, entry_id: Hashable, entry: Entry) -> None:
        self._unindex(entry_id)  # type: ignore[arg-type]
        if self._on_drop is not None:
            self._on_drop(entry)

    def _unindex(self, entry_id: int) -> None:
        for key in self._blocks.pop(entry_id, ()):
            ids = self._index.get(key)
            if ids is not None:
                ids.pop(entry_id, None)
                if not ids:
                    del self._index[key]


def block_keys(token_ids: Sequence[int], spans: Sequence[MediaSpan]) -> list[int]:
    """The chained key of every full block of ``token_ids``: the previous block's key, the
    block's ids and the keys of the images overlapping it."""
    keys = []
    previous = 0
    ordered = sorted(spans, key=lambda s: s.offset)
    first = 0  # the first span that does not end before the current block
    for start in range(0, len(token_ids) - BLOCK + 1, BLOCK):
        end = start + BLOCK
        while first < len(ordered) and ordered[first].end <= start:
            first += 1
        media = []
        i = first
        while i < len(ordered) and ordered[i].offset < end:
            media.append(ordered[i].key)
            i += 1
        previous = hash((previous, tuple(token_ids[start:end]), tuple(media)))
        keys.append(previous)
    return keys


def _usable(
    entry: Entry, token_ids: Sequence[int], spans: Sequence[MediaSpan], start: int, limit: int
) -> int:
    """How many of ``token_ids``' first tokens ``entry`` can stand in for: the common
    prefix (checked in full: block keys are hashes), cut before the first image the two
    disagree on and before any image the prefix would end inside, at most ``limit``;
    for an exact entry, its whole length or nothing."""
    stored = entry.token_ids
    n = min(len(stored), len(token_ids), limit)
    start = min(start, n)
    if stored[:start] != list(token_ids[:start]):
        start = 0  # a block key collision: compare from the beginning
    length = start
    while length < n and stored[length] == token_ids[length]:
        length += 1
    theirs = {(s.offset, s.end): s.key for s in entry.spans if s.offset < length}
    for span in sorted(spans, key=lambda s: s.offset):
        if span.offset >= length:
            break
        if span.end > length or theirs.pop((span.offset, span.end), None) != span.key:
            length = span.offset
            break
    for offset, _ in theirs:  # an image of the entry's that the prompt does not have there
        length = min(length, offset)
    if entry.exact and length != len(stored):
        return 0
    return length


def _covers(token_ids: Sequence[int], spans: Sequence[MediaSpan], entry: Entry) -> bool:
    """Whether a sequence starts with all of ``entry`` (ids and images)."""
    n = len(entry.token_ids)
    if len(token_ids) < n or list(token_ids[:n]) != entry.token_ids:
        return False
    ours = {(s.offset, s.end, s.key) for s in spans if s.offset < n}
    return ours == {(s.offset, s.end, s.key) for s in entry.spans}
