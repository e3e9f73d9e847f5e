"""The local backend's batch engine: running rows in padded KV tensors (``BatchKV``).

What the CPU runs, and any device where the pool engine does not (``kv_pool=False``).
Rows with different cached lengths share one forward: each row's KV is padded into one
tensor and masked; positions are passed per token (``LocalModel.positions``), so a
cached prefix and a full re-encode see the same positions, and greedy results (ids, and
logprobs within float tolerance) are those of a full re-encode.

- **Prefill**: admitted rows go in groups of similar length (a group is one forward of
  at most ``_PREFILL_TOKENS`` tokens, pads included), each group from its rows' cached
  prefixes; each row samples its first token. A model with linear-attention layers
  (Qwen3.5's Gated DeltaNet) prefills one row per forward: a pad fed through the
  recurrence would change its state.
- **Decode**: every running row feeds its last token; a done row is fed a pad and
  masked until it leaves.
- **Retirement**: a finished row is answered at once and its KV (prompt and completion
  but the last token, which was sampled, never fed) becomes a prefix-cache entry;
  finished rows leave the tensors once they are half of the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from vf_mm.inference._kv import BatchKV
from vf_mm.inference._rows import Pending, Row, answer, result, take
from vf_mm.inference._sampling import sample_rows
from vf_mm.inference._scheduler import RowParts

# most tokens (pads included) one prefill forward takes: bounds a prefill's activations
_PREFILL_TOKENS = 8192


class BatchEngine:
    """Runs rows of ``parts.model`` in padded KV tensors (module docstring): a
    ``RowEngine``, driven by the ``Scheduler``'s admission loop."""

    def __init__(self, parts: RowParts) -> None:
        self._parts = parts
        self._model = parts.model
        self.rows: list[Row] = []
        self._kv: BatchKV | None = None
        self._new: list[Row] = []  # admitted, not prefilled yet

    # -- RowEngine ------------------------------------------------------------------------

    def prepare(self, pendings: list[Pending]) -> None:
        for pending in pendings:
            self._parts.builder.prepare(pending)

    def admit(self, pendings: list[Pending]) -> list[Pending]:
        self._new = [r for r in map(self._parts.builder.row, pendings) if r is not None]
        return []  # the tensors grow: every request fits

    def prefill(self) -> None:
        new = self._new
        if new:
            new_kv = self._prefill(new)
            kv = self._kv
            self._kv = new_kv if kv is None else kv.merge(new_kv, reserve=_reserve(new))
            self.rows = self.rows + new
        self._new = []

    def decode(self) -> None:
        assert self._kv is not None, "running rows have their KV"
        self._decode(self.rows, self._kv)

    def retire(self) -> None:
        if self.rows and self._kv is not None:
            self.rows, self._kv = self._retire(self.rows, self._kv)

    def fail(self, exc: Exception) -> None:
        error = self._model.failure(exc)
        for row in [*self.rows, *self._new]:
            if row.pending is not None:  # not answered yet
                answer(row.pending, error)
        self.rows, self._kv, self._new = [], None, []

    def drain(self) -> None:
        """Nothing runs after the last step is read."""

    # -- forwards -------------------------------------------------------------------------

    def _prefill(self, rows: list[Row]) -> BatchKV:
        """Compute the uncached part of every row's prompt and sample each row's first
        token. Rows go in groups of similar length (a group is one forward)."""
        linear = self._model.linear
        order = sorted(rows, key=lambda r: len(r.new_ids), reverse=True)
        groups: list[list[Row]] = []
        for row in order:
            group = groups[-1] if groups else None
            if group is not None and not linear:  # a recurrent state takes no pads
                width = len(group[0].new_ids)  # the group's longest
                real = sum(len(r.new_ids) for r in group) + len(row.new_ids)
                padded = width * (len(group) + 1)
                if padded <= _PREFILL_TOKENS and padded <= 2 * real:
                    group.append(row)
                    continue
            groups.append([row])
        kv: BatchKV | None = None
        for group in groups:
            part = self._prefill_group(group)
            kv = part if kv is None else kv.merge(part, reserve=_reserve(rows))
        rows[:] = [r for g in groups for r in g]  # the batch's row order
        assert kv is not None
        return kv

    def _prefill_group(self, rows: list[Row]) -> BatchKV:
        m = self._model
        prefixes = [
            r.match.entry.state.prefix(r.cached) if r.match.entry is not None else None
            for r in rows
        ]
        width = max(len(r.new_ids) for r in rows)
        kv = BatchKV.start(
            prefixes,
            num_layers=m.num_layers,
            device=m.device,
            new=width,
            reserve=_reserve(rows),
            linear=m.linear,
        )
        ids = torch.full((len(rows), width), m.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        shape = (3, len(rows), width) if m.mrope else (len(rows), width)
        positions = torch.zeros(shape, dtype=torch.long)
        for i, row in enumerate(rows):
            new = row.new_ids
            ids[i, width - len(new) :] = torch.tensor(new)
            mask[i, width - len(new) :] = 1
            positions[..., i, width - len(new) :] = row.positions
        kv.extend_mask(mask.to(m.device))
        self._parts.stats.prefills_run += 1
        inputs: dict[str, Any] = {}
        if m.is_multimodal:
            inputs = self._parts.vision.inputs(rows, ids)
        logits = self._forward(ids, positions, kv, inputs)
        self._sample(rows, logits)
        return kv

    def _decode(self, rows: list[Row], kv: BatchKV) -> None:
        """One step: feed every running row its last sampled token, sample the next."""
        m = self._model
        ids = torch.tensor([[r.completion[-1] if not r.done else m.pad_token_id] for r in rows])
        at = torch.tensor([[r.next_position] for r in rows])
        positions = at[None].expand(3, -1, -1) if m.mrope else at
        alive = torch.tensor([[0 if r.done else 1] for r in rows])
        kv.extend_mask(alive.to(m.device))
        self._parts.stats.steps_run += 1
        logits = self._forward(ids, positions, kv, {})
        self._sample(rows, logits)

    def _forward(
        self, ids: torch.Tensor, positions: torch.Tensor, kv: BatchKV, inputs: dict[str, Any]
    ) -> torch.Tensor:
        device = self._model.device
        out = self._model.model(
            input_ids=ids.to(device),
            attention_mask=kv.mask,
            position_ids=positions.to(device),
            past_key_values=kv.cache,
            use_cache=True,
            logits_to_keep=1,
            **inputs,
        )
        return out.logits[:, -1]

    def _sample(self, rows: list[Row], logits: torch.Tensor) -> None:
        live = [i for i, r in enumerate(rows) if not r.done]
        if not live:
            return
        scores = logits if len(live) == len(rows) else logits[torch.tensor(live)]
        _, tokens, logprobs = sample_rows(
            scores,
            [rows[i].sampling for i in live],
            [rows[i].generator for i in live],
            self._model.suppress,
            [rows[i].banned for i in live],
        )
        take([rows[i] for i in live], tokens, logprobs, self._model.eos_token_ids)

    # -- retirement -----------------------------------------------------------------------

    def _retire(self, rows: list[Row], kv: BatchKV) -> tuple[list[Row], BatchKV | None]:
        """Answer the rows that just finished, keep their state, and drop finished rows
        from the batch once they are half of it."""
        for i, row in enumerate(rows):
            if row.pending is None:
                continue
            if row.done:
                if self._parts.prefix_cache and not row.pending.future.cancelled():
                    state = kv.row(i)  # prompt + completion[:-1]: the last token was not fed
                    tokens = row.prompt + row.completion[:-1]
                    self._parts.prefix.insert(
                        tokens,
                        row.spans,
                        state,
                        state.nbytes,
                        exact=state.exact,
                        replaces=row.match.entry,
                        reach=row.reach_through(len(tokens)),
                    )
                answer(row.pending, result(row))
                row.pending = None
            elif row.pending.future.cancelled():  # nobody waits for it: stop it here
                row.done = True
                row.pending = None
        keep = [i for i, r in enumerate(rows) if not r.done]
        if not keep:
            return [], None
        if 2 * len(keep) <= len(rows):
            kept = [rows[i] for i in keep]
            return kept, kv.select(keep, reserve=_reserve(kept))
        return rows, kv


def _reserve(rows: Sequence[Row]) -> int:
    """Columns to keep free for decoding ``rows``: the most tokens any still may sample."""
    return max((r.sampling.max_tokens - len(r.completion) for r in rows), default=0)
