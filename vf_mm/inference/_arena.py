"""One preallocated KV store for every layer: the memory of the local backend's pool engine.

``KVArena`` holds the keys and values of every sequence the engine runs or caches in one
tensor, ``(layers, 2, capacity + 1, kv_heads, head_dim)``, allocated once: GPU memory is
bounded by its size (a flag), never grows while requests run, and a forward's shapes do
not depend on how long the histories are (what lets a decode step be one CUDA graph).
A sequence owns a contiguous range of token slots, ``[start, start + reserved)``, taken
when it is admitted for its whole prompt and ``max_tokens`` (so a running request never
runs out of room); slot ``capacity`` is scratch that padding tokens write into.

Ranges are taken first-fit from a list of free intervals, merged with their neighbours
when given back. Reusing a cached prefix copies its slots into the new range (one copy
over every layer: about a millisecond for 30 MB a row on a GPU) instead of sharing them,
so ranges never alias and a range's owner may write anywhere in it.
"""

from __future__ import annotations

import bisect

import torch

# ranges are whole multiples of this many tokens: fewer, larger holes
GRAIN = 16


class KVArena:
    """Keys and values of ``capacity`` tokens for ``layers`` layers, and who owns which."""

    def __init__(
        self,
        *,
        layers: int,
        kv_heads: int,
        head_dim: int,
        capacity: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        if capacity < GRAIN:
            raise ValueError(f"a KV arena needs room for at least {GRAIN} tokens, got {capacity}")
        self.capacity = capacity // GRAIN * GRAIN
        # zeros: a key nobody wrote must still be finite (a masked NaN poisons a softmax)
        self.storage = torch.zeros(
            (layers, 2, self.capacity + 1, kv_heads, head_dim), dtype=dtype, device=device
        )
        self.scratch = self.capacity
        self.token_bytes = layers * 2 * kv_heads * head_dim * self.storage.element_size()
        self._starts: list[int] = [0]  # free intervals, sorted by start
        self._lengths: list[int] = [self.capacity]

    @staticmethod
    def tokens_for(nbytes: int, token_bytes: int) -> int:
        """How many tokens ``nbytes`` holds at ``token_bytes`` a token."""
        return nbytes // max(1, token_bytes)

    @property
    def nbytes(self) -> int:
        return self.storage.numel() * self.storage.element_size()

    @property
    def free_tokens(self) -> int:
        return sum(self._lengths)

    @property
    def largest_free(self) -> int:
        return max(self._lengths, default=0)

    def layer(self, index: int) -> torch.Tensor:
        """Layer ``index``'s ``(2, capacity + 1, kv_heads, head_dim)`` keys and values."""
        return self.storage[index]

    def alloc(self, tokens: int) -> int | None:
        """The start of a free range of at least ``tokens`` slots (rounded up to
        ``GRAIN``), now owned by the caller; None when no free interval is that long."""
        size = _round(tokens)
        for i, length in enumerate(self._lengths):
            if length >= size:
                start = self._starts[i]
                if length == size:
                    del self._starts[i], self._lengths[i]
                else:
                    self._starts[i] += size
                    self._lengths[i] -= size
                return start
        return None

    def free(self, start: int, tokens: int) -> None:
        """Give back the range ``alloc`` returned for ``tokens`` (or what ``shrink`` left)."""
        size = _round(tokens)
        if size == 0:
            return
        i = bisect.bisect_left(self._starts, start)
        if i > 0 and self._starts[i - 1] + self._lengths[i - 1] > start:
            raise ValueError(f"range at {start} overlaps a free one: freed twice?")
        if i < len(self._starts) and start + size > self._starts[i]:
            raise ValueError(f"range at {start} overlaps a free one: freed twice?")
        self._starts.insert(i, start)
        self._lengths.insert(i, size)
        if i + 1 < len(self._starts) and start + size == self._starts[i + 1]:  # merge right
            self._lengths[i] += self._lengths.pop(i + 1)
            self._starts.pop(i + 1)
        if i > 0 and self._starts[i - 1] + self._lengths[i - 1] == start:  # merge left
            self._lengths[i - 1] += self._lengths.pop(i)
            self._starts.pop(i)

    def shrink(self, start: int, tokens: int, keep: int) -> None:
        """Keep the first ``keep`` tokens of the range ``[start, start + tokens)``, give
        back the rest."""
        kept = _round(keep)
        if kept < _round(tokens):
            self.free(start + kept, _round(tokens) - kept)

    def copy(self, src: int, dst: int, tokens: int) -> None:
        """Copy ``tokens`` slots of every layer from ``src`` to ``dst`` (on the device's
        stream: ordered before any later forward)."""
        if tokens:
            self.storage[:, :, dst : dst + tokens] = self.storage[:, :, src : src + tokens]

    def release(self) -> None:
        """Give the memory back (the arena is not used again)."""
        self.storage = self.storage.new_empty((0,))
        self._starts, self._lengths = [], []


def _round(tokens: int) -> int:
    return -(-tokens // GRAIN) * GRAIN
