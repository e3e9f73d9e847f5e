"""The local backend's pool engine: continuous batching over a preallocated KV arena.

What the batch engine (``_kv.BatchKV``) does with padded tensors that are rebuilt as
rows come and go, this engine does with fixed memory:

- **Admission.** A request takes a contiguous range of the ``KVArena`` for its prompt
  and ``max_tokens`` (least recently used prefix-cache entries are evicted to make
  room). Its cached prefix, if any, is copied into the range; an entry the prompt
  extends whole is dropped then (the new row will leave a longer one). A request that
  does not fit waits until running rows finish; one that could never fit (more than the
  whole arena) fails alone with ``BackendOutOfMemoryError``.
- **Prefill.** The new tokens of every admitted row go through the model as one packed
  stream (``_packed``), with the vision tower's outputs for their new images; each row
  samples its first token. On CUDA a stream of up to ``prefill_tokens`` runs its text
  stack as a CUDA graph (``PrefillStep``), padded up to a token bucket by one more
  sequence that only the scratch slot sees; a longer one runs eagerly, unpadded.
- **Decode.** Every running row feeds its last token; ``DecodeStep`` replays a CUDA graph
  of the whole step, sampling included, for the batch's size bucket. The only host sync
  is reading the sampled tokens back (one small copy a step).
- **Retirement.** A finished row is answered at once; its range, cut to what it wrote
  (prompt and completion but the last token), becomes a prefix-cache entry, given back
  to the arena when the entry is evicted or replaced.

Rows join and leave between any two steps at no cost: nothing is copied or re-laid out,
a step's inputs are each row's token, position and range. When rows are admitted, and
how long a request waits to join, is the ``Scheduler``'s admission loop, the same as for
the batch engine; this engine is a ``RowEngine``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from vf_mm.errors import BackendOutOfMemoryError
from vf_mm.inference._arena import KVArena
from vf_mm.inference._local_model import LocalModel
from vf_mm.inference._packed import (
    DecodeStep,
    Launched,
    PackedModel,
    PackedStep,
    flash_available,
)
from vf_mm.inference._prefill_step import PrefillStep
from vf_mm.inference._prefix_cache import Entry, Match
from vf_mm.inference._rows import Pending, Row, answer, result, take
from vf_mm.inference._sampling import sample_packed, uses_filters
from vf_mm.inference._scheduler import RowParts

# most new tokens one packed prefill forward takes (its activations grow with them)
PREFILL_TOKENS = 16384


@dataclass(frozen=True, slots=True)
class ArenaRange:
    """A prefix-cache entry's state in the pool engine: ``length`` tokens' keys and
    values from arena slot ``start`` on."""

    start: int
    length: int


@dataclass(slots=True)
class _Flight:
    """A launched decode step and its rows, in its order."""

    rows: list[Row]
    launched: Launched


def pool_arena(model: LocalModel, packed: PackedModel, *, pool_bytes: int) -> KVArena:
    """The pool engine's ``KVArena`` for ``model``: as many tokens' keys and values of
    every layer as ``pool_bytes`` holds."""
    dtype = model.dtype
    token_bytes = packed.layers * 2 * packed.kv_heads * packed.head_dim * dtype.itemsize
    return KVArena(
        layers=packed.layers,
        kv_heads=packed.kv_heads,
        head_dim=packed.head_dim,
        capacity=KVArena.tokens_for(pool_bytes, token_bytes),
        dtype=dtype,
        device=model.device,
    )


def entry_release(arena: KVArena) -> Callable[[Entry], None]:
    """The prefix cache's ``on_drop`` over ``arena``: an entry that leaves the cache
    gives its range back."""

    def dropped(entry: Entry) -> None:
        state: ArenaRange = entry.state
        arena.free(state.start, state.length)

    return dropped


class PoolEngine:
    """Runs rows of ``parts.model`` (``packed`` for packed forwards) over ``arena``
    (module docstring): a ``RowEngine``, driven by the ``Scheduler``'s admission loop.
    Finished rows' ranges become entries of ``parts.prefix``, whose ``on_drop`` must be
    ``entry_release(arena)``. ``max_batch``: the most rows a decode step holds;
    ``graphs``: capture decode steps as CUDA graphs (CUDA only); ``prefill_tokens``:
    prefills of at most this many new tokens run their text stack from fixed buffers
    (``PrefillStep``), replayed as CUDA graphs with ``graphs`` on CUDA (0: every prefill
    eagerly)."""

    def __init__(
        self,
        parts: RowParts,
        packed: PackedModel,
        arena: KVArena,
        *,
        max_batch: int,
        graphs: bool,
        prefill_tokens: int = 0,
    ) -> None:
        self._parts = parts
        self._model = model = parts.model
        self.packed = packed
        self.arena = arena
        self.flash = flash_available(model.device, model.dtype)
        self.decoder = DecodeStep(
            packed,
            self.arena,
            max_rows=max_batch,
            mrope=model.mrope,
            suppress=model.suppress,
            device=model.device,
            reference=not self.flash,
            graphs=graphs,
        )
        self.prefiller = (
            PrefillStep(
                packed,
                arena,
                max_rows=max_batch,
                max_tokens=prefill_tokens,
                mrope=model.mrope,
                device=model.device,
                graphs=graphs,
                reference=not self.flash,
            )
            if prefill_tokens > 0
            else None
        )
        self.rows: list[Row] = []
        self._new: list[Row] = []  # admitted and placed, not prefilled yet
        self._flight: _Flight | None = None  # the decode step launched last, not read yet

    # -- RowEngine ------------------------------------------------------------------------

    def prepare(self, pendings: list[Pending]) -> None:
        for pending in pendings:
            self._parts.builder.prepare(pending)

    def admit(self, pendings: list[Pending]) -> list[Pending]:
        self._new, waiting = self._admit(pendings, running=bool(self.rows))
        return waiting

    def prefill(self) -> None:
        if self._new:
            self._prefill(self._new)
            self.rows = self.rows + self._new
        self._new = []

    def decode(self) -> None:
        self._decode(self.rows)

    def retire(self) -> None:
        self.rows = self._retire(self.rows)

    def fail(self, exc: Exception) -> None:
        error = self._model.failure(exc)
        self._flight = None
        for row in [*self.rows, *self._new]:
            if row.pending is not None:
                answer(row.pending, error)
                row.pending = None
            self._release(row)
        self.rows, self._new = [], []

    def drain(self) -> None:
        """Wait for the step in flight, if any, and drop its tokens (its rows are done)."""
        if self._flight is not None:
            flight, self._flight = self._flight, None
            flight.launched.read()
            for row in flight.rows:
                row.unread -= 1

    # -- admission -------------------------------------------------------------------------

    def _admit(self, pendings: list[Pending], *, running: bool) -> tuple[list[Row], list[Pending]]:
        """Rows for ``pendings``, each placed in the arena; those that do not fit now come
        back (in order) to wait for running rows to finish."""
        placed: list[Row] = []
        waiting: list[Pending] = []
        for pending in pendings:
            if waiting:  # first come, first placed
                waiting.append(pending)
                continue
            row = self._parts.builder.row(pending)
            if row is None:
                continue  # answered already (cancelled, or a bad request)
            try:
                fits = self._place(row, running=running or bool(placed))
            except Exception as exc:  # it fails alone (one that can never fit, say)
                answer(pending, self._model.failure(exc))
                continue
            if fits:
                placed.append(row)
            else:
                self._parts.builder.uncount(row)
                waiting.append(pending)
        return placed, waiting

    def _place(self, row: Row, *, running: bool) -> bool:
        """Give ``row`` its range and copy its cached prefix there. False: no room while
        other rows run (nothing was changed)."""
        need = len(row.prompt) + row.sampling.max_tokens
        if need > self.arena.capacity:
            raise BackendOutOfMemoryError(
                f"a prompt of {len(row.prompt)} tokens with max_tokens "
                f"{row.sampling.max_tokens} needs {need} KV slots; the pool holds "
                f"{self.arena.capacity} (kv_pool_bytes={self.arena.nbytes}): raise "
                "kv_pool_bytes, or send a shorter prompt or a smaller max_tokens",
                backend=self._model.name,
                needed=need,
                available=self.arena.capacity,
            )
        entry = row.match.entry
        while (start := self.arena.alloc(need)) is None:
            if self._parts.prefix.evict_one(keep=entry):
                continue
            if running:
                return False
            if entry is None:  # an empty arena holds any range up to its capacity
                raise AssertionError("the KV arena is fragmented with nothing in it")
            # nothing runs and only the matched entry is left: re-encode without it
            self._parts.prefix.drop(entry)
            self._parts.builder.unmatch(row)
            entry = None
        if entry is not None:
            state: ArenaRange = entry.state
            self.arena.copy(state.start, start, row.cached)
            if row.cached == state.length:  # the new row extends all of it: it replaces it
                self._parts.prefix.drop(entry)
                row.match = Match(None, row.cached)
        row.start, row.reserved = start, need
        return True

    def _release(self, row: Row) -> None:
        """Give back the range of a row that leaves without an entry."""
        if row.start >= 0:
            self.arena.free(row.start, row.reserved)
            row.start = -1

    # -- forwards --------------------------------------------------------------------------

    def _prefill(self, rows: list[Row]) -> None:
        """Compute every row's uncached tokens and sample each row's first token: rows go
        in packed groups of at most ``PREFILL_TOKENS`` new tokens (a longer row alone)."""
        groups: list[list[Row]] = []
        size = 0
        for row in rows:
            n = len(row.new_ids)
            if groups and size + n <= PREFILL_TOKENS:
                groups[-1].append(row)
                size += n
            else:
                groups.append([row])
                size = n
        for group in groups:
            self._prefill_group(group)

    def _prefill_group(self, rows: list[Row]) -> None:
        model = self._model
        device = model.device
        news = [row.new_ids for row in rows]
        ids = torch.tensor([[t for new in news for t in new]])
        positions = torch.cat([row.positions for row in rows], dim=-1)
        positions = positions[:, None] if model.mrope else positions[None]
        starts = [row.start for row in rows]
        cached = [row.cached for row in rows]
        new = [len(n) for n in news]
        step = PackedStep.build(
            self.arena, starts=starts, cached=cached, new=new, device=device,
            reference=not self.flash,
        )  # fmt: skip
        self._parts.stats.prefills_run += 1
        with self.packed.vision():  # the vision tower's attention: one varlen call
            inputs = self._parts.vision.inputs(rows, ids) if model.is_multimodal else {}
        keep = (step.cu_q[1:] - 1).long()
        fixed: contextlib.AbstractContextManager[None] = contextlib.nullcontext()
        if self.prefiller is not None and self.prefiller.serves(sum(new), len(rows)):
            fixed = self.prefiller.installed(starts=starts, cached=cached, new=new)
        with fixed:  # the text stack from fixed buffers (a CUDA graph), where it serves
            logits = self.packed.forward(
                ids.to(device), positions.to(device), step, keep=keep, inputs=inputs
            )
        self._sample(rows, logits, counters=[0] * len(rows))

    def _decode(self, rows: list[Row]) -> None:
        """Launch the next step for every row that may sample more, then read the step
        before (still running when it was launched after). A row that stopped at that
        step was fed once more in this one: that token is dropped when this step is read
        (its key and value went to the slot after the row's last, in its own range)."""
        going = [
            r for r in rows if not r.done and len(r.completion) + r.unread < r.sampling.max_tokens
        ]
        before = self._flight
        self._flight = self._launch(going, before) if going else None
        if before is not None:
            self._land(before)

    def _launch(self, rows: list[Row], before: _Flight | None) -> _Flight:
        self._parts.stats.steps_run += 1
        index = {id(r): i for i, r in enumerate(before.rows)} if before is not None else {}
        fed = [len(r.prompt) + len(r.completion) + r.unread for r in rows]  # after this step
        counters = [len(r.completion) + r.unread for r in rows]
        resample = None
        if any(uses_filters(r.sampling) or r.banned for r in rows):  # not in the graph
            resample = lambda logits: self._draw(rows, logits, counters)  # noqa: E731
        launched = self.decoder.launch(
            ids=[r.completion[-1] if not r.unread else 0 for r in rows],
            previous=[index[id(r)] if r.unread else -1 for r in rows],
            positions=[n - 1 + r.delta for r, n in zip(rows, fed, strict=True)],
            starts=[r.start for r in rows],
            lengths=fed,
            seeds=[_seed64(r.seed) for r in rows],
            counters=counters,
            temperatures=[r.sampling.temperature for r in rows],
            resample=resample,
        )
        for r in rows:
            r.unread += 1
        return _Flight(rows, launched)

    def _land(self, flight: _Flight) -> None:
        """Read a launched step's tokens into its rows (those still running)."""
        tokens, logprobs = flight.launched.read()
        live = []
        for i, row in enumerate(flight.rows):
            row.unread -= 1
            if not row.done and row.pending is not None:
                live.append(i)
        take(
            [flight.rows[i] for i in live],
            [tokens[i] for i in live],
            [logprobs[i] for i in live],
            self._model.eos_token_ids,
        )

    def _sample(self, rows: list[Row], logits: torch.Tensor, *, counters: list[int]) -> None:
        tokens, logprobs = self._draw(rows, logits, counters).cpu().tolist()
        take(rows, [int(t) for t in tokens], logprobs, self._model.eos_token_ids)

    def _draw(self, rows: Sequence[Row], logits: torch.Tensor, counters: list[int]) -> torch.Tensor:
        device = logits.device
        params = [r.sampling for r in rows]
        return sample_packed(
            logits,
            temperature=torch.tensor([p.temperature for p in params], device=device),
            seeds=torch.tensor([_seed64(r.seed) for r in rows], device=device),
            counters=torch.tensor(counters, device=device),
            suppress=self.decoder.suppress,
            filters=params if any(uses_filters(p) for p in params) else None,
            row_suppress=[r.banned for r in rows],
        )

    # -- retirement ------------------------------------------------------------------------

    def _retire(self, rows: list[Row]) -> list[Row]:
        """Answer the rows that just finished, keep what they wrote as prefix-cache
        entries; the rows still running."""
        for row in rows:
            if row.pending is None:
                continue
            if row.done:
                if self._parts.prefix_cache and not row.pending.future.cancelled():
                    keep = len(row.prompt) + len(row.completion) - 1  # the last was not fed
                    self.arena.shrink(row.start, row.reserved, keep)
                    self._parts.prefix.insert(
                        row.prompt + row.completion[:-1],
                        row.spans,
                        ArenaRange(row.start, keep),
                        keep * self.arena.token_bytes,
                        replaces=row.match.entry,
                        reach=row.reach_through(keep),
                    )
                    row.start = -1
                else:
                    self._release(row)
                answer(row.pending, result(row))
                row.pending = None
            elif row.pending.future.cancelled():  # nobody waits for it: stop it here
                row.done = True
                row.pending = None
                self._release(row)
        return [r for r in rows if not r.done]

    def close(self) -> None:
        """Give back the arena's memory and the captured graphs (the backend is closed)."""
        self.decoder.clear()
        if self.prefiller is not None:
            self.prefiller.clear()
        self.arena.release()

    def describe(self) -> dict[str, Any]:
        """The arena's size and use, for benches and ``/metrics``."""
        return {
            "kv_pool_bytes": self.arena.nbytes,
            "kv_pool_tokens": self.arena.capacity,
            "kv_free_tokens": self.arena.free_tokens,
            "graphs_captured": self.decoder.captures,
            "capture_s": round(self.decoder.capture_s, 2),
            **(self.prefiller.describe() if self.prefiller is not None else {}),
        }


def _seed64(seed: int) -> int:
    """A seed as a signed 64-bit value (what an int64 tensor holds)."""
    seed &= (1 << 64) - 1
    return seed - (1 << 64) if seed >= 1 << 63 else seed
