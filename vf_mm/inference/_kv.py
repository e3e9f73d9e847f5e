"""The running batch's KV tensors: rows that started from different cached lengths.

Each row of a batch is one request: its cached prefix (from the prefix cache), the new
part of its prompt, then its sampled tokens. Rows differ in every one of these lengths,
so ``BatchKV`` holds them in one ``(rows, heads, columns, dim)`` tensor per layer
with padding columns wherever a row has nothing, and an attention mask (1 on a row's
real tokens) that the model's own mask builder turns into causal attention over each
row's real tokens only. A row's layout is ``[pad][cached prefix][pad][new tokens]``
then its sampled tokens; positions (RoPE) are passed explicitly per token, so a pad
column shifts nothing. Pad columns hold zeros (masked keys must hold finite values:
a masked NaN still poisons the softmax's weighted sum).

``GrowLayer`` is the per-layer store behind the model's ``Cache`` interface: it writes
new columns into spare capacity instead of concatenating (a ``DynamicLayer`` copies the
whole layer at every decode step), and grows by doubling. A linear-attention layer
(Qwen3.5's Gated DeltaNet) keeps no columns but a state per row (its convolution's last
inputs and its recurrent matrix): ``StateLayer`` holds them, rows stacked. A state
belongs to exactly the tokens fed so far, so such rows are prefilled one per forward
(a pad token fed through the recurrence would change it), and a finished row's state is
read out before it is fed anything else.

Rows join (``merge``: the narrower side gets more left padding), leave (``select``:
the kept rows, and only the columns some kept row still uses) and are read back out
(``row``: a finished request's real columns, contiguous, for the prefix cache).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

try:  # the cache layer of linear-attention models (transformers 5.23 has it)
    from transformers.cache_utils import LinearAttentionLayer

    LINEAR_STATES = True
except ImportError:  # without it, linear-attention models are re-encoded (LocalBackend)
    LinearAttentionLayer = object  # type: ignore[assignment,misc]
    LINEAR_STATES = False


@dataclass(slots=True)
class RowKV:
    """One sequence's model state after ``length`` tokens: per layer ``(keys, values)``,
    each ``(1, heads, length, dim)``, or for a linear-attention layer (index in
    ``linear``) its ``(conv state, recurrent state)``, each for one row. With any such
    layer the state is ``exact``: it stands for its whole length only."""

    layers: list[tuple[torch.Tensor, torch.Tensor]]
    length: int
    linear: frozenset[int] = frozenset()

    @property
    def exact(self) -> bool:
        return bool(self.linear)

    @property
    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size()
                   for k, v in self.layers)  # fmt: skip

    def prefix(self, length: int) -> RowKV:
        """The first ``length`` tokens' tensors (views, no copy)."""
        if length == self.length:
            return self
        if self.exact:
            raise ValueError(f"a recurrent state of {self.length} tokens has no shorter prefix")
        return RowKV([(k[:, :, :length], v[:, :, :length]) for k, v in self.layers], length)


class GrowLayer(DynamicLayer):
    """A full-attention layer's KV for a batch, written into spare capacity. ``reserve``:
    columns kept free beyond what an update needs, when the store has to grow."""

    def __init__(self, reserve: int = 0) -> None:
        super().__init__()
        self.reserve = reserve
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._n = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.is_initialized = True

    def allocate(
        self, keys: torch.Tensor, values: torch.Tensor, rows: int, columns: int, room: int
    ) -> None:
        """A store of ``rows`` rows and ``columns`` columns, all zeros (to be written), with
        room for ``room`` more; heads, dim and dtype as ``keys`` / ``values``."""
        self.lazy_initialization(keys, values)
        self._k = keys.new_zeros((rows, keys.shape[1], columns + room, keys.shape[-1]))
        self._v = values.new_zeros((rows, values.shape[1], columns + room, values.shape[-1]))
        self._set(columns)

    def place(self, row: slice | int, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Write ``keys`` / ``values`` into ``row`` (one row or a slice of rows), right-aligned
        at the store's width."""
        assert self._k is not None and self._v is not None
        n = keys.shape[-2]
        self._k[row, :, self._n - n : self._n] = keys
        self._v[row, :, self._n - n : self._n] = values

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, s = self._n, key_states.shape[-2]
        if self._k is None or n + s > self._k.shape[-2]:
            self._grow(n + s, key_states, value_states)
        assert self._k is not None and self._v is not None
        self._k[:, :, n : n + s] = key_states
        self._v[:, :, n : n + s] = value_states
        self._set(n + s)
        assert self.keys is not None and self.values is not None  # _set made them views
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self._n

    def columns(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values over the columns in use."""
        assert self.keys is not None and self.values is not None
        return self.keys, self.values

    def _grow(self, need: int, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        old = 0 if self._k is None else self._k.shape[-2]
        size = max(need + self.reserve, 2 * old)
        k = key_states.new_empty((*key_states.shape[:2], size, key_states.shape[-1]))
        v = value_states.new_empty((*value_states.shape[:2], size, value_states.shape[-1]))
        if self._k is not None and self._v is not None and self._n:
            k[:, :, : self._n] = self._k[:, :, : self._n]
            v[:, :, : self._n] = self._v[:, :, : self._n]
        self._k, self._v = k, v

    def _set(self, n: int) -> None:
        assert self._k is not None and self._v is not None
        self._n = n
        self.keys = self._k[:, :, :n]
        self.values = self._v[:, :, :n]


class StateLayer(LinearAttentionLayer):
    """A linear-attention layer's state for a batch: one conv state and one recurrent
    state per row, stacked; the model updates them in place as it feeds tokens."""

    def load(self, conv: torch.Tensor, recurrent: torch.Tensor) -> None:
        """Start from these states (``(rows, ...)`` each), as if those rows' tokens had
        been fed already."""
        self.lazy_initialization(conv_states=conv, recurrent_states=recurrent)
        self.conv_states[0] = conv.clone()
        self.recurrent_states[0] = recurrent.clone()
        self.has_previous_state[0] = True

    @property
    def ready(self) -> bool:
        return bool(self.has_previous_state[0])

    def states(self) -> tuple[torch.Tensor, torch.Tensor]:
        conv, recurrent = self.conv_states[0], self.recurrent_states[0]
        assert conv is not None and recurrent is not None
        return conv, recurrent


Layer = GrowLayer | StateLayer


class BatchKV:
    """The KV store of a running batch and its ``(rows, columns)`` attention mask."""

    def __init__(
        self, layers: list[Layer], mask: torch.Tensor, linear: frozenset[int] = frozenset()
    ) -> None:
        self.layers = layers
        self.linear = linear
        self.cache = _Cache(list(layers))
        self.mask = mask

    @property
    def rows(self) -> int:
        return self.mask.shape[0]

    @property
    def width(self) -> int:
        return self.mask.shape[1]

    @classmethod
    def start(
        cls,
        prefixes: Sequence[RowKV | None],
        *,
        num_layers: int,
        device: torch.device | str,
        new: int,
        reserve: int,
        linear: frozenset[int] = frozenset(),
    ) -> BatchKV:
        """A batch whose rows start from ``prefixes`` (None: nothing cached), each
        right-aligned at a common width: the ``new`` columns of the prefill go right
        after, then ``reserve`` more (decoding) fit without growing. With ``linear``
        layers, either every row has a prefix or none has."""
        width = max((p.length for p in prefixes if p is not None), default=0)
        mask = torch.zeros((len(prefixes), width), dtype=torch.long, device=device)
        layers: list[Layer] = [
            StateLayer() if i in linear else GrowLayer(reserve) for i in range(num_layers)
        ]
        if width == 0:
            return cls(layers, mask, linear)
        if linear and any(p is None for p in prefixes):
            raise ValueError("rows with recurrent state start all from a prefix or all without")
        for r, p in enumerate(prefixes):
            if p is not None:
                mask[r, width - p.length :] = 1
        some = next(p for p in prefixes if p is not None and p.length)
        for i, layer in enumerate(layers):
            if isinstance(layer, StateLayer):
                states = [p.layers[i] for p in prefixes if p is not None]
                layer.load(torch.cat([c for c, _ in states]), torch.cat([s for _, s in states]))
                continue
            layer.allocate(*some.layers[i], len(prefixes), width, new + reserve)
            for r, p in enumerate(prefixes):
                if p is not None and p.length:
                    layer.place(r, *p.layers[i])
        return cls(layers, mask, linear)

    def extend_mask(self, columns: torch.Tensor) -> None:
        """Record the columns a forward just appended (``(rows, n)``, 1 on real tokens)."""
        self.mask = torch.cat([self.mask, columns.to(self.mask.dtype)], dim=1)

    def merge(self, other: BatchKV, *, reserve: int) -> BatchKV:
        """One batch holding this batch's rows then ``other``'s."""
        width = max(self.width, other.width)
        mask = torch.cat([_left_pad(self.mask, width), _left_pad(other.mask, width)])
        layers: list[Layer] = []
        split = self.rows
        for a, b in zip(self.layers, other.layers, strict=True):
            if isinstance(a, StateLayer) and isinstance(b, StateLayer):
                (ca, ra), (cb, rb) = a.states(), b.states()
                state = StateLayer()
                state.load(torch.cat([ca, cb]), torch.cat([ra, rb]))
                layers.append(state)
                continue
            assert isinstance(a, GrowLayer) and isinstance(b, GrowLayer)
            layer = GrowLayer(reserve)
            if a.is_initialized and b.is_initialized:
                (ka, va), (kb, vb) = a.columns(), b.columns()
                layer.allocate(ka, va, split + other.rows, width, reserve)
                layer.place(slice(0, split), ka, va)
                layer.place(slice(split, None), kb, vb)
            layers.append(layer)
        return BatchKV(layers, mask, self.linear)

    def select(self, rows: Sequence[int], *, reserve: int) -> BatchKV:
        """A batch of ``rows`` only, without the columns none of them uses."""
        index = torch.tensor(list(rows), dtype=torch.long, device=self.mask.device)
        mask = self.mask.index_select(0, index)
        used = mask.any(dim=0)
        columns = None if bool(used.all()) else used.nonzero().squeeze(1)
        if columns is not None:
            mask = mask.index_select(1, columns)
        layers: list[Layer] = []
        for old in self.layers:
            if isinstance(old, StateLayer):
                conv, recurrent = old.states()
                state = StateLayer()
                state.load(conv.index_select(0, index), recurrent.index_select(0, index))
                layers.append(state)
                continue
            layer = GrowLayer(reserve)
            if old.is_initialized:
                keys, values = old.columns()
                keys, values = keys.index_select(0, index), values.index_select(0, index)
                if columns is not None:
                    keys, values = keys.index_select(2, columns), values.index_select(2, columns)
                layer.allocate(keys, values, len(index), keys.shape[-2], reserve)
                layer.place(slice(None), keys, values)
            layers.append(layer)
        return BatchKV(layers, mask, self.linear)

    def row(self, r: int) -> RowKV:
        """Row ``r``'s state: its real columns, as contiguous tensors of their own, and
        its recurrent states as they are now."""
        columns = self.mask[r].nonzero().squeeze(1)
        layers = []
        for layer in self.layers:
            if isinstance(layer, StateLayer):
                conv, recurrent = layer.states()
                layers.append((conv[r : r + 1].clone(), recurrent[r : r + 1].clone()))
                continue
            keys, values = layer.columns()
            layers.append(
                (
                    keys[r : r + 1].index_select(2, columns),
                    values[r : r + 1].index_select(2, columns),
                )
            )
        return RowKV(layers, int(columns.numel()), self.linear)


class _Cache(DynamicCache):
    """A ``DynamicCache`` (what the models expect) over given layers."""

    def __init__(self, layers: list[Layer]) -> None:
        Cache.__init__(self, layers=list(layers))


def _left_pad(t: torch.Tensor, width: int, *, dim: int = 1) -> torch.Tensor:
    missing = width - t.shape[dim]
    if missing == 0:
        return t
    shape = list(t.shape)
    shape[dim] = missing
    return torch.cat([t.new_zeros(shape), t], dim=dim)
